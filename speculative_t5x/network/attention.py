"""Multi-head dot-product attention with T5X's parameters and block-written key/value caches."""

import functools
from typing import Any, Optional, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp

from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.layers import DenseGeneral

Array = jax.Array


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
  heads_first: bool = False,
) -> Array:
  """Unscaled dot-product attention (T5 folds 1/sqrt(head_dim) into the query init).

  Args:
    query: [B, q, heads, head_dim].
    key: [B, k, heads, head_dim]; with `heads_first`, [B, heads, head_dim, k].
    value: as `key`.
    bias: additive bias broadcastable to [B, heads, q, k] (masks, positions).
    dtype: dtype of the attention weights.
    float32_logits: compute logits and softmax in float32.
    dropout_rate: attention dropout, broadcast over queries as in T5X.
    dropout_rng: PRNG key for dropout; None disables dropout.
    heads_first: key and value in the caches' layout (`cache_layout`).

  Returns:
    [B, q, heads, head_dim].
  """
  if float32_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  logits = jnp.einsum('bqhd,bhdk->bhqk' if heads_first else 'bqhd,bkhd->bhqk', query, key)
  weights = jax.nn.softmax(logits + bias.astype(logits.dtype)).astype(dtype)
  if dropout_rng is not None and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    shape = weights.shape[:-2] + (1,) + weights.shape[-1:]
    keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
    weights = weights * (keep.astype(dtype) / jnp.asarray(keep_prob, dtype))
  return jnp.einsum('bhqk,bhdk->bqhd' if heads_first else 'bhqk,bkhd->bqhd', weights, value)


def cache_layout(entries: Array) -> Array:
  """[B, n, heads, head_dim] keys or values -> the caches' layout [B, heads, head_dim, n]."""
  return jnp.transpose(entries, (0, 2, 3, 1))


def write_block(cache: Array, block: Array, start_positions: Array) -> Array:
  """Overwrites positions s_b .. s_b + k - 1 of row b (the last axis) with block[b].

  A select over the whole cache rather than a per-row dynamic update: with
  the positions last, XLA:CPU copied every cache around a scatter
  (docs/results.md). Positions past the cache are dropped.

  Args:
    cache: [B, ..., L].
    block: [B, ..., k], k <= L, the cache's other dimensions.
    start_positions: int32 [B].

  Returns:
    The new cache, its shape and dtype.
  """
  length, k = cache.shape[-1], block.shape[-1]
  offset = jnp.arange(length)[None] - start_positions[:, None]  # [B, L]
  offset = offset.reshape(offset.shape[:1] + (1,) * (cache.ndim - 2) + offset.shape[1:])
  entries = jnp.take_along_axis(block, jnp.clip(offset, 0, k - 1), axis=-1)
  return jnp.where((offset >= 0) & (offset < k), entries.astype(cache.dtype), cache)


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
    """Creates zero key/value caches [batch, heads, head_dim, length] (`cache_layout`).

    T5X's layout: each head's keys and values are the right operands of
    attention's two products as XLA:CPU reads them in place. In the
    projections' [batch, length, heads, head_dim] XLA copied every cache into
    it on every call, a tenth of a one-token call (docs/results.md).
    """
    shape = (batch, self.config.num_heads, self.config.head_dim, length)
    self.put_variable('cache', 'cached_key', jnp.zeros(shape, self.config.dtype))
    self.put_variable('cache', 'cached_value', jnp.zeros(shape, self.config.dtype))

  def cache_shape(self) -> Tuple[int, int]:
    """(batch, cache_length) of the self-attention cache."""
    shape = self.get_variable('cache', 'cached_key').shape
    return shape[0], shape[-1]

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
    return self._attend(self.query(inputs), cached_key, cached_value, bias, True, heads_first=True)

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
    """Writes key/value [B, k, heads, head_dim] at positions start..start+k-1 of each row."""
    cached = []
    for name, new in (('cached_key', key), ('cached_value', value)):
      cached.append(
        write_block(self.get_variable('cache', name), cache_layout(new), start_positions)
      )
      self.put_variable('cache', name, cached[-1])
    return cached[0], cached[1]

  def init_cross_cache(self, encoded: Array):
    """Caches keys and values [B, heads, head_dim, Lin] of encoded [B, Lin, emb] (`cache_layout`).

    Projected once per decode call. In the projections' layout XLA copied
    both caches on every decoder call, a third of a one-token call at 512
    inputs (docs/results.md).
    """
    self.put_variable('cache', 'cached_key', cache_layout(self.key(encoded)))
    self.put_variable('cache', 'cached_value', cache_layout(self.value(encoded)))

  def attend_cached(self, inputs_q: Array, bias: Array) -> Array:
    """Attention to the cached keys/values (`init_cross_cache`): [B, q, emb] -> [B, q, emb]."""
    return self._attend(
      self.query(inputs_q),
      self.get_variable('cache', 'cached_key'),
      self.get_variable('cache', 'cached_value'),
      bias,
      True,
      heads_first=True,
    )

  def _attend(self, query, key, value, bias, deterministic, heads_first=False):
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
      heads_first=heads_first,
    )
    return self.out(x)
