"""The paper's analytical model of speculative decoding (Leviathan et al., 2023).

α is the expected acceptance rate, γ the number of draft tokens per iteration,
c the walltime of one draft step relative to one target step, ĉ the same ratio
in arithmetic operations. Under the paper's i.i.d. assumption on β:

  expected tokens per target call   (1 − α^{γ+1}) / (1 − α)           Eq. 1
  walltime improvement              Eq. 1 / (γc + 1)                  Thm 3.8
  operations increase               (γĉ + γ + 1) / Eq. 1              Thm 3.11
  γ = 1 lower bound                 (1 + α) / (1 + c)                 Cor 3.9
  γ-oracle expected tokens          1 / (1 − α)                       Sec 3.5

Theorem 3.8 assumes a target call on γ+1 tokens costs as much as one on a
single token, true on memory-bound accelerators. `walltime_improvement` takes
that cost ratio as `verify_cost` (v), predicting Eq. 1 / (γc + v); v = 1 is
the paper's assumption, and on CPUs v is measured.

Every function is vectorized: arguments are numpy arrays (or scalars, or
anything numpy converts) that broadcast together; results are numpy arrays.
"""

from typing import Dict, Mapping

import numpy as np


def acceptance_rate(p, q) -> np.ndarray:
  """β = Σ_x min(p(x), q(x)) = 1 − D_LK(p, q) (Theorem 3.5).

  Args:
    p: float [..., V], target distributions.
    q: float [..., V], draft distributions.

  Returns:
    float [...]; α is the mean of β over the prefixes of interest.
  """
  return np.sum(np.minimum(np.asarray(p), np.asarray(q)), axis=-1)


def expected_tokens(alpha, gamma) -> np.ndarray:
  """Eq. 1: expected tokens per iteration, (1 − α^{γ+1}) / (1 − α).

  Computed as expm1((γ+1)·log α) / (α − 1), accurate as α → 1, where it tends
  to γ + 1 (returned exactly at α = 1).

  Args:
    alpha: float array-like in [0, 1].
    gamma: int array-like >= 0.

  Returns:
    float64 array, the broadcast shape of alpha and gamma.
  """
  alpha = np.asarray(alpha, dtype=np.float64)
  calls = np.asarray(gamma, dtype=np.float64) + 1
  with np.errstate(divide='ignore', invalid='ignore'):
    geometric_sum = np.expm1(calls * np.log(alpha)) / (alpha - 1)
  return np.where(alpha == 1, calls, geometric_sum)


def expected_iterations(alpha: float, gamma: int, num_tokens: int) -> float:
  """Expected iterations to emit exactly `num_tokens` tokens (a row cut at a length).

  Eq. 1 counts the tokens of an uncut iteration; a row that must stop at
  `num_tokens` (no EOS) emits fewer in its last iteration, so its tokens per
  call are `num_tokens / expected_iterations(...)`, below Eq. 1. Under the
  i.i.d. assumption an iteration emits k tokens with probability
  α^{k−1}(1 − α) for k ≤ γ and α^γ for k = γ + 1, and the last one is cut:
  E(n) = 1 + Σ_k P(k) E(n − k), with E(n) = 0 for n ≤ 0.

  Args:
    alpha: float in [0, 1].
    gamma: int >= 1.
    num_tokens: int >= 0.
  """
  emit = np.array(
    [alpha ** (k - 1) * (1 - alpha) for k in range(1, gamma + 1)] + [alpha**gamma], dtype=np.float64
  )
  iterations = np.zeros(num_tokens + 1)
  for n in range(1, num_tokens + 1):
    remaining = np.maximum(n - np.arange(1, gamma + 2), 0)
    iterations[n] = 1 + np.dot(emit, iterations[remaining])
  return float(iterations[num_tokens])


def walltime_improvement(alpha, gamma, c, verify_cost=1.0) -> np.ndarray:
  """Theorem 3.8: expected walltime speedup over one-token-at-a-time decoding.

  Args:
    alpha: expected acceptance rate in [0, 1].
    gamma: draft tokens per iteration (int >= 1).
    c: walltime of one draft step / walltime of one target step.
    verify_cost: walltime of one target call on γ+1 tokens / one target step
      (v). The paper assumes v = 1; pass a measured v on hardware where the
      wider target call is not free.

  Returns:
    float64 array: expected_tokens(α, γ) / (γ·c + v).
  """
  return expected_tokens(alpha, gamma) / iteration_walltime(gamma, c, verify_cost)


def iteration_walltime(gamma, c, verify_cost=1.0) -> np.ndarray:
  """Theorem 3.8's cost of one iteration, in target steps: γ draft steps and one target call.

  Tokens per target call divided by it is the speedup: with Eq. 1's expected
  tokens, `walltime_improvement`; with tokens per call measured, the same
  prediction without Eq. 1's assumptions (rows that end at EOS cut their
  last block).

  Args:
    gamma: draft tokens per iteration (int >= 1).
    c: walltime of one draft step / walltime of one target step.
    verify_cost: walltime of one target call on γ+1 tokens / one target step.

  Returns:
    float64 array: γ·c + v.
  """
  return np.asarray(gamma) * np.asarray(c, dtype=np.float64) + verify_cost


def operations_factor(alpha, gamma, c_hat) -> np.ndarray:
  """Theorem 3.11: total arithmetic operations relative to plain decoding.

  Args:
    alpha: expected acceptance rate in [0, 1].
    gamma: draft tokens per iteration (int >= 1).
    c_hat: operations per draft token / operations per target token.

  Returns:
    float64 array: (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1}).
  """
  gamma = np.asarray(gamma)
  return (gamma * np.asarray(c_hat, dtype=np.float64) + gamma + 1) / (expected_tokens(alpha, gamma))


def optimal_gamma(alpha, c, max_gamma: int = 64, verify_cost=1.0) -> np.ndarray:
  """The integer γ in [1, max_gamma] maximizing `walltime_improvement`.

  Args:
    alpha: expected acceptance rate in [0, 1].
    c: draft/target walltime ratio.
    max_gamma: the largest γ considered.
    verify_cost: v as in `walltime_improvement`: a scalar, or an array whose
      last axis has max_gamma entries, v(γ) for γ = 1..max_gamma.

  Returns:
    int64 array, the broadcast shape of alpha and c; ties go to the smaller γ.
  """
  if max_gamma < 1:
    raise ValueError(f'max_gamma must be >= 1, got {max_gamma}.')
  gammas = np.arange(1, max_gamma + 1)
  improvement = walltime_improvement(
    np.asarray(alpha)[..., None], gammas, np.asarray(c)[..., None], verify_cost
  )
  return gammas[np.argmax(improvement, axis=-1)]


def predicted_speedups(alpha: float, c: Mapping[int, float], verify_cost) -> Dict[int, float]:
  """Theorem 3.8 at each measured γ: {γ: Eq. 1 / (γ·c(γ) + v(γ))}.

  Args:
    alpha: the measured acceptance rate.
    c: {γ: the measured draft/target step ratio at γ} (it varies a little
      with γ: the rollout's sampling and bookkeeping).
    verify_cost: {γ: the measured v(γ)}; the γs predicted are its keys.
  """
  return {
    g: float(walltime_improvement(alpha, g, c[g], verify_cost[g])) for g in sorted(verify_cost)
  }


def choose_gamma(predicted_speedup: Mapping[int, float]) -> int:
  """gamma='auto', the one choice of γ: the largest predicted speedup; ties go to the smaller γ.

  Args:
    predicted_speedup: {γ: predicted walltime factor}, from
      `predicted_speedups` (Theorem 3.8 with measured c and v) or from an
      iteration's parts timed alone (the benchmark's `predicted_speedup_parts`).
  """
  if not predicted_speedup:
    raise ValueError('choose_gamma needs a predicted speedup for at least one gamma.')
  gammas = sorted(predicted_speedup)
  return gammas[int(np.argmax([predicted_speedup[g] for g in gammas]))]


def oracle_expected_tokens(alpha) -> np.ndarray:
  """Expected tokens per iteration with a perfect γ-oracle: 1 / (1 − α).

  The upper bound on Eq. 1 over all γ (Section 3.5); inf at α = 1.
  """
  alpha = np.asarray(alpha, dtype=np.float64)
  with np.errstate(divide='ignore'):
    return 1 / (1 - alpha)
