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

At batch B > 1 a decode loop runs until its slowest row ends, and every call
scores all B rows, finished or not. `batch_walltime_improvement` predicts the
speedup of such loops from the rows' lengths: the baseline's batch takes
max L target steps, the speculative batch E[max_row I(L_row)] iterations,
with I(n) the iterations a row needs for n tokens (`iteration_count_cdfs`).

Every function is vectorized: arguments are numpy arrays (or scalars, or
anything numpy converts) that broadcast together; results are numpy arrays.
"""

from typing import Dict, Iterator, Mapping, Tuple

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


def _emitted_per_iteration(alpha, gamma: int) -> np.ndarray:
  """float64 [..., γ + 1]: P(an iteration emits k tokens), k = 1..γ+1, i.i.d. at alpha [...]."""
  alpha = np.asarray(alpha, np.float64)[..., None]
  k = np.arange(1, gamma + 2)
  return np.where(k <= gamma, alpha ** (k - 1) * (1 - alpha), alpha**gamma)


def iteration_count_cdfs(alpha, gamma: int, max_tokens: int) -> Iterator[np.ndarray]:
  """Yields F_i = P(I(n) <= i) over n = 0..max_tokens, for i = 0, 1, ..., max_tokens.

  A row that must stop at n tokens (its EOS, or the length limit) needs I(n)
  iterations; its last one is cut. Under the i.i.d. assumption an iteration
  emits k tokens with probability α^{k−1}(1 − α) for k <= γ and α^γ for
  k = γ + 1, so F_i(n) = Σ_k P(k) F_{i−1}(n − k), with F_i(n) = 1 for n <= 0
  and F_0(n) = 0 for n > 0. I(n) <= n: every iteration emits a token.

  Args:
    alpha: float in [0, 1], or float [R]: one acceptance rate per row.
    gamma: int >= 1.
    max_tokens: the largest n of interest (>= 0).

  Yields:
    float64 [max_tokens + 1] (or [R, max_tokens + 1]), F_i(n) at index n.
  """
  emitted = _emitted_per_iteration(alpha, gamma)  # [..., γ + 1]
  # Index n + γ + 1 holds F(n); the γ + 1 entries before it are n <= 0, where F = 1.
  cdf = np.zeros(emitted.shape[:-1] + (max_tokens + gamma + 2,))
  cdf[..., : gamma + 2] = 1.0
  width = cdf.shape[-1]
  yield cdf[..., gamma + 1 :]
  for _ in range(max_tokens):
    cdf = np.concatenate(
      [
        cdf[..., : gamma + 2],
        sum(
          emitted[..., k - 1 : k] * cdf[..., gamma + 2 - k : width - k] for k in range(1, gamma + 2)
        ),
      ],
      axis=-1,
    )
    yield cdf[..., gamma + 1 :]


def _iteration_moments(alpha, gamma: int, lengths_by_batch) -> Tuple[float, np.ndarray]:
  """(Σ_batches E[max_row I(L_row)], E[I(L_row)] [batches, rows]) by E[X] = Σ_{i >= 0} P(X > i).

  `alpha` is one rate, or one per row (the shape of `lengths_by_batch`). The
  rows' counts are independent under the i.i.d. assumption, so
  P(max_row I > i) = 1 − Π_row F_i(L_row). The sum stops once every term is
  below 1e-15 of a row.
  """
  lengths = np.asarray(lengths_by_batch, dtype=np.int64)  # [batches, rows]
  per_row = np.ndim(alpha) != 0
  if per_row and np.shape(alpha) != lengths.shape:
    raise ValueError(
      f'Per-row alphas must have the shape of lengths_by_batch {lengths.shape}; got '
      f'{np.shape(alpha)}.'
    )
  flat_alpha = np.ravel(alpha) if per_row else alpha
  batch_iterations, row_iterations = 0.0, np.zeros(lengths.shape)
  for cdf in iteration_count_cdfs(flat_alpha, gamma, int(lengths.max())):
    at_length = (
      cdf[np.arange(lengths.size), lengths.ravel()] if per_row else cdf[lengths.ravel()]
    ).reshape(lengths.shape)
    batch_term = float(np.sum(1 - np.prod(at_length, axis=1)))
    batch_iterations += batch_term
    row_iterations += 1 - at_length
    if batch_term < 1e-15:
      break
  return batch_iterations, row_iterations


def fit_row_alphas(gamma: int, lengths, iterations, steps: int = 50) -> np.ndarray:
  """Per row, the alpha whose i.i.d. model needs the row's measured iterations, in expectation.

  Acceptance differs between rows (a hard sentence accepts little), and the
  slowest row of a batch sets its loop's length: a model with one alpha for
  every row underestimates that. Fitting each row's alpha to what its
  batch-1 decode measured, E[I(L_row; α_row)] = iterations_row (bisection:
  E[I] falls as α grows), keeps that spread.

  Args:
    gamma: int >= 1.
    lengths: int [R], the tokens each row emitted.
    iterations: int [R], the iterations its decode took (ceil(L / (γ + 1))
      to L; outside that range the fit is clipped to alpha 1 or 0).
    steps: bisection steps (50: below float64's resolution of alpha).

  Returns:
    float64 [R] in [0, 1].
  """
  lengths = np.asarray(lengths, np.int64)
  iterations = np.asarray(iterations, np.float64)
  if lengths.shape != iterations.shape or lengths.ndim != 1:
    raise ValueError(
      f'lengths and iterations must both be [R]; got {lengths.shape} and {iterations.shape}.'
    )
  low, high = np.zeros(lengths.shape), np.ones(lengths.shape)
  for _ in range(steps):
    middle = (low + high) / 2
    expected = _iteration_moments(middle[None], gamma, lengths[None])[1][0]
    too_slow = expected > iterations  # More iterations than measured: alpha is higher.
    low, high = np.where(too_slow, middle, low), np.where(too_slow, high, middle)
  return (low + high) / 2


def expected_iterations(alpha: float, gamma: int, num_tokens: int) -> float:
  """E[I(n)]: expected iterations to emit exactly `num_tokens` tokens (a row cut at a length).

  Eq. 1 counts the tokens of an uncut iteration; a row that must stop at
  `num_tokens` emits fewer in its last iteration, so its tokens per call are
  `num_tokens / expected_iterations(...)`, below Eq. 1 (`iteration_count_cdfs`).

  Args:
    alpha: float in [0, 1].
    gamma: int >= 1.
    num_tokens: int >= 0.
  """
  return float(_iteration_moments(alpha, gamma, [[num_tokens]])[1].sum())


def expected_batch_iterations(alpha: float, gamma: int, lengths_by_batch) -> float:
  """Σ over batches of E[max_row I(L_row)]: the iterations of loops that wait for their slowest row.

  Args:
    alpha: float in [0, 1], or one per row as `lengths_by_batch`.
    gamma: int >= 1.
    lengths_by_batch: int [num_batches, batch_size], the tokens each row emits.
  """
  return _iteration_moments(alpha, gamma, lengths_by_batch)[0]


def batch_walltime_improvement(alpha, gamma, c, verify_cost, lengths_by_batch) -> float:
  """Theorem 3.8 for batched loops that run until their slowest row ends, rows cut at EOS.

  A batch's baseline loop takes max_row L_row target steps; its speculative
  loop takes max_row I(L_row) iterations of γc + v target steps each (the
  rows' I independent). Both loops keep scoring rows that have ended. At one
  row of unbounded length this is `walltime_improvement`.

  Args:
    alpha: one acceptance rate, or float [num_batches, batch_size], one per
      row (`fit_row_alphas`).
    gamma, c, verify_cost: as in `walltime_improvement` (scalars).
    lengths_by_batch: int [num_batches, batch_size]: the tokens each row
      emits (e.g. the baseline's output lengths, split into its batches).

  Returns:
    Σ_batches max L / (Σ_batches E[max I] · (γc + v)).
  """
  baseline_steps = sum(int(np.max(batch)) for batch in lengths_by_batch)
  iterations = expected_batch_iterations(alpha, gamma, lengths_by_batch)
  return float(baseline_steps / (iterations * iteration_walltime(gamma, c, verify_cost)))


def replayed_batch_walltime_improvement(
  row_iterations_by_batch, gamma, c, verify_cost, lengths_by_batch
) -> Tuple[float, float]:
  """Greedy batched loops from each row's batch-1 iterations: (speedup, finished-row share).

  A greedy decode is deterministic row by row: at a fixed γ a row drafts and
  accepts in a batch what it did alone, so a batch's loop runs exactly
  max_row I_row iterations; nothing is modelled but the cost of one (γc + v).
  Sampling draws new tokens in every run, so its rows' counts are random and
  `batch_walltime_improvement` models them.

  Args:
    row_iterations_by_batch: int [num_batches, batch_size], each row's
      iterations at batch 1 (the batch-1 record's `row_iterations`).
    gamma, c, verify_cost: as in `walltime_improvement` (scalars).
    lengths_by_batch: int [num_batches, batch_size], the tokens each row emits.

  Returns:
    (Σ max L / (Σ max I · (γc + v)), 1 − Σ I / (batch_size · Σ max I)).
  """
  iterations = np.asarray(row_iterations_by_batch, np.int64)
  lengths = np.asarray(lengths_by_batch, np.int64)
  if iterations.shape != lengths.shape or iterations.ndim != 2:
    raise ValueError(
      f'row_iterations_by_batch and lengths_by_batch must both be [num_batches, batch_size]; '
      f'got {iterations.shape} and {lengths.shape}.'
    )
  calls = int(iterations.max(axis=1).sum())
  speedup = lengths.max(axis=1).sum() / (calls * iteration_walltime(gamma, c, verify_cost))
  return float(speedup), float(1 - iterations.sum() / (iterations.shape[1] * calls))


def finished_row_share(alpha: float, gamma: int, lengths_by_batch) -> float:
  """The expected share of a batched loop's (row, call) pairs whose row had already ended.

  1 − Σ_row E[I(L_row)] / (batch_size · Σ_batches E[max_row I(L_row)]).
  γ = 0 is the baseline, one token per step: 1 − Σ L / (batch_size · Σ max L).

  Args:
    alpha: float in [0, 1], or one per row as `lengths_by_batch` (unused at γ = 0).
    gamma: int >= 0.
    lengths_by_batch: int [num_batches, batch_size], the tokens each row emits.
  """
  batch_size = len(lengths_by_batch[0])
  if gamma == 0:
    calls = sum(int(np.max(batch)) for batch in lengths_by_batch)
    rows = sum(int(np.sum(batch)) for batch in lengths_by_batch)
  else:
    calls, per_row = _iteration_moments(alpha, gamma, lengths_by_batch)
    rows = float(per_row.sum())
  return float(1 - rows / (batch_size * calls))


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


def expected_tokens_by_position(rates) -> np.ndarray:
  """Eq. 1 without the i.i.d. assumption: 1 + Σ_k Π_{j<=k} a_j tokens per iteration.

  Args:
    rates: float [..., γ], a_j = P(draft position j accepted | positions
      1..j-1 accepted): the benchmark's acceptance by position. A parallel
      draft's fall with j; all equal to α gives Eq. 1.

  Returns:
    float64 [...].
  """
  return 1 + np.sum(np.cumprod(np.asarray(rates, np.float64), axis=-1), axis=-1)


def walltime_improvement_by_position(rates, drafting_cost, verify_cost=1.0) -> np.ndarray:
  """Theorem 3.8 with acceptance by position and the whole iteration's drafting cost.

  Args:
    rates: float [..., γ], acceptance by position (`expected_tokens_by_position`).
    drafting_cost: walltime of one iteration's drafting / one target step:
      γc for a chain draft, one call's cost for a parallel draft.
    verify_cost: v(γ), as in `walltime_improvement`.

  Returns:
    float64 [...]: expected_tokens_by_position / (drafting_cost + v).
  """
  cost = np.asarray(drafting_cost, np.float64) + verify_cost
  return expected_tokens_by_position(rates) / cost


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
