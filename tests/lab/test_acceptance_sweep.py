"""scripts/acceptance_sweep.py's pieces on a tiny random pair (its timings mean nothing here)."""

import importlib.util
import os
import types

import numpy as np
import pytest

from speculative_t5x import acceptance
from testing_utils import padded_inputs, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PATH = os.path.join(REPO, 'scripts', 'acceptance_sweep.py')
_SPEC = importlib.util.spec_from_file_location('acceptance_sweep', _PATH)
acceptance_sweep = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(acceptance_sweep)


@pytest.mark.slow  # The whole sweep (alpha, timings, both rules); over a minute.
def test_sweep_reports_every_figure():
  target = tiny_model(seed=0, vocab_size=24, layers=2, scale=3.0)
  draft = tiny_model(seed=1, vocab_size=24, scale=3.0)
  result = acceptance_sweep.sweep(
    target,
    draft,
    padded_inputs(0, 3, 6, target.vocab_size),
    temperatures=(0.0, 1.0),
    gammas=(2,),
    draft_threshold=0.5,
    max_decode_len=8,
    repetitions=1,
    alpha_tokens=100,
    progress=lambda line: None,
  )
  assert set(result['by_t']) == {0.0, 1.0}
  for temperature, r in result['by_t'].items():
    assert [c['gamma'] for c in r['tokens_per_call']] == [2]
    for c in r['tokens_per_call']:
      assert 1 <= c['token'] <= c['gamma'] + 1 and 1 <= c['block'] <= c['gamma'] + 1
      if temperature == 0:  # Greedy: both rules accept the longest agreeing prefix.
        assert c['block'] == c['token'] and c['gain'] == dict(mean=0.0, stderr=0.0)
    # The ratio is the record's own speedups at its best token gamma.
    (best,) = [c for c in r['tokens_per_call'] if c['gamma'] == r['best_token_gamma']]
    assert r['block_over_token_walltime_at_best_gamma'] == pytest.approx(
      best['speedup_block'] / best['speedup_token']
    )
    auto = r['auto_gamma']
    (chosen,) = [c for c in r['tokens_per_call'] if c['gamma'] == auto['chosen']]
    assert auto['chosen_speedup'] == chosen['speedup_token']
    assert auto['chosen_over_best'] == pytest.approx(
      chosen['speedup_token'] / best['speedup_token']
    )
    assert [a['verification'] for a in r['adaptive']] == ['token', 'block']
    for a in r['adaptive']:
      assert a['gamma'] == 2 and 1 <= a['drafted_per_iteration'] <= 2
      assert np.isfinite(a['over_best_fixed'])
  report = acceptance_sweep.format_report(result)
  assert '## T = 0.0' in report and "gamma='auto' picks" in report
  assert 'Adaptive (block, threshold 0.5, gamma <= 2)' in report


def _row(verification, gamma, speedup, per_sequence, draft_threshold=0.0):
  return dict(
    name=verification,
    verification=verification,
    gamma=gamma,
    draft_threshold=draft_threshold,
    speedup=speedup,
    tokens_per_call=float(np.mean(per_sequence)),
    mean_acceptance_length=float(np.mean(per_sequence)),
    drafted_per_iteration=float(gamma),
    per_sequence=np.asarray(per_sequence, np.float64),
  )


def test_summarize_picks_the_measured_best_and_theorem_3_8s_gamma():
  """Several gammas, with measured inputs whose best and predicted best differ."""
  alpha, c = 0.8, 0.05
  verify_cost = {1: 1.0, 2: 1.2, 3: 1.3}
  speedup = {
    ('token', 1): 1.2,
    ('block', 1): 1.25,
    ('token', 2): 1.6,
    ('block', 2): 1.7,
    ('token', 3): 1.4,
    ('block', 3): 1.45,
  }
  token_per_sequence = {1: [1.5, 1.7, 1.6], 2: [2.0, 2.4, 2.2], 3: [2.5, 2.9, 2.3]}
  rows = [
    _row(
      v,
      g,
      speedup[v, g],
      np.add(token_per_sequence[g], [0.0, 0.1 * g, 0.3] if v == 'block' else 0.0),
    )
    for g in (1, 2, 3)
    for v in ('token', 'block')
  ]
  rows += [
    _row('token', 3, 1.8, [2.6, 2.8, 2.4], draft_threshold=0.4),
    _row('block', 3, 1.5, [2.7, 2.9, 2.5], draft_threshold=0.4),
  ]
  parts = {(1.0, g): types.SimpleNamespace(c=c, verify_cost=v) for g, v in verify_cost.items()}
  r = acceptance_sweep.summarize(rows, alpha, parts, 1.0, [1, 2, 3])

  # Theorem 3.8, written out: (1 - alpha^(g+1)) / (1 - alpha) / (g c + v(g)).
  predicted = {
    g: (1 - alpha ** (g + 1)) / (1 - alpha) / (g * c + v) for g, v in verify_cost.items()
  }
  assert max(predicted, key=predicted.get) == 3  # 2.04 against 1.88 (2) and 1.71 (1).
  assert r['auto_gamma']['chosen'] == 3
  assert r['best_token_gamma'] == r['auto_gamma']['best'] == 2  # Measured: 1.6x.
  assert r['auto_gamma']['chosen_speedup'] == 1.4
  assert r['auto_gamma']['chosen_over_best'] == pytest.approx(1.4 / 1.6)
  assert r['block_over_token_walltime_at_best_gamma'] == pytest.approx(1.7 / 1.6)
  assert (r['best_fixed']['verification'], r['best_fixed']['gamma']) == ('block', 2)
  assert 'per_sequence' not in r['best_fixed']
  assert [a['over_best_fixed'] for a in r['adaptive']] == pytest.approx([1.8 / 1.7, 1.5 / 1.7])
  for comparison, g in zip(r['tokens_per_call'], (1, 2, 3)):
    gain = np.array([0.0, 0.1 * g, 0.3])
    assert comparison['gamma'] == g
    assert comparison['block'] - comparison['token'] == pytest.approx(gain.mean())
    assert comparison['gain']['mean'] == pytest.approx(gain.mean())
    assert comparison['gain']['stderr'] == pytest.approx(acceptance.standard_error(gain))
    assert (comparison['speedup_token'], comparison['speedup_block']) == (
      speedup['token', g],
      speedup['block', g],
    )
