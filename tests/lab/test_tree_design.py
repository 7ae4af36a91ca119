"""Tree design (`tree_design`): the expected accepted tokens of a tree at measured rates, and
the best tree of a node budget (checked against brute force over every small tree)."""

import numpy as np
import pytest

from speculative_t5x.tree import Tree
from speculative_t5x_lab import theory
from speculative_t5x_lab import tree_design


# --- Choosing a tree ----------------------------------------------------------


def _plane_trees(num_nodes):
  """Every ordered tree with num_nodes nodes, as nested child lists."""
  if num_nodes == 1:
    return [[]]
  return _forests(num_nodes - 1)


def _forests(num_nodes):
  """Every ordered forest with num_nodes nodes in all: lists of child lists."""
  if num_nodes == 0:
    return [[]]
  forests = []
  for first in range(1, num_nodes + 1):
    for head in _plane_trees(first):
      for rest in _forests(num_nodes - first):
        forests.append([head] + rest)
  return forests


def _all_trees(max_drafted):
  for drafted in range(1, max_drafted + 1):
    for children in _plane_trees(drafted + 1):
      yield tree_design._tree_from_children(children)  # pylint: disable=protected-access


RATES = {
  'decreasing': np.array([[0.8, 0.5, 0.3], [0.7, 0.4, 0.2], [0.6, 0.3, 0.1], [0.5, 0.3, 0.1]]),
  'later_rank_better': np.array([[0.1, 0.9, 0.5]] * 4),
  'random': np.random.default_rng(0).random((4, 3)),
}


@pytest.mark.parametrize('name', RATES)
def test_choose_tree_is_optimal_by_brute_force(name):
  rates = RATES[name]
  trees = list(_all_trees(6))
  assert len(trees) == 1 + 2 + 5 + 14 + 42 + 132  # Catalan numbers.
  for max_nodes in range(1, 7):
    for max_depth in (2, 4):
      allowed = [t for t in trees if t.num_drafted <= max_nodes and t.max_depth <= max_depth]
      best = max(tree_design.expected_accepted(t, rates) for t in allowed)
      chosen = tree_design.choose_tree(rates, max_nodes, max_depth)
      assert chosen.num_drafted <= max_nodes and chosen.max_depth <= max_depth
      assert tree_design.expected_accepted(chosen, rates) == pytest.approx(best, abs=1e-12)


def test_choose_tree_prefers_a_later_rank_when_it_is_worth_more():
  # Rank 1 accepts 0.9 * 0.9 = 0.81 of the time, rank 0 only 0.1: the best
  # two-node tree is two siblings (rank 0 as the price of rank 1), not a chain.
  rates = RATES['later_rank_better']
  assert tree_design.choose_tree(rates, 2).parents == (-1, 0, 0)
  assert tree_design.expected_accepted(Tree((-1, 0, 0)), rates) == pytest.approx(0.91)


@pytest.mark.parametrize('alpha', [0.3, 0.6, 0.9])
@pytest.mark.parametrize('gamma', [1, 3, 6])
def test_chain_expected_tokens_is_equation_1(alpha, gamma):
  rates = np.full((gamma, 1), alpha)
  expected = theory.expected_tokens(alpha, gamma)
  assert 1 + tree_design.expected_accepted(Tree.chain(gamma), rates) == pytest.approx(expected)
  assert tree_design.choose_tree(rates, gamma) == Tree.chain(gamma)
  assert 1 + tree_design.expected_accepted(Tree.chain(gamma), [alpha]) == pytest.approx(expected)


def test_choose_tree_is_monotone_in_budget():
  rates = np.array([[0.7, 0.4, 0.3, 0.2]] * 6)
  values = [
    tree_design.expected_accepted(tree_design.choose_tree(rates, budget), rates)
    for budget in range(1, 40)
  ]
  assert all(later >= earlier - 1e-12 for earlier, later in zip(values, values[1:]))
  assert values[-1] > values[0]
  assert tree_design.choose_tree(np.zeros((3, 2)), 5) == Tree.chain(1)
  assert tree_design.choose_tree([0.7, 0.4], 10, max_depth=3).max_depth <= 3
  # Rates [K] hold at every depth: only the budget bounds the depth.
  assert tree_design.choose_tree([0.7, 0.4], 10) == tree_design.choose_tree([[0.7, 0.4]] * 10, 10)
  assert tree_design.choose_tree([0.9], 4) == Tree.chain(4)


def test_rates_errors_name_the_problem():
  with pytest.raises(ValueError, match=r'probabilities in \[0, 1\]'):
    tree_design.expected_accepted(Tree.chain(1), [[1.5]])
  with pytest.raises(ValueError, match='cover depths 0..0.*needs 2'):
    tree_design.expected_accepted(Tree.chain(2), [[0.5]])
  with pytest.raises(ValueError, match='max_nodes must be an int >= 1'):
    tree_design.choose_tree([[0.5]], 0)


def test_acceptance_rates_from_counts():
  rates, stderr = tree_design.acceptance_rates_from_counts([[100, 40], [0, 0]], [[60, 10], [0, 0]])
  np.testing.assert_allclose(rates, [[0.6, 0.25], [0, 0]])
  np.testing.assert_allclose(stderr[0], [np.sqrt(0.24 / 100), np.sqrt(0.1875 / 40)])
  assert np.all(np.isnan(stderr[1]))
  with pytest.raises(ValueError, match='0 <= accepted <= reached'):
    tree_design.acceptance_rates_from_counts([[1]], [[2]])
  with pytest.raises(ValueError, match=r'shape \[D, K\]'):
    tree_design.acceptance_rates_from_counts([1], [1])
