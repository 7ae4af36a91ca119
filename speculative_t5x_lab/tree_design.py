"""Tree design from measured acceptance: which static token tree to decode with.

The library judges a given tree exactly (`speculative_t5x.tree`); choosing one
is an experiment: the tree benchmark measures acceptance by depth and sibling
rank (`rank_counts`, `acceptance_rates_from_counts`), and `choose_tree` picks
the tree of a node budget that accepts the most tokens in expectation at those
rates (`expected_accepted`), a dynamic program over depth, rank and node
budget (after Sequoia, arXiv 2402.12374).
"""

from typing import Any, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x.tree import Tree
from speculative_t5x.tree import TreeJudgement


def rank_counts(judgement: TreeJudgement, max_children: int) -> Tuple[jax.Array, jax.Array]:
  """Measured acceptance by depth and rank, summed over a batch.

  Args:
    judgement: a `TreeJudgement` of B rows.
    max_children: static K, the tree's most children per node.

  Returns:
    reached: int32 [D, K], how often the rank-r child of a node at depth d
      was judged (ranks < r rejected).
    accepted: int32 [D, K], how often it was accepted. Feed both to
      `acceptance_rates_from_counts`.
  """
  ranks = jnp.arange(max_children)
  reached = judgement.children_judged[..., None] > ranks
  accepted = judgement.accepted_rank[..., None] == ranks
  return (
    jnp.sum(reached, axis=0).astype(jnp.int32),
    jnp.sum(accepted, axis=0).astype(jnp.int32),
  )


def acceptance_rates_from_counts(reached, accepted) -> Tuple[np.ndarray, np.ndarray]:
  """Rates for `choose_tree` from measured counts, with their standard errors.

  Args:
    reached: int [D, K], how often the rank-r child at depth d was judged.
    accepted: int [D, K], how often it was accepted (<= reached).

  Returns:
    rates: float64 [D, K], accepted / reached; 0 where nothing was reached
      (an unmeasured rank is never worth a node).
    stderr: float64 [D, K], the binomial standard error sqrt(r(1-r)/n); NaN
      where nothing was reached.
  """
  reached = np.asarray(reached, np.float64)
  accepted = np.asarray(accepted, np.float64)
  if reached.shape != accepted.shape or reached.ndim != 2:
    raise ValueError(
      f'reached and accepted must both have shape [D, K]; got {reached.shape} and {accepted.shape}.'
    )
  if np.any(accepted < 0) or np.any(accepted > reached):
    raise ValueError(
      'Counts must satisfy 0 <= accepted <= reached (a child is accepted only when judged); '
      f'got reached {reached.tolist()} and accepted {accepted.tolist()}.'
    )
  seen = reached > 0
  rates = np.where(seen, accepted / np.where(seen, reached, 1), 0.0)
  stderr = np.where(seen, np.sqrt(rates * (1 - rates) / np.where(seen, reached, 1)), np.nan)
  return rates, stderr


def _rank_gains(rates, max_depth: int) -> np.ndarray:
  """float64 [D, K]: probability that the rank-r child at depth d is accepted, ranks < r
  having been rejected, from rates [D, K] (or [K], the same at every depth)."""
  rates = np.asarray(rates, np.float64)
  if rates.ndim == 1:
    rates = np.broadcast_to(rates, (max_depth, rates.shape[0]))
  if rates.ndim != 2 or rates.shape[1] < 1 or np.any((rates < 0) | (rates > 1)):
    raise ValueError(
      'rates must be probabilities in [0, 1] of shape [D, K] (depth of the parent, sibling '
      f'rank) or [K] (every depth); got {rates!r}.'
    )
  if rates.shape[0] < max_depth:
    raise ValueError(
      f'rates cover depths 0..{rates.shape[0] - 1} of the parent, but the tree needs '
      f'{max_depth} (depth {max_depth}); measure deeper or pass max_depth <= {rates.shape[0]}.'
    )
  rejected_before = np.cumprod(np.pad(1 - rates, ((0, 0), (1, 0)), constant_values=1), axis=1)
  return rates * rejected_before[:, :-1]


def expected_accepted(tree: Tree, rates) -> float:
  """Expected accepted draft tokens per target call under i.i.d. acceptance.

  A node is on the accepted path with probability the product, along its
  path, of each node's gain: rates[d, r] * prod_{s<r} (1 - rates[d, s]) for
  a rank-r child of a node at depth d. Tokens per call = 1 + this.

  Args:
    tree: a `Tree`.
    rates: float [D, K] (D >= the tree's depth): rates[d, r] is the
      probability that the rank-r child of a node at depth d is accepted
      given that ranks < r were rejected; ranks >= K count as 0. Or [K], the
      same at every depth.

  Returns:
    The expected number of accepted drafted tokens.
  """
  gains = _rank_gains(rates, tree.max_depth)
  gains = np.pad(gains, ((0, 0), (0, max(0, tree.max_children - gains.shape[1]))))
  reached = np.ones(tree.num_nodes)
  for i in range(1, tree.num_nodes):
    reached[i] = reached[tree.parents[i]] * gains[tree.depths[i] - 1, tree.ranks[i]]
  return float(reached[1:].sum())


def _tree_from_children(children: List[List[Any]]) -> Tree:
  """A `Tree` from a nested [child, child, ...] list (each child a list), numbered
  breadth first."""
  parents, queue = [-1], [(0, children)]
  for node, kids in queue:
    for kid in kids:
      queue.append((len(parents), kid))
      parents.append(node)
  return Tree(tuple(parents))


def choose_tree(rates, max_nodes: int, max_depth: Optional[int] = None) -> Tree:
  """The tree of at most max_nodes drafted nodes maximizing `expected_accepted`.

  Sequoia's dynamic program: best[d][m] is the most expected accepted tokens
  below a node at depth d with m nodes to spend; a node's children are filled
  rank by rank, child r getting 1 + j nodes (itself and j below it) for a
  gain g(d, r) * (1 + best[d + 1][j]). Exact for any rates, including ones
  where a later rank is worth more than an earlier one (there best-first
  growth by path probability is not optimal). O(D·K·M²) arithmetic.

  Args:
    rates: as in `expected_accepted`.
    max_nodes: the budget of drafted nodes, >= 1.
    max_depth: the deepest node allowed; default: rates' depth D for rates
      [D, K]; for rates [K] (the same at every depth) the budget alone, so
      that a chain of max_nodes can be chosen.

  Returns:
    The best tree. Among equal values the program keeps fewer nodes under
    earlier ranks and never adds a node that gains nothing; if no node gains
    anything (all rates 0), a chain of one.
  """
  if not isinstance(max_nodes, (int, np.integer)) or max_nodes < 1:
    raise ValueError(f'max_nodes must be an int >= 1 (drafted nodes); got {max_nodes!r}.')
  if max_depth is None:
    max_depth = np.shape(rates)[0] if np.ndim(rates) == 2 else max_nodes
  max_depth = min(int(max_depth), int(max_nodes))
  if max_depth < 1:
    raise ValueError(f'max_depth must be >= 1; got {max_depth}.')
  gains = _rank_gains(rates, max_depth)[:max_depth]
  width = gains.shape[1]
  # best[d, m]: the most below a node at depth d with at most m nodes. Filling a
  # node's children from rank r on with at most m nodes: stop (0), or give child
  # r itself and j nodes below it; choice[d, r, m] is that j, -1 to stop.
  best = np.zeros((max_depth + 1, max_nodes + 1))
  choice = np.full((max_depth, width, max_nodes + 1), -1)
  for d in range(max_depth - 1, -1, -1):
    fill = np.zeros((width + 1, max_nodes + 1))
    for r in range(width - 1, -1, -1):
      for m in range(1, max_nodes + 1):
        below = np.arange(m)  # j nodes under child r, at most m - 1 - j for later ranks.
        values = gains[d, r] * (1 + best[d + 1, below]) + fill[r + 1, m - 1 - below]
        j = int(np.argmax(values))  # The first maximum: the fewest nodes under r.
        if values[j] > 0:
          fill[r, m], choice[d, r, m] = values[j], j
    best[d] = fill[0]

  def build(d: int, r: int, m: int) -> List[Any]:
    """The children (nested lists) from rank r on of a node at depth d, m nodes."""
    if d >= max_depth or r >= width or m <= 0 or choice[d, r, m] < 0:
      return []
    j = int(choice[d, r, m])
    return [build(d + 1, 0, j)] + build(d, r + 1, m - 1 - j)

  children = build(0, 0, max_nodes)
  return _tree_from_children(children) if children else Tree.chain(1)
