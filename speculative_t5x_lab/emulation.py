"""Emulated acceptance: the benchmarks' timing mode for random weights, as a judge.

Random weights (e.g. T5-XXL beside T5-small, never trained as a pair) give
no meaningful acceptance, yet their timings are what a speedup on such a pair
would cost. `EmulatedJudge(rates)` takes the exact judge's place through the
decode loop's one door for another rule (`judge=`, `speculative_t5x.judging`):
it accepts each drafted token i.i.d. at `rates` (`verify_chain`; a tree's
rates by sibling rank, `verify_tree`, checked by `tree_rates`) instead of
comparing the two distributions, with the same kind of work per row (draws,
gathers, one sample). The outputs are not the target's distribution; the
records say `emulated`.

  decode = models.make_decoder(target, draft, gamma=4, eos_id=-1, judge=EmulatedJudge(0.7))

Only the lab builds one: the library's rules are the exact ones.
"""

import dataclasses
import functools
from typing import Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import judging
from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x import tree as tree_lib

Array = jax.Array
Rates = Union[float, Tuple[float, ...]]


def verify_chain(
  rng: Array,
  draft_tokens: Array,
  target_probs: Array,
  alpha: float,
  one_hot_target: bool = False,
  num_drafted: Optional[Array] = None,
) -> Tuple[Array, Array, Array]:
  """Timing only: accepts each draft token i.i.d. with probability `alpha`.

  Stands in for `speculative_sampling.verify` when full-size models with
  random weights are timed at the acceptance rate of a trained pair. It does
  the same kind of work per row (draws, a gather, one sample) but its output
  is NOT distributed as the target's: never use it to produce text.

  Args:
    rng: a PRNG key.
    draft_tokens: int32 [B, gamma].
    target_probs: float [B, gamma + 1, V].
    alpha: the acceptance probability, in [0, 1].
    one_hot_target: static; the next token is p's argmax.
    num_drafted: int32 [B] tokens drafted per row (None: gamma); later ones
      are never accepted.

  Returns:
    (num_accepted int32 [B], next_token int32 [B], beta float32 [B, gamma]) as
    `speculative_sampling.verify(..., return_beta=True)`: the accepted count
    is the number of leading successes, the next token is drawn from the
    target at that position, and beta is `alpha` everywhere.
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'Emulated acceptance must lie in [0, 1]; got {alpha}.')
  accept_rng, sample_rng = jax.random.split(rng)
  accepted = jax.random.uniform(accept_rng, draft_tokens.shape) < alpha
  gamma = draft_tokens.shape[1]
  if num_drafted is not None:
    accepted &= jnp.arange(gamma) < num_drafted[:, None]
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)
  next_probs = jnp.take_along_axis(target_probs, num_accepted[:, None, None], axis=1)[:, 0]
  next_token = sampling.sample(sample_rng, next_probs, one_hot=one_hot_target)
  beta = jnp.full(draft_tokens.shape, alpha, jnp.float32)
  return num_accepted.astype(jnp.int32), next_token, beta


def tree_rates(rates: Union[float, Sequence[float]], tree: tree_lib.Tree) -> np.ndarray:
  """float32 [K]: the emulated acceptance of a tree (`verify_tree`'s `rates`), checked.

  Timing at a trained pair's acceptance on random weights (the chain's is
  `verify_chain`): every node's rank-r child is accepted with probability
  rates[r] given that ranks < r were rejected, i.i.d. across nodes and
  depths. A tree needs a rate per sibling rank (the rank-0 rate is a chain's
  alpha; later ranks are judged after a rejection, so their rates are lower:
  measure them with `tree_benchmark.measure_rates`, whose [D, K] rates,
  averaged over depth, give them).

  Args:
    rates: K' >= K probabilities in [0, 1] by rank (K = the tree's most
      children per node); ranks past K are unused.
    tree: the `tree.Tree` they emulate.

  Raises:
    ValueError: a scalar, a rate outside [0, 1], or fewer rates than ranks.
  """
  array = np.asarray(rates, np.float64)
  if array.ndim != 1 or array.size < tree.max_children:
    raise ValueError(
      f'Emulating {tree.describe()} needs an acceptance rate per sibling rank, '
      f"{tree.max_children} of them (rank 0 first, a chain's alpha); got {rates!r}. Measure "
      'them with tree_benchmark.measure_rates on a trained pair.'
    )
  if np.any((array < 0) | (array > 1)) or not np.all(np.isfinite(array)):
    raise ValueError(f'Emulated acceptance rates must lie in [0, 1]; got {rates!r}.')
  return array[: tree.max_children].astype(np.float32)


def _verify_tree_row(key, tokens, valid, target_probs, rates, *, tree, one_hot_target):
  """`verify_tree` for one row: tokens int32 [N], valid bool [N], target_probs [N, V],
  rates float32 [K]."""
  depth, width = tree.max_depth, tree.max_children
  children = jnp.asarray(tree.children)
  accept_key, next_key = jax.random.split(key)
  coins = jax.random.uniform(accept_key, (depth, width))
  node, alive = jnp.zeros((), jnp.int32), jnp.ones((), bool)
  path, ranks, judged, counts = [node], [], [], []
  for d in range(depth):
    kids = children[node]
    kid_valid = (kids >= 0) & valid[jnp.maximum(kids, 0)]
    hits = coins[d] < kid_valid * rates  # A rate of 0 never hits, 1 always does.
    hit, rank = jnp.any(hits), jnp.argmax(hits).astype(jnp.int32)
    judged.append(alive & jnp.any(kid_valid))
    ranks.append(jnp.where(alive & hit, rank, -1))
    num_valid = jnp.cumsum(kid_valid.astype(jnp.int32))
    counts.append(jnp.where(alive, jnp.where(hit, num_valid[rank], num_valid[-1]), 0))
    node = jnp.where(alive & hit, kids[rank], node)
    alive &= hit
    path.append(node)
  path = jnp.stack(path)
  num_accepted = jnp.sum(jnp.stack(ranks) >= 0).astype(jnp.int32)
  # The next token is drawn from p itself at the node where the walk stopped.
  if one_hot_target:
    next_token = sampling.argmax(target_probs[node])
  else:
    next_token = sampling.sample(next_key, target_probs[node])
  judged = jnp.stack(judged)
  return tree_lib.TreeJudgement(
    path=path,
    num_accepted=num_accepted,
    next_token=next_token,
    path_tokens=jnp.where(jnp.arange(depth) < num_accepted, tokens[path[1:]], 0),
    path_target_probs=target_probs[path],
    beta=jnp.where(judged, rates[0], 0.0),
    accepted_rank=jnp.stack(ranks),
    judged=judged,
    children_judged=jnp.stack(counts),
  )


def verify_tree(
  rng: Array,
  tree: tree_lib.Tree,
  node_tokens: Array,
  node_valid: Array,
  target_probs: Array,
  rates: Union[float, Sequence[float]],
  *,
  one_hot_target: bool,
) -> tree_lib.TreeJudgement:
  """Timing only: the walk of `tree.verify_tree`, each child accepted at its rank's rate.

  Each valid rank-r child is accepted with probability rates[r] after ranks
  < r were rejected, i.i.d. per node, and the next token is drawn from p
  (its argmax for a greedy target) at the node where the walk stopped. The
  output is NOT the target's distribution.

  Args:
    rng: one PRNG key, split one per row.
    tree: the static `tree.Tree`, N nodes, depth D.
    node_tokens: int32 [B, N], each node's token (the root's is unused).
    node_valid: bool [B, N], as `tree.verify_tree`'s.
    target_probs: float [B, N, V], the standardized target distribution p
      after each node.
    rates: K' >= K rates by sibling rank (`tree_rates`).
    one_hot_target: static; every p is one-hot (greedy).

  Returns:
    A `tree.TreeJudgement` (beta is rates[0] where judged).
  """
  rates = jnp.asarray(tree_rates(rates, tree))
  verify_row = functools.partial(_verify_tree_row, tree=tree, one_hot_target=one_hot_target)
  return jax.vmap(verify_row, in_axes=(0, 0, 0, 0, None))(
    jax.random.split(rng, node_tokens.shape[0]),
    jnp.asarray(node_tokens, jnp.int32),
    jnp.asarray(node_valid, bool),
    jnp.asarray(target_probs, jnp.float32),
    rates,
  )


@dataclasses.dataclass(frozen=True)
class EmulatedJudge(judging.ExactJudge):
  """A `judging.Judge` that accepts i.i.d. at `rates`: timing only (see the module docstring).

  Attributes:
    rates: one rate (a chain) or rates by sibling rank, rank 0 first (a
      tree); stored as a float or a tuple of floats, so that the judge is
      hashable (static) and equal rates compile once. A number or any
      sequence (a numpy array too) is taken.
  """

  rates: Rates

  def __post_init__(self):
    rates = self.rates
    if np.ndim(rates) == 0:
      rates = float(rates)
    else:
      rates = tuple(float(rate) for rate in np.ravel(rates))
    object.__setattr__(self, 'rates', rates)

  def check(self, spec: settings_lib.SpeculativeSettings) -> None:
    """ValueError unless the rates fit: one rate in [0, 1] for a chain, one per rank for a tree."""
    if spec.tree is not None:
      tree_rates(self.rates, spec.tree)
    elif np.ndim(self.rates) != 0:
      raise ValueError(
        f'Emulated acceptance for a chain is one acceptance rate; got {self.rates!r}. Rates '
        'by sibling rank are for a token tree (tree=...).'
      )
    elif not 0.0 <= self.rates <= 1.0:
      raise ValueError(f'Emulated acceptance must lie in [0, 1]; got {self.rates}.')

  def verify_chain(
    self, rng, draft_tokens, draft_probs, target_probs, spec, *, one_hot_target, num_drafted
  ):
    """`verify_chain` at the rate, in the exact rule's place (same shapes; q unused)."""
    del draft_probs, spec
    return verify_chain(
      rng,
      draft_tokens,
      target_probs,
      self.rates,
      one_hot_target=one_hot_target,
      num_drafted=num_drafted,
    )

  def verify_tree(
    self, rng, tree, node_tokens, node_valid, draft_probs, target_probs, *, one_hot_target
  ):
    """`verify_tree` at the rates, in the exact rule's place (same shapes; q unused)."""
    del draft_probs
    return verify_tree(
      rng, tree, node_tokens, node_valid, target_probs, self.rates, one_hot_target=one_hot_target
    )


def judge_at(rates) -> Optional[EmulatedJudge]:
  """The judge at `rates` (see the module docstring); None (the exact rules) for None rates."""
  return None if rates is None else EmulatedJudge(rates)
