"""The T5 1.1 encoder-decoder (flax.linen) with block-cached decoding.

The network is T5X's minimal T5 (`t5x/examples/t5/network.py`) rebuilt so that
its parameter tree, shapes, initializers, logical axis annotations
(`params_axes`), config field names and method signatures are T5X's: a T5X
checkpoint loads without conversion and T5X's `EncoderDecoderModel` can train,
score and decode with it (`decode=True` follows T5X's cache protocol).

What is new is block-cached decoding for speculative decoding:

  _, variables = module.apply({'params': params}, encoded, encoder_input_tokens,
                              cache_length, method=Transformer.init_decoder_cache,
                              mutable=['cache'])
  logits, variables = module.apply({'params': params, **variables}, block_tokens,
                                   start_positions, method=Transformer.decode_block,
                                   mutable=['cache'])

`decode_block` scores k >= 1 tokens per row at per-row positions, writes their
keys and values there (overwriting), and attends to the cached positions before
each row's start. A row is rolled back by passing a smaller start position next
time: entries at positions >= the start are masked until overwritten.

Cache layout (every leaf but the scalar `cache_index` has the batch first):
  decoder/layers_{i}/self_attention/cached_{key,value}:
      [batch, cache_length, heads, head_dim], compute dtype. Position t of a row
      holds the key/value of the decoder input at t; a block write is one
      contiguous slice per row.
  decoder/layers_{i}/encoder_decoder_attention/cached_{key,value}:
      [batch, input_length, heads, head_dim], projected once from the encoder
      output (block cache only).
  decoder/encoder_mask: bool [batch, input_length], True at non-padding inputs
      (block cache only).
  decoder/cache_index: int32 scalar, the next position (T5X protocol only).
T5X's own cache is [batch, heads, head_dim, length] with one `cache_index` per
layer; only T5X's decode functions touch it, and they do so by leaf name and
leading batch axis, which this layout keeps. Logical axes for sharding:
`KV_CACHE_AXES` and `ENCODER_MASK_AXES`.

`init_decoder_cache(config, params, encoder_input_tokens, cache_length)` and
`apply_decode_block(config, params, cache, block_tokens, start_positions)` wrap
the two methods as pure functions for decode loops.
"""

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence, Tuple

from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

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


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters, with T5X's `T5Config` field names.

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
    # gin binds sequences as lists; a tuple keeps the config hashable.
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    for name in (
      'vocab_size',
      'emb_dim',
      'num_heads',
      'num_encoder_layers',
      'num_decoder_layers',
      'head_dim',
      'mlp_dim',
    ):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'T5Config.{name} must be a positive integer, got {value!r}.')
    if not self.mlp_activations:
      raise ValueError('T5Config.mlp_activations is empty; T5 1.1 uses ("gelu", "linear").')
    for name in self.mlp_activations:
      _activation(name)  # Raises for unknown names.
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate}.')
    jnp.dtype(self.dtype)  # Raises for unknown dtypes.


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
  reshaped for the contraction; inputs and kernel are cast to `dtype`.
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

  config: T5Config

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

  def cache_length(self) -> int:
    return self.get_variable('cache', 'cached_key').shape[1]

  def attend_block(self, inputs: Array, bias: Array, start_positions: Array) -> Array:
    """Cached self-attention for a block of k positions per row.

    Writes the block's keys/values at positions start..start+k-1 of each row,
    then attends over the whole cache; `bias` must mask what a query may not see.

    Args:
      inputs: [B, k, emb].
      bias: [B, heads, k, cache_length] (causal mask plus relative positions).
      start_positions: int32 [B].

    Returns:
      [B, k, emb].
    """
    cached_key = _write_block(
      self.get_variable('cache', 'cached_key'), self.key(inputs), start_positions
    )
    cached_value = _write_block(
      self.get_variable('cache', 'cached_value'), self.value(inputs), start_positions
    )
    self.put_variable('cache', 'cached_key', cached_key)
    self.put_variable('cache', 'cached_value', cached_value)
    return self._attend(self.query(inputs), cached_key, cached_value, bias, True)

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

  config: T5Config

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
  """Pre-norm causal self-attention, cross-attention and MLP blocks."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = LayerNorm(cfg.dtype)
    self.self_attention = MultiHeadDotProductAttention(cfg)
    self.pre_cross_attention_layer_norm = LayerNorm(cfg.dtype)
    self.encoder_decoder_attention = MultiHeadDotProductAttention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(
    self, inputs: Array, encoded: Array, self_bias: Array, cross_bias: Array, deterministic: bool
  ) -> Array:
    """Uncached: [B, L, emb] -> [B, L, emb]; biases [B|1, heads|1, L, L|input_length]."""
    x = self.pre_self_attention_layer_norm(inputs)
    x = self.self_attention(x, x, self_bias, deterministic=deterministic)
    x = inputs + self.dropout(x, deterministic)
    return self._cross_attention_and_mlp(x, encoded, cross_bias, deterministic)

  def init_cache(self, batch: int, cache_length: int, encoded: Optional[Array]):
    """Zero self-attention caches; cross-attention keys/values unless `encoded` is None."""
    self.self_attention.init_self_cache(batch, cache_length)
    if encoded is not None:
      self.encoder_decoder_attention.init_cross_cache(encoded)

  def cache_length(self) -> int:
    return self.self_attention.cache_length()

  def decode_block(
    self,
    inputs: Array,
    encoded: Optional[Array],
    self_bias: Array,
    cross_bias: Array,
    start_positions: Array,
  ) -> Array:
    """Cached, deterministic: [B, k, emb] -> [B, k, emb].

    `encoded` [B, input_length, emb] is re-projected for cross-attention (T5X's
    protocol); None uses the cross-attention keys/values cached by `init_cache`.
    """
    x = self.pre_self_attention_layer_norm(inputs)
    x = inputs + self.self_attention.attend_block(x, self_bias, start_positions)
    return self._cross_attention_and_mlp(x, encoded, cross_bias, True)

  def _cross_attention_and_mlp(self, x, encoded, cross_bias, deterministic):
    y = self.pre_cross_attention_layer_norm(x)
    if encoded is None:
      y = self.encoder_decoder_attention.attend_cached(y, cross_bias)
    else:
      y = self.encoder_decoder_attention(y, encoded, cross_bias, deterministic=deterministic)
    y = x + self.dropout(y, deterministic)
    z = self.mlp(self.pre_mlp_layer_norm(y), deterministic)
    return y + self.dropout(z, deterministic)


class Decoder(nn.Module):
  """Token embedding, decoder layers with causal relative biases, norm, logits."""

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab')
      )

  def __call__(
    self,
    encoded: Array,
    decoder_input_tokens: Array,
    decoder_mask: Optional[Array],
    encoder_decoder_mask: Array,
    deterministic: bool,
    decode: bool,
  ) -> Array:
    """Teacher-forced logits, or one T5X-protocol cached step if `decode`.

    Args:
      encoded: [B, input_length, emb].
      decoder_input_tokens: int32 [B, L] (L == 1 for a cached step).
      decoder_mask: bool [B, 1, L, L] padding/packing mask or None (causality
        is always applied).
      encoder_decoder_mask: bool [B, 1, L, input_length].
      deterministic: disables dropout.
      decode: T5X's cache protocol: the first call (no cache yet) creates zero
        caches of length L and a `cache_index`; later calls feed one token at
        `cache_index` and increment it.

    Returns:
      float32 logits [B, L, vocab].
    """
    batch, length = decoder_input_tokens.shape
    cross_bias = _mask_to_bias(encoder_decoder_mask).astype(self.config.dtype)
    y = self.dropout(self.shared_embedding(decoder_input_tokens), deterministic)
    if decode and self.has_variable('cache', 'cache_index'):
      if length != 1:
        raise ValueError(
          'A decode=True step feeds one token per row: decoder_input_tokens '
          f'must be [batch, 1], got {decoder_input_tokens.shape}.'
        )
      index = self.get_variable('cache', 'cache_index')
      start_positions = jnp.full((batch,), index, jnp.int32)
      y = self._decode_block(y, encoded, cross_bias, start_positions)
      self.put_variable('cache', 'cache_index', index + 1)
      return self._logits(y, deterministic=True)
    if decode:
      for layer in self.layers:
        layer.init_cache(batch, length, encoded=None)
      self.put_variable('cache', 'cache_index', jnp.array(0, jnp.int32))
    positions = jnp.arange(length)[None]
    self_bias = self._causal_bias(positions, positions, decoder_mask)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    return self._logits(y, deterministic)

  def init_block_cache(self, encoded: Array, encoder_mask: Array, cache_length: int):
    """See `Transformer.init_decoder_cache`."""
    for layer in self.layers:
      layer.init_cache(encoded.shape[0], cache_length, encoded)
    self.put_variable('cache', 'encoder_mask', encoder_mask)

  def decode_block(self, block_tokens: Array, start_positions: Array) -> Array:
    """See `Transformer.decode_block`."""
    if not self.has_variable('cache', 'encoder_mask'):
      raise ValueError(
        'decode_block needs the cache made by Transformer.init_decoder_cache '
        "(apply it with mutable=['cache'] and pass {'cache': ...} here)."
      )
    encoder_mask = self.get_variable('cache', 'encoder_mask')
    if (
      block_tokens.ndim != 2
      or start_positions.shape != block_tokens.shape[:1]
      or block_tokens.shape[0] != encoder_mask.shape[0]
    ):
      raise ValueError(
        f"Expected block_tokens [batch, k] and start_positions [batch] with the cache's "
        f'batch {encoder_mask.shape[0]}; got {block_tokens.shape} and {start_positions.shape}.'
      )
    if block_tokens.shape[1] > self.layers[0].cache_length():
      raise ValueError(
        f'A block of {block_tokens.shape[1]} tokens does not fit a cache of '
        f'length {self.layers[0].cache_length()}.'
      )
    cross_bias = _mask_to_bias(encoder_mask[:, None, None, :]).astype(self.config.dtype)
    y = self.shared_embedding(block_tokens)
    y = self._decode_block(y, None, cross_bias, start_positions.astype(jnp.int32))
    return self._logits(y, deterministic=True)

  def _decode_block(self, y, encoded, cross_bias, start_positions):
    query_positions = start_positions[:, None] + jnp.arange(y.shape[1])
    key_positions = jnp.arange(self.layers[0].cache_length())[None]
    self_bias = self._causal_bias(query_positions, key_positions)
    for layer in self.layers:
      y = layer.decode_block(y, encoded, self_bias, cross_bias, start_positions)
    return y

  def _causal_bias(self, query_positions, key_positions, mask=None):
    """[B|1, heads, q, k]: relative biases where key <= query (and `mask`), else NEG_INF."""
    allowed = key_positions[:, None, None, :] <= query_positions[:, None, :, None]
    if mask is not None:
      allowed = jnp.logical_and(allowed, mask)
    relative = self.relpos_bias(query_positions, key_positions, bidirectional=False)
    return _mask_to_bias(allowed, relative)

  def _logits(self, y, deterministic):
    y = self.dropout(self.decoder_norm(y), deterministic)
    if self.config.logits_via_embedding:
      # The tied embedding needs 1/sqrt(emb) to keep logits at unit scale.
      return self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)


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


# ------------------------------------------------------------------------------
# The model.
# ------------------------------------------------------------------------------
class Transformer(nn.Module):
  """The T5 1.1 encoder-decoder with T5X's interface plus block-cached decoding."""

  config: T5Config

  def setup(self):
    cfg = self.config
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
      targets_valid = decoder_target_tokens > 0
      decoder_mask = make_attention_mask(targets_valid, targets_valid)
      encoder_decoder_mask = make_attention_mask(targets_valid, encoder_input_tokens > 0)
      if decoder_segment_ids is not None:
        decoder_mask &= make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal)
      if encoder_segment_ids is not None:
        encoder_decoder_mask &= make_attention_mask(
          decoder_segment_ids, encoder_segment_ids, jnp.equal
        )
    return self.decoder(
      encoded,
      decoder_input_tokens,
      decoder_mask,
      encoder_decoder_mask,
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
    if not isinstance(cache_length, (int, np.integer)) or cache_length < 1:
      raise ValueError(f'cache_length must be a positive int, got {cache_length!r}.')
    self.decoder.init_block_cache(encoded, encoder_input_tokens > 0, int(cache_length))

  def decode_block(self, block_tokens: Array, start_positions: Array) -> Array:
    """Scores a block of k tokens per row against the cache; updates the cache.

    Row b's tokens sit at positions start_positions[b] + j, j < k: each attends
    causally within the block and to the row's cached positions before
    start_positions[b]; cached entries at later positions (stale ones from a
    rolled-back block) are masked. Keys/values of the block overwrite the
    cache there. Deterministic. Apply with mutable=['cache'].

    The caller guarantees start_positions[b] + k <= cache_length (inside jit
    this cannot be checked; an out-of-range write would be clamped).

    Args:
      block_tokens: int32 [B, k], the decoder inputs at those positions.
      start_positions: int32 [B], position of each row's first block token.

    Returns:
      float32 logits [B, k, vocab]; `apply` also returns `{'cache': new_cache}`.
    """
    return self.decoder.decode_block(block_tokens, start_positions)


# ------------------------------------------------------------------------------
# Pure-function entry points for decode loops.
# ------------------------------------------------------------------------------
def init_decoder_cache(
  config: T5Config, params: Any, encoder_input_tokens: Array, cache_length: int
) -> Any:
  """Encodes the inputs and returns the `decode_block` cache (no dropout).

  Args:
    config: the network's config.
    params: its parameter tree.
    encoder_input_tokens: int32 [B, input_length]; 0 is padding.
    cache_length: static; the longest decode plus the largest block.

  Returns:
    The cache collection (see the module docstring for its layout).
  """
  module = Transformer(config)
  encoded = module.apply(
    {'params': params}, encoder_input_tokens, enable_dropout=False, method=Transformer.encode
  )
  _, variables = module.apply(
    {'params': params},
    encoded,
    encoder_input_tokens,
    cache_length,
    method=Transformer.init_decoder_cache,
    mutable=['cache'],
  )
  return variables['cache']


def apply_decode_block(
  config: T5Config, params: Any, cache: Any, block_tokens: Array, start_positions: Array
) -> Tuple[Array, Any]:
  """`Transformer.decode_block` as a function: (logits [B, k, vocab], new cache).

  Args:
    config: the network's config.
    params: its parameter tree.
    cache: from `init_decoder_cache`.
    block_tokens: int32 [B, k].
    start_positions: int32 [B]; start + k <= cache_length.
  """
  logits, variables = Transformer(config).apply(
    {'params': params, 'cache': cache},
    block_tokens,
    start_positions,
    method=Transformer.decode_block,
    mutable=['cache'],
  )
  return logits, variables['cache']


# ------------------------------------------------------------------------------
# Parameter shapes and host-side random parameters.
# ------------------------------------------------------------------------------
def abstract_params(config: T5Config) -> Tuple[dict, dict]:
  """Shapes of `Transformer(config)`'s parameters, computing nothing.

  Returns:
    (params, params_axes): `jax.ShapeDtypeStruct`s (float32) in the tree of
    `Transformer.init(...)['params']`, and the logical axes `['params_axes']`.
  """
  tokens = jnp.ones((1, 1), jnp.int32)
  variables = jax.eval_shape(
    lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, tokens, enable_dropout=False
    )
  )
  return variables['params'], variables['params_axes']


def decoder_weight_bytes(config: T5Config, bytes_per_parameter: int = 4) -> int:
  """Bytes of parameters one cached decoder step reads (float32 storage by default).

  Every decoder layer's attention, cross-attention and MLP kernels, the layer
  norms and position table, and the logits kernel (or, with
  `logits_via_embedding`, the whole token embedding). Computed from the
  config alone, so it can be known before JAX starts (`xla_flags`).
  """
  attention = 4 * config.emb_dim * config.num_heads * config.head_dim
  mlp = (len(config.mlp_activations) + 1) * config.emb_dim * config.mlp_dim
  layer = 2 * attention + mlp + 3 * config.emb_dim
  logits = config.vocab_size * config.emb_dim
  parameters = (
    config.num_decoder_layers * layer + config.emb_dim + logits + config.num_heads * NUM_BUCKETS
  )
  return parameters * bytes_per_parameter


def random_params(config: T5Config, seed: int = 0) -> Tuple[dict, dict]:
  """Random parameters drawn on the host, with no XLA compilation.

  Same tree, shapes and per-parameter scales as `Transformer.init` (embedding
  N(0, 1); kernels std 1/sqrt(fan_in), queries further / sqrt(head_dim);
  relative position tables uniform with variance 2/(heads + buckets); layer norm
  scales 1), but not its random stream or its truncation. `Transformer.init`
  compiles one random-number program per parameter, which takes seconds on a
  CPU even for tiny models; this is for tests and timing.

  Args:
    config: the network's config.
    seed: numpy seed.

  Returns:
    (params, params_axes): float32 numpy arrays and their logical axes, as
    `Transformer.init(...)['params']` and `['params_axes']`.
  """
  shapes, params_axes = abstract_params(config)
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
        value /= np.sqrt(config.head_dim)
    return value.astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes), params_axes
