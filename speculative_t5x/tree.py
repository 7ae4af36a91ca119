"""Tree speculative decoding: a token tree per row, verified in one target call.

A chain drafts γ tokens one after another; a tree drafts several candidates
at each step (the siblings of a node), so a rejection of the most likely
candidate can still be rescued by the next one. The target scores every node
of the tree in one call (each node attends to its ancestors only), and
`verify_tree` walks from the root accepting at most one child per node.

The tree is static: `Tree` (a parent array) fixes the shape of every row's
draft, so the whole decode stays one compiled loop. Node 0 is the root, the
row's last emitted token; nodes 1..N-1 are drafted tokens, in breadth-first
order, siblings contiguous, a child's index among its siblings (its rank)
being the order in which it was drawn.

Drawing (`draw_children`): a node's children are drawn from the draft's q at
that node without replacement (Gumbel-top-k, the same law as drawing one at a
time and removing each drawn token), or greedily as q's top k.

Verifying (`verify_tree`): recursive rejection sampling without replacement
(Jeon et al., arXiv 2402.14160; trees as in SpecInfer, arXiv 2305.09781). At
a node with target p and draft q, start from p' = p, q' = q; for each child x
by rank, accept with probability min(1, p'(x)/q'(x)); on rejection
p' <- norm(max(0, p' - q')) and q' <- q' without x, renormalized. An accepted
child becomes the current node; if all children are rejected the next token
is drawn from the last p'; at a leaf it is a bonus draw from p.

Why it is exact: for one child this is Algorithm 1's step, whose output token
is distributed as p. For the r-th child, given that children 1..r-1 were
rejected, x_r is distributed as q'_r (q without the earlier draws) and the
token wanted is distributed as p'_r (what p still owes after the rejected
draws); one more step of Algorithm 1 with (p'_r, q'_r) turns that into the
law p'_r, by the same argument, and by induction over ranks the node emits a
token distributed as p. Which child subtree is used next depends only on the
accepted token, and that subtree was drafted from the token's own prefix, so
by induction over depth the emitted tokens are distributed as the target's
ancestral samples. tests/test_tree.py enumerates this in float64.

A deterministic draft (a greedy draft's top k, prompt lookup) has
`draft_probs=None`: each child is a proposal with a one-hot q' at its own
token, so it is accepted with probability p'(x) and p' <- p' without x. That
rule is exact too: it is the step above with q'_r = one_hot(x_r).

Choosing a tree for a pair from its measured acceptance is the lab's
(`speculative_t5x_lab.tree_design`).
"""

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import sampling
from speculative_t5x import speculative_sampling as spec


def _read_only(array: np.ndarray) -> np.ndarray:
  array.setflags(write=False)
  return array


@dataclasses.dataclass(frozen=True)
class Tree:
  """A static draft tree, defined by its parent array.

  Attributes:
    parents: parents[i] is node i's parent; parents[0] = -1 (the root, the
      row's last emitted token). Required order: parents[i] < i; depths
      nondecreasing in index (each depth's nodes contiguous); each node's
      children contiguous and in the order of their parents (parents
      nondecreasing from node 1 on). A child's index among its siblings is
      its rank, the order in which it was drawn.

  Frozen and hashable: a static argument of jitted functions. The array
  properties are numpy, computed once and read-only.
  """

  parents: Tuple[int, ...]

  def __post_init__(self):
    parents = self.parents
    if isinstance(parents, (str, bytes)) or not isinstance(parents, Sequence):
      raise TypeError(
        f'Tree.parents must be a sequence of ints (parents[0] = -1); got {parents!r}. '
        'To build a tree from branching factors use Tree.from_branching or Tree.parse.'
      )
    if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in parents):
      raise TypeError(f'Tree.parents must hold ints; got {tuple(parents)!r}.')
    parents = tuple(int(p) for p in parents)
    object.__setattr__(self, 'parents', parents)
    if len(parents) < 2 or parents[0] != -1:
      raise ValueError(
        'A tree needs its root (parents[0] = -1) and at least one drafted node; '
        f'got parents {parents}. Example: (-1, 0, 0) drafts two candidates for one token.'
      )
    depths = [0]
    for i in range(1, len(parents)):
      if not 0 <= parents[i] < i:
        raise ValueError(
          f'Tree parents must satisfy 0 <= parents[i] < i for i >= 1 (a parent comes '
          f'before its children); parents[{i}] = {parents[i]} in {parents}.'
        )
      depths.append(depths[parents[i]] + 1)
      if depths[i] < depths[i - 1]:
        raise ValueError(
          f'Tree nodes must be in breadth-first order (depths nondecreasing in index); '
          f'node {i} has depth {depths[i]} after node {i - 1} at depth {depths[i - 1]} '
          f'in parents {parents}. Number the nodes level by level.'
        )
      if parents[i] < parents[i - 1]:
        raise ValueError(
          f"Each node's children must be contiguous and in their parents' order "
          f'(parents nondecreasing from node 1); node {i} (a child of {parents[i]}) comes '
          f'after node {i - 1} (a child of {parents[i - 1]}) in parents {parents}. '
          'Sort each level by parent.'
        )

  @classmethod
  def from_branching(cls, branching: Sequence[int]) -> 'Tree':
    """Every node at depth d - 1 gets branching[d - 1] children.

    `Tree.from_branching((3, 2, 1, 1))` has 1 + 3 + 6 + 6 + 6 = 22 nodes.
    """
    if isinstance(branching, Sequence) and not isinstance(branching, (str, bytes)):
      branching = tuple(branching)
    if (
      not isinstance(branching, tuple)
      or not branching
      or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in branching)
      or min(branching) < 1
    ):
      raise ValueError(
        'Tree branching must be a non-empty sequence of ints >= 1 (children per node at '
        f'each depth, e.g. (3, 2, 1, 1)); got {branching!r}.'
      )
    parents, level = [-1], [0]
    for width in branching:
      next_level = []
      for node in level:
        for _ in range(width):
          next_level.append(len(parents))
          parents.append(node)
      level = next_level
    return cls(tuple(parents))

  @classmethod
  def chain(cls, gamma: int) -> 'Tree':
    """γ drafted tokens one after another: today's speculative decoding."""
    if not isinstance(gamma, (int, np.integer)) or isinstance(gamma, bool) or gamma < 1:
      raise ValueError(f'A chain needs gamma >= 1 drafted tokens; got {gamma!r}.')
    return cls.from_branching((1,) * int(gamma))

  @classmethod
  def parse(cls, spec_: Union['Tree', str, Sequence[int], Dict[str, Any]]) -> 'Tree':
    """The one place a tree is read from a configuration (gin, a flag).

    Accepts a `Tree`; branching factors as a sequence of ints, (3, 2, 1, 1),
    or a string '3,2,1,1'; or a dict {'parents': [-1, 0, 0, 1]} (or
    {'branching': [...]}) for a tree that is not uniform per depth.
    """
    if isinstance(spec_, Tree):
      return spec_
    if isinstance(spec_, str):
      try:
        branching = tuple(int(part) for part in spec_.replace(' ', '').split(','))
      except ValueError:
        raise ValueError(
          f"A tree string must be comma-separated branching factors, e.g. '3,2,1,1'; got "
          f'{spec_!r}. For a parent array pass {{"parents": [...]}}.'
        ) from None
      return cls.from_branching(branching)
    if isinstance(spec_, dict):
      if set(spec_) == {'parents'}:
        return cls(tuple(spec_['parents']))
      if set(spec_) == {'branching'}:
        return cls.from_branching(spec_['branching'])
      raise ValueError(
        f"A tree dict must have exactly one key, 'parents' or 'branching'; got {spec_!r}."
      )
    if isinstance(spec_, Sequence):
      return cls.from_branching(spec_)
    raise ValueError(
      f"Cannot read a tree from {spec_!r}: pass branching factors ((3, 2, 1, 1) or '3,2,1,1'), "
      "a dict {'parents': [...]}, or a Tree (a chain of γ is (1,) * γ)."
    )

  @property
  def num_nodes(self) -> int:
    """N, the root included."""
    return len(self.parents)

  @property
  def num_drafted(self) -> int:
    """N - 1, the drafted tokens."""
    return len(self.parents) - 1

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """int32 [N]: each node's depth, the root's 0."""
    depths = np.zeros(self.num_nodes, np.int32)
    for i in range(1, self.num_nodes):
      depths[i] = depths[self.parents[i]] + 1
    return _read_only(depths)

  @property
  def max_depth(self) -> int:
    """D: the deepest node's depth, the most tokens a row can accept in one call."""
    return int(self.depths[-1])

  @functools.cached_property
  def num_children(self) -> np.ndarray:
    """int32 [N]: each node's children."""
    counts = np.bincount(np.asarray(self.parents[1:]), minlength=self.num_nodes)
    return _read_only(counts.astype(np.int32))

  @property
  def max_children(self) -> int:
    """K: the most children of any node."""
    return int(self.num_children.max())

  @functools.cached_property
  def ranks(self) -> np.ndarray:
    """int32 [N]: each node's index among its siblings (its draw order); the root's 0."""
    ranks = np.zeros(self.num_nodes, np.int32)
    for i in range(2, self.num_nodes):
      if self.parents[i] == self.parents[i - 1]:
        ranks[i] = ranks[i - 1] + 1
    return _read_only(ranks)

  @functools.cached_property
  def children(self) -> np.ndarray:
    """int32 [N, K]: children[i, r] is node i's rank-r child, -1 where it has none."""
    children = np.full((self.num_nodes, self.max_children), -1, np.int32)
    for i in range(1, self.num_nodes):
      children[self.parents[i], self.ranks[i]] = i
    return _read_only(children)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """bool [N, N]: ancestors[i, j] iff j is i or an ancestor of i (the attention mask)."""
    ancestors = np.eye(self.num_nodes, dtype=bool)
    for i in range(1, self.num_nodes):
      ancestors[i] |= ancestors[self.parents[i]]
    return _read_only(ancestors)

  @functools.cached_property
  def levels(self) -> Tuple[Tuple[int, int], ...]:
    """(start, stop) node ranges of depths 0..D."""
    bounds = np.searchsorted(self.depths, np.arange(self.max_depth + 2))
    return tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))

  @functools.cached_property
  def internal(self) -> np.ndarray:
    """int32 [I]: the nodes with children, ascending."""
    return _read_only(np.flatnonzero(self.num_children > 0).astype(np.int32))

  @functools.cached_property
  def branching(self) -> Optional[Tuple[int, ...]]:
    """Children per node at each depth if every depth is uniform, else None."""
    branching = []
    for start, stop in self.levels[:-1]:
      counts = set(self.num_children[start:stop].tolist())
      if len(counts) != 1:
        return None
      branching.append(counts.pop())
    return tuple(branching)

  def describe(self) -> str:
    """One line for reports: the shape, drafted nodes, depth and width per depth."""
    shape = (
      f'branching {self.branching}'
      if self.branching is not None
      else f'parents {self.parents}'
      if self.num_nodes <= 16
      else 'non-uniform'
    )
    widths = '/'.join(str(stop - start) for start, stop in self.levels[1:])
    return f'tree {shape}: {self.num_drafted} drafted, depth {self.max_depth}, widths {widths}'

  __str__ = describe


def draw_children(
  rng: jax.Array, probs: jax.Array, num_children: int, *, greedy: bool
) -> Tuple[jax.Array, jax.Array]:
  """Draws num_children distinct child tokens per frontier node.

  Sampled (`greedy=False`): Gumbel-top-k on log q, which draws without
  replacement in the same law as drawing one token at a time from q and
  removing it (the order of the top k is the draw order).

  Greedy (`greedy=True`): the k most probable tokens of `probs`, ties to the
  lower id; no random numbers. A greedy draft's standardized q (temperature
  0) is one-hot and ranks nothing past its argmax, so the caller passes the
  draft's own distribution at temperature 1 (`sampling.standardize(logits,
  1.0)`, or softmax of its logits; any nonnegative weights whose order is the
  draft's preference), and verifies with `draft_probs=None`: each child is
  then a deterministic proposal.

  Args:
    rng: a PRNG key (unused when greedy).
    probs: float [B, V]; sampled: the standardized draft distributions q at B
      frontier nodes; greedy: the weights to rank by.
    num_children: static int k in [1, V].
    greedy: static.

  Returns:
    tokens: int32 [B, k], in draw (rank) order.
    valid: bool [B, k]; False where the draw had probability 0 (k exceeds
      q's support, e.g. under top-k): such children are never accepted, and
      they always come after every valid one.
  """
  probs = jnp.asarray(probs, jnp.float32)
  if not 1 <= num_children <= probs.shape[-1]:
    raise ValueError(
      f'num_children must lie in [1, V] = [1, {probs.shape[-1]}] (distinct tokens); got '
      f'{num_children}.'
    )
  if greedy:
    scores = probs
  else:
    log_probs = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
    scores = log_probs + jax.random.gumbel(rng, probs.shape, jnp.float32)
  _, tokens = jax.lax.top_k(scores, num_children)  # Equal scores: the lower id first.
  valid = jnp.take_along_axis(probs, tokens, axis=-1) > 0
  return tokens.astype(jnp.int32), valid


def _at(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  """probs [..., V] at tokens int [...]: [...]."""
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def node_outcome_probabilities(
  target_probs: jax.Array,
  draft_probs: Optional[jax.Array],
  child_tokens: jax.Array,
  child_valid: jax.Array,
) -> Tuple[jax.Array, jax.Array]:
  """The per-node rule of `verify_tree`, as probabilities.

  Runs the children in rank order with p' = p, q' = q: a valid child x has
  acceptance probability min(1, p'(x)/q'(x)); then p' <- norm(max(0, p' -
  q')) (p' itself where that mass is ~0) and q' <- q' without x,
  renormalized. An invalid child is skipped: acceptance 0, p' and q'
  unchanged (exact when it had q'(x) = 0 or comes after every valid sibling,
  which `draw_children` guarantees). With `draft_probs=None` each child is a
  deterministic proposal (q' one-hot at x): acceptance p'(x), and p' <- p'
  without x, renormalized.

  Args:
    target_probs: float [..., V], p at the node.
    draft_probs: float [..., V], the q its children were drawn from without
      replacement, or None (deterministic proposals).
    child_tokens: int [..., K], the children's tokens by rank.
    child_valid: bool [..., K].

  Returns:
    accept: [..., K] in the inputs' dtype: the probability that child r is
      accepted given that children < r were rejected (what `verify_tree`
      draws its coin against); child r is accepted with probability
      accept[r] * prod_{s<r} (1 - accept[s]).
    residual: [..., V], the last p', from which the next token is drawn when
      every child is rejected (p itself when no child is valid).
  """
  p = target_probs
  q = draft_probs
  vocab = jnp.arange(p.shape[-1])
  accept = []
  for rank in range(child_tokens.shape[-1]):
    token, valid = child_tokens[..., rank], child_valid[..., rank]
    if q is None:
      prob = spec.acceptance_probability(_at(p, token), jnp.ones((), p.dtype))
      next_p = spec.residual_distribution_for_token(p, token)
    else:
      prob = spec.acceptance_probability(_at(p, token), _at(q, token))
      next_p = spec.residual_distribution(p, q)
      removed = jnp.where(vocab == token[..., None], 0, q)
      mass = jnp.sum(removed, axis=-1, keepdims=True)
      q = jnp.where(valid[..., None], removed / jnp.where(mass > 0, mass, 1), q)
    accept.append(jnp.where(valid, prob, 0))
    p = jnp.where(valid[..., None], next_p, p)
  return jnp.stack(accept, axis=-1), p


@flax.struct.dataclass
class TreeJudgement:
  """What `verify_tree` decided for each row (D = the tree's depth).

  Attributes:
    path: int32 [B, D+1], the node ids of the accepted path; path[:, 0] = 0
      and entries past num_accepted repeat the last accepted node, so
      path[:, num_accepted] is the node whose p drew next_token.
    num_accepted: int32 [B] in [0, D], the drafted tokens accepted.
    next_token: int32 [B]: the residual sample after a rejection, or the
      bonus sample from p at the leaf the walk reached. A row emits
      path_tokens[b, :num_accepted[b]] then next_token[b].
    path_tokens: int32 [B, D], the accepted tokens, 0 past num_accepted.
    path_target_probs: float32 [B, D+1, V], p at path[:, i] (the target's
      distribution of the emitted token i, for its log-prob).
    beta: float32 [B, D], Σ_x min(p, q) at the node judged at each depth (the
      probability that its rank-0 child is accepted; p(x) of the rank-0
      child for a deterministic draft; 1 or 0 for a greedy target), 0 where
      nothing was judged.
    accepted_rank: int32 [B, D], the rank accepted at each depth, -1 where
      every child was rejected or the depth was not reached.
    judged: bool [B, D], the walk reached a node at this depth with at least
      one valid child.
    children_judged: int32 [B, D], how many children were judged at each
      depth (the valid ones up to the accepted one); ranks 0..n-1 when
      invalid children come last, as `draw_children`'s do.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array
  path_tokens: jax.Array
  path_target_probs: jax.Array
  beta: jax.Array
  accepted_rank: jax.Array
  judged: jax.Array
  children_judged: jax.Array


def _verify_tree_row(key, tokens, valid, draft_probs, target_probs, *, tree, one_hot_target):
  """`verify_tree` for one row: tokens [N], valid [N], probs [N, V] (draft: or None)."""
  depth, width = tree.max_depth, tree.max_children
  children = jnp.asarray(tree.children)
  accept_key, next_key = jax.random.split(key)
  coins = jax.random.uniform(accept_key, (depth, width))
  node, alive = jnp.zeros((), jnp.int32), jnp.ones((), bool)
  next_probs = target_probs[0]
  path, ranks, betas, judged, counts = [node], [], [], [], []
  for d in range(depth):
    kids = children[node]
    kid_tokens = tokens[jnp.maximum(kids, 0)]
    kid_valid = (kids >= 0) & valid[jnp.maximum(kids, 0)]
    p = target_probs[node]
    q = None if draft_probs is None else draft_probs[node]
    if one_hot_target:
      accept = (kid_valid & (kid_tokens == sampling.argmax(p))).astype(jnp.float32)
    else:
      accept, residual = node_outcome_probabilities(p, q, kid_tokens, kid_valid)
    hits = coins[d] < accept  # accept 0 never hits, 1 always does.
    hit, rank = jnp.any(hits), jnp.argmax(hits).astype(jnp.int32)
    if not one_hot_target:
      next_probs = jnp.where(alive & ~hit, residual, next_probs)
    if q is None:
      beta = p[kid_tokens[0]]
    else:
      beta = jnp.sum(jnp.minimum(p, q))
    judged.append(alive & jnp.any(kid_valid))
    betas.append(jnp.where(judged[-1], beta, 0.0))
    ranks.append(jnp.where(alive & hit, rank, -1))
    num_valid = jnp.cumsum(kid_valid.astype(jnp.int32))
    counts.append(jnp.where(alive, jnp.where(hit, num_valid[rank], num_valid[-1]), 0))
    node = jnp.where(alive & hit, kids[rank], node)
    alive &= hit
    path.append(node)
  path = jnp.stack(path)
  num_accepted = jnp.sum(jnp.stack(ranks) >= 0).astype(jnp.int32)
  if one_hot_target:
    next_token = sampling.argmax(target_probs[node])
  else:
    next_probs = jnp.where(alive, target_probs[node], next_probs)
    next_token = sampling.sample(next_key, next_probs)
  path_tokens = jnp.where(jnp.arange(depth) < num_accepted, tokens[path[1:]], 0)
  return TreeJudgement(
    path=path,
    num_accepted=num_accepted,
    next_token=next_token,
    path_tokens=path_tokens,
    path_target_probs=target_probs[path],
    beta=jnp.stack(betas),
    accepted_rank=jnp.stack(ranks),
    judged=jnp.stack(judged),
    children_judged=jnp.stack(counts),
  )


def verify_tree(
  rng: jax.Array,
  tree: Tree,
  node_tokens: jax.Array,
  node_valid: jax.Array,
  draft_probs: Optional[jax.Array],
  target_probs: jax.Array,
  *,
  one_hot_target: bool,
) -> TreeJudgement:
  """Accepts one path of each row's draft tree and draws the token after it.

  Batched and jittable (`tree` and `one_hot_target` static); float32
  arithmetic whatever the input dtype; O(B·D·K·V) work. Lenience is not
  supported for trees: the rule is the exact one.

  Args:
    rng: one PRNG key, or B keys (one per row); row b's result depends only
      on its own key, as in `speculative_sampling.verify`.
    tree: the static `Tree`, N nodes, depth D.
    node_tokens: int32 [B, N], each node's token (the root's is unused).
    node_valid: bool [B, N]; an invalid child is skipped (never accepted,
      p' and q' unchanged): use it for draws past q's support and for rows
      that drafted fewer children (its invalid children must then come after
      its valid ones). An invalid node's subtree is never reached. The root's
      entry is unused.
    draft_probs: float [B, N, V]: row i is the q node i's children were drawn
      from without replacement (`draw_children`; unused at leaves). None: a
      deterministic draft, each child a proposal with one-hot q.
    target_probs: float [B, N, V]: the standardized target distribution p
      after each node (conditioned on the node's path).
    one_hot_target: static; every p is one-hot (greedy): the first valid
      child whose token is argmax p is accepted, the next token is argmax p
      at the last node reached, and no random numbers are drawn.

  Returns:
    A `TreeJudgement`.

  Raises:
    ValueError: on shapes that do not match the tree, or an rng that is
      neither one key nor B keys.
  """
  batch_size = _check_shapes(tree, node_tokens, node_valid, draft_probs, target_probs)
  verify_row = functools.partial(_verify_tree_row, tree=tree, one_hot_target=one_hot_target)
  return jax.vmap(verify_row)(
    spec._row_keys(rng, batch_size),  # pylint: disable=protected-access
    jnp.asarray(node_tokens, jnp.int32),
    jnp.asarray(node_valid, bool),
    None if draft_probs is None else jnp.asarray(draft_probs, jnp.float32),
    jnp.asarray(target_probs, jnp.float32),
  )


def _check_shapes(tree, node_tokens, node_valid, draft_probs, target_probs) -> int:
  """B, the rows of `verify_tree`'s arguments; TypeError or ValueError unless they fit `tree`."""
  if not isinstance(tree, Tree):
    raise TypeError(f'tree must be a Tree (see Tree.parse); got {tree!r}.')
  if node_tokens.ndim != 2 or node_tokens.shape[1] != tree.num_nodes:
    raise ValueError(
      f'node_tokens must have shape [B, N] with N = {tree.num_nodes} nodes of '
      f'{tree.describe()}; got {node_tokens.shape}.'
    )
  batch_size = node_tokens.shape[0]
  if jnp.shape(node_valid) != node_tokens.shape:
    raise ValueError(
      f'node_valid must have the shape of node_tokens {node_tokens.shape}; got '
      f'{jnp.shape(node_valid)}.'
    )
  if target_probs.ndim != 3 or target_probs.shape[:2] != node_tokens.shape:
    raise ValueError(
      f'target_probs must have shape [B, N, V] = [{batch_size}, {tree.num_nodes}, V]; '
      f'got {target_probs.shape}.'
    )
  if draft_probs is not None and draft_probs.shape != target_probs.shape:
    raise ValueError(
      f"draft_probs must have target_probs' shape {target_probs.shape} (the target's "
      f'vocabulary); got {draft_probs.shape}.'
    )
  return batch_size
