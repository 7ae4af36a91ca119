"""The benchmarks' emulated acceptance: a judge the lab passes through the loop's `judge=`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import models
from speculative_t5x import settings
from speculative_t5x.tree import Tree
from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import emulation
from speculative_t5x_lab import tree_design
from testing_utils import padded_inputs, tiny_model

TARGET = tiny_model(seed=0)
DRAFT = tiny_model(seed=1)


def test_the_judge_is_static_its_rates_a_float_or_a_tuple():
  judge = emulation.EmulatedJudge(np.float64(0.7))
  assert judge.rates == 0.7 and type(judge.rates) is float
  by_rank = emulation.EmulatedJudge(np.array([0.9, 0.5]))
  assert by_rank.rates == (0.9, 0.5) and all(type(rate) is float for rate in by_rank.rates)
  # Hashable, compared by value: equal rates compile once, others apart.
  assert judge == emulation.EmulatedJudge(0.7) and hash(judge) == hash(emulation.EmulatedJudge(0.7))
  assert by_rank != emulation.EmulatedJudge((0.9, 0.4))
  assert emulation.judge_at(None) is None and emulation.judge_at(0.7) == judge


@pytest.mark.parametrize(
  'fields, rates, message',
  [
    (dict(tree=(2, 2)), 0.7, 'an acceptance rate per sibling rank, 2 of them'),
    (dict(tree=(2, 2)), (0.7, 1.5), r'must lie in \[0, 1\]'),
    (dict(gamma=2), (0.7, 0.3), 'for a chain is one acceptance rate'),
    (dict(gamma=2), 1.5, r'must lie in \[0, 1\]'),
  ],
)
def test_rates_that_do_not_fit_are_refused_when_the_decoder_is_made(fields, rates, message):
  with pytest.raises(ValueError, match=message):
    models.make_decoder(TARGET, DRAFT, judge=emulation.EmulatedJudge(rates), **fields)
  with pytest.raises(ValueError, match=message):
    emulation.EmulatedJudge(rates).check(settings.SpeculativeSettings(**fields))


@pytest.mark.parametrize(
  'rates, message',
  [
    (0.7, r'needs an acceptance rate per sibling rank, 2 of them'),
    ((0.7,), r'needs an acceptance rate per sibling rank, 2 of them'),
    ((0.7, 1.5), r'must lie in \[0, 1\]'),
  ],
)
def test_tree_rates_name_the_problem(rates, message):
  with pytest.raises(ValueError, match=message):
    emulation.tree_rates(rates, Tree.from_branching((2, 1)))


def test_the_chain_rule_accepts_leading_successes_at_the_rate():
  """Timing only: i.i.d. acceptance at alpha, the count of leading successes, never past a row's
  draft; beta is alpha."""
  rows, gamma, vocab, alpha = 20_000, 4, 5, 0.6
  draft_tokens = jnp.zeros((rows, gamma), jnp.int32)
  target_probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (rows, gamma + 1, vocab)))
  num_drafted = jnp.full((rows,), 3, jnp.int32)
  num_accepted, next_token, beta = jax.jit(
    emulation.verify_chain, static_argnames=('alpha', 'one_hot_target')
  )(jax.random.key(1), draft_tokens, target_probs, alpha=alpha, num_drafted=num_drafted)
  counts = np.bincount(np.asarray(num_accepted), minlength=gamma + 1)
  expected = rows * np.array([1 - alpha, alpha * (1 - alpha), alpha**2 * (1 - alpha), alpha**3, 0])
  np.testing.assert_allclose(counts, expected, atol=5 * np.sqrt(rows * 0.25))
  np.testing.assert_allclose(np.asarray(beta), alpha)
  assert next_token.shape == (rows,) and np.all(np.asarray(next_token) < vocab)


@pytest.mark.parametrize('one_hot_target', [False, True])
def test_the_tree_rule_accepts_each_rank_at_its_rate(one_hot_target):
  """Timing only: rank r is accepted at rates[r] after ranks < r were rejected, i.i.d. per node."""
  tree, rows, vocab_size, rates = Tree.from_branching((3, 2)), 20_000, 6, (0.7, 0.4, 0.2)
  node_tokens = jnp.tile(jnp.arange(tree.num_nodes, dtype=jnp.int32) % vocab_size, (rows, 1))
  node_valid = jnp.ones((rows, tree.num_nodes), bool).at[:, 3].set(False)  # Root's 3rd child.
  target_probs = jax.nn.softmax(
    jax.random.normal(jax.random.key(0), (rows, tree.num_nodes, vocab_size)), axis=-1
  )
  judgement = jax.jit(emulation.verify_tree, static_argnames=('tree', 'one_hot_target', 'rates'))(
    jax.random.key(1),
    tree,
    node_tokens,
    node_valid,
    target_probs,
    rates=rates + (0.9,),  # Ranks past the tree's are unused.
    one_hot_target=one_hot_target,
  )
  measured, stderr = tree_design.acceptance_rates_from_counts(
    *tree_design.rank_counts(judgement, tree.max_children)
  )
  # Depth 0: ranks 0 and 1 at their rates, the invalid rank 2 never; depth 1: two ranks.
  np.testing.assert_allclose(measured[0], [0.7, 0.4, 0.0], atol=4 * np.nanmax(stderr[0]))
  np.testing.assert_allclose(measured[1, :2], [0.7, 0.4], atol=4 * np.nanmax(stderr[1]))
  assert np.all(np.asarray(judgement.accepted_rank[:, 0]) != 2)
  np.testing.assert_allclose(np.asarray(judgement.beta)[np.asarray(judgement.judged)], 0.7)
  if one_hot_target:  # The token after the walk is p's argmax at the node where it stopped.
    stop = np.asarray(judgement.path)[np.arange(rows), np.asarray(judgement.num_accepted)]
    argmax = np.argmax(np.asarray(target_probs)[np.arange(rows), stop], axis=-1)
    np.testing.assert_array_equal(judgement.next_token, argmax)


@pytest.mark.parametrize(
  'rates, iterations', [((1.0, 0.0), 3), pytest.param((0.0, 0.0), 8, marks=pytest.mark.slow)]
)
def test_an_emulated_tree_accepts_at_its_rates(rates, iterations):
  """Rank 0 always accepted: depth + 1 = 3 tokens per call (8 tokens in 3 calls); never
  accepted: one token per call. eos_id -1: rows run to the full length."""
  inputs = padded_inputs(0, 2, 6, TARGET.vocab_size)
  out = models.generate(
    TARGET,
    DRAFT,
    inputs,
    tree=(2, 2),
    max_decode_len=8,
    eos_id=-1,
    judge=emulation.EmulatedJudge(rates),
  )
  np.testing.assert_array_equal(out.stats.iterations, [iterations, iterations])
  np.testing.assert_array_equal(out.stats.emitted, [8, 8])
  assert out.stats.record == ()  # It records nothing.


def test_equal_judges_made_apart_share_one_compiled_program():
  inputs = padded_inputs(0, 2, 6, TARGET.vocab_size)
  kwargs = dict(gamma=2, max_decode_len=6, eos_id=-1)
  judge = lambda: acceptance_counts.AcceptanceCounts(emulation.EmulatedJudge(0.5))
  first = models.generate(TARGET, DRAFT, inputs, judge=judge(), **kwargs)
  compiled = models._generate._cache_size()  # pylint: disable=protected-access
  second = models.generate(TARGET, DRAFT, inputs, judge=judge(), **kwargs)
  assert models._generate._cache_size() == compiled  # pylint: disable=protected-access
  np.testing.assert_array_equal(second.tokens, first.tokens)
  assert int(second.stats.record.accepted_histogram.sum()) == int(second.stats.iterations.sum())
