"""scripts/acceptance_sweep.py's pieces on a tiny random pair (its timings mean nothing here)."""

import importlib.util
import os

import numpy as np

from testing_utils import padded_inputs, tiny_model

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'scripts', 'acceptance_sweep.py')
_SPEC = importlib.util.spec_from_file_location('acceptance_sweep', _PATH)
acceptance_sweep = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(acceptance_sweep)


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
    assert r['best_token_gamma'] == r['auto_gamma']['chosen'] == 2
    assert r['block_over_token_walltime_at_best_gamma'] > 0
    assert [a['verification'] for a in r['adaptive']] == ['token', 'block']
    for a in r['adaptive']:
      assert a['gamma'] == 2 and 1 <= a['drafted_per_iteration'] <= 2
      assert np.isfinite(a['over_best_fixed'])
  report = acceptance_sweep.format_report(result)
  assert '## T = 0.0' in report and "gamma='auto' picks" in report
  assert 'Adaptive (block, threshold 0.5, gamma <= 2)' in report
