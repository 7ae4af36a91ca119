"""Speculation profiles: the gamma to decode with at each batch size, γ = 0 (no speculation) included.

A larger batch moves the target from memory-bound toward compute-bound: its
(γ+1)-token block stops being nearly free, rejected draft tokens become real
work, and past some batch size speculative decoding loses. A profile holds,
for one pair on one machine in one decoding mode (temperature, top-k, top-p),
what the benchmark's profile sweep measured at each batch size B: alpha, c(B),
v(γ, B), the share of target-call rows already finished, the speedups that
Theorem 3.8 predicts from them (as the paper states it, and for loops that
wait for their batch's slowest row) and the speedup measured, per γ; and the γ
chosen per batch size by `speculative_t5x_lab.theory.choose_gamma` over γ ∈ {0, 1, ...} with γ = 0
the baseline (speedup 1), so the choice never picks a loss it measured.

`gamma='auto'` with `profile=<its JSON path>` (`settings.SpeculativeSettings`,
`models.generate`, `infer.infer` / gin `GAMMA = 'auto'` and
`SPECULATION_PROFILE`, the T5X models) decodes each batch with the γ the
profile gives for its size: the nearest measured size at or below it (the
smallest measured size for a batch below every one). γ = 0 runs the baseline
program. Each (γ, shape) is one compiled program.

The file (JSON):

  {"version": 1, "pair": ..., "task": ..., "architecture": ...,
   "machine": {"device": ..., "cpu": ..., "bandwidth_gb_per_s": ...},
   "mode": {"temperature": 0.0, "topk": 0, "topp": 0.0},
   "alpha": 0.65, "basis": "measured",
   "gamma_by_batch_size": {"1": 5, ..., "64": 0},
   "predicted_gamma_by_batch_size": {...},
   "batch_sizes": {"1": {"gammas": {"3": {"c": ..., "verify_cost": ...,
     "predicted_speedup": ..., "predicted_speedup_batched": ...,
     "measured_speedup": ..., "finished_row_share": ...,
     "predicted_finished_row_share": ..., "baseline_finished_row_share": ...},
     ...}}, ...}}
"""

import dataclasses
import functools
import json
import os
from typing import Any, Dict, Tuple


PROFILE_VERSION = 1
HOW_TO_MAKE_ONE = (
  'Make one with the profile sweep of the benchmark: its gin file configs/runs/profile.gin '
  '(after the pair and task files; its header has the command), or '
  '`speculative_t5x_lab.benchmark.run_benchmark(..., sweep=Sweep(profile_dir=...))` in Python, which '
  'writes one profile per temperature.'
)


@dataclasses.dataclass(frozen=True)
class SpeculationProfile:
  """The chosen γ per measured batch size, and the decoding mode it was measured in.

  Attributes:
    path: the JSON file it was read from.
    gamma_by_batch_size: ((batch size, γ), ...), ascending batch sizes; γ = 0
      is the baseline.
    temperature, topk, topp: the decoding mode of the measurements.
  """

  path: str
  gamma_by_batch_size: Tuple[Tuple[int, int], ...]
  temperature: float
  topk: int
  topp: float

  def gamma_for(self, batch_size: int) -> int:
    """γ for a batch of `batch_size` rows: the nearest measured size at or below it."""
    chosen = self.gamma_by_batch_size[0][1]
    for measured, gamma in self.gamma_by_batch_size:
      if measured <= batch_size:
        chosen = gamma
    return chosen

  def check_mode(self, temperature: float, topk: int, topp: float) -> None:
    """ValueError unless the decode samples as the profile's measurements did."""
    mine = sampling_mode(temperature, topk, topp)
    theirs = sampling_mode(self.temperature, self.topk, self.topp)
    if mine != theirs:
      raise ValueError(
        f'The speculation profile {self.path} was measured at {theirs}, but this decode '
        f'samples at {mine}: acceptance, and so the best gamma, depends on the mode. Use the '
        'profile of this mode (the profile sweep writes one per temperature).'
      )


def sampling_mode(temperature: float, topk: int, topp: float) -> Dict[str, Any]:
  """The mode a profile is for: greedy (temperature 0, or T5X's topk=1) or the sampling triple."""
  if float(temperature) == 0.0 or int(topk) == 1:
    return {'greedy': True}
  return dict(temperature=float(temperature), topk=int(topk), topp=float(topp))


def _check(condition: bool, path: str, problem: str) -> None:
  if not condition:
    raise ValueError(f'{path} is not a speculation profile: {problem}. {HOW_TO_MAKE_ONE}')


@functools.lru_cache(maxsize=32)
def _load(path: str, modified: float) -> SpeculationProfile:
  del modified  # Part of the cache key only: a rewritten file is read again.
  try:
    with open(path) as f:
      data = json.load(f)
  except json.JSONDecodeError as error:
    raise ValueError(f'{path} is not a speculation profile: {error}. {HOW_TO_MAKE_ONE}') from None
  _check(isinstance(data, dict), path, 'its JSON is not an object')
  _check(
    data.get('version') == PROFILE_VERSION,
    path,
    f'version {data.get("version")!r}, this code reads {PROFILE_VERSION}',
  )
  table = data.get('gamma_by_batch_size')
  _check(isinstance(table, dict) and bool(table), path, 'no gamma_by_batch_size table')
  try:
    pairs = tuple(sorted((int(b), int(g)) for b, g in table.items()))
  except (TypeError, ValueError):
    pairs = ()
  _check(
    bool(pairs) and all(b >= 1 and g >= 0 for b, g in pairs),
    path,
    f'gamma_by_batch_size must map batch sizes >= 1 to gammas >= 0; got {table}',
  )
  mode = data.get('mode') or {}
  _check({'temperature', 'topk', 'topp'} <= mode.keys(), path, 'no mode {temperature, topk, topp}')
  return SpeculationProfile(
    path=path,
    gamma_by_batch_size=pairs,
    temperature=float(mode['temperature']),
    topk=int(mode['topk']),
    topp=float(mode['topp']),
  )


def load_profile(path: str) -> SpeculationProfile:
  """Reads (once per file version) and checks a profile; errors say how to make one."""
  if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
    raise ValueError(f'No speculation profile at {path!r}. {HOW_TO_MAKE_ONE}')
  path = os.fspath(path)
  return _load(path, os.path.getmtime(path))
