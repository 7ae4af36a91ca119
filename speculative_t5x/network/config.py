"""The networks' configs: `T5Config`, `DecoderOnlyConfig` and their named sizes.

Field names are T5X's, so that T5X's gin files and checkpoints map onto them
one to one; `t5_1_1_config` and `decoder_only_config` give T5X's sizes (and
small ones for tests and CPU experiments) by name.
"""

import dataclasses
from typing import Any, Callable, Sequence

from flax import linen as nn
import jax
import jax.numpy as jnp

from speculative_t5x import checks

Array = jax.Array


def _check_config(config: Any, positive_fields: Sequence[str]) -> None:
  """The checks `T5Config` and `DecoderOnlyConfig` share; messages name the class."""
  cls = type(config).__name__
  # gin binds sequences as lists; a tuple keeps the config hashable.
  object.__setattr__(config, 'mlp_activations', tuple(config.mlp_activations))
  for name in positive_fields:
    checks.check_positive_int(f'{cls}.{name}', getattr(config, name))
  if not config.mlp_activations:
    raise ValueError(f'{cls}.mlp_activations is empty; T5 1.1 uses ("gelu", "linear").')
  for name in config.mlp_activations:
    activation(name)  # Raises for unknown names.
  if not 0.0 <= config.dropout_rate < 1.0:
    raise ValueError(f'{cls}.dropout_rate must be in [0, 1), got {config.dropout_rate}.')
  jnp.dtype(config.dtype)  # Raises for unknown dtypes.


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of `Transformer`, with T5X's `T5Config` field names.

  Defaults are T5X's except `dtype` (bfloat16) and `mlp_activations` (T5 1.1's
  gated GELU). `dtype` is the compute dtype (a dtype or its name, as gin binds
  'bfloat16'); parameters are always stored in float32. `mlp_activations` names
  flax.linen functions or 'linear'; one entry gives the T5 1.0 MLP (`wi`), two
  the gated one (`wi_0`, `wi_1`).
  """

  vocab_size: int
  dtype: Any = jnp.bfloat16
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dropout_rate: float = 0.1
  # If True, logits are the decoder output times the token embedding,
  # divided by sqrt(emb_dim); otherwise a separate `logits_dense` kernel.
  logits_via_embedding: bool = False
  # Whether to compute attention logits in float32 whatever `dtype` is.
  float32_attention_logits: bool = False

  def __post_init__(self):
    _check_config(
      self,
      (
        'vocab_size',
        'emb_dim',
        'num_heads',
        'num_encoder_layers',
        'num_decoder_layers',
        'head_dim',
        'mlp_dim',
      ),
    )


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Hyperparameters of `DecoderOnly`, with T5X's decoder-only `TransformerConfig` names.

  T5X's class is in t5x/examples/decoder_only/network.py.

  As in `T5Config`, defaults are T5X's except `dtype` (bfloat16; T5X's default
  is float32) and `mlp_activations` (gated GELU; T5X's default is ('relu',)):
  the values of T5X's decoder-only gin files, which also set
  `logits_via_embedding=True` (configs/models/decoder_only_*.gin). The fields
  mean what `T5Config`'s do; `num_layers` is the depth of the one stack.
  `float32_attention_logits` is ours: T5X's decoder-only attention has it off.
  """

  vocab_size: int
  dtype: Any = jnp.bfloat16
  emb_dim: int = 512
  num_heads: int = 8
  num_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False

  def __post_init__(self):
    _check_config(self, ('vocab_size', 'emb_dim', 'num_heads', 'num_layers', 'head_dim', 'mlp_dim'))


# Either network's config; functions taking one dispatch on its type.
NetworkConfig = T5Config | DecoderOnlyConfig


def is_decoder_only(config: NetworkConfig) -> bool:
  """Whether `config` is a `DecoderOnlyConfig` (else a `T5Config`, an encoder-decoder)."""
  return isinstance(config, DecoderOnlyConfig)


def num_decoder_layers(config: NetworkConfig) -> int:
  """The depth of the decoder stack (the only stack of a decoder-only model)."""
  return config.num_layers if is_decoder_only(config) else config.num_decoder_layers


# T5 1.1 sizes of T5X's gin files (t5x/examples/t5/t5_1_1/*.gin), plus small
# ones for tests and CPU experiments (a draft and a target):
# (emb_dim, num_heads, encoder and decoder layers, head_dim, mlp_dim).
T5_1_1_SIZES = {
  size: dict(
    emb_dim=emb,
    num_heads=heads,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    head_dim=head_dim,
    mlp_dim=mlp,
  )
  for size, (emb, heads, layers, head_dim, mlp) in {
    'tiny': (128, 4, 2, 32, 256),
    'mini': (256, 4, 4, 64, 512),
    'small': (512, 6, 8, 64, 1024),
    'base': (768, 12, 12, 64, 2048),
    'large': (1024, 16, 24, 64, 2816),
    'xl': (2048, 32, 24, 64, 5120),
    'xxl': (4096, 64, 24, 64, 10240),
  }.items()
}


def t5_1_1_config(size: str, **overrides) -> T5Config:
  """The T5 1.1 config of a named size (`T5_1_1_SIZES`), with overrides.

  Shared settings are those of T5X's `t5_1_1/base.gin`: vocab 32128, bfloat16,
  gated GELU, untied logits. Example: `t5_1_1_config('small', dtype='float32')`.
  """
  if size not in T5_1_1_SIZES:
    raise ValueError(f'Unknown T5 1.1 size {size!r}; choose one of {sorted(T5_1_1_SIZES)}.')
  fields = dict(
    vocab_size=32128,
    dtype=jnp.bfloat16,
    mlp_activations=('gelu', 'linear'),
    logits_via_embedding=False,
    **T5_1_1_SIZES[size],
  )
  fields.update(overrides)
  return T5Config(**fields)


# Decoder-only sizes: T5X's (t5x/examples/decoder_only/models/*.gin: gated GELU,
# logits through the embedding) and the paper's GPT-like pair (Leviathan et
# al. 2023, Table 3: one GELU layer, untied logits, an 8k vocabulary), as the
# gin files configs/models/decoder_only_*.gin and gpt_like_*.gin bind them.
_T5X_DECODER_ONLY = dict(mlp_activations=('gelu', 'linear'), logits_via_embedding=True)
_GPT_LIKE = dict(vocab_size=8192, mlp_activations=('gelu',), logits_via_embedding=False)
DECODER_ONLY_SIZES = {
  size: dict(emb_dim=emb, num_heads=heads, num_layers=layers, head_dim=64, mlp_dim=mlp, **shared)
  for size, (emb, heads, layers, mlp, shared) in {
    'tiny': (128, 4, 2, 256, _T5X_DECODER_ONLY),
    'base': (768, 12, 12, 2048, _T5X_DECODER_ONLY),
    'large': (1024, 16, 24, 2816, _T5X_DECODER_ONLY),
    'xl': (2048, 32, 24, 5120, _T5X_DECODER_ONLY),
    'xxl': (4096, 64, 24, 10240, _T5X_DECODER_ONLY),
    'gpt_like_target': (768, 12, 12, 3072, _GPT_LIKE),
    'gpt_like_draft': (256, 4, 2, 1024, _GPT_LIKE),
  }.items()
}


def decoder_only_config(size: str, **overrides) -> DecoderOnlyConfig:
  """The decoder-only config of a named size (`DECODER_ONLY_SIZES`), with overrides.

  Vocabulary 32128 (T5X's) unless the size sets its own, bfloat16. Example:
  `decoder_only_config('gpt_like_draft', dtype='float32')`.
  """
  if size not in DECODER_ONLY_SIZES:
    raise ValueError(
      f'Unknown decoder-only size {size!r}; choose one of {sorted(DECODER_ONLY_SIZES)}.'
    )
  fields = {'vocab_size': 32128, 'dtype': jnp.bfloat16, **DECODER_ONLY_SIZES[size], **overrides}
  return DecoderOnlyConfig(**fields)


def activation(name: str) -> Callable[[Array], Array]:
  """The function an `mlp_activations` entry names: 'linear' (identity) or a flax.linen one."""
  if name == 'linear':
    return lambda x: x
  fn = getattr(nn, name, None) if isinstance(name, str) else None
  if not callable(fn):
    raise ValueError(
      f'Unknown MLP activation {name!r}: use "linear" or a flax.linen '
      'function name such as "gelu" or "relu".'
    )
  return fn
