"""Tests for speculative_t5x.tree (tree drafting, verification and choice)."""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative_t5x import speculative_sampling as spec
from speculative_t5x import tree as tree_lib
from speculative_t5x.tree import Tree
from speculative_t5x_lab import tree_design

verify_tree = jax.jit(tree_lib.verify_tree, static_argnames=('tree', 'one_hot_target'))

# A tree that is not uniform per depth: the root's three children have two,
# none and one child.
NON_UNIFORM = Tree((-1, 0, 0, 0, 1, 1, 3))


@pytest.fixture
def x64():
  """Float64 JAX inside the test only (the flag is restored afterwards)."""
  with jax.enable_x64(True):
    yield


# --- Structure ---------------------------------------------------------------


def test_tree_2_1_by_hand():
  tree = Tree.from_branching((2, 1))
  assert tree.parents == (-1, 0, 0, 1, 2)
  assert (tree.num_nodes, tree.num_drafted, tree.max_depth, tree.max_children) == (5, 4, 2, 2)
  np.testing.assert_array_equal(tree.depths, [0, 1, 1, 2, 2])
  np.testing.assert_array_equal(tree.children, [[1, 2], [3, -1], [4, -1], [-1, -1], [-1, -1]])
  np.testing.assert_array_equal(tree.num_children, [2, 1, 1, 0, 0])
  np.testing.assert_array_equal(tree.ranks, [0, 0, 1, 0, 0])
  assert tree.levels == ((0, 1), (1, 3), (3, 5))
  np.testing.assert_array_equal(tree.internal, [0, 1, 2])
  np.testing.assert_array_equal(
    tree.ancestors.astype(int),
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
  )
  assert tree.branching == (2, 1)
  assert str(tree) == tree.describe() == 'tree branching (2, 1): 4 drafted, depth 2, widths 2/2'
  assert tree.depths.dtype == np.int32 and tree.children.dtype == np.int32
  with pytest.raises(ValueError):
    tree.depths[0] = 1  # Cached arrays are read-only.


def test_tree_2_2_and_3_1_by_hand():
  tree = Tree.from_branching((2, 2))
  assert tree.parents == (-1, 0, 0, 1, 1, 2, 2)
  np.testing.assert_array_equal(tree.ranks, [0, 0, 1, 0, 1, 0, 1])
  np.testing.assert_array_equal(tree.children[:3], [[1, 2], [3, 4], [5, 6]])
  assert tree.levels == ((0, 1), (1, 3), (3, 7))
  tree = Tree.from_branching((3, 1))
  assert tree.parents == (-1, 0, 0, 0, 1, 2, 3)
  np.testing.assert_array_equal(tree.ranks, [0, 0, 1, 2, 0, 0, 0])
  np.testing.assert_array_equal(tree.children[0], [1, 2, 3])
  np.testing.assert_array_equal(tree.children[3], [6, -1, -1])
  assert Tree.from_branching((3, 2, 1, 1)).num_nodes == 22


def test_chain_by_hand():
  chain = Tree.chain(3)
  assert chain == Tree.from_branching((1, 1, 1)) and chain.parents == (-1, 0, 1, 2)
  np.testing.assert_array_equal(chain.children, [[1], [2], [3], [-1]])
  np.testing.assert_array_equal(chain.ancestors, np.tril(np.ones((4, 4), bool)))
  assert chain.branching == (1, 1, 1) and chain.max_depth == 3


def test_non_uniform_tree_by_hand():
  tree = NON_UNIFORM
  np.testing.assert_array_equal(tree.depths, [0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(tree.num_children, [3, 2, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(tree.ranks, [0, 0, 1, 2, 0, 1, 0])
  np.testing.assert_array_equal(tree.children[1], [4, 5, -1])
  np.testing.assert_array_equal(tree.children[3], [6, -1, -1])
  np.testing.assert_array_equal(tree.internal, [0, 1, 3])
  assert tree.branching is None
  assert tree.describe() == 'tree parents (-1, 0, 0, 0, 1, 1, 3): 6 drafted, depth 2, widths 3/3'
  assert tree.ancestors[6].tolist() == [True, False, False, True, False, False, True]


@pytest.mark.parametrize(
  'parents, message',
  [
    ((-1,), 'at least one drafted node'),
    ((0, 0), r'parents\[0\] = -1'),
    ((-1, 2, 0), r'0 <= parents\[i\] < i.*parents\[1\] = 2'),
    ((-1, 0, 1, 0), 'breadth-first order.*node 3 has depth 1 after node 2 at depth 2'),
    ((-1, 0, 0, 2, 1), 'contiguous.*node 4 \\(a child of 1\\) comes after node 3'),
  ],
)
def test_invalid_trees_name_the_problem(parents, message):
  with pytest.raises(ValueError, match=message):
    Tree(parents)


def test_invalid_arguments_name_the_problem():
  with pytest.raises(TypeError, match='sequence of ints'):
    Tree('3,2')
  with pytest.raises(TypeError, match='must hold ints'):
    Tree((-1, 0.0))
  with pytest.raises(ValueError, match='ints >= 1'):
    Tree.from_branching((2, 0))
  with pytest.raises(ValueError, match='gamma >= 1'):
    Tree.chain(0)
  with pytest.raises(ValueError, match="comma-separated.*'3;2'"):
    Tree.parse('3;2')
  with pytest.raises(ValueError, match="'parents' or 'branching'"):
    Tree.parse({'parent': [-1, 0]})
  with pytest.raises(ValueError, match=r'\(1,\) \* γ'):
    Tree.parse(4)


def test_parse_and_hash():
  tree = Tree.from_branching((3, 2, 1, 1))
  assert Tree.parse('3,2,1,1') == Tree.parse([3, 2, 1, 1]) == Tree.parse((3, 2, 1, 1)) == tree
  assert Tree.parse(' 3, 2,1,1 ') == tree and Tree.parse(tree) is tree
  assert Tree.parse({'branching': (3, 2, 1, 1)}) == tree
  assert Tree.parse({'parents': list(NON_UNIFORM.parents)}) == NON_UNIFORM
  assert Tree([-1, 0, 0]).parents == (-1, 0, 0)  # A list becomes a tuple.
  assert hash(Tree((-1, 0, 0))) == hash(Tree.from_branching((2,)))
  assert len({Tree.chain(2), Tree.chain(2), Tree.chain(3)}) == 2


# --- Drawing children ---------------------------------------------------------


def _ordered_draw_probability(q, tokens):
  """Probability of drawing `tokens` in this order from q without replacement."""
  prob, left = 1.0, 1.0
  for token in tokens:
    prob *= q[token] / left
    left -= q[token]
  return prob


def test_draw_children_is_sampling_without_replacement():
  q = np.array([0.4, 0.3, 0.2, 0.1])
  rows = 60_000
  tokens, valid = jax.jit(tree_lib.draw_children, static_argnames=('num_children', 'greedy'))(
    jax.random.key(5), jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, 4)), 3, greedy=False
  )
  assert tokens.shape == (rows, 3) and tokens.dtype == jnp.int32 and bool(jnp.all(valid))
  draws = list(itertools.permutations(range(4), 3))
  codes = np.asarray(tokens) @ np.array([16, 4, 1])
  counts = np.array([np.sum(codes == a * 16 + b * 4 + c) for a, b, c in draws])
  assert counts.sum() == rows  # Never a repeated token.
  expected = rows * np.array([_ordered_draw_probability(q, draw) for draw in draws])
  assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_draw_children_marks_draws_past_the_support_invalid():
  probs = jnp.array([[0.0, 0.7, 0.0, 0.3], [0.0, 0.0, 1.0, 0.0]])
  for greedy in (False, True):
    tokens, valid = tree_lib.draw_children(jax.random.key(0), probs, 3, greedy=greedy)
    np.testing.assert_array_equal(valid, [[True, True, False], [True, False, False]])
    assert set(np.asarray(tokens[0, :2]).tolist()) == {1, 3} and int(tokens[1, 0]) == 2
  tokens, _ = tree_lib.draw_children(None, probs, 3, greedy=True)
  np.testing.assert_array_equal(tokens, [[1, 3, 0], [2, 0, 1]])


def test_greedy_draw_ranks_with_ties_to_the_lower_id():
  probs = jnp.array([[0.1, 0.3, 0.3, 0.3], [0.5, 0.1, 0.2, 0.2]])
  tokens, valid = tree_lib.draw_children(None, probs, 3, greedy=True)
  np.testing.assert_array_equal(tokens, [[1, 2, 3], [0, 2, 3]])
  assert bool(jnp.all(valid))
  with pytest.raises(ValueError, match=r'num_children must lie in \[1, V\] = \[1, 4\]'):
    tree_lib.draw_children(None, probs, 5, greedy=True)


# --- Enumeration of one tree step ---------------------------------------------


def _normalized(weights):
  weights = np.asarray(weights, np.float64)
  return weights / weights.sum()


def _with_zeros(rng, probs):
  """probs with random entries zeroed (at least one kept), renormalized."""
  keep = rng.random(probs.shape[0]) < 0.55
  keep[rng.integers(probs.shape[0])] = True
  return _normalized(np.where(keep, probs, 0))


def _pair(case, rng, vocab_size):
  """(p, q) at one prefix, float64, for a case of where exactness could break."""
  p = rng.dirichlet(np.ones(vocab_size))
  q = rng.dirichlet(np.ones(vocab_size))
  if case == 'near_tied':
    return p, _normalized(p * (1 + 1e-9 * rng.standard_normal(vocab_size)))
  if case == 'zero_holding':
    return _with_zeros(rng, p), _with_zeros(rng, q)
  if case == 'equal':
    return p, p
  if case == 'disjoint':
    order = rng.permutation(vocab_size)
    half = vocab_size // 2
    return _normalized(np.isin(np.arange(vocab_size), order[:half]) * p), _normalized(
      np.isin(np.arange(vocab_size), order[half:]) * q
    )
  return p, q


def _tables(case, vocab_size, depth, seed):
  """Conditional tables {prefix: p(.|prefix)} and {prefix: q(.|prefix)}, lengths 0..depth."""
  rng = np.random.default_rng(seed)
  target, draft = {}, {}
  for length in range(depth + 1):
    for prefix in itertools.product(range(vocab_size), repeat=length):
      target[prefix], draft[prefix] = _pair(case, rng, vocab_size)
  return target, draft


def _ordered_draws(q, k, deterministic):
  """[(tokens, valid, probability)]: every ordered draw of k children from q.

  Sampled: without replacement over q's support, then (past the support)
  invalid fillers, the lowest unused ids, as `draw_children` gives them.
  Deterministic: the single draw of q's top k (ties to the lower id).
  """
  support = [x for x in range(len(q)) if q[x] > 0]
  if deterministic:
    top = sorted(range(len(q)), key=lambda x: (-q[x], x))[:k]
    return [(tuple(top), tuple(q[x] > 0 for x in top), 1.0)]
  draws = []
  for head in itertools.permutations(support, min(k, len(support))):
    fillers = [x for x in range(len(q)) if x not in head][: k - len(head)]
    valid = (True,) * len(head) + (False,) * len(fillers)
    draws.append((head + tuple(fillers), valid, _ordered_draw_probability(q, head)))
  return draws


_node_outcome_probabilities = jax.jit(tree_lib.node_outcome_probabilities)


def library_rule(p, q, tokens, valid):
  """The library's per-node probabilities for a batch of draws, as float64 numpy.

  The batch is padded to 64 draws (V!/(V-K)! <= 60 here), so that one program
  serves every node of a given vocabulary and number of children.
  """
  pad = lambda x: np.concatenate([x, np.repeat(x[:1], 64 - len(x), axis=0)])
  accept, residual = _node_outcome_probabilities(
    pad(p), None if q is None else pad(q), pad(tokens), pad(valid)
  )
  assert accept.dtype == jnp.float64
  return np.asarray(accept)[: len(p)], np.asarray(residual)[: len(p)]


def reference_rule(p, q, tokens, valid, update_draft=True, update_residual=True):
  """An independent numpy statement of recursive rejection sampling at a node.

  update_draft=False is with-replacement acceptance used for a
  without-replacement draw (q' never loses the rejected tokens);
  update_residual=False judges every sibling against the original p and takes
  the residual only once, after the last one. Both are wrong.
  """
  accepts, residuals = [], []
  for row in range(len(tokens)):
    target = p[row].copy()
    draft = None if q is None else q[row].copy()
    proposal, accept = target, []
    for token, ok in zip(tokens[row], valid[row]):
      if not ok:
        accept.append(0.0)
        continue
      current = np.eye(len(target))[token] if draft is None else draft.copy()
      accept.append(
        0.0
        if target[token] == 0
        else 1.0
        if target[token] >= current[token]
        else target[token] / current[token]
      )
      excess = np.maximum(target - current, 0)
      proposal = excess / excess.sum() if excess.sum() > 8 * np.finfo(float).eps else target
      if update_residual:
        target = proposal
      if draft is not None and update_draft:
        draft[token] = 0
        draft = draft / draft.sum() if draft.sum() > 0 else draft
    accepts.append(accept)
    residuals.append(target if update_residual else proposal)
  return np.array(accepts), np.array(residuals)


def emitted_blocks(tree, target, draft, rule=library_rule, deterministic=False):
  """{block: probability} of what one `verify_tree` step emits, by enumeration.

  A block is the accepted tokens then the next token. Every ordered draw at
  every node the walk can reach is enumerated with its probability, and every
  acceptance outcome with `rule`'s probabilities (the library's own by
  default). A node's subtree is drawn from its own prefix, independently of
  its siblings' subtrees, so the walk below an accepted child is enumerated
  once per (node, prefix).
  """
  vocab_size = len(target[()])
  memo = {}

  def walk(node, prefix):
    if (node, prefix) in memo:
      return memo[(node, prefix)]
    kids = [kid for kid in tree.children[node] if kid >= 0]
    blocks = collections.defaultdict(float)
    if not kids:
      for y in range(vocab_size):
        blocks[(y,)] += target[prefix][y]
      memo[(node, prefix)] = blocks
      return blocks
    draws = _ordered_draws(draft[prefix], len(kids), deterministic)
    tokens = np.array([d[0] for d in draws])
    valid = np.array([d[1] for d in draws])
    accept, residual = rule(
      np.broadcast_to(target[prefix], (len(draws), vocab_size)),
      None if deterministic else np.broadcast_to(draft[prefix], (len(draws), vocab_size)),
      tokens,
      valid,
    )
    for (draw, _, weight), accept_row, residual_row in zip(draws, accept, residual):
      all_rejected = 1.0
      for kid, token, a in zip(kids, draw, accept_row):
        if all_rejected * a > 0:
          for block, prob in walk(kid, prefix + (token,)).items():
            blocks[(token,) + block] += weight * all_rejected * a * prob
        all_rejected *= 1 - a
      for y in range(vocab_size):
        blocks[(y,)] += weight * all_rejected * residual_row[y]
    memo[(node, prefix)] = blocks
    return blocks

  return dict(walk(0, ()))


def extended(blocks, target, length):
  """{sequence: probability}: each block completed to `length` tokens by the target."""
  sequences = collections.defaultdict(float)
  stack = list(blocks.items())
  while stack:
    sequence, prob = stack.pop()
    if len(sequence) == length:
      sequences[sequence] += prob
      continue
    for y, p in enumerate(target[sequence]):
      if p > 0:
        stack.append((sequence + (y,), prob * p))
  return sequences


def max_deviation_from_target(tree, target, draft, **kwargs):
  length = tree.max_depth + 1
  emitted = extended(emitted_blocks(tree, target, draft, **kwargs), target, length)
  expected = extended({(): 1.0}, target, length)
  return max(abs(emitted.get(s, 0.0) - expected.get(s, 0.0)) for s in set(emitted) | set(expected))


CASES = ['random', 'near_tied', 'zero_holding', 'equal', 'disjoint']
TREES = [
  (Tree.from_branching((2, 1)), 5),
  (Tree.from_branching((2, 2)), 4),
  (Tree.from_branching((3, 1)), 4),
  (Tree.from_branching((1, 1)), 4),
  (NON_UNIFORM, 4),
  (Tree.from_branching((3,)), 3),
]


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('tree, vocab_size', TREES, ids=[str(t.parents) for t, _ in TREES])
def test_tree_step_is_distributed_as_the_target_exactly(x64, tree, vocab_size, case):
  target, draft = _tables(case, vocab_size, tree.max_depth, seed=len(tree.parents) + vocab_size)
  assert max_deviation_from_target(tree, target, draft) < 1e-12


@pytest.mark.parametrize('case', ['random', 'zero_holding', 'disjoint'])
@pytest.mark.parametrize('tree', [Tree.from_branching((2, 2)), NON_UNIFORM], ids=str)
def test_deterministic_draft_tree_step_is_exact(x64, tree, case):
  """draft_probs=None: children are the draft's top k, each a one-hot proposal."""
  target, draft = _tables(case, 4, tree.max_depth, seed=11)
  assert max_deviation_from_target(tree, target, draft, deterministic=True) < 1e-12


def test_reference_rule_agrees_with_the_library(x64):
  rng = np.random.default_rng(2)
  p = rng.dirichlet(np.ones(5), size=6)
  q = np.stack([_with_zeros(rng, row) for row in rng.dirichlet(np.ones(5), size=6)])
  tokens = np.stack([rng.permutation(5)[:3] for _ in range(6)])
  valid = rng.random((6, 3)) < 0.8
  for draft in (q, None):
    for got, want in zip(
      library_rule(p, draft, tokens, valid), reference_rule(p, draft, tokens, valid)
    ):
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
  'broken',
  [{'update_draft': False}, {'update_residual': False}],
  ids=['no_q_update', 'no_p_update'],
)
def test_broken_rules_are_not_exact(x64, broken):
  """The enumeration detects each mistake a tree verifier is prone to."""
  tree = Tree.from_branching((2, 2))
  target, draft = _tables('random', 4, tree.max_depth, seed=3)

  def rule(*args):
    return reference_rule(*args, **broken)

  assert max_deviation_from_target(tree, target, draft) < 1e-12
  assert max_deviation_from_target(tree, target, draft, rule=rule) > 1e-3


# --- Monte Carlo of verify_tree against the enumeration ------------------------


def _flat_tables(tables, vocab_size, depth):
  """Tables as float32 arrays [V^L, V], one per prefix length L (base-V prefix index)."""
  return tuple(
    jnp.asarray(
      [tables[prefix] for prefix in itertools.product(range(vocab_size), repeat=length)],
      jnp.float32,
    )
    for length in range(depth + 1)
  )


def _draw_and_verify(key, target, draft, *, tree, rows, deterministic):
  """Draws `rows` trees from the draft's tables and verifies them against the target's."""
  vocab_size = target[0].shape[-1]
  draw_key, verify_key = jax.random.split(key)
  index = [jnp.zeros((rows,), jnp.int32)] + [None] * tree.num_drafted
  tokens = [jnp.zeros((rows,), jnp.int32)] + [None] * tree.num_drafted
  valid = [jnp.ones((rows,), bool)] + [None] * tree.num_drafted
  for node in tree.internal:
    kids = tree.children[node][tree.children[node] >= 0]
    q = draft[tree.depths[node]][index[node]]
    drawn, drawn_valid = tree_lib.draw_children(
      jax.random.fold_in(draw_key, node), q, len(kids), greedy=deterministic
    )
    for rank, kid in enumerate(kids):
      tokens[kid], valid[kid] = drawn[:, rank], drawn_valid[:, rank]
      index[kid] = index[node] * vocab_size + tokens[kid]
  at_nodes = lambda tables: jnp.stack(
    [tables[tree.depths[n]][index[n]] for n in range(tree.num_nodes)], axis=1
  )
  return tree_lib.verify_tree(
    verify_key,
    tree,
    jnp.stack(tokens, axis=1),
    jnp.stack(valid, axis=1),
    None if deterministic else at_nodes(draft),
    at_nodes(target),
    one_hot_target=False,
  )


def _block_codes(num_accepted, path_tokens, next_token, vocab_size):
  """One integer per emitted block (accepted tokens, then the next token)."""
  codes = np.zeros(num_accepted.shape, np.int64)
  for i in range(path_tokens.shape[1] + 1):
    accepted = path_tokens[:, i] if i < path_tokens.shape[1] else 0
    token = np.where(i < num_accepted, accepted, np.where(i == num_accepted, next_token, -1))
    codes += (token + 1) * (vocab_size + 1) ** i
  return codes


@pytest.mark.parametrize(
  'tree, case, deterministic, seed',
  [
    (Tree.from_branching((2, 2)), 'random', False, 21),
    # Seed 1 has drafts with fewer than 3 tokens of support: invalid children.
    (Tree.from_branching((3, 1)), 'zero_holding', False, 1),
    (NON_UNIFORM, 'random', True, 21),
  ],
  ids=['2_2_random', '3_1_zero_holding', 'non_uniform_deterministic'],
)
def test_verify_tree_matches_the_enumeration_by_monte_carlo(tree, case, deterministic, seed):
  vocab_size, rows = 4, 200_000
  target, draft = _tables(case, vocab_size, tree.max_depth, seed=seed)
  judgement = jax.jit(_draw_and_verify, static_argnames=('tree', 'rows', 'deterministic'))(
    jax.random.key(17),
    _flat_tables(target, vocab_size, tree.max_depth),
    _flat_tables(draft, vocab_size, tree.max_depth),
    tree=tree,
    rows=rows,
    deterministic=deterministic,
  )
  codes = _block_codes(
    np.asarray(judgement.num_accepted),
    np.asarray(judgement.path_tokens),
    np.asarray(judgement.next_token),
    vocab_size,
  )
  # Against the independent numpy rule (equal to the library's, and exact), so
  # that a wrong library rule fails here too, not only in the enumeration.
  blocks = emitted_blocks(tree, target, draft, rule=reference_rule, deterministic=deterministic)
  expected = collections.Counter()
  for block, prob in blocks.items():
    expected[sum((token + 1) * (vocab_size + 1) ** i for i, token in enumerate(block))] += prob
  observed = collections.Counter(codes.tolist())
  assert set(observed) <= {code for code, prob in expected.items() if prob > 0}
  cells = sorted((code for code in expected if expected[code] > 0), key=expected.get)
  big = [code for code in cells if expected[code] * rows >= 5]
  small = [code for code in cells if expected[code] * rows < 5]
  groups = [[code] for code in big] + ([small] if small else [])
  counts = np.array([sum(observed[code] for code in group) for group in groups], float)
  means = np.array([sum(expected[code] for code in group) for group in groups]) * rows
  assert stats.chisquare(counts, means * counts.sum() / means.sum()).pvalue > 1e-3
  assert len(groups) > 10


# --- Greedy, and the judgement's fields ---------------------------------------


def test_greedy_verification_by_hand():
  # Tree (2, 1): nodes 1, 2 are the root's candidates, 3 follows 1, 4 follows 2.
  tree = Tree.from_branching((2, 1))
  one_hot = jnp.eye(5, dtype=jnp.float32)
  tokens = jnp.array([[0, 3, 1, 2, 4], [0, 3, 1, 2, 4], [0, 3, 1, 2, 4]], jnp.int32)
  valid = jnp.array([[True] * 5, [True, True, False, True, True], [True] * 5])
  # Row 0: the target wants 1 (rank 1), then 4 (node 4 agrees), then 0.
  # Row 1: the same, but node 2 is invalid: nothing accepted, next token 1.
  # Row 2: the target wants 3 (rank 0), then 0 (node 3 drafted 2): one token.
  target = jnp.stack(
    [
      one_hot[jnp.array([1, 0, 4, 0, 0])],
      one_hot[jnp.array([1, 0, 4, 0, 0])],
      one_hot[jnp.array([3, 0, 0, 0, 0])],
    ]
  )
  draft = jnp.full((3, 5, 5), 0.2)
  for q in (draft, None):
    judgement = verify_tree(jax.random.key(0), tree, tokens, valid, q, target, one_hot_target=True)
    np.testing.assert_array_equal(judgement.path, [[0, 2, 4], [0, 0, 0], [0, 1, 1]])
    np.testing.assert_array_equal(judgement.num_accepted, [2, 0, 1])
    np.testing.assert_array_equal(judgement.next_token, [0, 1, 0])
    np.testing.assert_array_equal(judgement.path_tokens, [[1, 4], [0, 0], [3, 0]])
    np.testing.assert_array_equal(judgement.accepted_rank, [[1, 0], [-1, -1], [0, -1]])
    np.testing.assert_array_equal(judgement.judged, [[True, True], [True, False], [True, True]])
    np.testing.assert_array_equal(judgement.children_judged, [[2, 1], [1, 0], [1, 1]])
    np.testing.assert_array_equal(
      judgement.path_target_probs, target[jnp.arange(3)[:, None], judgement.path]
    )
    assert judgement.path.dtype == judgement.next_token.dtype == jnp.int32
  # beta: p at the rank-0 child's token without q; Σ min(p, q) = 0.2 with the uniform q.
  np.testing.assert_allclose(judgement.beta, [[0, 1], [0, 0], [1, 0]])
  sampled = verify_tree(jax.random.key(0), tree, tokens, valid, draft, target, one_hot_target=False)
  np.testing.assert_array_equal(sampled.next_token, [0, 1, 0])
  np.testing.assert_array_equal(sampled.path, [[0, 2, 4], [0, 0, 0], [0, 1, 1]])
  np.testing.assert_allclose(sampled.beta, [[0.2, 0.2], [0.2, 0], [0.2, 0.2]], rtol=1e-6)


def test_verify_tree_rows_depend_only_on_their_keys():
  """Reversing the rows and their keys reverses the results (one compiled shape)."""
  tree = Tree.from_branching((2, 2))
  rng = np.random.default_rng(0)
  target = jnp.asarray(rng.dirichlet(np.ones(6), size=(16, 7)), jnp.float32)
  draft = jnp.asarray(rng.dirichlet(np.ones(6), size=(16, 7)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 6, size=(16, 7)), jnp.int32)
  valid = jnp.ones((16, 7), bool)
  keys = jax.random.split(jax.random.key(3), 16)
  forward = verify_tree(keys, tree, tokens, valid, draft, target, one_hot_target=False)
  backward = verify_tree(
    keys[::-1], tree, tokens[::-1], valid, draft[::-1], target[::-1], one_hot_target=False
  )
  for got, want in zip(jax.tree.leaves(backward), jax.tree.leaves(forward)):
    np.testing.assert_array_equal(got, want[::-1])
  assert len(set(np.asarray(forward.num_accepted).tolist())) > 1


def test_verify_tree_shape_errors_name_the_problem():
  tree = Tree.from_branching((2,))
  tokens, valid = jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3), bool)
  probs = jnp.full((2, 3, 4), 0.25)
  with pytest.raises(ValueError, match=r'node_tokens must have shape \[B, N\] with N = 3'):
    tree_lib.verify_tree(None, tree, tokens[:, :2], valid, probs, probs, one_hot_target=False)
  with pytest.raises(ValueError, match='node_valid must have the shape'):
    tree_lib.verify_tree(None, tree, tokens, valid[:1], probs, probs, one_hot_target=False)
  with pytest.raises(ValueError, match=r'target_probs must have shape \[B, N, V\] = \[2, 3, V\]'):
    tree_lib.verify_tree(None, tree, tokens, valid, probs, probs[:, :2], one_hot_target=False)
  with pytest.raises(ValueError, match="draft_probs must have target_probs' shape"):
    tree_lib.verify_tree(None, tree, tokens, valid, probs[..., :3], probs, one_hot_target=False)
  with pytest.raises(TypeError, match='tree must be a Tree'):
    tree_lib.verify_tree(None, (2,), tokens, valid, probs, probs, one_hot_target=False)


# --- A chain is today's token verification -------------------------------------


def algorithm_1_blocks(gamma, target, draft):
  """{block: probability} of one `speculative_sampling.verify` step, by enumeration
  with its own functions: x_i ~ q_i, kept with acceptance_probability, else the
  residual; the bonus token from p after γ acceptances."""
  blocks = collections.defaultdict(float)
  stack = [((), 1.0)]
  while stack:
    prefix, weight = stack.pop()
    p = jnp.asarray(target[prefix])
    if len(prefix) == gamma:
      for y, py in enumerate(np.asarray(p)):
        blocks[prefix + (y,)] += weight * py
      continue
    q = jnp.asarray(draft[prefix])
    accept = np.asarray(spec.acceptance_probability(p, q))
    residual = np.asarray(spec.residual_distribution(p, q))
    rejected = float(np.sum(np.asarray(q) * (1 - accept)))
    for y in range(len(residual)):
      blocks[prefix + (y,)] += weight * rejected * residual[y]
    for x, kept in enumerate(np.asarray(q) * accept):
      if kept > 0:
        stack.append((prefix + (x,), weight * kept))
  return dict(blocks)


@pytest.mark.parametrize('case', CASES)
def test_chain_step_equals_algorithm_1_enumerated(x64, case):
  chain = Tree.chain(3)
  target, draft = _tables(case, 4, chain.max_depth, seed=5)
  tree_blocks = emitted_blocks(chain, target, draft)
  chain_blocks = algorithm_1_blocks(3, target, draft)
  for block in set(tree_blocks) | set(chain_blocks):
    assert abs(tree_blocks.get(block, 0.0) - chain_blocks.get(block, 0.0)) < 1e-13, block


def test_chain_greedy_equals_verify():
  rows, gamma, vocab_size = 64, 4, 5
  rng = np.random.default_rng(9)
  target_tokens = rng.integers(0, vocab_size, size=(rows, gamma + 1))
  # The draft agrees with the target 70% of the time: accepted lengths vary.
  agree = rng.random((rows, gamma)) < 0.7
  draft_tokens = np.where(
    agree, target_tokens[:, :gamma], rng.integers(0, vocab_size, (rows, gamma))
  )
  target = jnp.eye(vocab_size, dtype=jnp.float32)[target_tokens]
  draft = jnp.asarray(rng.dirichlet(np.ones(vocab_size), size=(rows, gamma)), jnp.float32)
  num_accepted, next_token = jax.jit(spec.verify, static_argnames='one_hot_target')(
    jax.random.key(0), jnp.asarray(draft_tokens, jnp.int32), draft, target, one_hot_target=True
  )
  chain = Tree.chain(gamma)
  node_tokens = jnp.asarray(np.pad(draft_tokens, ((0, 0), (1, 0))), jnp.int32)
  node_draft = jnp.pad(draft, ((0, 0), (0, 1), (0, 0)))
  for q in (node_draft, None):
    judgement = verify_tree(
      jax.random.key(1),
      chain,
      node_tokens,
      jnp.ones(node_tokens.shape, bool),
      q,
      target,
      one_hot_target=True,
    )
    np.testing.assert_array_equal(judgement.num_accepted, num_accepted)
    np.testing.assert_array_equal(judgement.next_token, next_token)
  assert len(set(np.asarray(num_accepted).tolist())) >= 3


def test_one_child_rule_is_algorithm_1(x64):
  rng = np.random.default_rng(4)
  p, q = jnp.asarray(rng.dirichlet(np.ones(6))), jnp.asarray(rng.dirichlet(np.ones(6)))
  accept, residual = tree_lib.node_outcome_probabilities(p, q, jnp.array([2]), jnp.array([True]))
  np.testing.assert_allclose(accept[0], spec.acceptance_probability(p[2], q[2]), rtol=0, atol=0)
  np.testing.assert_allclose(residual, spec.residual_distribution(p, q), rtol=0, atol=0)


def test_measured_rates_match_the_rule():
  """rank_counts over many rows recovers the rank-wise acceptance of one node."""
  tree, rows, vocab_size = Tree.from_branching((3,)), 100_000, 5
  rng = np.random.default_rng(8)
  p, q = rng.dirichlet(np.ones(vocab_size)), rng.dirichlet(np.ones(vocab_size))
  target, draft = {(): p, **{(x,): p for x in range(vocab_size)}}, {(): q}
  judgement = jax.jit(_draw_and_verify, static_argnames=('tree', 'rows', 'deterministic'))(
    jax.random.key(2),
    _flat_tables(target, vocab_size, 1),
    _flat_tables({**draft, **{(x,): q for x in range(vocab_size)}}, vocab_size, 1),
    tree=tree,
    rows=rows,
    deterministic=False,
  )
  reached, accepted = tree_design.rank_counts(judgement, tree.max_children)
  rates, stderr = tree_design.acceptance_rates_from_counts(reached, accepted)
  assert int(reached[0, 0]) == rows
  # The exact conditional rates: E[accept_r | ranks < r rejected].
  with jax.enable_x64(True):
    draws = _ordered_draws(q, 3, deterministic=False)
    accept, _ = library_rule(
      np.tile(p, (len(draws), 1)),
      np.tile(q, (len(draws), 1)),
      np.array([d[0] for d in draws]),
      np.array([d[1] for d in draws]),
    )
  weights = np.array([d[2] for d in draws])
  rejected_before = np.cumprod(np.pad(1 - accept, ((0, 0), (1, 0)), constant_values=1), axis=1)
  exact = (weights @ (rejected_before[:, :-1] * accept)) / (weights @ rejected_before[:, :-1])
  np.testing.assert_allclose(rates[0], exact, atol=5 * stderr[0].max())
