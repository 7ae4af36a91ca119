"""T5X's layers: bias-free dense, RMS norm, embedding, relative position biases, MLP.

Parameters are stored in float32 with T5X's names, shapes, initializers and
logical axes (`param_with_axes`); computation is in the config's dtype.
Dense layers and the embedding's transpose run on the CPU kernel where the
'packed' collection holds their kernel (`kernels.pack_params`).
"""

import functools
from typing import Any, Callable, Tuple

from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import kernels
from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import activation

Array = jax.Array
param_with_axes = nn_partitioning.param_with_axes

# T5's relative attention: 32 buckets, distances >= 128 share the last bucket.
NUM_BUCKETS = 32
MAX_DISTANCE = 128


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
      h = activation(name)(h)
      hidden = h if hidden is None else hidden * h
    hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic)
    return DenseGeneral(
      inputs.shape[-1],
      dtype=cfg.dtype,
      kernel_init=kernel_init,
      kernel_axes=('mlp', 'embed'),
      name='wo',
    )(hidden)
