"""The profile sweep's writer: a speculation profile from the benchmark's walltime records.

The library reads profiles (`speculative_t5x.profiles`, whose docstring gives
the file's fields); only the lab measures and writes them: the benchmark's
profile sweep (`benchmark.Sweep(profile_dir=...)`) turns its walltime records
into the gamma chosen per batch size here.
"""

import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence

from speculative_t5x import profiles
from speculative_t5x import sampling
from speculative_t5x_lab import theory


def choose_gammas(
  predicted: Mapping[int, Mapping[int, float]],
  measured: Optional[Mapping[int, Mapping[int, float]]] = None,
) -> Dict[int, int]:
  """{batch size: γ} by `theory.choose_gamma`, γ = 0 (speedup 1) always a candidate.

  Args:
    predicted: {B: {γ: predicted speedup}} for γ >= 1.
    measured: {B: {γ: measured speedup}}; where given for a batch size, the
      choice is made on it (the prediction's errors, e.g. in v at large B,
      then cannot turn into a loss), else on the prediction.
  """
  chosen = {}
  for batch_size, by_gamma in predicted.items():
    basis = (measured or {}).get(batch_size) or by_gamma
    chosen[batch_size] = theory.choose_gamma({0: 1.0, **{g: s for g, s in basis.items() if g}})
  return chosen


def profile_from_records(
  walltime: Sequence[Mapping[str, Any]], temperature: float, alpha: Optional[float]
) -> Dict[str, Any]:
  """A profile's fields (less labels) from the benchmark's walltime records of one temperature.

  Args:
    walltime: `benchmark` walltime records (kind 'walltime') at `temperature`,
      one per (batch size, gamma), with top-k and top-p off.
    temperature: their sampling temperature.
    alpha: the measured alpha (None: no predictions, e.g. no alpha measured).

  Returns:
    {'mode', 'alpha', 'basis', 'gamma_by_batch_size',
    'predicted_gamma_by_batch_size', 'batch_sizes'}: per batch size and
    gamma c, v, the speedup predicted by Theorem 3.8 (c(B), v(gamma, B)) and
    by `theory.batch_walltime_improvement` (the same, with both loops
    waiting for their batch's slowest row), the measured (median) speedup,
    and the finished-row shares (measured, predicted, the baseline's); gamma
    chosen on the measured speedups (`choose_gammas`), and on the batched
    prediction alone.
  """
  by_size: Dict[int, Dict[int, Dict[str, Any]]] = {}
  for r in walltime:
    by_size.setdefault(int(r['batch_size']), {})[int(r['gamma'])] = dict(
      c=r['c'],
      verify_cost=r['verify_cost'],
      predicted_speedup=r.get('predicted_speedup'),
      predicted_speedup_batched=r.get('predicted_speedup_batched'),
      predicted_speedup_rows=r.get('predicted_speedup_rows'),
      measured_speedup=r['speedup']['median'],
      finished_row_share=r.get('finished_row_share'),
      predicted_finished_row_share=r.get('predicted_finished_row_share'),
      predicted_finished_row_share_rows=r.get('predicted_finished_row_share_rows'),
      baseline_finished_row_share=r.get('baseline_finished_row_share'),
      **speedup_terms(r),
    )
  measured = {b: {g: v['measured_speedup'] for g, v in gs.items()} for b, gs in by_size.items()}
  predict = lambda v: best_prediction(v, temperature)
  predicted = {
    b: {g: predict(v) for g, v in gs.items() if predict(v) is not None} for b, gs in by_size.items()
  }
  return dict(
    mode=dict(temperature=float(temperature), topk=0, topp=0.0),
    alpha=alpha,
    basis='measured',
    gamma_by_batch_size=choose_gammas(predicted, measured),
    predicted_gamma_by_batch_size=choose_gammas(predicted) if alpha is not None else None,
    batch_sizes={
      str(b): {'gammas': {str(g): v for g, v in sorted(gs.items())}}
      for b, gs in sorted(by_size.items())
    },
  )


def best_prediction(cell: Mapping[str, Any], temperature: float) -> Optional[float]:
  """The batched prediction a profile cell is judged and chosen on (None: none made).

  Greedy: from each row's batch-1 iterations (`predicted_speedup_rows`, exact
  up to the cost of an iteration: a greedy row accepts the same tokens in any
  batch). Sampled: one alpha for every row (`predicted_speedup_batched`): an
  alpha fitted to one sampled decode per row spreads the rows too far, and
  predicted the T = 1 sweep's batches 0.64-1.17x of measured against one
  alpha's 0.85-1.32x (docs/results.md, "γ per batch size").
  """
  if sampling.is_greedy(temperature) and cell.get('predicted_speedup_rows') is not None:
    return cell['predicted_speedup_rows']
  return cell.get('predicted_speedup_batched')


def speedup_terms(walltime: Mapping[str, Any]) -> Dict[str, Optional[float]]:
  """A walltime record's speedup as (baseline steps per target call) x (a step / an iteration).

  Measured: B rows, baseline steps S = Σ_batches max L, speculative calls C;
  the tokens are Σ L = B·S·(1 − f_base) = τ·B·C·(1 − f_spec), τ the tokens per
  live row and call, so S / C = τ (1 − f_spec) / (1 − f_base), and the
  speedup over S / C is what one baseline step costs against one iteration.
  Predicted: S / E[C] from `theory.batch_walltime_improvement`'s model (one
  alpha) and from each row's batch-1 decode (`_rows`, see
  `benchmark._predict_from_rows`), and 1 / (γc + v). Comparing
  the pairs names the term a prediction misses.

  Returns:
    {steps_per_call_measured, steps_per_call_predicted,
    steps_per_call_predicted_rows, step_over_iteration_measured,
    step_over_iteration_predicted}; None where a field is missing (e.g. no alpha).
  """
  speedup, tokens_per_call = walltime['speedup']['median'], walltime.get('tokens_per_call')
  finished, baseline_finished = (
    walltime.get('finished_row_share'),
    walltime.get('baseline_finished_row_share'),
  )
  measured = None
  if None not in (tokens_per_call, finished, baseline_finished):
    measured = tokens_per_call * (1 - finished) / (1 - baseline_finished)
  iteration = float(
    theory.iteration_walltime(walltime['gamma'], walltime['c'], walltime['verify_cost'])
  )
  steps = lambda key: None if walltime.get(key) is None else walltime[key] * iteration
  return dict(
    steps_per_call_measured=measured,
    steps_per_call_predicted=steps('predicted_speedup_batched'),
    steps_per_call_predicted_rows=steps('predicted_speedup_rows'),
    step_over_iteration_measured=None if measured is None else speedup / measured,
    step_over_iteration_predicted=1 / iteration,
  )


def write_profile(path: str, profile: Mapping[str, Any]) -> None:
  """Writes a profile dict (the module docstring's fields) as JSON; checks it reads back."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  record = dict(version=profiles.PROFILE_VERSION, **profile)
  record['gamma_by_batch_size'] = {
    str(b): int(g) for b, g in profile['gamma_by_batch_size'].items()
  }
  with open(path, 'w') as f:
    json.dump(record, f, indent=1)
  profiles.load_profile(path)
