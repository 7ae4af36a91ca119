"""Tests for speculative_t5x_lab.theory against the paper's numbers."""

import numpy as np
import pytest

from speculative_t5x_lab import theory

# Table 1 of the paper: (α, γ, speed, operations), computed with c = ĉ = 0
# (a draft of negligible cost), printed to two decimals.
TABLE_1 = [
  (0.6, 2, 1.96, 1.53),
  (0.7, 3, 2.53, 1.58),
  (0.8, 2, 2.44, 1.23),
  (0.8, 5, 3.69, 1.63),
  (0.9, 2, 2.71, 1.11),
  (0.9, 10, 6.86, 1.60),
]


@pytest.mark.parametrize('alpha, gamma, speed, operations', TABLE_1)
def test_table_1(alpha, gamma, speed, operations):
  assert round(float(theory.walltime_improvement(alpha, gamma, c=0.0)), 2) == (speed)
  assert round(float(theory.operations_factor(alpha, gamma, c_hat=0.0)), 2) == operations


def test_table_1_vectorized():
  alpha, gamma, speed, operations = map(np.array, zip(*TABLE_1))
  np.testing.assert_array_equal(np.round(theory.walltime_improvement(alpha, gamma, 0.0), 2), speed)
  np.testing.assert_array_equal(
    np.round(theory.operations_factor(alpha, gamma, 0.0), 2), operations
  )


def test_table_4_t5_small_prediction():
  # T5-small drafting for T5-XXL on EnDe at temperature 0: α = 0.75, c = 0.02,
  # γ = 7 predicts 3.2x (the paper measured 3.4x).
  assert round(float(theory.walltime_improvement(0.75, 7, 0.02)), 1) == 3.2


def test_expected_tokens_is_the_geometric_sum():
  alpha = np.linspace(0, 0.999, 50)[:, None]
  gamma = np.arange(0, 12)[None, :]
  direct = np.array([[sum(a**k for k in range(g + 1)) for g in gamma[0]] for a in alpha[:, 0]])
  np.testing.assert_allclose(theory.expected_tokens(alpha, gamma), direct, rtol=1e-12)


def test_expected_tokens_limit_at_alpha_one_has_no_nan():
  np.testing.assert_array_equal(theory.expected_tokens(1.0, [1, 3, 7]), [2, 4, 8])
  near_one = theory.expected_tokens(1 - 1e-12, 7)
  assert np.isfinite(near_one) and abs(near_one - 8) < 1e-9
  assert theory.expected_tokens(0.0, 5) == 1.0


def test_corollary_3_9_bound_at_gamma_one():
  alpha = np.linspace(0, 0.99, 20)[:, None]
  c = np.linspace(0, 1, 11)[None, :]
  np.testing.assert_allclose(
    theory.walltime_improvement(alpha, 1, c), (1 + alpha) / (1 + c), rtol=1e-12
  )
  # Speculative decoding helps at γ = 1 exactly when α > c.
  assert np.all((theory.walltime_improvement(alpha, 1, c) > 1) == (alpha > c))


def test_verify_cost_generalizes_theorem_3_8():
  np.testing.assert_allclose(
    theory.walltime_improvement(0.8, 4, 0.1, verify_cost=1.0),
    theory.walltime_improvement(0.8, 4, 0.1),
  )
  # A (γ+1)-token target call costing 1.5 one-token calls.
  np.testing.assert_allclose(
    theory.walltime_improvement(0.8, 4, 0.1, verify_cost=1.5),
    theory.expected_tokens(0.8, 4) / (4 * 0.1 + 1.5),
  )


def test_acceptance_by_position_generalizes_eq_1_and_theorem_3_8():
  alpha = np.linspace(0, 1, 11)[:, None]
  for gamma in (1, 3, 12):
    rates = np.broadcast_to(alpha, (11, gamma))
    np.testing.assert_allclose(
      theory.expected_tokens_by_position(rates), theory.expected_tokens(alpha[:, 0], gamma)
    )
    np.testing.assert_allclose(
      theory.walltime_improvement_by_position(rates, gamma * 0.1, verify_cost=1.2),
      theory.walltime_improvement(alpha[:, 0], gamma, 0.1, verify_cost=1.2),
    )
  # By hand: a rejection at position 1 ends the block whatever follows.
  assert theory.expected_tokens_by_position([0.5, 1.0, 1.0]) == 1 + 0.5 + 0.5 + 0.5
  assert theory.expected_tokens_by_position([0.0, 1.0]) == 1.0
  # A parallel draft: falling rates, one call's cost (1 + 0.8 + 0.4) / (0.1 + 1).
  np.testing.assert_allclose(
    theory.walltime_improvement_by_position([0.8, 0.5], 0.1), 2.2 / 1.1, rtol=1e-12
  )


def test_optimal_gamma_maximizes_the_improvement():
  alpha = np.array([0.5, 0.7, 0.8, 0.9, 0.95])[:, None]
  c = np.array([0.01, 0.05, 0.2])[None, :]
  best = theory.optimal_gamma(alpha, c)
  assert best.shape == (5, 3) and np.all(best >= 1)
  for gamma in range(1, 65):
    assert np.all(
      theory.walltime_improvement(alpha, best, c) >= theory.walltime_improvement(alpha, gamma, c)
    )
  # Hand-checked: α = 0.8, c = 0.05 -> γ = 8 (0.8656 / 0.28 = 3.092x; γ = 7
  # gives 3.082x, γ = 9 3.078x). With a free draft, more guesses always help.
  assert theory.optimal_gamma(0.8, 0.05) == 8
  assert theory.optimal_gamma(0.8, 0.0, max_gamma=20) == 20
  # Costlier drafts and costlier verify calls shift the optimum.
  assert theory.optimal_gamma(0.8, 0.2) < theory.optimal_gamma(0.8, 0.05)
  assert theory.optimal_gamma(
    0.8, 0.05, verify_cost=1 + 0.2 * np.arange(1, 65)
  ) < theory.optimal_gamma(0.8, 0.05)
  with pytest.raises(ValueError, match='max_gamma'):
    theory.optimal_gamma(0.8, 0.05, max_gamma=0)


def test_oracle_bounds_every_fixed_gamma():
  alpha = np.linspace(0, 0.99, 30)
  oracle = theory.oracle_expected_tokens(alpha)
  for gamma in (1, 5, 50):
    assert np.all(theory.expected_tokens(alpha, gamma) <= oracle)
  np.testing.assert_allclose(theory.expected_tokens(alpha, 10_000), oracle, rtol=1e-9)
  assert theory.oracle_expected_tokens(1.0) == np.inf


def test_acceptance_rate_by_hand():
  p = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
  q = np.array([[0.25, 0.25, 0.5], [0.0, 0.0, 1.0]])
  np.testing.assert_allclose(theory.acceptance_rate(p, q), [0.5, 0.0])
  np.testing.assert_allclose(theory.acceptance_rate(p, p), [1.0, 1.0])


def _simulated_iterations(rng, alpha, gamma, num_tokens):
  """Iterations of one row of the i.i.d. model to emit `num_tokens` tokens."""
  emitted, iterations = 0, 0
  while emitted < num_tokens:
    accepted = 0
    while accepted < gamma and rng.random() < alpha:
      accepted += 1
    emitted += accepted + 1
    iterations += 1
  return iterations


def test_expected_iterations_of_a_cut_row():
  # Without a cut the tokens per iteration tend to Eq. 1.
  alpha, gamma = 0.75, 3
  long = 20_000
  assert long / theory.expected_iterations(alpha, gamma, long) == pytest.approx(
    theory.expected_tokens(alpha, gamma), rel=1e-3
  )
  # alpha = 1: every iteration emits gamma + 1 tokens, the last one what is left.
  assert theory.expected_iterations(1.0, 3, 10) == 3
  # alpha = 0: one token per iteration.
  assert theory.expected_iterations(0.0, 5, 7) == 7
  # Two tokens, gamma 1: one iteration if the draft token is accepted, else two.
  assert theory.expected_iterations(0.6, 1, 2) == pytest.approx(0.6 * 1 + 0.4 * 2)
  # Monte Carlo of the i.i.d. model.
  rng = np.random.default_rng(0)
  counts = [_simulated_iterations(rng, alpha, gamma, 32) for _ in range(20_000)]
  assert np.mean(counts) == pytest.approx(theory.expected_iterations(alpha, gamma, 32), abs=0.05)


def test_batched_loops_run_until_their_slowest_row_ends():
  alpha, gamma = 0.8, 3
  lengths = [[10, 12, 30, 5], [7, 7, 7, 7]]
  rng = np.random.default_rng(1)
  runs = np.array(
    [
      [[_simulated_iterations(rng, alpha, gamma, n) for n in batch] for batch in lengths]
      for _ in range(5_000)
    ]
  )  # [runs, batches, rows]
  batch_iterations = runs.max(axis=2).sum(axis=1)  # Each batch runs as long as its slowest row.
  assert np.mean(batch_iterations) == pytest.approx(
    theory.expected_batch_iterations(alpha, gamma, lengths), abs=4 * np.std(batch_iterations) / 70
  )
  finished = 1 - runs.sum(axis=(1, 2)) / (4 * batch_iterations)
  assert np.mean(finished) == pytest.approx(
    theory.finished_row_share(alpha, gamma, lengths), abs=0.01
  )
  # The baseline's loop: one token per step, each batch as long as its longest row.
  assert theory.finished_row_share(alpha, 0, lengths) == pytest.approx(1 - 85 / (4 * 37))
  speedup = theory.batch_walltime_improvement(alpha, gamma, 0.05, 1.2, lengths)
  assert speedup == pytest.approx(
    37 / (theory.expected_batch_iterations(alpha, gamma, lengths) * (3 * 0.05 + 1.2))
  )
  # One unbounded row: Theorem 3.8.
  assert theory.batch_walltime_improvement(alpha, gamma, 0.05, 1.2, [[5_000]]) == pytest.approx(
    theory.walltime_improvement(alpha, gamma, 0.05, 1.2), rel=1e-3
  )
  # More rows per batch: the slowest row of more draws is slower, and more rows wait for it.
  wide = theory.batch_walltime_improvement(alpha, gamma, 0.05, 1.2, [[20] * 16])
  narrow = theory.batch_walltime_improvement(alpha, gamma, 0.05, 1.2, [[20]] * 16)
  assert wide < narrow


def test_replayed_greedy_batches_wait_for_their_slowest_row():
  iterations = np.array([[4, 12, 10], [2, 20, 2]])
  lengths = np.array([[10, 12, 30], [5, 48, 8]])
  speedup, finished = theory.replayed_batch_walltime_improvement(iterations, 3, 0.05, 1.2, lengths)
  # Batches run 12 and 20 iterations (their slowest rows) against 30 and 48 baseline steps.
  assert speedup == pytest.approx((30 + 48) / ((12 + 20) * (3 * 0.05 + 1.2)))
  assert finished == pytest.approx(1 - 50 / (3 * 32))
  # One row per batch: nothing waits.
  assert theory.replayed_batch_walltime_improvement(
    iterations.reshape(6, 1), 3, 0.05, 1.2, lengths.reshape(6, 1)
  )[1] == pytest.approx(0.0)
  with pytest.raises(ValueError, match='both be'):
    theory.replayed_batch_walltime_improvement(iterations.ravel(), 3, 0.05, 1.2, lengths)


def test_row_alphas_are_fitted_to_each_rows_iterations():
  gamma, lengths = 3, np.array([10, 12, 30, 5, 48, 8])
  iterations = np.array([4, 12, 10, 2, 20, 2])  # 12 of 12: nothing accepted; 2 of 8: all.
  alphas = theory.fit_row_alphas(gamma, lengths, iterations)
  expected = [theory.expected_iterations(a, gamma, n) for a, n in zip(alphas, lengths)]
  np.testing.assert_allclose(expected, iterations, rtol=1e-6)
  assert alphas[1] == pytest.approx(0.0, abs=1e-9) and alphas[5] == pytest.approx(1.0, abs=1e-6)
  # Rows of one alpha: the per-row model is the one-alpha model.
  same = np.full((2, 3), 0.7)
  lengths_by_batch = lengths.reshape(2, 3)
  assert theory.expected_batch_iterations(same, gamma, lengths_by_batch) == pytest.approx(
    theory.expected_batch_iterations(0.7, gamma, lengths_by_batch)
  )
  # Spread alphas of the same mean make the slowest row slower: more iterations per batch.
  spread = np.array([[0.4, 0.7, 1.0], [0.4, 0.7, 1.0]])
  assert theory.expected_batch_iterations(
    spread, gamma, [[20] * 3] * 2
  ) > theory.expected_batch_iterations(0.7, gamma, [[20] * 3] * 2)
  with pytest.raises(ValueError, match='shape of lengths_by_batch'):
    theory.expected_batch_iterations(np.full(6, 0.7), gamma, lengths_by_batch)


def test_choose_gamma_maximizes_the_predicted_speedup_over_the_measured_gammas():
  # v grows with gamma: the free-verify optimum (7 for alpha 0.9, c 0.05) moves down.
  verify_cost = {1: 1.0, 3: 1.2, 5: 2.0, 7: 3.0}
  c = {g: 0.05 for g in verify_cost}
  free_verify = theory.predicted_speedups(0.9, c, {g: 1.0 for g in verify_cost})
  assert theory.choose_gamma(free_verify) == 7
  predicted = theory.predicted_speedups(0.9, c, verify_cost)
  assert predicted == {
    g: theory.walltime_improvement(0.9, g, 0.05, v) for g, v in verify_cost.items()
  }
  assert theory.choose_gamma(predicted) == 3 == max(predicted, key=predicted.get)
  assert theory.choose_gamma({5: 1.2, 3: 1.2, 7: 1.1}) == 3  # A tie goes to the smaller gamma.
  with pytest.raises(ValueError, match='at least one gamma'):
    theory.choose_gamma({})
