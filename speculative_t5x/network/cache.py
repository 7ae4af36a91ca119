"""The block cache as pure functions of either config: build, prefill, decode, compact.

  cache = init_decoder_cache(config, params, input_tokens, cache_length)
  # Optional: write positions 0..W-1 (a decoder-only model's prompt).
  cache = prefill_decoder_cache(config, params, cache, block_tokens, prefix_lengths,
                                bidirectional=...)
  logits, cache = apply_decode_block(config, params, cache, block_tokens,
                                     start_positions, tree=None, first_node=0)
  cache = compact_tree_path(config, cache, start_positions, path)  # After a tree block.

Cache layout (every leaf but a scalar `cache_index` has the batch first):
  decoder/layers_{i}/self_attention/cached_{key,value}:
      [batch, heads, head_dim, cache_length], compute dtype. Position t of a
      row holds the key/value of the decoder input at t.
  decoder/layers_{i}/encoder_decoder_attention/cached_{key,value}:
      [batch, heads, head_dim, input_length], projected once from the encoder
      output (encoder-decoder block cache only).
  decoder/encoder_mask: bool [batch, input_length], True at non-padding inputs
      (encoder-decoder block cache only).
  decoder/cache_index: int32, the next position (T5X protocol only): a scalar,
      or [batch] after a decoder-only `prefill=True` call (per row, as T5X's).
Keys and values have the layout of T5X's own cache
(`MultiHeadDotProductAttention.init_self_cache` says why); T5X keeps one
`cache_index` per layer. T5X's decode functions touch the cache by leaf name
and leading batch axis (expanding a [batch] `cache_index` too), which this
layout keeps. Logical axes for sharding: `KV_CACHE_AXES` and
`ENCODER_MASK_AXES`.
"""

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from speculative_t5x import kernels
from speculative_t5x.network.attention import write_block
from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import is_decoder_only
from speculative_t5x.network.config import num_decoder_layers
from speculative_t5x.network.features import check_feature_layers
from speculative_t5x.network.transformer import DecoderOnly
from speculative_t5x.network.transformer import Transformer
from speculative_t5x.network.transformer import module_for

Array = jax.Array

# Logical axes of the decoder cache leaves (see the module docstring): every
# key and value cache, self- and cross-attention.
KV_CACHE_AXES = ('batch', 'heads', 'kv', 'length')
ENCODER_MASK_AXES = ('batch', 'length')


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
  masked: Optional[Array] = None,
  mask_embedding: Optional[Array] = None,
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
    masked: optional bool [B, k], a parallel draft's mask tokens: these
      positions' input is `mask_embedding` [emb] (needed with it), not their
      token's embedding.
    mask_embedding: optional [emb], see `masked`.
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
    masked=masked,
    mask_embedding=mask_embedding,
    method='decode_block',
    mutable=['cache'],
  )
  return outputs, variables['cache']


def compact_tree_path(
  config: NetworkConfig, cache: Any, start_positions: Array, path: Array
) -> Any:
  """Moves an accepted root-to-node path of a tree block to consecutive slots.

  For every decoder layer's self-attention cached key and value
  [B, heads, head_dim, cache_length], row b's entries at slots
  start_b + path[b, i] move to slots start_b + i, i < P; the cross-attention
  caches and the encoder mask are untouched. After a tree `decode_block` at
  these starts, the cache then holds at start_b..start_b+m what a chain block
  of the root and the path's m accepted nodes would have written, and decoding
  continues at start_b + m + 1. One gather and one slice write of P entries
  per row and layer (the write, as a block's, a select over the cache).

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
  num_layers = num_decoder_layers(config)
  if len(leaves) != 2 * num_layers or any(x.ndim != 4 for x in leaves):
    raise ValueError(
      'compact_tree_path needs the cache of init_decoder_cache for this config '
      f'(decoder/layers_0..{num_layers - 1}/self_attention/cached_{{key,value}}).'
    )
  batch, cache_length = leaves[0].shape[0], leaves[0].shape[-1]
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
  slots = jnp.clip(start_positions[:, None] + path, 0, cache_length - 1)  # [B, P]

  def move(keypath, entries):
    if not is_self_attention(keypath):
      return entries
    moved = jnp.take_along_axis(entries, slots[:, None, None, :], axis=-1)
    return write_block(entries, moved, start_positions)

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
