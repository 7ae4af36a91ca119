"""The benchmark with a parallel draft (PARD) beside a chain draft, on tiny random pairs."""

import os

import numpy as np
import pytest

from speculative_t5x_lab import benchmark
from speculative_t5x_lab import measure
from speculative_t5x_lab import records as records_lib
from speculative_t5x_lab import reports
from testing_utils import padded_inputs, tiny_model

TARGET = tiny_model(seed=0, vocab_size=24, layers=2, scale=1.5)
CHAIN = tiny_model(seed=0, vocab_size=24, scale=1.5)
NETWORK = tiny_model(seed=1, vocab_size=24, scale=1.5)
PARALLEL = NETWORK.as_parallel_draft()  # Untrained: the mask is the mean token embedding.
CHAIN_PAIR, PARALLEL_PAIR = 'target / chain draft', 'target / parallel draft'
GAMMAS = (1, 3)


@pytest.fixture(scope='module')
def parallel_records(tmp_path_factory):
  """A chain draft's greedy benchmark with the parallel draft timed in the same passes."""
  output_dir = str(tmp_path_factory.mktemp('parallel_benchmark'))
  result = benchmark.run_benchmark(
    TARGET,
    CHAIN,
    padded_inputs(0, 8, 7, TARGET.vocab_size),
    sweep=benchmark.Sweep(temperatures=(0.0,), gammas=GAMMAS),
    measurement=benchmark.Measurement(
      num_walltime_examples=4, repetitions=1, max_decode_len=10, alpha_tokens=600
    ),
    other_drafts=benchmark.OtherDrafts(
      alpha_drafts={'its network': NETWORK}, compared_drafts={PARALLEL_PAIR: PARALLEL}
    ),
    report=benchmark.Report(
      pair_name=CHAIN_PAIR, output_dir=output_dir, progress=lambda line: None
    ),
  )
  return result, output_dir


def test_the_parallel_draft_gets_costs_alpha_and_walltime_beside_the_chain(parallel_records):
  result, _ = parallel_records
  costs = {r['pair']: r for r in result if r['kind'] == 'costs'}
  assert costs[CHAIN_PAIR]['draft']['kind'] == 'network'
  assert costs[PARALLEL_PAIR]['draft']['kind'] == records_lib.PARALLEL_DRAFT_KIND
  # One measurement of the target's parts: the same v(gamma) for both drafts.
  assert costs[PARALLEL_PAIR]['verify_cost'] == costs[CHAIN_PAIR]['verify_cost']
  for gamma, parts in costs[PARALLEL_PAIR]['parts_ms'][0.0].items():
    # The one call is the rollout; nothing is caught up outside it.
    assert parts['draft_rollout'] > 0 and parts['draft_catch_up'] == 0, gamma
  assert costs[PARALLEL_PAIR]['floors']['draft']['bytes'] > 0
  # alpha by teacher forcing is its first position's: its network's next-token output.
  alpha = {r['draft']: r['alpha'] for r in result if r['kind'] == 'alpha'}
  assert alpha[PARALLEL_PAIR] == pytest.approx(alpha['its network'], abs=1e-6)
  walltime = {(r['pair'], r['gamma']): r for r in result if r['kind'] == 'walltime'}
  assert set(walltime) == {(pair, g) for pair in costs for g in GAMMAS}
  for gamma in GAMMAS:
    chain, parallel = walltime[CHAIN_PAIR, gamma], walltime[PARALLEL_PAIR, gamma]
    assert parallel['identical_outputs'] == 1.0 and parallel['c'] > 0
    assert len(parallel['acceptance_by_position']) == gamma
    # One rate does not describe its blocks: no Eq. 1 prediction from its first position's.
    assert parallel['alpha'] is None and 'predicted_speedup' not in parallel
    assert chain['alpha'] == alpha[benchmark.PAIR_DRAFT] and 'predicted_speedup' in chain
    assert parallel['ms_per_token_baseline'] == chain['ms_per_token_baseline']


def test_the_report_sets_the_parallel_draft_beside_the_chain(parallel_records):
  result, output_dir = parallel_records
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert '## Parallel draft beside the chain draft (batch 1)' in markdown
  walltime = {(r['pair'], r['gamma']): r for r in result if r['kind'] == 'walltime'}
  lines = reports.parallel_draft_lines(result)
  for gamma in GAMMAS:
    chain, parallel = walltime[CHAIN_PAIR, gamma], walltime[PARALLEL_PAIR, gamma]
    (row,) = [line for line in lines if line.startswith(f'| 0.0 | {gamma} | {PARALLEL_PAIR} |')]
    cells = [cell.strip() for cell in row.split('|')[1:-1]]
    assert float(cells[5]) == pytest.approx(gamma * parallel['c'], abs=1e-3)
    assert float(cells[6]) == pytest.approx(gamma * parallel['c'] / chain['c'], abs=1e-2)
    assert cells[4] == ' '.join(f'{a:.2f}' for a in parallel['acceptance_by_position'])
  best = max(GAMMAS, key=lambda g: walltime[PARALLEL_PAIR, g]['speedup']['median'])
  assert any(line.startswith(f'- T = 0.0, {PARALLEL_PAIR}: best gamma {best},') for line in lines)
  ratio = walltime[PARALLEL_PAIR, 3]['tokens_per_call'] / walltime[CHAIN_PAIR, 3]['tokens_per_call']
  assert any(f'3: {ratio:.2f}' in line for line in lines)
  # Without a parallel draft the section is absent.
  assert reports.parallel_draft_lines([r for r in result if r['pair'] != PARALLEL_PAIR]) == []


def test_a_parallel_draft_is_timed_cold_when_a_model_draft_of_its_network_is():
  # Both read the same decoder weights per call: the same timer for both.
  assert measure.draft_weight_bytes(PARALLEL) == measure.draft_weight_bytes(NETWORK.as_draft())


def test_a_parallel_draft_can_be_the_pairs_own_draft(tmp_path):
  result = benchmark.run_benchmark(
    TARGET,
    PARALLEL,
    padded_inputs(0, 4, 7, TARGET.vocab_size),
    sweep=benchmark.Sweep(temperatures=(1.0,), gammas=(2,)),
    measurement=benchmark.Measurement(
      num_walltime_examples=2, repetitions=1, max_decode_len=8, alpha_tokens=300
    ),
    report=benchmark.Report(output_dir=str(tmp_path), progress=lambda line: None),
  )
  (walltime,) = [r for r in result if r['kind'] == 'walltime']
  assert walltime['alpha'] is None and np.isfinite(walltime['speedup']['median'])
  (costs,) = [r for r in result if r['kind'] == 'costs']
  assert costs['draft']['kind'] == records_lib.PARALLEL_DRAFT_KIND
