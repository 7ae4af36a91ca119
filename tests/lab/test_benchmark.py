"""The benchmark end to end on tiny random pairs, and the emulation mode.

Encoder-decoder pairs with and without decoder prompts, decoder-only prefix
LMs, every draft type (model, n-gram, prompt lookup).
"""

import json
import os
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import emulation
from speculative_t5x_lab import records as records_lib
from speculative_t5x import drafts
from speculative_t5x import gin_utils
from speculative_t5x import layouts
from speculative_t5x_lab import measure
from speculative_t5x import network
from speculative_t5x_lab import theory
from testing_utils import padded_inputs, tiny_decoder_only_model, tiny_model

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
    sweep=benchmark.Sweep(
      temperatures=(1.0,), gammas=(1, 3), batch_sizes=(1, 2), batch_size_gamma='auto'
    ),
    measurement=benchmark.Measurement(
      num_walltime_examples=4, repetitions=2, max_decode_len=10, alpha_tokens=3000
    ),
    other_drafts=benchmark.OtherDrafts(
      ngram_corpus=corpus, alpha_drafts={'another draft': OTHER_DRAFT}
    ),
    report=benchmark.Report(
      distillation=DISTILLATION, output_dir=output_dir, progress=lambda line: None
    ),
  )
  return result, output_dir


def test_reports_other_drafts_alpha_and_the_distillation(records):
  result, output_dir = records
  alpha_drafts = {r['draft'] for r in result if r['kind'] == 'alpha'}
  assert alpha_drafts == {benchmark.PAIR_DRAFT, 'another draft', '1-gram', '2-gram'}
  (distillation,) = [r for r in result if r['kind'] == 'distillation']
  assert distillation['curve'] == DISTILLATION['curve']
  assert os.path.getsize(os.path.join(output_dir, 'distillation_T1.png')) > 0
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert '## Distillation (forward_kl, 20 steps, for T = 1.0' in markdown
  assert '| 0 | 0.300 | 0.500 | 0.020 |' in markdown  # T, alpha before, after, stderr.


def test_writes_json_markdown_and_figures(records):
  result, output_dir = records
  with open(os.path.join(output_dir, 'benchmark.json')) as f:
    assert json.load(f) == json.loads(json.dumps(records_lib.to_json(result), default=float))
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
    TARGET,
    DRAFT,
    gamma=gamma,
    temperature=1.0,
    max_decode_len=60,
    eos_id=-1,
    judge=acceptance_counts.AcceptanceCounts(emulation.EmulatedJudge(alpha)),
  )
  run = benchmark.time_decoding(decode, inputs, batch_size=16, repetitions=1)
  histogram = run.stats.record.accepted_histogram
  iterations = histogram.sum()
  mean_tokens = (histogram * (np.arange(gamma + 1) + 1)).sum() / iterations
  expected = theory.expected_tokens(alpha, gamma)
  # Tokens per call are in [1, gamma + 1]: their standard deviation is < gamma / 2.
  assert abs(mean_tokens - expected) < 4 * (gamma / 2) / np.sqrt(iterations)
  assert run.tokens == 16 * 60  # No EOS: every emulated row runs to full length.


def test_decoders_are_timed_batch_by_batch_each_first_in_turn():
  """Batch k of every decoder runs before batch k + 1 of any, the first decoder rotating;
  each pass's seconds sum its batches' calls, and the first pass's outputs are kept."""
  calls = []

  class Recorded:
    """A compiled decoder's stand-in that records (decoder, batch row) per call."""

    def __init__(self, name):
      self.name = name
      self.static_args = {'eos_id': 1}

    def compile(self, *unused_args):
      return self

    def memory_analysis(self):
      return None

    def __call__(self, batch, key, prompts):
      calls.append((self.name, int(batch[0, 0])))
      return benchmark.models.GenerateOutput(tokens=jnp.asarray(batch), scores=None, stats=None)

  inputs = np.arange(3 * 2).reshape(3, 2).astype(np.int32) + 2  # No EOS: 2 tokens a row.
  runs = benchmark.time_decodings(
    [Recorded('a'), Recorded('b')], inputs, batch_size=1, repetitions=2
  )
  warm_up = [('a', 2), ('b', 2)]
  one_pass = [('a', 2), ('b', 2), ('b', 4), ('a', 4), ('a', 6), ('b', 6)]
  assert calls == warm_up + one_pass + one_pass
  for run in runs:
    assert len(run.seconds) == 2 and min(run.seconds) > 0
    np.testing.assert_array_equal(run.outputs, inputs)
    assert run.tokens == 6


@pytest.mark.slow  # The emulation runs fast in test_emulated_tokens_per_call_follow_eq_1.
def test_gin_main_runs_a_pair_file_in_the_emulation_mode(tmp_path):
  """`python -m speculative_t5x_lab.benchmark` with random weights, as for XXL/small."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  command = [
    sys.executable,
    '-m',
    'speculative_t5x_lab.benchmark',
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


def test_a_misspelt_or_invalid_setting_is_an_error_before_anything_runs():
  with pytest.raises(TypeError, match=r"Unknown benchmark settings \['gamma'\].*'gammas'"):
    benchmark.benchmark_pair(target=TARGET, draft=DRAFT, output_dir='/unused', gamma=3)
  with pytest.raises(ValueError, match='verification'):
    benchmark.Sweep(verification='tree')


# ------------------------------------------------------------------------------
# Prompts: decoder-only pairs, and encoder-decoder pairs with decoder prompts.
# ------------------------------------------------------------------------------
PREFIX_LM_TARGET = tiny_decoder_only_model(
  seed=0, vocab_size=24, layers=2, scale=1.5, inputs_bidirectional_attention=True
)
PREFIX_LM_DRAFT = tiny_decoder_only_model(
  seed=1, vocab_size=24, layers=1, scale=1.5, inputs_bidirectional_attention=True
)


def ragged_prompts(seed, batch, width, vocab_size=24):
  """int32 [batch, width]: prompts of 1..width tokens (ids >= 2), then 0-padding."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(2, vocab_size, (batch, width))
  lengths = rng.integers(1, width + 1, batch)
  prompts[np.arange(width)[None] >= lengths[:, None]] = 0
  return prompts.astype(np.int32)


def _run(target, draft, inputs, output_dir, decoder_prompts=None, **overrides):
  """`run_benchmark` at a small sweep; `overrides`: option fields by name."""
  settings = dict(
    temperatures=(0.0,),
    gammas=(2,),
    num_walltime_examples=4,
    repetitions=1,
    max_decode_len=8,
    alpha_tokens=600,
    ngram_corpus=list(padded_inputs(1, 20, 7, target.vocab_size)),
    output_dir=str(output_dir),
    progress=lambda line: None,
  )
  settings.update(overrides)
  return benchmark.run_benchmark(
    target,
    draft,
    inputs,
    decoder_prompts=decoder_prompts,
    **benchmark.options_from_fields(**settings),
  )


@pytest.fixture(scope='module')
def decoder_only_records(tmp_path_factory):
  output_dir = tmp_path_factory.mktemp('decoder_only')
  lookup = drafts.PromptLookupDraft(vocab_size=24)
  result = _run(
    PREFIX_LM_TARGET,
    PREFIX_LM_DRAFT,
    ragged_prompts(0, 8, 6),
    output_dir,
    alpha_drafts={'prompt lookup': lookup},
  )
  return result, output_dir


@pytest.fixture(scope='module')
def decoder_prompt_records(tmp_path_factory):
  """An encoder-decoder pair with decoder prompts, prompt lookup as the draft."""
  output_dir = tmp_path_factory.mktemp('decoder_prompts')
  result = _run(
    TARGET,
    drafts.PromptLookupDraft(vocab_size=24),
    padded_inputs(0, 8, 7, TARGET.vocab_size),
    output_dir,
    decoder_prompts=ragged_prompts(1, 8, 5),
    temperatures=(1.0,),
    alpha_drafts={'model': DRAFT},
  )
  return result, output_dir


@pytest.mark.parametrize(
  'fixture, architecture, alpha_drafts',
  [  # `slow`: the gpt-like pair file and the gin main's decoder prompts run these paths fast.
    pytest.param(
      'decoder_only_records',
      'decoder-only prefix LM',
      {benchmark.PAIR_DRAFT, 'prompt lookup', '1-gram', '2-gram'},
      marks=pytest.mark.slow,
    ),
    pytest.param(
      'decoder_prompt_records',
      'encoder-decoder',
      {benchmark.PAIR_DRAFT, 'model', '1-gram', '2-gram'},
      marks=pytest.mark.slow,
    ),
  ],
)
def test_prompted_pairs_get_alpha_costs_walltime_and_the_report(
  fixture, architecture, alpha_drafts, request
):
  result, output_dir = request.getfixturevalue(fixture)
  assert all(r['architecture'] == architecture for r in result)
  alpha = {r['draft']: r for r in result if r['kind'] == 'alpha'}
  assert set(alpha) == alpha_drafts
  assert all(0.0 <= r['alpha'] <= 1.0 and r['num_tokens'] >= 600 for r in alpha.values())
  (costs,) = [r for r in result if r['kind'] == 'costs']
  assert costs['prompts']['width'] > 0 and costs['prompts']['mean_tokens'] > 0
  assert costs['floors']['target']['bytes'] > 0
  (walltime,) = [r for r in result if r['kind'] == 'walltime']
  for field in ('alpha', 'alpha_loop', 'c', 'verify_cost', 'predicted_speedup'):
    assert walltime[field] is not None, field
  assert walltime['verify_cost'] > 0 and walltime['c'] >= 0
  assert walltime['ms_per_token_baseline']['median'] > 0
  assert walltime['ms_per_token_speculative']['median'] > 0
  assert walltime['breakdown']['encode'] > 0  # The prompts' prefill, once per call.
  if walltime['temperature'] == 0.0:
    assert walltime['identical_outputs'] == 1.0
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert f'({architecture}), task' in markdown
  assert '## Walltime at batch 1' in markdown and '## alpha (Table 3)' in markdown


def test_measure_alpha_of_a_prefix_lm_agrees_with_the_decode_loop():
  """Teacher-forced alpha after ragged prompts == the loop's mean beta, within their errors."""
  prompts = ragged_prompts(2, 512, 6)
  result = acceptance.measure_alpha(
    PREFIX_LM_TARGET,
    {'draft': PREFIX_LM_DRAFT},
    prompts,
    temperature=1.0,
    max_decode_len=12,
    min_tokens=4000,
  )['draft']
  decode = benchmark.models.make_decoder(
    PREFIX_LM_TARGET, PREFIX_LM_DRAFT, gamma=3, temperature=1.0, max_decode_len=12
  )
  means, counts = [], []
  for k in range(8):
    stats = decode(prompts[64 * k : 64 * (k + 1)], jax.random.PRNGKey(k)).stats
    means.append(float(stats.mean_beta))
    counts.append(int(stats.beta_count))
  loop = np.average(means, weights=counts)
  loop_stderr = np.std(means) / np.sqrt(len(means))
  assert abs(result.alpha - loop) < 4 * np.hypot(result.stderr, loop_stderr), (result, loop)


def test_measure_alpha_splits_samples_cut_at_the_decode_length_from_those_that_end():
  """alpha over all tokens is the token-weighted mean of alpha over cut and ended samples, and
  the cut share is that of the target's samples without EOS, recounted from the same decodes."""
  inputs = padded_inputs(0, 128, 7, 24)
  max_decode_len = 8
  result = acceptance.measure_alpha(
    TARGET,
    {'draft': DRAFT},
    inputs,
    temperature=1.0,
    max_decode_len=max_decode_len,
    min_tokens=500,
  )['draft']
  decode = benchmark.models.make_decoder(
    TARGET, None, temperature=1.0, max_decode_len=max_decode_len
  )
  key, cut_tokens, all_tokens, start = jax.random.PRNGKey(0), 0, 0, 0
  while all_tokens < 500:  # measure_alpha's batches of 64 rows, and their keys.
    key, step_key = jax.random.split(key)
    batch = layouts.trim_padding(inputs[start : start + 64], multiple=16)
    outputs = np.asarray(decode(batch, step_key).tokens)
    lengths = layouts.output_lengths(outputs)
    cut = ~(outputs == layouts.EOS_ID).any(axis=1)
    cut_tokens += int(lengths[cut].sum())
    all_tokens += int(lengths.sum())
    start += 64
  assert result.num_tokens == all_tokens
  assert 0.0 < result.cut_share < 1.0
  np.testing.assert_allclose(result.cut_share, cut_tokens / all_tokens, rtol=1e-6)
  mixed = result.cut_share * result.alpha_cut + (1 - result.cut_share) * result.alpha_ended
  np.testing.assert_allclose(mixed, result.alpha, rtol=1e-5)
  assert result.alpha_cut != result.alpha_ended


@pytest.mark.parametrize('architecture', ['encoder-decoder', 'decoder-only', 'prefix LM'])
def test_continuation_logits_equal_the_cached_decoders(architecture):
  """Teacher forcing after the prompts == a prefilled cache scoring the continuation."""
  prompts = ragged_prompts(3, 3, 5)
  prompts[2] = 0  # A row without a prompt.
  outputs = np.random.default_rng(4).integers(2, 24, (3, 6)).astype(np.int32)
  model, inputs = {
    'encoder-decoder': (TARGET, padded_inputs(0, 3, 7, 24)),
    'decoder-only': (tiny_decoder_only_model(seed=0, vocab_size=24), prompts),
    'prefix LM': (PREFIX_LM_TARGET, prompts),
  }[architecture]
  logits = acceptance.continuation_logits(model, inputs, outputs, prompts)
  decoder_inputs, positions = layouts.continuation_layout(prompts, outputs)
  cache, prompt_lengths = benchmark.models.prefilled_target_cache(
    model.config,
    model.params,
    jnp.asarray(inputs),
    16,
    layouts.decoder_prompt_layout(jnp.asarray(prompts), 6),
    prefill_width=6,
    inputs_bidirectional_attention=model.inputs_bidirectional_attention,
  )
  np.testing.assert_array_equal(prompt_lengths, positions[:, 0])
  expected, _ = network.apply_decode_block(
    model.config,
    model.params,
    cache,
    jnp.asarray(np.take_along_axis(decoder_inputs, positions, axis=1)),
    prompt_lengths,
  )
  np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_mismatched_pairs_and_misplaced_prompts_are_errors():
  prompts = ragged_prompts(0, 4, 3)
  with pytest.raises(ValueError, match='The target is decoder-only but the draft network is'):
    benchmark.run_benchmark(PREFIX_LM_TARGET, DRAFT, prompts)
  with pytest.raises(ValueError, match='A decoder-only target takes its prompts as the inputs'):
    benchmark.run_benchmark(PREFIX_LM_TARGET, PREFIX_LM_DRAFT, prompts, decoder_prompts=prompts)
  with pytest.raises(ValueError, match='decoder_prompt_length=3 is for encoder-decoder pairs'):
    benchmark.benchmark_pair(
      target=PREFIX_LM_TARGET,
      draft=PREFIX_LM_DRAFT,
      output_dir='/unused',
      emulate_alpha=0.5,
      decoder_prompt_length=3,
    )


def test_reference_prompts_split_each_reference():
  class Characters:
    """A vocabulary of one id per character (a = 2, b = 3, ...)."""

    encode = staticmethod(lambda text: [ord(c) - ord('a') + 2 for c in text])
    decode = staticmethod(lambda ids: ''.join(chr(i - 2 + ord('a')) for i in ids))

  prompts, rest = benchmark.reference_prompts(['abcd', 'ab', 'a'], Characters, 3)
  np.testing.assert_array_equal(prompts, [[2, 3, 4], [2, 0, 0], [0, 0, 0]])
  assert rest == ['d', 'b', 'a']  # Every reference keeps at least one token.


@gin.configurable('benchmark_test_values')
def _values(**values):
  return values


def test_the_gpt_like_pair_file_binds_the_papers_models_and_benchmarks(tmp_path):
  """configs/pairs/gpt_like.gin: the model files' networks; its main at a tiny size."""
  macros = ["CHECKPOINT_PATH = '/target'", 'DROPOUT_RATE = 0.0']
  configs = gin_utils.call_configured(
    _values,
    ['configs/pairs/gpt_like.gin'],
    [
      *macros,
      'benchmark_test_values.target = @network.DecoderOnlyConfig()',
      'benchmark_test_values.draft = @draft/network.DecoderOnlyConfig()',
      'benchmark_test_values.gamma = %GAMMA',
    ],
  )
  for name in ('target', 'draft'):
    assert configs[name] == gin_utils.call_configured(
      network.DecoderOnlyConfig, [f'configs/models/gpt_like_{name}.gin'], macros
    )
  dims = ['emb_dim = 32', 'num_heads = 2', 'head_dim = 16', 'mlp_dim = 64', 'num_layers = 1']
  records = gin_utils.call_configured(
    benchmark.benchmark_pair,
    ['configs/pairs/gpt_like.gin', 'configs/runs/benchmark.gin'],
    [
      'VOCAB_SIZE = 64',
      *[f'network.DecoderOnlyConfig.{dim}' for dim in dims],
      *[f'draft/network.DecoderOnlyConfig.{dim}' for dim in dims],
      'CHECKPOINT_PATH = None',
      'TASK = None',
      'TARGET = @target/models.random_model()',
      'DRAFT = @draft/models.random_model()',
      'EMULATE_ALPHA = 0.6',
      'GAMMAS = [2]',
      'NUM_EXAMPLES = 2',
      'MAX_DECODE_LEN = 6',
      'benchmark_pair.temperatures = [0.0]',
      'benchmark_pair.batch_sizes = [1]',
      'benchmark_pair.repetitions = 1',
      'benchmark_pair.random_input_length = 5',
      f"BENCHMARK_OUTPUT_DIR = '{tmp_path}'",
    ],
  )
  (walltime,) = [r for r in records if r['kind'] == 'walltime']
  assert walltime['architecture'] == 'decoder-only' and walltime['emulated']
  (costs,) = [r for r in records if r['kind'] == 'costs']
  assert costs['prompts']['width'] == 5  # The random inputs are the prompts.
  assert '(decoder-only), task' in (tmp_path / 'benchmark.md').read_text()


def test_gin_main_continues_decoder_prompts_of_an_encoder_decoder_pair():
  records = benchmark.benchmark_pair(
    target=TARGET,
    draft=DRAFT,
    output_dir=None,
    emulate_alpha=0.6,
    decoder_prompt_length=3,
    num_examples=2,
    random_input_length=5,
    temperatures=(0.0,),
    gammas=(2,),
    num_walltime_examples=2,
    repetitions=1,
    max_decode_len=6,
    progress=lambda line: None,
  )
  (costs,) = [r for r in records if r['kind'] == 'costs']
  assert costs['architecture'] == 'encoder-decoder'
  assert costs['prompts'] == {'width': 3, 'mean_tokens': 3.0, 'max_tokens': 3}


@pytest.mark.parametrize(
  'model', [TARGET, PREFIX_LM_TARGET], ids=['encoder-decoder', 'decoder-only']
)
def test_decoder_step_bytes_are_the_weights_one_embedding_row_and_the_caches(model):
  """`measure.decoder_step_bytes` (from the parameters) against the config's weight bytes."""
  config = model.config
  one_row = 4 * config.emb_dim  # The gathered embedding row of one token (untied logits).
  weights = network.decoder_weight_bytes(config) + one_row
  step_bytes = lambda **shape: measure.decoder_step_bytes(
    config, model.params, batch_size=1, block_size=1, **shape
  )
  assert step_bytes(input_length=0, cache_length=0) == weights
  # Keys and values of every layer over the cache, and (encoder-decoder only) over the inputs.
  kv_bytes = 2 * 4 * config.num_heads * config.head_dim
  layers = config.num_layers if network.is_decoder_only(config) else config.num_decoder_layers
  cross = 0 if network.is_decoder_only(config) else 7
  assert step_bytes(input_length=7, cache_length=10) == weights + layers * kv_bytes * (10 + cross)
