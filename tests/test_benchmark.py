"""The benchmark end to end on a tiny random pair, and the emulation mode."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from speculative_t5x import benchmark
from speculative_t5x import theory
from testing_utils import padded_inputs, tiny_model

TARGET = tiny_model(seed=0, vocab_size=24, layers=2, scale=1.5)
DRAFT = tiny_model(seed=0, vocab_size=24, scale=1.5)
OTHER_DRAFT = tiny_model(seed=1, vocab_size=24, scale=1.5)
# A distillation record as `distill.distill` logs it (only reported here).
DISTILLATION = dict(
  divergence='forward_kl',
  steps=20,
  temperature=1.0,
  data_mix={'draft': 1.0},
  eval_examples=8,
  curve=[
    dict(step=0, alpha_T0=0.3, alpha_T0_stderr=0.01, alpha_T1=0.4, alpha_T1_stderr=0.01),
    dict(step=20, alpha_T0=0.5, alpha_T0_stderr=0.02, alpha_T1=0.6, alpha_T1_stderr=0.02),
  ],
)


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  output_dir = str(tmp_path_factory.mktemp('benchmark'))
  inputs = padded_inputs(0, 8, 7, TARGET.vocab_size)
  corpus = list(padded_inputs(1, 20, 7, TARGET.vocab_size))
  result = benchmark.run_benchmark(
    TARGET,
    DRAFT,
    inputs,
    temperatures=(1.0,),
    gammas=(1, 3),
    batch_sizes=(1, 2),
    batch_size_gamma='auto',
    num_walltime_examples=4,
    repetitions=2,
    max_decode_len=10,
    alpha_tokens=3000,
    ngram_corpus=corpus,
    alpha_drafts={'another draft': OTHER_DRAFT},
    distillation=DISTILLATION,
    output_dir=output_dir,
    progress=lambda line: None,
  )
  return result, output_dir


def test_reports_other_drafts_alpha_and_the_distillation(records):
  result, output_dir = records
  alpha_drafts = {r['draft'] for r in result if r['kind'] == 'alpha'}
  assert alpha_drafts == {'ModelDraft', 'another draft', '1-gram', '2-gram'}
  (distillation,) = [r for r in result if r['kind'] == 'distillation']
  assert distillation['curve'] == DISTILLATION['curve']
  assert os.path.getsize(os.path.join(output_dir, 'distillation_T1.png')) > 0
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert '## Distillation (forward_kl, 20 steps, for T = 1.0' in markdown
  assert '| 0 | 0.300 | 0.500 | 0.020 |' in markdown  # T, alpha before, after, stderr.


def test_writes_json_markdown_and_figures(records):
  result, output_dir = records
  with open(os.path.join(output_dir, 'benchmark.json')) as f:
    assert json.load(f) == json.loads(json.dumps(result, default=float))
  for name in (
    'benchmark.md',
    'speedup_vs_gamma.png',
    'speedup_vs_batch.png',
    'iteration_breakdown.png',
  ):
    assert os.path.getsize(os.path.join(output_dir, name)) > 0
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert '## Walltime at batch 1' in markdown and '## alpha (Table 3)' in markdown
  assert "## Where an iteration's time goes" in markdown
  assert '## One-token steps against the memory floor' in markdown
  assert '## gamma chosen from the measured parts' in markdown
  assert '## Drafted and accepted per iteration (batch 1)' in markdown


def test_every_record_has_its_fields(records):
  result, _ = records
  kinds = [r['kind'] for r in result]
  assert kinds.count('costs') == 1 and kinds.count('distillation') == 1
  # 4 drafts: the model, another model, unigram, bigram.
  assert kinds.count('alpha') == 4
  walltime = [r for r in result if r['kind'] == 'walltime']
  assert {(r['gamma'], r['batch_size']) for r in walltime if r['batch_size'] == 1} == {
    (1, 1),
    (3, 1),
  }
  assert {r['batch_size'] for r in walltime} == {1, 2}
  for r in walltime:
    for field in (
      'alpha',
      'alpha_loop',
      'c',
      'verify_cost',
      'tokens_per_call',
      'ms_per_token_baseline',
      'ms_per_token_speculative',
      'speedup',
      'predicted_speedup',
      'predicted_tokens_per_call',
      'accepted_histogram',
      'acceptance_by_position',
      'mean_acceptance_length',
      'drafted_per_iteration',
      'draft_steps_per_call',
      'memory',
      'identical_outputs',
    ):
      assert r[field] is not None, field
    assert len(r['accepted_histogram']) == r['gamma'] + 1
    assert r['drafted_per_iteration'] == r['draft_steps_per_call'] == r['gamma']
    assert 1 <= r['mean_acceptance_length'] <= r['gamma'] + 1
    if r['batch_size'] == 1:
      breakdown = r['breakdown']
      parts = ('draft_catch_up', 'draft_rollout', 'target_block', 'judge', 'emit', 'encode')
      assert all(breakdown[part] >= 0 for part in parts)
      assert breakdown['target_block'] > 0 and breakdown['draft_rollout'] > 0
      assert breakdown['parts_sum'] == pytest.approx(sum(breakdown[part] for part in parts))
      assert breakdown['unexplained'] == pytest.approx(
        breakdown['measured'] - breakdown['parts_sum']
      )
      assert 0 <= breakdown['catch_up_rate'] <= 1
      assert r['predicted_speedup_parts'] > 0
    assert r['memory']['temp_bytes'] > 0
    assert r['ms_per_token_baseline']['min'] <= r['ms_per_token_baseline']['median']
  (choice,) = [r for r in result if r['kind'] == 'gamma_choice']
  assert choice['chosen_gamma'] in (1, 3) and choice['best_gamma'] in (1, 3)
  chosen = next(
    r for r in walltime if r['gamma'] == choice['chosen_gamma'] and r['batch_size'] == 1
  )
  assert choice['chosen_predicted_speedup'] == max(
    r['predicted_speedup_parts'] for r in walltime if r['batch_size'] == 1
  )
  assert choice['chosen_measured_speedup'] == chosen['speedup']['median']
  # batch_size_gamma='auto': the batch sweep runs at the chosen gamma.
  assert {r['gamma'] for r in walltime if r['batch_size'] == 2} == {choice['chosen_gamma']}
  costs = next(r for r in result if r['kind'] == 'costs')
  assert set(costs['floors']) == {'target', 'draft', 'draft_bytes_over_target_bytes'}
  assert costs['floors']['target']['bytes'] > costs['floors']['draft']['bytes'] > 0
  assert costs['bandwidth_gb_per_s'] > 0
  for r in (r for r in result if r['kind'] == 'alpha'):
    assert 0.0 <= r['alpha'] <= 1.0 and r['num_tokens'] >= 3000


def test_alpha_agrees_with_the_decode_loop(records):
  """Teacher-forced alpha on target samples vs the loop's on-the-fly beta."""
  result, _ = records
  for r in result:
    if r['kind'] == 'walltime' and r['batch_size'] == 1:
      # The loop judges ~num_examples * tokens positions only; allow its noise.
      assert abs(r['alpha'] - r['alpha_loop']) < 0.15, r


def test_emulated_tokens_per_call_follow_eq_1():
  alpha, gamma = 0.7, 4
  inputs, _ = benchmark.random_inputs(16, 6, TARGET.vocab_size)
  decode = benchmark.models.make_decoder(
    TARGET, DRAFT, gamma=gamma, temperature=1.0, max_decode_len=60, eos_id=-1, emulate_alpha=alpha
  )
  run = benchmark.time_decoding(decode, inputs, batch_size=16, repetitions=1)
  histogram = run.stats.accepted_histogram
  iterations = histogram.sum()
  mean_tokens = (histogram * (np.arange(gamma + 1) + 1)).sum() / iterations
  expected = theory.expected_tokens(alpha, gamma)
  # Tokens per call are in [1, gamma + 1]: their standard deviation is < gamma / 2.
  assert abs(mean_tokens - expected) < 4 * (gamma / 2) / np.sqrt(iterations)
  assert run.tokens == 16 * 60  # No EOS: every emulated row runs to full length.


def test_gin_main_runs_a_pair_file_in_the_emulation_mode(tmp_path):
  """`python -m speculative_t5x.benchmark` with random weights, as for XXL/small."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [
    sys.executable,
    '-m',
    'speculative_t5x.benchmark',
    '--gin_file=configs/models/tiny.gin',
    '--gin_file=configs/pairs/pair.gin',
    '--gin_file=configs/runs/benchmark.gin',
    '--gin.VOCAB_SIZE=64',
    '--gin.GAMMA=2',
    '--gin.CHECKPOINT_PATH=None',
    '--gin.TASK=None',
    '--gin.TARGET=@target/models.random_model()',
    '--gin.DRAFT=@draft/models.random_model()',
    '--gin.draft/network.T5Config.num_decoder_layers=1',
    '--gin.EMULATE_ALPHA=0.6',
    '--gin.GAMMAS=[2]',
    '--gin.NUM_EXAMPLES=2',
    '--gin.MAX_DECODE_LEN=8',
    '--gin.benchmark_pair.temperatures=[1.0]',
    '--gin.benchmark_pair.batch_sizes=[1, 2]',
    '--gin.benchmark_pair.repetitions=1',
    '--gin.benchmark_pair.random_input_length=6',
    f"--gin.BENCHMARK_OUTPUT_DIR='{tmp_path}'",
  ]
  subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True)
  with open(tmp_path / 'benchmark.json') as f:
    records = json.load(f)
  walltime = [r for r in records if r['kind'] == 'walltime']
  assert [(r['gamma'], r['batch_size']) for r in walltime] == [(2, 1), (2, 2)]
  assert all(r['emulated'] and r['alpha'] == 0.6 for r in walltime)
  assert not [r for r in records if r['kind'] == 'alpha']  # Emulation measures no alpha.


def test_gin_main_needs_examples_or_the_emulation():
  with pytest.raises(ValueError, match='Nothing to decode: include a task file'):
    benchmark.benchmark_pair(target=TARGET, draft=DRAFT, output_dir='/unused')


def test_trim_padding_drops_only_all_zero_columns():
  inputs = np.array([[5, 6, 1, 0, 0, 0, 0], [7, 1, 0, 0, 0, 0, 0]], np.int32)
  np.testing.assert_array_equal(benchmark.trim_padding(inputs), inputs[:, :3])
  np.testing.assert_array_equal(benchmark.trim_padding(inputs, multiple=2), inputs[:, :4])
  np.testing.assert_array_equal(benchmark.trim_padding(inputs, multiple=16), inputs)
