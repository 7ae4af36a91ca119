"""The lab's acceptance counts: a judge's record, consistent with the loop's own statistics."""

import jax
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import models
from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import benchmark
import markov
from test_decoding import run_speculative, speculative_fn
from testing_utils import padded_inputs, tiny_model

COUNTED = acceptance_counts.AcceptanceCounts()


def test_counts_of_a_chain_are_consistent_and_change_nothing():
  vocab, length, gamma = 6, 10, 3
  target = markov.MarkovTarget(markov.random_table(seed=11, num_positions=30, vocab_size=vocab))
  row_shift = np.arange(16) % 5
  draft = drafts.NgramDraft.fit([[2, 3, 4, 5, 1]], vocab)
  sample = dict(temperature=1.0, topk=0)
  exact = run_speculative(target, draft, {}, row_shift, length, gamma, **sample)
  decodes, log_probs, stats = run_speculative(
    target, draft, {}, row_shift, length, gamma, judge=COUNTED, **sample
  )
  np.testing.assert_array_equal(decodes, exact[0])  # The exact judge's keys, in its order.
  np.testing.assert_array_equal(log_probs, exact[1])
  counts = acceptance_counts.counts(stats)
  assert counts.accepted_histogram.sum() == stats.iterations.sum()
  assert counts.position_reached[0] == stats.iterations.sum()
  assert counts.position_accepted.sum() == stats.accepted.sum()
  assert np.all(counts.position_accepted <= counts.position_reached)
  assert int(counts.fully_accepted) == int(counts.accepted_histogram[-1])
  assert int(stats.beta_count) == int(counts.position_reached.sum())
  np.testing.assert_array_equal(counts.rank_accepted[:, 0], counts.position_accepted)
  with pytest.raises(TypeError, match='no acceptance counts'):
    acceptance_counts.counts(exact[2])


@pytest.mark.parametrize('verification', ['token', 'block'])
def test_counts_of_an_adaptive_draft_length(verification):
  """Rows draft 1..gamma tokens; only those are judged and counted."""
  vocab, length, gamma = 6, 12, 5
  table = markov.random_table(seed=11, num_positions=30, vocab_size=vocab, scale=3.0)
  target = markov.MarkovTarget(table)
  row_shift = np.arange(16) % 7
  draft = markov.MarkovDraft(target.table * 0.7)  # Less sure than the target.
  run = speculative_fn(
    target,
    target.cache(row_shift),
    row_shift,
    length,
    gamma,
    draft_threshold=0.6,
    judge=COUNTED,
    temperature=1.0,
    topk=0,
  )
  _, _, stats = run(jax.random.PRNGKey(3), draft)
  counts = stats.record
  drafted, iterations = np.asarray(stats.drafted[:, 0]), np.asarray(stats.iterations[:, 0])
  assert int(counts.position_reached[0]) == iterations.sum()
  assert np.all(np.diff(np.asarray(counts.position_reached)) <= 0)
  assert counts.position_accepted.sum() == stats.accepted.sum() < drafted.sum()
  assert counts.accepted_histogram.sum() == iterations.sum()
  assert int(stats.beta_count) == int(counts.position_reached.sum())
  assert 0 < int(counts.fully_accepted) < iterations.sum()


def test_counts_of_a_tree_by_rank():
  target, draft = tiny_model(seed=0), tiny_model(seed=1)
  inputs = padded_inputs(0, 8, 9, target.vocab_size)
  kwargs = dict(temperature=1.0, max_decode_len=12, tree=(3, 2), rng=jax.random.PRNGKey(2))
  exact = models.generate(target, draft, inputs, **kwargs)
  out = models.generate(target, draft, inputs, judge=COUNTED, **kwargs)
  np.testing.assert_array_equal(out.tokens, exact.tokens)
  counts = out.stats.record
  assert counts.rank_judged.shape == (2, 3)
  assert np.asarray(counts.rank_accepted).sum() == np.asarray(out.stats.accepted).sum()
  assert np.all(counts.rank_accepted <= counts.rank_judged)
  # Rank r is judged only after ranks < r were rejected.
  assert np.all(np.diff(np.asarray(counts.rank_judged), axis=1) <= 0)
  assert counts.acceptance_by_rank.shape == (2, 3)


def test_batches_join_by_summing_the_counts():
  stats = [
    decoding.SpeculativeStats.zeros(2, acceptance_counts.Counts.zeros(3)),
    decoding.SpeculativeStats.zeros(1, acceptance_counts.Counts.zeros(3)),
  ]
  stats[0] = stats[0].replace(record=stats[0].record.replace(accepted_histogram=np.arange(4)))
  stats[1] = stats[1].replace(record=stats[1].record.replace(accepted_histogram=np.ones(4)))
  joined = benchmark._join_stats(stats)  # pylint: disable=protected-access
  assert joined.iterations.shape == (3,)
  np.testing.assert_array_equal(joined.record.accepted_histogram, [1, 2, 3, 4])
  assert benchmark._join_stats([decoding.SpeculativeStats.zeros(1)]).record == ()  # pylint: disable=protected-access
