"""T5X's T5 1.1 encoder-decoder and decoder-only networks (flax.linen), block-cached.

Two networks rebuilt from T5X so that their parameter trees, shapes,
initializers, logical axis annotations (`params_axes`), config field names and
method signatures are T5X's: a T5X checkpoint loads without conversion, and
T5X's models can train, score and decode with them (`decode=True` follows
T5X's cache protocol):

  * `Transformer(T5Config)`: the minimal T5 (`t5x/examples/t5/network.py`),
    for T5X's `EncoderDecoderModel`.
  * `DecoderOnly(DecoderOnlyConfig)`: the decoder-only model
    (`t5x/examples/decoder_only/network.py`, `DecoderWrapper`), for T5X's
    `DecoderOnlyModel`, prefix LM (`decoder_causal_attention`, `prefill=True`)
    included.
One set of layers serves both: the decoder-only stack is the encoder-decoder's
decoder without cross-attention and with its own token embedding.

What is new is block-cached decoding for speculative decoding:

  module = module_for(config)
  # Transformer: (encoded, encoder_input_tokens, cache_length); DecoderOnly:
  # (batch, cache_length).
  _, variables = module.apply({'params': params}, ..., cache_length,
                              method='init_decoder_cache', mutable=['cache'])
  # Optional: write positions 0..W-1 (a decoder-only model's prompt).
  _, variables = module.apply({'params': params, **variables}, block_tokens,
                              prefix_lengths, bidirectional, method='prefill',
                              mutable=['cache'])
  logits, variables = module.apply({'params': params, **variables}, block_tokens,
                                   start_positions, method='decode_block',
                                   mutable=['cache'])

`decode_block` scores k >= 1 tokens per row at per-row positions, writes their
keys and values there (overwriting), and attends to the cached positions before
each row's start. With static `feature_layers` it (and `prefill`) also returns
the features of every scored position, those decoder layers' outputs (the last
layer's is the output before the final norm), from the same call: what a draft
head that reads the target (`drafts.FeatureDraft`) drafts from. A row is rolled back by passing a smaller start position next
time: entries at positions >= the start are masked until overwritten. `prefill`
writes a block's keys and values at positions 0..W-1 without computing logits;
for a decoder-only model it can attend bidirectionally within the prompt (T5X's
prefix LM). With `tree=` (tree speculative decoding), `decode_block` scores
nodes of a static token tree instead of a chain: node i is written at slot
start + i and attends to the context and its ancestors, at position
start + depth; `compact_tree_path` then moves an accepted root-to-node path to
consecutive slots. Sequence layout of both: position 0 holds BOS (token 0); a
decoder-only prompt token i sits at position i, so after a prefill of a prompt
of length P the loop feeds position P first.

Cache layout (every leaf but a scalar `cache_index` has the batch first):
  decoder/layers_{i}/self_attention/cached_{key,value}:
      [batch, cache_length, heads, head_dim], compute dtype. Position t of a row
      holds the key/value of the decoder input at t; a block write is one
      contiguous slice per row.
  decoder/layers_{i}/encoder_decoder_attention/cached_{key,value}:
      [batch, input_length, heads, head_dim], projected once from the encoder
      output (encoder-decoder block cache only).
  decoder/encoder_mask: bool [batch, input_length], True at non-padding inputs
      (encoder-decoder block cache only).
  decoder/cache_index: int32, the next position (T5X protocol only): a scalar,
      or [batch] after a decoder-only `prefill=True` call (per row, as T5X's).
T5X's own cache is [batch, heads, head_dim, length] with one `cache_index` per
layer; only T5X's decode functions touch it, and they do so by leaf name and
leading batch axis (expanding a [batch] `cache_index` too), which this layout
keeps. Logical axes for sharding: `KV_CACHE_AXES` and `ENCODER_MASK_AXES`.

Pure functions that take either config: `module_for(config)`,
`init_decoder_cache(config, params, input_tokens, cache_length)`,
`prefill_decoder_cache(config, params, cache, block_tokens, prefix_lengths,
bidirectional=...)`, `apply_decode_block(config, params, cache, block_tokens,
start_positions, tree=None, first_node=0)`, `compact_tree_path(config, cache,
start_positions, path)`, `abstract_params`, `random_params`,
`decoder_weight_bytes`.
"""

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import kernels
from speculative_t5x import settings as settings_lib

Array = jax.Array
param_with_axes = nn_partitioning.param_with_axes

# T5's relative attention: 32 buckets, distances >= 128 share the last bucket.
NUM_BUCKETS = 32
MAX_DISTANCE = 128
# Additive attention bias of a masked position (T5X's value).
NEG_INF = -1e10
# Logical axes of the decoder cache leaves (see the module docstring).
KV_CACHE_AXES = ('batch', 'length', 'heads', 'kv')
ENCODER_MASK_AXES = ('batch', 'length')


def _check_config(config: Any, positive_fields: Sequence[str]) -> None:
  """The checks `T5Config` and `DecoderOnlyConfig` share; messages name the class."""
  cls = type(config).__name__
  # gin binds sequences as lists; a tuple keeps the config hashable.
  object.__setattr__(config, 'mlp_activations', tuple(config.mlp_activations))
  for name in positive_fields:
    settings_lib.check_positive_int(f'{cls}.{name}', getattr(config, name))
  if not config.mlp_activations:
    raise ValueError(f'{cls}.mlp_activations is empty; T5 1.1 uses ("gelu", "linear").')
  for name in config.mlp_activations:
    _activation(name)  # Raises for unknown names.
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


def _num_decoder_layers(config: NetworkConfig) -> int:
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


def _activation(name: str) -> Callable[[Array], Array]:
  if name == 'linear':
    return lambda x: x
  fn = getattr(nn, name, None) if isinstance(name, str) else None
  if not callable(fn):
    raise ValueError(
      f'Unknown MLP activation {name!r}: use "linear" or a flax.linen '
      'function name such as "gelu" or "relu".'
    )
  return fn


# ------------------------------------------------------------------------------
# Relative position buckets.
# ------------------------------------------------------------------------------
def relative_position_bucket(
  relative_position: np.ndarray,
  bidirectional: bool = True,
  num_buckets: int = NUM_BUCKETS,
  max_distance: int = MAX_DISTANCE,
) -> np.ndarray:
  """T5's bucket of `relative_position` = memory position - query position.

  Half the buckets (per direction if bidirectional) are exact distances; the
  rest are log-spaced up to `max_distance`, beyond which all distances share the
  last bucket. Causal (not bidirectional) attention maps every future position
  to bucket 0. The float32 arithmetic with an epsilon in the log is T5X's (and
  Mesh TensorFlow's), so bucket boundaries fall exactly where theirs do.

  Args:
    relative_position: int array of any shape.
    bidirectional: whether memory positions after the query get own buckets.
    num_buckets: number of buckets.
    max_distance: distances from here on share the last bucket.

  Returns:
    int32 numpy array of `relative_position`'s shape, values in [0, num_buckets).
  """
  distance = -np.asarray(relative_position, np.int32)  # query - memory
  bucket = np.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket += np.where(distance < 0, num_buckets, 0).astype(np.int32)
    distance = np.abs(distance)
  else:
    distance = np.maximum(distance, 0)
  max_exact = num_buckets // 2
  log_position = (
    np.log(distance.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
    / np.log(max_distance / max_exact)
    * (num_buckets - max_exact)
  )
  large = np.minimum(max_exact + log_position.astype(np.int32), num_buckets - 1)
  return bucket + np.where(distance < max_exact, distance, large)


@functools.lru_cache(maxsize=None)
def _bucket_lookup(bidirectional: bool) -> np.ndarray:
  """Buckets of relative positions -MAX_DISTANCE..MAX_DISTANCE (clipped beyond).

  All distances >= MAX_DISTANCE share a bucket, so a lookup of the clipped
  relative position reproduces `relative_position_bucket` for dynamic positions
  without evaluating logarithms on the device.
  """
  return relative_position_bucket(np.arange(-MAX_DISTANCE, MAX_DISTANCE + 1), bidirectional)


# ------------------------------------------------------------------------------
# Layers.
# ------------------------------------------------------------------------------
class DenseGeneral(nn.Module):
  """A bias-free linear map of the last `len(axis)` axes (T5X's DenseGeneral).

  The kernel is stored 2-D, [prod(input dims), prod(features)], in float32 and
  reshaped for the contraction; inputs and kernel are cast to `dtype`. Where
  the 'packed' collection holds this layer's kernel (decoding on
  `kernels.pack_params`, float32) the CPU kernel computes it instead.
  """

  features: int | Tuple[int, ...]
  axis: int | Tuple[int, ...] = -1
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
  kernel_axes: Tuple[str, ...] = ()

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    axis = tuple(a % inputs.ndim for a in axis)
    contracted = tuple(inputs.shape[a] for a in axis)
    if self.has_variable(kernels.COLLECTION, 'kernel') and jnp.dtype(self.dtype) == jnp.float32:
      # Decoding on `kernels.pack_params`: the CPU kernel on the packed copy
      # (the plain kernel may have been dropped).
      batch = inputs.shape[: inputs.ndim - len(axis)]
      if axis != tuple(range(len(batch), inputs.ndim)):
        raise ValueError(f'A packed DenseGeneral contracts trailing axes; got axis {self.axis}.')
      x = inputs.reshape(batch + (int(np.prod(contracted)),))
      packed = self.get_variable(kernels.COLLECTION, 'kernel')
      return kernels.matmul(x, packed, int(np.prod(features))).reshape(batch + features)
    kernel = param_with_axes(
      'kernel',
      self.kernel_init,
      (int(np.prod(contracted)), int(np.prod(features))),
      jnp.float32,
      axes=self.kernel_axes,
    )
    kernel = jnp.asarray(kernel, self.dtype).reshape(contracted + features)
    inputs = jnp.asarray(inputs, self.dtype)
    return lax.dot_general(inputs, kernel, ((axis, tuple(range(len(axis)))), ((), ())))


class LayerNorm(nn.Module):
  """T5's RMS layer norm: no mean subtraction, no bias; statistics in float32."""

  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    mean_square = jnp.mean(lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(mean_square + self.epsilon), self.dtype)
    scale = param_with_axes(
      'scale', nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=('embed',)
    )
    return y * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """The shared token embedding [vocab, emb] and its transpose for logits."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = param_with_axes(
      'embedding',
      nn.initializers.normal(stddev=1.0),
      (self.num_embeddings, self.features),
      jnp.float32,
      axes=('vocab', 'embed'),
    )

  def __call__(self, tokens: Array) -> Array:
    """int [...] -> [..., features] in `dtype`.

    A gather, cast after the lookup: the same values as T5X's one-hot
    contraction without a [..., vocab] intermediate or a cast of the table.
    """
    return jnp.take(self.embedding, tokens.astype(jnp.int32), axis=0).astype(self.dtype)

  def attend(self, query: Array) -> Array:
    """[..., features] -> float32 [..., num_embeddings] dot products."""
    if self.has_variable(kernels.COLLECTION, 'embedding') and jnp.dtype(self.dtype) == jnp.float32:
      # Decoding on `kernels.pack_params`: the CPU kernel on the packed transpose.
      packed = self.get_variable(kernels.COLLECTION, 'embedding')
      return kernels.matmul(query, packed, self.num_embeddings)
    return jnp.dot(query, self.embedding.T)


class RelativePositionBiases(nn.Module):
  """T5 relative position biases, one table [heads, buckets] per stack."""

  num_heads: int
  dtype: Any

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array, bidirectional: bool) -> Array:
    """Attention biases for the given positions.

    Args:
      query_positions: int32 [B, q] (B may be 1 to broadcast).
      key_positions: int32 [B, k] (B may be 1).
      bidirectional: False for causal (decoder) attention.

    Returns:
      [B, heads, q, k] biases in `dtype`.
    """
    table = param_with_axes(
      'rel_embedding',
      nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
      (self.num_heads, NUM_BUCKETS),
      jnp.float32,
      axes=('heads', 'relpos_buckets'),
    )
    relative = key_positions[:, None, :] - query_positions[:, :, None]
    relative = jnp.clip(relative, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
    buckets = jnp.asarray(_bucket_lookup(bidirectional))[relative]  # [B, q, k]
    return jnp.moveaxis(jnp.asarray(table, self.dtype).T[buckets], -1, 1)


def dot_product_attention(
  query: Array,
  key: Array,
  value: Array,
  bias: Array,
  *,
  dtype: Any,
  float32_logits: bool = False,
  dropout_rate: float = 0.0,
  dropout_rng: Optional[Array] = None,
) -> Array:
  """Unscaled dot-product attention (T5 folds 1/sqrt(head_dim) into the query init).

  Args:
    query: [B, q, heads, head_dim].
    key: [B, k, heads, head_dim].
    value: [B, k, heads, head_dim].
    bias: additive bias broadcastable to [B, heads, q, k] (masks, positions).
    dtype: dtype of the attention weights.
    float32_logits: compute logits and softmax in float32.
    dropout_rate: attention dropout, broadcast over queries as in T5X.
    dropout_rng: PRNG key for dropout; None disables dropout.

  Returns:
    [B, q, heads, head_dim].
  """
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key)
  weights = jax.nn.softmax(logits + bias.astype(logits.dtype)).astype(dtype)
  if dropout_rng is not None and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    shape = weights.shape[:-2] + (1,) + weights.shape[-1:]
    keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
    weights = weights * (keep.astype(dtype) / jnp.asarray(keep_prob, dtype))
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def _write_block(cache: Array, block: Array, start_positions: Array) -> Array:
  """Overwrites cache[b, s_b : s_b + k] with block[b] ([B, L, ...], [B, k, ...], [B])."""
  write = lambda c, x, s: lax.dynamic_update_slice_in_dim(c, x, s, axis=0)
  return jax.vmap(write)(cache, block.astype(cache.dtype), start_positions)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with T5X's parameters and optional key/value caches.

  Parameters: `query`, `key`, `value` kernels [emb, heads * head_dim] (axes
  'embed', 'joined_kv') and `out` [heads * head_dim, emb]. Attention logits are
  not scaled; the query initializer is divided by sqrt(head_dim) instead.
  """

  config: NetworkConfig

  def setup(self):
    cfg = self.config
    kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
    depth_scaling = jnp.sqrt(cfg.head_dim).astype(cfg.dtype)
    projection = functools.partial(
      DenseGeneral,
      features=(cfg.num_heads, cfg.head_dim),
      dtype=cfg.dtype,
      kernel_axes=('embed', 'joined_kv'),
    )
    self.query = projection(kernel_init=lambda *args: kernel_init(*args) / depth_scaling)
    self.key = projection(kernel_init=kernel_init)
    self.value = projection(kernel_init=kernel_init)
    self.out = DenseGeneral(
      features=cfg.emb_dim,
      axis=(-2, -1),
      dtype=cfg.dtype,
      kernel_init=kernel_init,
      kernel_axes=('joined_kv', 'embed'),
    )

  def __call__(
    self, inputs_q: Array, inputs_kv: Array, bias: Array, *, deterministic: bool
  ) -> Array:
    """Attention without a cache.

    Args:
      inputs_q: [B, q, emb].
      inputs_kv: [B, k, emb].
      bias: additive bias broadcastable to [B, heads, q, k].
      deterministic: disables dropout.

    Returns:
      [B, q, emb].
    """
    return self._attend(
      self.query(inputs_q), self.key(inputs_kv), self.value(inputs_kv), bias, deterministic
    )

  def init_self_cache(self, batch: int, length: int):
    """Creates zero key/value caches [batch, length, heads, head_dim]."""
    shape = (batch, length, self.config.num_heads, self.config.head_dim)
    self.put_variable('cache', 'cached_key', jnp.zeros(shape, self.config.dtype))
    self.put_variable('cache', 'cached_value', jnp.zeros(shape, self.config.dtype))

  def cache_shape(self) -> Tuple[int, int]:
    """(batch, cache_length) of the self-attention cache."""
    return self.get_variable('cache', 'cached_key').shape[:2]

  def attend_block(self, inputs: Array, bias: Array, start_positions: Array) -> Array:
    """Cached self-attention for a block of k positions per row.

    Writes the block's keys/values at slots start..start+k-1 of each row,
    then attends over the whole cache; `bias` must mask what a query may not see.

    Args:
      inputs: [B, k, emb].
      bias: [B, heads, k, cache_length] (visibility mask plus relative
        positions, `tree_attention_layout`).
      start_positions: int32 [B], the slot of each row's first block entry.

    Returns:
      [B, k, emb].
    """
    cached_key, cached_value = self._write_self_cache(
      self.key(inputs), self.value(inputs), start_positions
    )
    return self._attend(self.query(inputs), cached_key, cached_value, bias, True)

  def prefill_self_cache(self, inputs: Array, bias: Array) -> Array:
    """Self-attention within a block at positions 0..W-1; caches its keys/values there.

    The block's queries attend to the block's own keys (not to the cache), so
    the cost is W x W whatever the cache length.

    Args:
      inputs: [B, W, emb].
      bias: [B|1, heads, W, W], what each query of the block may see.

    Returns:
      [B, W, emb].
    """
    key, value = self.key(inputs), self.value(inputs)
    self._write_self_cache(key, value, jnp.zeros(inputs.shape[:1], jnp.int32))
    return self._attend(self.query(inputs), key, value, bias, True)

  def _write_self_cache(
    self, key: Array, value: Array, start_positions: Array
  ) -> Tuple[Array, Array]:
    """Overwrites positions start..start+k-1 of each row's cache; returns the new caches."""
    cached = []
    for name, new in (('cached_key', key), ('cached_value', value)):
      cached.append(_write_block(self.get_variable('cache', name), new, start_positions))
      self.put_variable('cache', name, cached[-1])
    return cached[0], cached[1]

  def init_cross_cache(self, encoded: Array):
    """Caches the keys/values of the encoder output [B, input_length, emb]."""
    self.put_variable('cache', 'cached_key', self.key(encoded))
    self.put_variable('cache', 'cached_value', self.value(encoded))

  def attend_cached(self, inputs_q: Array, bias: Array) -> Array:
    """Attention to the cached keys/values: [B, q, emb] -> [B, q, emb]."""
    return self._attend(
      self.query(inputs_q),
      self.get_variable('cache', 'cached_key'),
      self.get_variable('cache', 'cached_value'),
      bias,
      True,
    )

  def _attend(self, query, key, value, bias, deterministic):
    cfg = self.config
    dropout_rng = None
    if not deterministic and cfg.dropout_rate > 0.0:
      dropout_rng = self.make_rng('dropout')
    x = dot_product_attention(
      query,
      key,
      value,
      bias,
      dtype=cfg.dtype,
      float32_logits=cfg.float32_attention_logits,
      dropout_rate=cfg.dropout_rate,
      dropout_rng=dropout_rng,
    )
    return self.out(x)


class MlpBlock(nn.Module):
  """T5's MLP: activations of `wi_*` (or `wi`) multiplied, then `wo`."""

  config: NetworkConfig

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool) -> Array:
    cfg = self.config
    kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
    hidden = None
    for i, name in enumerate(cfg.mlp_activations):
      dense_name = 'wi' if len(cfg.mlp_activations) == 1 else f'wi_{i}'
      h = DenseGeneral(
        cfg.mlp_dim,
        dtype=cfg.dtype,
        kernel_init=kernel_init,
        kernel_axes=('embed', 'mlp'),
        name=dense_name,
      )(inputs)
      h = _activation(name)(h)
      hidden = h if hidden is None else hidden * h
    hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic)
    return DenseGeneral(
      inputs.shape[-1],
      dtype=cfg.dtype,
      kernel_init=kernel_init,
      kernel_axes=('mlp', 'embed'),
      name='wo',
    )(hidden)


def _mask_to_bias(mask: Array, bias: Array | float = 0.0) -> Array:
  """`bias` where the boolean `mask` allows attention, NEG_INF elsewhere."""
  return jnp.where(mask, bias, NEG_INF)


# ------------------------------------------------------------------------------
# Stacks.
# ------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP blocks with residuals."""

  config: T5Config

  @nn.compact
  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    x = LayerNorm(cfg.dtype, name='pre_attention_layer_norm')(inputs)
    x = MultiHeadDotProductAttention(cfg, name='attention')(x, x, bias, deterministic=deterministic)
    x = inputs + dropout(x, deterministic)
    y = LayerNorm(cfg.dtype, name='pre_mlp_layer_norm')(x)
    y = MlpBlock(cfg, name='mlp')(y, deterministic)
    return x + dropout(y, deterministic)


class Encoder(nn.Module):
  """Token embedding, encoder layers with bidirectional relative biases, norm."""

  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(
    self, encoder_input_tokens: Array, encoder_mask: Array, deterministic: bool
  ) -> Array:
    """int32 [B, L] tokens, bool [B, 1, L, L] mask -> [B, L, emb] in `dtype`."""
    cfg = self.config
    positions = jnp.arange(encoder_input_tokens.shape[1])[None]
    bias = RelativePositionBiases(cfg.num_heads, cfg.dtype, name='relpos_bias')(
      positions, positions, bidirectional=True
    )
    bias = _mask_to_bias(encoder_mask, bias)
    x = self.shared_embedding(encoder_input_tokens)
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f'layers_{i}')(x, bias, deterministic)
    x = LayerNorm(cfg.dtype, name='encoder_norm')(x)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic)


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, optional cross-attention and MLP blocks.

  `cross_attention=False` is T5X's decoder-only layer: the same parameters
  without `pre_cross_attention_layer_norm` and `encoder_decoder_attention`.
  The three entry points differ only in how the self-attention sees keys.
  """

  config: NetworkConfig
  cross_attention: bool = True

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = LayerNorm(cfg.dtype)
    self.self_attention = MultiHeadDotProductAttention(cfg)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = LayerNorm(cfg.dtype)
      self.encoder_decoder_attention = MultiHeadDotProductAttention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(
    self,
    inputs: Array,
    encoded: Optional[Array],
    self_bias: Array,
    cross_bias: Optional[Array],
    deterministic: bool,
  ) -> Array:
    """Uncached: [B, L, emb] -> [B, L, emb]; biases [B|1, heads|1, L, L|input_length]."""
    attend = lambda x: self.self_attention(x, x, self_bias, deterministic=deterministic)
    return self._layer(inputs, attend, encoded, cross_bias, deterministic)

  def init_cache(self, batch: int, cache_length: int, encoded: Optional[Array]):
    """Zero self-attention caches; cross-attention keys/values unless `encoded` is None."""
    self.self_attention.init_self_cache(batch, cache_length)
    if encoded is not None:
      self.encoder_decoder_attention.init_cross_cache(encoded)

  def decode_block(
    self,
    inputs: Array,
    encoded: Optional[Array],
    self_bias: Array,
    cross_bias: Optional[Array],
    start_positions: Array,
  ) -> Array:
    """Cached, deterministic: [B, k, emb] -> [B, k, emb].

    Writes the block's keys/values at each row's start_positions and attends
    over the cache (`self_bias` [B, heads, k, cache_length]). `encoded`
    [B, input_length, emb] is re-projected for cross-attention (T5X's
    protocol); None uses the cross-attention keys/values cached by `init_cache`.
    """
    attend = lambda x: self.self_attention.attend_block(x, self_bias, start_positions)
    return self._layer(inputs, attend, encoded, cross_bias, True)

  def prefill(self, inputs: Array, self_bias: Array, cross_bias: Optional[Array]) -> Array:
    """Deterministic [B, W, emb] -> [B, W, emb] of a block at positions 0..W-1.

    Attends within the block (`self_bias` [B|1, heads, W, W]) and caches its
    keys/values; cross-attention uses the cached encoder keys/values.
    """
    attend = lambda x: self.self_attention.prefill_self_cache(x, self_bias)
    return self._layer(inputs, attend, None, cross_bias, True)

  def with_context(
    self,
    inputs: Array,
    context: Sequence[Array],
    self_bias: Array,
    encoded: Optional[Array],
    cross_bias: Optional[Array],
    deterministic: bool,
  ) -> Tuple[Array, Array]:
    """Uncached, with more self-attention keys: (output [B, q, emb], normalized inputs).

    The self-attention's keys/values are those of concat(context + [the
    normalized inputs]) along the length: `context` holds the normalized
    inputs of other calls ([B, k_i, emb] each; this call's second output), and
    `self_bias` [B|1, heads|1, q, sum k_i + q] says what each query sees. A
    draft head's training-time test uses it (`feature_head`).
    """
    normed = self.pre_self_attention_layer_norm(inputs)
    keys = jnp.concatenate([*context, normed], axis=1)
    attend = lambda x: self.self_attention(x, keys, self_bias, deterministic=deterministic)
    return self._layer(inputs, attend, encoded, cross_bias, deterministic), normed

  def _layer(self, inputs, self_attend, encoded, cross_bias, deterministic):
    x = inputs + self.dropout(
      self_attend(self.pre_self_attention_layer_norm(inputs)), deterministic
    )
    if self.cross_attention:
      y = self.pre_cross_attention_layer_norm(x)
      if encoded is None:
        y = self.encoder_decoder_attention.attend_cached(y, cross_bias)
      else:
        y = self.encoder_decoder_attention(y, encoded, cross_bias, deterministic=deterministic)
      x = x + self.dropout(y, deterministic)
    z = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(z, deterministic)


class Decoder(nn.Module):
  """Decoder layers with causal relative biases (one table), norm and logits.

  With a `T5Config`, the encoder-decoder's decoder: layers with cross-attention,
  embedding with the model's `shared_embedding`. With a `DecoderOnlyConfig`,
  T5X's decoder-only stack: no cross-attention and its own `token_embedder`.
  """

  config: NetworkConfig
  shared_embedding: Optional[nn.Module] = None

  @property
  def _decoder_only(self) -> bool:
    return is_decoder_only(self.config)

  def setup(self):
    cfg = self.config
    if self._decoder_only:
      self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype)
    self.layers = [
      DecoderLayer(cfg, cross_attention=not self._decoder_only)
      for _ in range(_num_decoder_layers(cfg))
    ]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab')
      )

  def __call__(
    self,
    decoder_input_tokens: Array,
    decoder_mask: Optional[Array],
    *,
    encoded: Optional[Array] = None,
    encoder_decoder_mask: Optional[Array] = None,
    deterministic: bool,
    decode: bool = False,
    prefill_lengths: Optional[Array] = None,
  ) -> Array:
    """Teacher-forced logits, or one call of T5X's cache protocol.

    Args:
      decoder_input_tokens: int32 [B, L] (L == 1 for a cached step).
      decoder_mask: bool [B, 1, L, L], which positions each position attends
        to (`make_decoder_mask`); None is causal.
      encoded: [B, input_length, emb], the encoder output (encoder-decoder).
      encoder_decoder_mask: bool [B, 1, L, input_length] (encoder-decoder).
      deterministic: disables dropout.
      decode: T5X's cache protocol: the first call (no cache yet) creates zero
        caches of length L and a scalar `cache_index` and returns causal
        logits; later calls feed one token per row at `cache_index` (a scalar,
        or [B] after a prefill) and increment it.
      prefill_lengths: T5X's prefill (decoder-only, after the creating call,
        decode False): int32 [B]. The logits are computed with `decoder_mask`
        while the keys/values of all L positions are cached; `cache_index`
        becomes prefill_lengths (entries from there on are stale, masked until
        overwritten).

    Returns:
      float32 logits [B, L, vocab].
    """
    batch, length = decoder_input_tokens.shape
    cross_bias = None
    if encoder_decoder_mask is not None:
      cross_bias = _mask_to_bias(encoder_decoder_mask).astype(self.config.dtype)
    y = self.dropout(self._embedder()(decoder_input_tokens), deterministic)
    if decode and self.has_variable('cache', 'cache_index'):
      if length != 1:
        raise ValueError(
          'A decode=True step feeds one token per row: decoder_input_tokens '
          f'must be [batch, 1], got {decoder_input_tokens.shape}.'
        )
      index = self.get_variable('cache', 'cache_index')
      start_positions = jnp.broadcast_to(index, (batch,)).astype(jnp.int32)
      y, _ = self._decode_block(y, encoded, cross_bias, start_positions)
      self.put_variable('cache', 'cache_index', index + 1)
      return self._logits(y, deterministic=True)
    if decode:
      for layer in self.layers:
        layer.init_cache(batch, length, encoded=None)
      self.put_variable('cache', 'cache_index', jnp.array(0, jnp.int32))
    positions = jnp.arange(length)[None]
    allowed = _causal_mask(positions, positions) if decoder_mask is None else decoder_mask
    self_bias = self._self_bias(positions, positions, allowed)
    if prefill_lengths is not None:
      if not self.has_variable('cache', 'cache_index'):
        raise ValueError(
          'prefill=True fills the cache made by a first decode=True call (as '
          "T5X's DecoderOnlyModel._compute_kv_cache makes it); there is none."
        )
      self._check_block(
        decoder_input_tokens, prefill_lengths, 'prefill_lengths', 'decoder_input_tokens'
      )
      y = self._prefill(y, self_bias, cross_bias, (len(self.layers) - 1,))
      self.put_variable('cache', 'cache_index', jnp.asarray(prefill_lengths, jnp.int32))
      return self._logits(y, deterministic=True)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    return self._logits(y, deterministic)

  def init_block_cache(
    self,
    batch: int,
    cache_length: int,
    encoded: Optional[Array] = None,
    encoder_mask: Optional[Array] = None,
  ):
    """Zero self-attention caches [batch, cache_length, heads, head_dim] per layer.

    With `encoded` [batch, input_length, emb] and `encoder_mask` bool
    [batch, input_length] (encoder-decoder), also the cross-attention
    keys/values and the mask.
    """
    for layer in self.layers:
      layer.init_cache(batch, cache_length, encoded)
    if encoder_mask is not None:
      self.put_variable('cache', 'encoder_mask', encoder_mask)

  def decode_block(
    self,
    block_tokens: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Array | Tuple[Array, Array]:
    """See `Transformer.decode_block`."""
    cross_bias = self._block_cross_bias('decode_block')
    self._check_block(block_tokens, start_positions, 'start_positions')
    y = self._embedder()(block_tokens)
    y, features = self._decode_block(
      y, None, cross_bias, start_positions.astype(jnp.int32), tree, first_node, feature_layers
    )
    logits = self._logits(y, deterministic=True)
    return logits if feature_layers is None else (logits, features)

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """See `DecoderOnly.prefill`; the block's features with `feature_layers`, else None."""
    cross_bias = self._block_cross_bias('prefill')
    prefix_lengths = jnp.asarray(prefix_lengths, jnp.int32)
    self._check_block(block_tokens, prefix_lengths, 'prefix_lengths')
    positions = jnp.arange(block_tokens.shape[1])[None]
    allowed = _causal_mask(positions, positions)
    if bidirectional:
      in_prefix = positions <= prefix_lengths[:, None]
      allowed = jnp.logical_or(allowed, make_attention_mask(in_prefix, in_prefix))
    self_bias = self._self_bias(positions, positions, allowed)
    return self._prefill(self._embedder()(block_tokens), self_bias, cross_bias, feature_layers)

  def _block_cross_bias(self, method: str) -> Optional[Array]:
    """Checks that the block cache exists; its cross-attention bias (None if decoder-only)."""
    has_cache = self.layers[0].self_attention.has_variable('cache', 'cached_key')
    if not self._decoder_only:
      has_cache = has_cache and self.has_variable('cache', 'encoder_mask')
    if not has_cache:
      model = 'DecoderOnly' if self._decoder_only else 'Transformer'
      raise ValueError(
        f'{method} needs the cache made by {model}.init_decoder_cache '
        "(apply it with mutable=['cache'] and pass {'cache': ...} here)."
      )
    if self._decoder_only:
      return None
    encoder_mask = self.get_variable('cache', 'encoder_mask')
    return _mask_to_bias(encoder_mask[:, None, None, :]).astype(self.config.dtype)

  def _check_block(
    self, block_tokens: Array, positions: Array, positions_name: str, tokens_name='block_tokens'
  ):
    """Raises unless tokens [batch, k] and positions [batch] fit the cache."""
    batch, cache_length = self.layers[0].self_attention.cache_shape()
    if (
      block_tokens.ndim != 2
      or positions.shape != block_tokens.shape[:1]
      or block_tokens.shape[0] != batch
    ):
      raise ValueError(
        f"Expected {tokens_name} [batch, k] and {positions_name} [batch] with the cache's "
        f'batch {batch}; got {block_tokens.shape} and {positions.shape}.'
      )
    if block_tokens.shape[1] > cache_length:
      raise ValueError(
        f'A block of {block_tokens.shape[1]} tokens does not fit a cache of length {cache_length}.'
      )

  def _decode_block(
    self, y, encoded, cross_bias, start_positions, tree=None, first_node=0, feature_layers=None
  ):
    """Block (chain or tree nodes, see `tree_attention_layout`) through the layers.

    Returns (the last layer's output, `select_features` of every layer's).
    """
    cache_length = self.layers[0].self_attention.cache_shape()[1]
    query_positions, key_positions, visible = tree_attention_layout(
      start_positions, cache_length, y.shape[1], tree, first_node
    )
    self_bias = self._self_bias(query_positions, key_positions, visible)
    # Node i's key/value goes to slot start + i.
    write_positions = start_positions + first_node if first_node else start_positions
    outputs = []
    for layer in self.layers:
      y = layer.decode_block(y, encoded, self_bias, cross_bias, write_positions)
      outputs.append(y)
    return y, select_features(outputs, feature_layers)

  def _prefill(self, y, self_bias, cross_bias, feature_layers=None):
    # Without features only the caches are needed: under jit, XLA drops the
    # last layer's attention output and MLP when the caller discards them.
    outputs = []
    for layer in self.layers:
      y = layer.prefill(y, self_bias, cross_bias)
      outputs.append(y)
    return select_features(outputs, feature_layers)

  def _self_bias(self, query_positions, key_positions, allowed):
    """[B|1, heads, q, k]: causal-bucket relative biases where `allowed`, else NEG_INF.

    T5X's decoders use causal buckets even where a prefix LM attends forward:
    a later key then shares bucket 0 with the query's own position.
    """
    relative = self.relpos_bias(query_positions, key_positions, bidirectional=False)
    return _mask_to_bias(allowed, relative)

  def _embedder(self) -> Embed:
    return self.token_embedder if self._decoder_only else self.shared_embedding

  def embed(self, tokens: Array) -> Array:
    """int [...] -> [..., emb]: the decoder's token embedding (no dropout)."""
    return self._embedder()(tokens)

  def feature_logits(self, features: Array) -> Array:
    """float32 logits [..., vocab] of last-layer outputs [..., emb]: final norm, logits layer."""
    return self._logits(features, deterministic=True)

  def _logits(self, y, deterministic):
    y = self.dropout(self.decoder_norm(y), deterministic)
    if self.config.logits_via_embedding:
      # The tied embedding needs 1/sqrt(emb) to keep logits at unit scale.
      return self._embedder().attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)


def check_feature_layers(config: NetworkConfig, feature_layers: Any) -> Tuple[int, ...]:
  """`feature_layers` as a tuple of distinct decoder layer indices in [0, num_layers).

  Layer i's feature is its output (the residual stream after layer i): the
  last layer's is the decoder output before the final norm.
  """
  num_layers = _num_decoder_layers(config)
  layers = tuple(feature_layers) if isinstance(feature_layers, (tuple, list)) else None
  if (
    not layers
    or len(set(layers)) != len(layers)
    or not all(isinstance(i, (int, np.integer)) and 0 <= i < num_layers for i in layers)
  ):
    raise ValueError(
      f'feature_layers must be a non-empty tuple of distinct decoder layer indices in '
      f'[0, {num_layers}) (this network has {num_layers} decoder layers; the last, '
      f'{num_layers - 1}, gives the output before the final norm); got {feature_layers!r}.'
    )
  return tuple(int(i) for i in layers)


def select_features(
  layer_outputs: Sequence[Array], feature_layers: Optional[Tuple[int, ...]]
) -> Optional[Array]:
  """[..., len(feature_layers) * emb]: the listed layers' outputs, concatenated in that order.

  None without `feature_layers` (nothing is kept, so XLA can drop unused work).
  """
  if feature_layers is None:
    return None
  return jnp.concatenate([layer_outputs[i] for i in feature_layers], axis=-1)


# ------------------------------------------------------------------------------
# Masks.
# ------------------------------------------------------------------------------
def make_attention_mask(
  query_input: Array,
  key_input: Array,
  pairwise_fn: Callable[[Array, Array], Array] = jnp.logical_and,
) -> Array:
  """bool [B, 1, q, k] = pairwise_fn(query_input[b, i], key_input[b, j])."""
  return pairwise_fn(query_input[:, None, :, None], key_input[:, None, None, :]).astype(bool)


def _causal_mask(query_positions: Array, key_positions: Array) -> Array:
  """bool [B|1, 1, q, k]: key position <= query position (int [B|1, q], [B|1, k])."""
  return key_positions[:, None, None, :] <= query_positions[:, None, :, None]


def _tree_arrays(tree: Any, block_size: int, first_node: int, cache_length: int):
  """Checked static (depths int32 [N], ancestors bool [N, N]) of a block's tree.

  tree=None is the chain of the block's k tokens: depths arange(k) and a
  lower-triangular `ancestors`. Raises at trace time for a tree that does not
  fit the cache, a block past its last node, or malformed arrays.
  """
  if not isinstance(first_node, (int, np.integer)) or first_node < 0:
    raise ValueError(f'first_node must be a static int >= 0, got {first_node!r}.')
  if tree is None:
    if first_node:
      raise ValueError(
        f'first_node={first_node} needs a tree; a chain block (tree=None) starts at node 0.'
      )
    return np.arange(block_size, dtype=np.int32), np.tri(block_size, dtype=bool)
  try:
    depths = np.asarray(tree.depths)
    ancestors = np.asarray(tree.ancestors)
  except AttributeError:
    raise TypeError(
      'tree must have numpy attributes depths [N] and ancestors [N, N] (a tree.Tree), '
      f'got {type(tree).__name__}.'
    ) from None
  num_nodes = depths.shape[0] if depths.ndim == 1 else 0
  if (
    num_nodes < 1
    or not np.issubdtype(depths.dtype, np.integer)
    or ancestors.shape != (num_nodes, num_nodes)
    or ancestors.dtype != bool
  ):
    raise ValueError(
      'tree.depths must be int [N] and tree.ancestors bool [N, N], N >= 1; got '
      f'{depths.dtype} {depths.shape} and {ancestors.dtype} {ancestors.shape}.'
    )
  if not (np.array_equal(ancestors, np.tril(ancestors)) and ancestors.diagonal().all()):
    raise ValueError(
      'tree.ancestors[i, j] must hold for j == i and fail for j > i (parents[i] < i, '
      'nodes in BFS order).'
    )
  if num_nodes > cache_length:
    raise ValueError(f'A tree of {num_nodes} nodes does not fit a cache of length {cache_length}.')
  if first_node + block_size > num_nodes:
    raise ValueError(
      f"A block of {block_size} tokens from node {first_node} runs past the tree's last "
      f'node {num_nodes - 1}; first_node + k must be <= {num_nodes}.'
    )
  return depths.astype(np.int32), ancestors


def tree_attention_layout(
  start_positions: Array,
  cache_length: int,
  block_size: int,
  tree: Any = None,
  first_node: int = 0,
) -> Tuple[Array, Array, Array]:
  """Positions and visibility of a block of tree nodes against a row's cache.

  The block holds nodes first_node..first_node+k-1 of a static tree of N
  nodes (node 0 the root; BFS order). Node i's key/value lives at cache slot
  start + i. Its query sits at position start + depths[i] and sees the
  context (slots < start) and the slots start + j of its ancestors and itself
  (ancestors[i, j]), nothing else. A tree slot's key has position
  start + depths[j] (relative biases see depths, not slots); every other slot's
  key has position = slot. tree=None is the chain of the k tokens (token j at
  position start + j, causal), exactly today's block.

  Args:
    start_positions: int32 [B], each row's root slot.
    cache_length: static L, the cache's number of slots.
    block_size: static k, the block's number of tokens.
    tree: None, or a static object with numpy attributes `depths` int [N] and
      `ancestors` bool [N, N] (ancestors[i, j]: j is i or an ancestor of i),
      such as a `tree.Tree`; any object with those two attributes will do.
    first_node: static int, the tree node of the block's first token.

  Returns:
    query_positions: int32 [B, k].
    key_positions: int32 [B, L].
    visible: bool [B, 1, k, L], which slots each query attends to.
  """
  depths, ancestors = _tree_arrays(tree, block_size, first_node, cache_length)
  start = start_positions[:, None]
  query_positions = start + depths[first_node : first_node + block_size]
  slots = jnp.arange(cache_length)[None]
  node = slots - start  # [B, L]: the tree node a slot would hold.
  context = node < 0
  in_tree = ~context & (node < len(depths))
  node = jnp.clip(node, 0, len(depths) - 1)
  key_positions = jnp.where(in_tree, start + jnp.asarray(depths)[node], slots)
  sees_node = jnp.asarray(ancestors[first_node : first_node + block_size])[:, node]  # [k, B, L]
  visible = context[:, None] | (in_tree[:, None] & jnp.moveaxis(sees_node, 0, 1))
  return query_positions, key_positions, visible[:, None]


def make_decoder_mask(
  decoder_target_tokens: Array,
  decoder_causal_attention: Optional[Array] = None,
  decoder_segment_ids: Optional[Array] = None,
) -> Array:
  """The decoder self-attention mask of T5X's `layers.make_decoder_mask`, as bool.

  Position i attends to position j if j <= i, or if both are marked in
  `decoder_causal_attention` (a prefix LM's bidirectional inputs); and both
  are non-padding (target != 0); and, when packed, both are in one segment.

  Args:
    decoder_target_tokens: [B, L]; 0 is padding.
    decoder_causal_attention: [B, L], 1 at positions that attend bidirectionally
      among themselves, or None.
    decoder_segment_ids: int [B, L] packing ids, or None.

  Returns:
    bool [B, 1, L, L].
  """
  positions = jnp.arange(decoder_target_tokens.shape[-1])[None]
  mask = _causal_mask(positions, positions)
  if decoder_causal_attention is not None:
    mask = jnp.logical_or(
      mask, make_attention_mask(decoder_causal_attention, decoder_causal_attention)
    )
  valid = decoder_target_tokens > 0
  mask = jnp.logical_and(mask, make_attention_mask(valid, valid))
  if decoder_segment_ids is not None:
    mask = jnp.logical_and(
      mask, make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal)
    )
  return mask


# ------------------------------------------------------------------------------
# The model.
# ------------------------------------------------------------------------------
class Transformer(nn.Module):
  """The T5 1.1 encoder-decoder with T5X's interface plus block-cached decoding."""

  config: T5Config

  def setup(self):
    cfg = self.config
    if not isinstance(cfg, T5Config):
      raise TypeError(
        f'Transformer takes a T5Config, got {type(cfg).__name__}; '
        'network.module_for(config) picks the module for either config.'
      )
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = Encoder(cfg, shared_embedding=self.token_embedder)
    self.decoder = Decoder(cfg, shared_embedding=self.token_embedder)

  def encode(
    self,
    encoder_input_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    enable_dropout: bool = True,
  ) -> Array:
    """Encodes int32 [B, L] tokens (0 is padding) to [B, L, emb] in `dtype`.

    `encoder_segment_ids` int32 [B, L] restrict attention to equal ids (packing).
    """
    if encoder_input_tokens.ndim != 2:
      raise ValueError(
        f'encoder_input_tokens must be [batch, length], got shape {encoder_input_tokens.shape}.'
      )
    valid = encoder_input_tokens > 0
    mask = make_attention_mask(valid, valid)
    if encoder_segment_ids is not None:
      mask &= make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal)
    return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

  def decode(
    self,
    encoded: Array,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    decoder_segment_ids: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
  ) -> Array:
    """Decoder logits, teacher-forced or (decode=True) one T5X-protocol step.

    Args:
      encoded: [B, input_length, emb] from `encode`.
      encoder_input_tokens: int32 [B, input_length], only for the padding mask.
      decoder_input_tokens: int32 [B, L], the targets shifted right (BOS = 0).
      decoder_target_tokens: int32 [B, L]; 0 marks padding (teacher forcing).
      encoder_segment_ids: int32 [B, input_length] packing ids, or None.
      decoder_segment_ids: int32 [B, L] packing ids, or None.
      decoder_positions: unused, as in T5X (relative biases need no positions).
      enable_dropout: enables dropout (needs a 'dropout' rng).
      decode: T5X's cache protocol. The first call, with `mutable=['cache']`
        and decoder_input_tokens [B, max_len], creates a zero cache of max_len
        positions; each later call takes one token [B, 1], writes it at the
        scalar `cache_index`, attends to positions <= it and increments it.
      max_decode_length: accepted for T5X; the cache's length plays its role.

    Returns:
      float32 logits [B, L, vocab].
    """
    del decoder_positions, max_decode_length
    if decode:
      if encoder_segment_ids is not None:
        raise ValueError('Packing is for training: decode=True takes no encoder_segment_ids.')
      decoder_mask = None
      encoder_decoder_mask = make_attention_mask(
        jnp.ones_like(decoder_target_tokens, bool), encoder_input_tokens > 0
      )
    else:
      decoder_mask = make_decoder_mask(decoder_target_tokens, None, decoder_segment_ids)
      encoder_decoder_mask = make_attention_mask(
        decoder_target_tokens > 0, encoder_input_tokens > 0
      )
      if encoder_segment_ids is not None:
        encoder_decoder_mask &= make_attention_mask(
          decoder_segment_ids, encoder_segment_ids, jnp.equal
        )
    return self.decoder(
      decoder_input_tokens,
      decoder_mask,
      encoded=encoded,
      encoder_decoder_mask=encoder_decoder_mask,
      deterministic=not enable_dropout,
      decode=decode,
    )

  def __call__(
    self,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    decoder_segment_ids: Optional[Array] = None,
    encoder_positions: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
  ) -> Array:
    """Encodes and decodes; float32 logits [B, L, vocab] (see `encode`, `decode`).

    `encoder_positions` and `decoder_positions` are unused, as in T5X.
    """
    del encoder_positions
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
    return self.decode(
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      decoder_target_tokens,
      encoder_segment_ids,
      decoder_segment_ids,
      decoder_positions,
      enable_dropout,
      decode,
      max_decode_length,
    )

  def init_decoder_cache(
    self, encoded: Array, encoder_input_tokens: Array, cache_length: int
  ) -> None:
    """Builds the cache for `decode_block` (apply with mutable=['cache']).

    Allocates zero self-attention keys/values of `cache_length` positions per
    decoder layer, projects each layer's cross-attention keys/values from
    `encoded` once, and stores the encoder padding mask. Size `cache_length`
    for the longest decode plus the largest block (positions start + k - 1 must
    stay below it).

    Args:
      encoded: [B, input_length, emb] from `encode`.
      encoder_input_tokens: int32 [B, input_length]; 0 is padding.
      cache_length: static number of decoder positions.

    Returns:
      None; `apply` returns `(None, {'cache': cache})`.
    """
    if (
      encoded.ndim != 3
      or encoder_input_tokens.shape != encoded.shape[:2]
      or encoded.shape[2] != self.config.emb_dim
    ):
      raise ValueError(
        f'Expected encoded [batch, length, {self.config.emb_dim}] and '
        'encoder_input_tokens [batch, length]; got '
        f'{encoded.shape} and {encoder_input_tokens.shape}.'
      )
    settings_lib.check_positive_int('cache_length', cache_length)
    self.decoder.init_block_cache(
      encoded.shape[0], int(cache_length), encoded, encoder_input_tokens > 0
    )

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool = False,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """Writes the decoder keys/values of a block at positions 0..W-1; no logits.

    Causal, as `decode_block` at start 0 would write them; the next call
    continues at any position <= W. Apply with mutable=['cache'].

    Args:
      block_tokens: int32 [B, W], the decoder inputs (BOS = 0 first).
      prefix_lengths: int32 [B]; unused (the signature is `DecoderOnly.prefill`'s).
      bidirectional: must be False.
      feature_layers: optional static decoder layer indices (`check_feature_layers`).

    Returns:
      None, or with `feature_layers` the block's features [B, W, len * emb]
      (`select_features`); `apply` also returns `{'cache': new_cache}`.
    """
    if bidirectional:
      raise ValueError(
        "T5X's encoder-decoder has no prefix-LM decoder: its decoder attends "
        'causally. Use bidirectional=False (a DecoderOnly network has prefix-LM '
        'prefills).'
      )
    return self.decoder.prefill(block_tokens, prefix_lengths, False, feature_layers)

  def decode_block(
    self,
    block_tokens: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Array | Tuple[Array, Array]:
    """Scores a block of k tokens per row against the cache; updates the cache.

    Chain (tree=None): row b's tokens sit at positions start_positions[b] + j,
    j < k: each attends causally within the block and to the row's cached
    positions before start_positions[b]; cached entries at later positions
    (stale ones from a rolled-back block) are masked. Keys/values of the block
    overwrite the cache there.

    Tree: the tokens are nodes first_node..first_node+k-1 of the static
    `tree`, whose root (node 0) is the row's last emitted token at slot
    start. Node i's key/value is written at slot start + i; its query sits at
    position start + depths[i] and sees the context (slots < start) and its
    ancestors' slots, whether written by this call or by an earlier one at the
    same start (a draft writes the tree level by level). See
    `tree_attention_layout`; `compact_tree_path` then moves an accepted path
    to consecutive slots. The cross-attention is the same for every node.

    Deterministic. Apply with mutable=['cache']. The caller guarantees
    start_positions[b] + (k, or the tree's N) <= cache_length (inside jit this
    cannot be checked; an out-of-range write would be clamped).

    Args:
      block_tokens: int32 [B, k], the decoder inputs at those positions (nodes).
      start_positions: int32 [B], position of each row's first block token
        (with a tree, the root's slot).
      tree: None, or a static tree with numpy `depths` int [N] and `ancestors`
        bool [N, N] (duck-typed; see `tree_attention_layout`).
      first_node: static int, the tree node of block_tokens[:, 0] (0 without
        a tree); first_node + k <= N.
      feature_layers: optional static decoder layer indices: also return the
        block's features, those layers' outputs concatenated
        (`select_features`; the last layer's is the output before the final
        norm), from this same call.

    Returns:
      float32 logits [B, k, vocab], or with `feature_layers` (logits, features
      [B, k, len(feature_layers) * emb] in the compute dtype); `apply` also
      returns `{'cache': new_cache}`.
    """
    return self.decoder.decode_block(
      block_tokens, start_positions, tree, first_node, feature_layers
    )


class DecoderOnly(nn.Module):
  """T5X's decoder-only model (`DecoderWrapper`) plus block-cached decoding.

  Parameters are T5X's, under its wrapper's `decoder/` scope:
  `token_embedder/embedding`, `relpos_bias/rel_embedding` (one table, causal
  buckets), `layers_{i}/{pre_self_attention_layer_norm, self_attention,
  pre_mlp_layer_norm, mlp}`, `decoder_norm/scale` and `logits_dense/kernel`
  (absent with `logits_via_embedding`).

  Sequence layout (T5X's `DecoderFeatureConverter`): position 0 holds BOS (0)
  and prompt token i sits at position i; a prefix LM marks positions 0..P of a
  prompt of length P in `decoder_causal_attention`.
  """

  config: DecoderOnlyConfig

  def setup(self):
    if not isinstance(self.config, DecoderOnlyConfig):
      raise TypeError(
        f'DecoderOnly takes a DecoderOnlyConfig, got {type(self.config).__name__}; '
        'network.module_for(config) picks the module for either config.'
      )
    self.decoder = Decoder(self.config)

  def __call__(
    self,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    decoder_segment_ids: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    decoder_causal_attention: Optional[Array] = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
    prefill: Optional[bool] = None,
    prefill_lengths: Optional[Array] = None,
  ) -> Array:
    """Teacher-forced logits, or one call of T5X's cache protocol.

    Args:
      decoder_input_tokens: int32 [B, L], the targets shifted right (BOS = 0).
      decoder_target_tokens: [B, L]; 0 marks padding (no attention to or from).
      decoder_segment_ids: int32 [B, L] packing ids, or None.
      decoder_positions: unused, as in T5X (relative biases need no positions).
      decoder_causal_attention: [B, L], 1 where positions attend to each other
        bidirectionally (a prefix LM's inputs), or None (causal).
      enable_dropout: enables dropout (needs a 'dropout' rng).
      decode: T5X's cache protocol, as T5X's `DecoderOnlyModel` drives it. The
        first call (no cache yet; apply with mutable=['cache']) creates zero
        caches of L positions and a scalar `cache_index`, and returns causal
        logits. Each later call takes one token per row [B, 1], writes it at
        the row's `cache_index` (a scalar, or [B] after a prefill), attends to
        positions <= it and increments it. Masks are not used.
      max_decode_length: accepted for T5X; the cache's length plays its role.
      prefill: T5X's prefill (decode False, after the creating call): the
        logits with the mask above while the keys/values of all L positions are
        cached at positions 0..L-1; `cache_index` becomes `prefill_lengths`.
        T5X passes the prompt with the mask `decoder_causal_attention` as
        `decoder_target_tokens`, and prompt lengths P as `prefill_lengths`:
        the cache is then valid at positions < P, and decoding feeds P next.
      prefill_lengths: int32 [B], required with `prefill`.

    Returns:
      float32 logits [B, L, vocab].
    """
    del decoder_positions, max_decode_length
    if decoder_input_tokens.ndim != 2:
      raise ValueError(
        f'decoder_input_tokens must be [batch, length], got shape {decoder_input_tokens.shape}.'
      )
    if prefill and decode:
      raise ValueError(
        'prefill and decode cannot both be True: fill the cache with one prefill=True '
        'call, then decode with decode=True calls (as T5X).'
      )
    if prefill and prefill_lengths is None:
      raise ValueError(
        'prefill=True needs prefill_lengths [batch], the index each row continues at.'
      )
    decoder_mask = None
    if not decode:
      decoder_mask = make_decoder_mask(
        decoder_target_tokens, decoder_causal_attention, decoder_segment_ids
      )
    return self.decoder(
      decoder_input_tokens,
      decoder_mask,
      deterministic=not enable_dropout,
      decode=decode,
      prefill_lengths=prefill_lengths if prefill else None,
    )

  def init_decoder_cache(self, batch: int, cache_length: int) -> None:
    """Builds the zero cache for `prefill` and `decode_block` (mutable=['cache']).

    Self-attention keys/values of `cache_length` positions per layer. Size it
    for the longest decode plus the largest block (positions start + k - 1
    must stay below it).

    Args:
      batch: static number of rows.
      cache_length: static number of positions.

    Returns:
      None; `apply` returns `(None, {'cache': cache})`.
    """
    settings_lib.check_positive_int('batch', batch)
    settings_lib.check_positive_int('cache_length', cache_length)
    self.decoder.init_block_cache(int(batch), int(cache_length))

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool = False,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """Writes the keys/values of a block at positions 0..W-1; computes no logits.

    Causal, or with `bidirectional` T5X's prefix LM: a query at position
    q <= prefix_lengths[b] also attends to every key at a position
    <= prefix_lengths[b]. For a prompt of length P (BOS at 0, prompt tokens at
    1..P) pass prefix_lengths = P and a block holding positions 0..P at least
    (W > P; causally W >= P suffices): the cache is then what T5X's prefill
    writes at positions < P, and the decode loop feeds position P next
    (`decode_block` at start P). Later block positions are written too; they
    are stale for decoding, masked until overwritten. Apply with
    mutable=['cache'].

    Args:
      block_tokens: int32 [B, W], the inputs at positions 0..W-1.
      prefix_lengths: int32 [B], P per row (only read if bidirectional).
      bidirectional: prefix-LM attention among positions 0..P.
      feature_layers: optional static decoder layer indices (`check_feature_layers`).

    Returns:
      None, or with `feature_layers` the block's features [B, W, len * emb]
      (`select_features`); `apply` also returns `{'cache': new_cache}`.
    """
    return self.decoder.prefill(block_tokens, prefix_lengths, bidirectional, feature_layers)

  def decode_block(
    self,
    block_tokens: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Array | Tuple[Array, Array]:
    """Scores a block of k tokens (or tree nodes) per row; see `Transformer.decode_block`.

    Args:
      block_tokens: int32 [B, k], the inputs at start_positions[b] + j (chain)
        or tree nodes first_node..first_node+k-1.
      start_positions: int32 [B].
      tree: None (a chain), or a static tree (`depths`, `ancestors`).
      first_node: static int, the tree node of block_tokens[:, 0].
      feature_layers: optional static decoder layer indices (see
        `Transformer.decode_block`).

    Returns:
      float32 logits [B, k, vocab], or with `feature_layers` (logits, features);
      `apply` also returns `{'cache': new_cache}`.
    """
    return self.decoder.decode_block(
      block_tokens, start_positions, tree, first_node, feature_layers
    )


# ------------------------------------------------------------------------------
# Pure-function entry points for decode loops; each takes either config.
# ------------------------------------------------------------------------------
def module_for(config: NetworkConfig) -> nn.Module:
  """`Transformer(config)` for a T5Config, `DecoderOnly(config)` for a DecoderOnlyConfig."""
  if isinstance(config, T5Config):
    return Transformer(config)
  if isinstance(config, DecoderOnlyConfig):
    return DecoderOnly(config)
  raise TypeError(
    f'Expected a network.T5Config or network.DecoderOnlyConfig, got {type(config).__name__}.'
  )


def compute_logits(
  config: NetworkConfig,
  params: Any,
  features: Mapping[str, Array],
  dropout_key: Optional[Array] = None,
  feature_layers: Optional[Tuple[int, ...]] = None,
) -> Array | Tuple[Array, Array]:
  """float32 [B, L, V]: T5X's forward pass of either architecture on model features.

  The one place where the architecture picks the module's arguments (T5X's
  `_compute_logits`): training's loss, held-out and benchmark alpha all call
  it. `features` holds a feature converter's arrays: an encoder-decoder's
  int32 [B, Lin] 'encoder_input_tokens' (optionally 'encoder_segment_ids')
  and [B, L] 'decoder_input_tokens', 'decoder_target_tokens' (optionally
  'decoder_segment_ids'); a decoder-only network's [B, L] 'decoder_*'
  arrays, optionally 'decoder_segment_ids', 'decoder_positions' and
  'decoder_causal_attention' (present: a prefix LM whose marked positions
  attend to each other; absent: causal). Other keys are ignored
  ('decoder_loss_weights', a decoder-only network's 'encoder_input_tokens').
  Dropout is on when `dropout_key` is not None.

  With `feature_layers` (static decoder layer indices), (logits, the
  target's features [B, L, len * emb] at every position): the listed decoder
  layers' outputs, captured from this forward pass (flax
  `capture_intermediates`), concatenated (`select_features`).
  """
  options = dict(
    enable_dropout=dropout_key is not None,
    rngs=None if dropout_key is None else {'dropout': dropout_key},
  )
  if feature_layers is not None:
    feature_layers = check_feature_layers(config, feature_layers)
    options.update(
      capture_intermediates=lambda module, method: (
        isinstance(module, DecoderLayer) and method == '__call__'
      ),
      mutable=['intermediates'],
    )
    logits, state = _forward(config, params, features, options)
    layers = state['intermediates']['decoder']
    outputs = [layers[f'layers_{i}']['__call__'][0] for i in range(_num_decoder_layers(config))]
    return logits, select_features(outputs, feature_layers)
  return _forward(config, params, features, options)


def _forward(config: NetworkConfig, params: Any, features: Mapping[str, Array], options) -> Any:
  """`module.apply` of the teacher-forced forward pass with `options` (see `compute_logits`)."""
  module = module_for(config)
  if is_decoder_only(config):
    return module.apply(
      {'params': params},
      features['decoder_input_tokens'],
      features['decoder_target_tokens'],
      features.get('decoder_segment_ids'),
      features.get('decoder_positions'),
      features.get('decoder_causal_attention'),
      **options,
    )
  if 'decoder_causal_attention' in features:
    raise ValueError(
      "decoder_causal_attention is for decoder-only prefix LMs; an encoder-decoder's decoder "
      'attends causally. Leave it out of the features.'
    )
  return module.apply(
    {'params': params},
    features['encoder_input_tokens'],
    features['decoder_input_tokens'],
    features['decoder_target_tokens'],
    features.get('encoder_segment_ids'),
    features.get('decoder_segment_ids'),
    **options,
  )


def init_decoder_cache(
  config: NetworkConfig,
  params: Any,
  input_tokens: Array,
  cache_length: int,
  encoded: Optional[Array] = None,
) -> Any:
  """The cache for `apply_decode_block` and `prefill_decoder_cache` (no dropout).

  For a T5Config, encodes `input_tokens` (unless `encoded` is given) and
  caches the cross-attention keys/values. For a DecoderOnlyConfig the tokens
  only give the batch size: the self-attention caches start at zero and the
  prompt is written by `prefill_decoder_cache`.

  Args:
    config: the network's config.
    params: its parameter tree, or `kernels.PackedParams` (the CPU kernel).
    input_tokens: int32 [B, input_length]; 0 is padding.
    cache_length: static; the longest decode plus the largest block.
    encoded: optional [B, input_length, emb], `encode`'s output of
      `input_tokens`, when the caller needs it too (a feature head's).

  Returns:
    The cache collection (see the module docstring for its layout).
  """
  module = module_for(config)
  if is_decoder_only(config):
    _, variables = module.apply(
      kernels.variables(params),
      input_tokens.shape[0],
      cache_length,
      method=DecoderOnly.init_decoder_cache,
      mutable=['cache'],
    )
    return variables['cache']
  if encoded is None:
    encoded = module.apply(
      kernels.variables(params), input_tokens, enable_dropout=False, method=Transformer.encode
    )
  _, variables = module.apply(
    kernels.variables(params),
    encoded,
    input_tokens,
    cache_length,
    method=Transformer.init_decoder_cache,
    mutable=['cache'],
  )
  return variables['cache']


def encode(config: T5Config, params: Any, input_tokens: Array) -> Array:
  """[B, input_length, emb]: an encoder-decoder's encoder output (no dropout).

  `params` may be `kernels.PackedParams`, as `init_decoder_cache` takes them.
  """
  return Transformer(config).apply(
    kernels.variables(params), input_tokens, enable_dropout=False, method=Transformer.encode
  )


def embed_tokens(config: NetworkConfig, params: Any, tokens: Array) -> Array:
  """[..., emb] in the compute dtype: the decoder's token embedding of int `tokens` [...]."""
  return module_for(config).apply(
    {'params': params}, tokens, method=lambda m, x: m.decoder.embed(x)
  )


def logits_from_features(config: NetworkConfig, params: Any, features: Array) -> Array:
  """float32 [..., vocab]: the decoder's final norm and logits layer on last-layer outputs.

  What `decode_block` computes from its last layer's output, so a feature
  [..., emb] of the last layer (`feature_layers` ending at it) gives the
  target's own logits.
  """
  return module_for(config).apply(
    {'params': params}, features, method=lambda m, y: m.decoder.feature_logits(y)
  )


def apply_decode_block(
  config: NetworkConfig,
  params: Any,
  cache: Any,
  block_tokens: Array,
  start_positions: Array,
  *,
  tree: Any = None,
  first_node: int = 0,
  feature_layers: Optional[Tuple[int, ...]] = None,
) -> Tuple[Any, Any]:
  """`decode_block` as a function: (logits [B, k, vocab], new cache).

  With `feature_layers`, ((logits, features [B, k, len * emb]), new cache)
  from the same call (see `Transformer.decode_block`).

  Under jit, `tree` and `first_node` are static (a `tree.Tree` is hashable).

  Args:
    config: the network's config.
    params: its parameter tree, or `kernels.PackedParams` (the CPU kernel).
    cache: from `init_decoder_cache`.
    block_tokens: int32 [B, k]; with a tree, nodes first_node..first_node+k-1.
    start_positions: int32 [B]; start + k (with a tree, + N) <= cache_length.
    tree: None (a chain block), or a static tree with numpy `depths` int [N]
      and `ancestors` bool [N, N] (see `Transformer.decode_block`).
    first_node: static int, the tree node of block_tokens[:, 0].
    feature_layers: optional static decoder layer indices (`check_feature_layers`).
  """
  if feature_layers is not None:
    feature_layers = check_feature_layers(config, feature_layers)
  outputs, variables = module_for(config).apply(
    kernels.variables(params, cache=cache),
    block_tokens,
    start_positions,
    tree=tree,
    first_node=first_node,
    feature_layers=feature_layers,
    method='decode_block',
    mutable=['cache'],
  )
  return outputs, variables['cache']


def compact_tree_path(
  config: NetworkConfig, cache: Any, start_positions: Array, path: Array
) -> Any:
  """Moves an accepted root-to-node path of a tree block to consecutive slots.

  For every decoder layer's self-attention cached key and value
  [B, cache_length, heads, head_dim], row b's entries at slots
  start_b + path[b, i] move to slots start_b + i, i < P; the cross-attention
  caches and the encoder mask are untouched. After a tree `decode_block` at
  these starts, the cache then holds at start_b..start_b+m what a chain block
  of the root and the path's m accepted nodes would have written, and decoding
  continues at start_b + m + 1. One gather and one slice write of P entries
  per row and layer.

  Args:
    config: the network's config.
    cache: from `init_decoder_cache`, after the tree call.
    start_positions: int32 [B], the root slots of the tree call.
    path: int32 [B, P], tree nodes: path[b, 0] = 0 (the root, which stays),
      then the accepted nodes by depth. Entries past a row's accepted length
      may be any node in [0, N) (their slots are rewritten before being read);
      slots past the cache are clamped.

  Returns:
    The new cache (same tree and shapes).
  """
  start_positions = jnp.asarray(start_positions, jnp.int32)
  path = jnp.asarray(path, jnp.int32)

  def is_self_attention(keypath):
    names = tuple(getattr(k, 'key', None) for k in keypath)
    return names[-2:] in (('self_attention', 'cached_key'), ('self_attention', 'cached_value'))

  leaves = [
    x for keypath, x in jax.tree_util.tree_leaves_with_path(cache) if is_self_attention(keypath)
  ]
  num_layers = _num_decoder_layers(config)
  if len(leaves) != 2 * num_layers or any(x.ndim != 4 for x in leaves):
    raise ValueError(
      'compact_tree_path needs the cache of init_decoder_cache for this config '
      f'(decoder/layers_0..{num_layers - 1}/self_attention/cached_{{key,value}}).'
    )
  batch, cache_length = leaves[0].shape[:2]
  if (
    path.ndim != 2
    or start_positions.shape != (batch,)
    or path.shape[0] != batch
    or not 1 <= path.shape[1] <= cache_length
  ):
    raise ValueError(
      f'Expected start_positions [batch] and path [batch, P], 1 <= P <= {cache_length}, with '
      f"the cache's batch {batch}; got {start_positions.shape} and {path.shape}."
    )
  slots = start_positions[:, None] + path  # [B, P]
  take = jax.vmap(functools.partial(jnp.take, axis=0, mode='clip'))

  def move(keypath, entries):
    if is_self_attention(keypath):
      return _write_block(entries, take(entries, slots), start_positions)
    return entries

  return jax.tree_util.tree_map_with_path(move, cache)


def prefill_decoder_cache(
  config: NetworkConfig,
  params: Any,
  cache: Any,
  block_tokens: Array,
  prefix_lengths: Array,
  *,
  bidirectional: bool = False,
  feature_layers: Optional[Tuple[int, ...]] = None,
) -> Any:
  """`prefill` as a function: the cache with positions 0..W-1 written.

  See `DecoderOnly.prefill` (bidirectional is T5X's prefix LM; an
  encoder-decoder takes only bidirectional=False).

  Args:
    config: the network's config.
    params: its parameter tree, or `kernels.PackedParams` (the CPU kernel).
    cache: from `init_decoder_cache`.
    block_tokens: int32 [B, W]: BOS (0), then the prompt, at positions 0..W-1.
    prefix_lengths: int32 [B], the prompt lengths P (the loop feeds P next).
    bidirectional: prefix-LM attention among positions 0..P.
    feature_layers: optional static decoder layer indices (`check_feature_layers`).

  Returns:
    The new cache, or with `feature_layers` (the new cache, the block's
    features [B, W, len * emb], what the prefill computed at each position).
  """
  if feature_layers is not None:
    feature_layers = check_feature_layers(config, feature_layers)
  features, variables = module_for(config).apply(
    kernels.variables(params, cache=cache),
    block_tokens,
    prefix_lengths,
    bidirectional,
    feature_layers,
    method='prefill',
    mutable=['cache'],
  )
  return variables['cache'] if feature_layers is None else (variables['cache'], features)


# ------------------------------------------------------------------------------
# Parameter shapes and host-side random parameters.
# ------------------------------------------------------------------------------
def abstract_params(config: NetworkConfig) -> Tuple[dict, dict]:
  """Shapes of `module_for(config)`'s parameters, computing nothing.

  Returns:
    (params, params_axes): `jax.ShapeDtypeStruct`s (float32) in the tree of
    `module_for(config).init(...)['params']`, and the logical axes
    `['params_axes']`.
  """
  module = module_for(config)
  tokens = jnp.ones((1, 1), jnp.int32)
  # The encoder-decoder takes encoder inputs, decoder inputs and targets.
  args = (tokens,) * (2 if is_decoder_only(config) else 3)
  variables = jax.eval_shape(
    lambda: module.init(jax.random.PRNGKey(0), *args, enable_dropout=False)
  )
  return variables['params'], variables['params_axes']


def parameter_count(params: Any) -> int:
  """The number of parameters in a tree of arrays or `jax.ShapeDtypeStruct`s.

  E.g. `parameter_count(abstract_params(config)[0])`, computing nothing.
  """
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params))


def decoder_weight_bytes(config: NetworkConfig, bytes_per_parameter: int = 4) -> int:
  """Bytes of parameters one cached decoder step reads (float32 storage by default).

  Every decoder layer's attention (and, encoder-decoder, cross-attention) and
  MLP kernels, the layer norms and position table, and the logits kernel (or,
  with `logits_via_embedding`, the whole token embedding). Computed from the
  config alone, so it can be known before JAX starts (`xla_flags`).
  """
  cross_attention = not is_decoder_only(config)
  attention = 4 * config.emb_dim * config.num_heads * config.head_dim
  mlp = (len(config.mlp_activations) + 1) * config.emb_dim * config.mlp_dim
  layer = (1 + cross_attention) * attention + mlp + (2 + cross_attention) * config.emb_dim
  logits = config.vocab_size * config.emb_dim
  parameters = (
    _num_decoder_layers(config) * layer + config.emb_dim + logits + config.num_heads * NUM_BUCKETS
  )
  return parameters * bytes_per_parameter


def random_params(config: NetworkConfig, seed: int = 0) -> Tuple[dict, dict]:
  """Random parameters drawn on the host, with no XLA compilation.

  Same tree, shapes and per-parameter scales as `module_for(config).init`
  (embedding N(0, 1); kernels std 1/sqrt(fan_in), queries further /
  sqrt(head_dim); relative position tables uniform with variance
  2/(heads + buckets); layer norm scales 1), but not its random stream or its
  truncation. `init` compiles one random-number program per parameter, which
  takes seconds on a CPU even for tiny models; this is for tests and timing.

  Args:
    config: the network's config.
    seed: numpy seed.

  Returns:
    (params, params_axes): float32 numpy arrays and their logical axes, as
    `module_for(config).init(...)['params']` and `['params_axes']`.
  """
  shapes, params_axes = abstract_params(config)
  return t5x_like_random_params(shapes, config.head_dim, seed), params_axes


def t5x_like_random_params(shapes: Any, head_dim: int, seed: int) -> Any:
  """float32 numpy arrays of `shapes` (a tree of shaped leaves) at T5X's initializer scales.

  Embeddings std 1; kernels std 1/sqrt(fan_in), queries further / sqrt(head_dim);
  relative position tables uniform with variance 2/(heads + buckets); layer
  norm scales 1. Shared by `random_params` and the feature head's.
  """
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    shape = leaf.shape
    if name == 'embedding':
      value = rng.standard_normal(shape)
    elif name == 'rel_embedding':
      limit = np.sqrt(6.0 / sum(shape))
      value = rng.uniform(-limit, limit, shape)
    elif name == 'scale':
      value = np.ones(shape)
    else:
      value = rng.standard_normal(shape) / np.sqrt(shape[0])
      if path[-2].key == 'query':
        value /= np.sqrt(head_dim)
    return value.astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)
