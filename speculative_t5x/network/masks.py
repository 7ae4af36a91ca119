"""Attention masks and biases: padding, causal, prefix-LM, packing, and token trees.

Masks are bool [B|1, 1, q, k] (True: the query attends to the key);
`mask_to_bias` turns one into the additive bias attention takes.
`tree_attention_layout` gives the positions and visibility of a block of
tree nodes against a row's cache (tree speculative decoding).
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Additive attention bias of a masked position (T5X's value).
NEG_INF = -1e10


def mask_to_bias(mask: Array, bias: Array | float = 0.0) -> Array:
  """`bias` where the boolean `mask` allows attention, NEG_INF elsewhere."""
  return jnp.where(mask, bias, NEG_INF)


def make_attention_mask(
  query_input: Array,
  key_input: Array,
  pairwise_fn: Callable[[Array, Array], Array] = jnp.logical_and,
) -> Array:
  """bool [B, 1, q, k] = pairwise_fn(query_input[b, i], key_input[b, j])."""
  return pairwise_fn(query_input[:, None, :, None], key_input[:, None, None, :]).astype(bool)


def causal_mask(query_positions: Array, key_positions: Array) -> Array:
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
  mask = causal_mask(positions, positions)
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
