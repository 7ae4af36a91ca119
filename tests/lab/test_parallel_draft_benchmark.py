"""scripts/parallel_draft_benchmark.py's pieces: the checks and the projection on hand-made
records, the untimed rates on a tiny random pair."""

import argparse
import importlib.util
import os

import pytest

from speculative_t5x_lab import records as records_lib
from testing_utils import padded_inputs, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PATH = os.path.join(REPO, 'scripts', 'parallel_draft_benchmark.py')
_SPEC = importlib.util.spec_from_file_location('parallel_draft_benchmark', _PATH)
script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(script)


def _walltime(pair, temperature, gamma, c, tokens_per_call, speedup, rates):
  return records_lib.from_json(
    dict(
      kind='walltime',
      pair=pair,
      temperature=temperature,
      gamma=gamma,
      batch_size=1,
      c=c,
      tokens_per_call=tokens_per_call,
      speedup=dict(median=speedup, min=speedup, max=speedup),
      acceptance_by_position=rates,
    )
  )


# T = 0: the parallel call costs 1.2 chain steps at gamma 5 and keeps 0.9 of the chain's
# tokens per call, but its best speedup (gamma 5) is under the chain's (gamma 3).
RECORDS = [
  _walltime(script.CHAIN, 0.0, 3, 0.05, 3.0, 2.1, [0.9] * 3),
  _walltime(script.CHAIN, 0.0, 5, 0.05, 4.0, 2.0, [0.9] * 5),
  _walltime(script.PARALLEL, 0.0, 3, 0.02, 2.7, 1.8, [0.9, 0.6, 0.5]),
  _walltime(script.PARALLEL, 0.0, 5, 0.012, 3.6, 1.9, [0.9, 0.7, 0.5, 0.4, 0.3]),
]


def test_acceptance_checks_name_each_figure_and_verdict():
  lines = script.acceptance_checks(RECORDS)
  assert lines == [
    '- T = 0, gamma 5: drafting cost 1.20 chain draft steps (chain: 5) <= 1.5: met',
    "- T = 0, gamma 5: tokens per call 0.90x the chain's >= 0.85: met",
    '- T = 0: best speedup, parallel 1.90x (gamma 5) >= chain 2.10x (gamma 3): NOT met',
  ]


def test_the_projection_prices_gamma_chain_steps_against_one_parallel_call():
  rates = script.rates_of_records(RECORDS)
  lines = script.projection(rates, c=0.1, verify_cost=1.0, parallel_cost=0.1)
  assert lines[0].startswith('PROJECTION, not a measurement')
  # gamma 3: chain 1 + .9 + .81 + .729 = 3.439 over 0.3 + 1; parallel 1 + .9 + .54 + .27 = 2.71
  # over 0.1 + 1.
  assert '| 0 | 3 | 3.44 | 2.65x | 2.71 | 2.46x |' in lines
  assert len([line for line in lines if line.startswith('| 0 |')]) == 2


def test_untimed_rates_of_a_draft_that_is_its_target_accept_everything():
  target = tiny_model(seed=0, vocab_size=24, scale=3.0)
  pairs = {0.0: {script.CHAIN: target, script.PARALLEL: target.as_parallel_draft()}}
  args = argparse.Namespace(gammas=[2], max_decode_len=8)
  rates = script.untimed_rates(target, pairs, padded_inputs(0, 4, 6, 24), args, batch_size=2)
  assert set(rates) == {(0.0, script.CHAIN, 2), (0.0, script.PARALLEL, 2)}
  # Greedy, the target as its own chain draft: every drafted token is the target's.
  assert rates[0.0, script.CHAIN, 2]['acceptance_by_position'] == [1.0, 1.0]
  parallel = rates[0.0, script.PARALLEL, 2]
  # q_1 is the network's next-token output: the first position is always accepted.
  assert parallel['acceptance_by_position'][0] == 1.0
  assert 1.0 <= parallel['tokens_per_call'] <= rates[0.0, script.CHAIN, 2]['tokens_per_call']


@pytest.mark.parametrize('temperature', [0.0])
def test_rate_lines_list_every_draft_and_gamma(temperature):
  rates = script.rates_of_records(RECORDS)
  lines = script.rate_lines(rates)
  assert f'| {temperature:g} | 5 | {script.PARALLEL} | 3.60 | 0.90 0.70 0.50 0.40 0.30 |' in lines
  assert len(lines) == 2 + len(RECORDS)


def test_a_saved_rates_file_is_projected_without_decoding(tmp_path):
  rates = script.rates_of_records(RECORDS)
  path = str(tmp_path / 'rates.json')
  script.write_rates(path, rates)
  assert script.read_rates(path) == rates
  script.main(['--rates_json', path, '--output_dir', str(tmp_path), '--project_c', '0.1'])
  written = (tmp_path / 'parallel_draft.md').read_text()
  assert '| 0 | 3 | 3.44 | 2.65x | 2.71 | 2.46x |' in written
  assert '| 0 | 5 | parallel draft | 3.60 | 0.90 0.70 0.50 0.40 0.30 |' in written
