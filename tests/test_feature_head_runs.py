"""A feature head (`drafts.FeatureDraft`) where every draft goes: its gin main
(train_feature_head, resumed, settings checked), infer through gin
(configs/runs/feature_head_draft.gin), the benchmark's alpha, costs, walltime
and report, on tiny random targets."""

import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x import checkpoints
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import gin_utils
from speculative_t5x import infer
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x import settings as settings_lib
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import measure
from speculative_t5x_lab import reports
from speculative_t5x.training import train_feature_head
import testing_utils
from testing_utils import padded_inputs, tiny_decoder_only_model, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = 'translate: '
VOCAB_SIZE = 64


def random_head(target, seed=0, **fields):
  config = feature_head.config_for(target.config, emb_dim=32, head_dim=16, mlp_dim=64, **fields)
  return drafts.FeatureDraft.for_target(target, feature_head.init_params(config, seed), config)


TARGETS = {
  'encoder-decoder': tiny_model(seed=0, vocab_size=24, layers=2, scale=3.0),
  'decoder-only': tiny_decoder_only_model(seed=0, vocab_size=24, layers=2, scale=3.0),
}


# ------------------------------------------------------------------------------
# Teacher-forced alpha: the head's first draft token, as the loop computes it.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize('architecture', list(TARGETS))
def test_teacher_forced_logits_are_the_heads_first_draft_token(architecture):
  """`acceptance.draft_logits` of a head at output j equal the logits the loop's state holds
  after `observe` accepted the outputs before j (the head's entry at j - 1), for every j."""
  target = TARGETS[architecture]
  draft = random_head(target, output='own')
  inputs = padded_inputs(3, 2, 6, target.vocab_size)
  outputs = np.random.default_rng(4).integers(2, target.vocab_size, (2, 5)).astype(np.int32)
  prompts = inputs if architecture == 'decoder-only' else None
  logits = np.asarray(acceptance.draft_logits(draft, inputs, outputs, prompts))
  decoder_inputs, positions = layouts.continuation_layout(prompts, outputs)
  batch = {
    'encoder_input_tokens': jnp.asarray(inputs),
    'decoder_input_tokens': jnp.asarray(decoder_inputs),
    'decoder_target_tokens': jnp.ones_like(decoder_inputs),
  }
  _, features = network.compute_logits(
    target.config, target.params, batch, feature_layers=draft.feature_layers
  )
  next_tokens = jnp.pad(decoder_inputs[:, 1:], ((0, 0), (0, 1)))
  encoded = None
  if architecture == 'encoder-decoder':
    encoded = network.encode(target.config, target.params, jnp.asarray(inputs))
  start = draft.init_cache(jnp.asarray(inputs), decoder_inputs.shape[1] + 4, encoded=encoded)
  positions = np.asarray(positions)
  for j in range(outputs.shape[1]):
    # The loop's observe after accepting each row's outputs before j: the whole block, the
    # row's last true position positions[row, j] - 1 (one program for every j).
    position = positions[:, j]
    state = draft.after_verify(
      start,
      features,
      next_tokens,
      jnp.zeros((2,), jnp.int32),
      jnp.asarray(np.maximum(position - 1, 0), jnp.int32),
    )
    # At position 0 the head drafts from its start state.
    expected = np.where(position[:, None] > 0, state['logits'], start['logits'])
    np.testing.assert_allclose(logits[:, j], expected, atol=1e-4, rtol=1e-4, err_msg=f'j={j}')


@pytest.mark.parametrize('architecture', list(TARGETS))
def test_alpha_reads_a_heads_features_from_the_targets_own_pass(architecture, monkeypatch):
  """`measure_alpha`'s one target pass gives p and the features of a head on that target: the
  same alpha as the head running the target itself (here on an equal copy of its parameters)."""
  target = TARGETS[architecture]
  head = random_head(target, output='own')
  own_pass = head.replace(target_params=jax.tree.map(jnp.array, target.params))
  handed_features = []
  feature_head_logits = acceptance._feature_head_logits

  def recorded(draft, *args):
    handed_features.append((draft is head, args[-1] is not None))
    return feature_head_logits(draft, *args)

  monkeypatch.setattr(acceptance, '_feature_head_logits', recorded)
  result = acceptance.measure_alpha(
    target,
    {'shared': head, 'own pass': own_pass},
    padded_inputs(5, 8, 6, target.vocab_size),
    temperature=1.0,
    max_decode_len=6,
    min_tokens=60,
    batch_size=8,
  )
  assert handed_features and all(shared == handed for shared, handed in handed_features)
  assert {shared for shared, _ in handed_features} == {True, False}
  np.testing.assert_allclose(result['shared'].alpha, result['own pass'].alpha, rtol=1e-5)
  assert result['shared'].num_tokens == result['own pass'].num_tokens >= 60


# ------------------------------------------------------------------------------
# The benchmark with a head.
# ------------------------------------------------------------------------------
HEAD_PAIR = 'target / feature head'


@pytest.fixture(scope='module')
def head_records(tmp_path_factory):
  """A model draft's benchmark with a head compared in the same passes."""
  target = TARGETS['encoder-decoder']
  output_dir = str(tmp_path_factory.mktemp('head_benchmark'))
  records = benchmark.run_benchmark(
    target,
    tiny_model(seed=1, vocab_size=24, scale=3.0),
    padded_inputs(0, 8, 7, target.vocab_size),
    sweep=benchmark.Sweep(temperatures=(0.0,), gammas=(1, 2)),
    measurement=benchmark.Measurement(
      num_walltime_examples=4, repetitions=1, max_decode_len=10, alpha_tokens=800
    ),
    other_drafts=benchmark.OtherDrafts(
      compared_drafts={HEAD_PAIR: random_head(target, output='target')}
    ),
    report=benchmark.Report(
      pair_name='target / model draft', output_dir=output_dir, progress=lambda line: None
    ),
  )
  return records, output_dir


def test_the_benchmark_times_a_feature_head_beside_the_pairs_draft(head_records):
  records, output_dir = head_records
  costs = {r['pair']: r for r in records if r['kind'] == 'costs'}
  assert costs['target / model draft']['draft']['kind'] == 'network'
  head_costs = costs[HEAD_PAIR]
  assert head_costs['draft']['kind'] == 'feature head' and head_costs['draft']['output'] == 'target'
  assert head_costs['draft']['width'] == 32 and head_costs['draft']['feature_layers'] == [1]
  for gamma, parts in head_costs['parts_ms'][0.0].items():
    assert parts['draft_observe'] > 0 and parts['draft_rollout'] > 0, gamma
  # One measurement of the target's parts for both drafts.
  assert head_costs['verify_cost'] == costs['target / model draft']['verify_cost']
  assert head_costs['target_step_ms'] == costs['target / model draft']['target_step_ms']
  # The head's weights and, with output 'target', the target's logits layer it applies.
  assert head_costs['floors']['draft']['bytes'] > 4 * 24 * 32
  alpha = {r['draft']: r for r in records if r['kind'] == 'alpha'}
  assert set(alpha) == {benchmark.PAIR_DRAFT, HEAD_PAIR}
  walltime = {(r['pair'], r['gamma']): r for r in records if r['kind'] == 'walltime'}
  assert set(walltime) == {(pair, g) for pair in costs for g in (1, 2)}
  for gamma in (1, 2):
    head, draft = walltime[HEAD_PAIR, gamma], walltime['target / model draft', gamma]
    assert head['identical_outputs'] == 1.0 and head['c'] > 0
    assert head['breakdown']['draft_observe'] > 0 and draft['breakdown']['draft_observe'] == 0
    assert head['alpha'] == alpha[HEAD_PAIR]['alpha']
    # One baseline run for both: the same baseline timings.
    assert head['ms_per_token_baseline'] == draft['ms_per_token_baseline']
  # At gamma 1 every draft token is a first one, from the true features: alpha by teacher
  # forcing measures the same acceptance as the loop (up to the loop's few positions).
  assert abs(walltime[HEAD_PAIR, 1]['alpha'] - walltime[HEAD_PAIR, 1]['alpha_loop']) < 0.15
  markdown = open(os.path.join(output_dir, 'benchmark.md')).read()
  assert 'draft: a network (' in markdown
  assert f'Also **{HEAD_PAIR}**: draft: a feature head of width 32' in markdown
  assert '| head observe |' in markdown and f'| {HEAD_PAIR} |' in markdown


def test_a_heads_parts_with_prompts_are_timed():
  """A decoder-only target's prompt is prefilled into the head (from the target's features,
  random here) in the per-call set-up, and the head's cache rewrite is a part of c."""
  target = TARGETS['decoder-only']
  parts = measure.iteration_parts(
    target.config,
    target.params,
    random_head(target, output='own'),
    settings_lib.SpeculativeSettings(gamma=2),
    batch_size=1,
    input_length=4,
    prompt_length=4,
    max_decode_len=6,
    repetitions=1,
  )
  assert parts.draft_encode > 0 and parts.draft_observe > 0 and parts.draft_catch_up == 0
  assert parts.c == pytest.approx(
    (parts.draft_rollout + parts.draft_observe) / 2 / parts.target_step
  )


def test_costs_records_without_a_draft_description_still_report():
  assert reports.draft_description(None) == ''
  assert 'network (2.90M parameters)' in reports.draft_description(
    dict(kind='network', parameters=2_900_000)
  )


# ------------------------------------------------------------------------------
# The gin main, resumed; infer with the head through gin.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def gin_fixture(tmp_path_factory):
  directory = tmp_path_factory.mktemp('head_gin')
  task, data, vocabulary = testing_utils.phrase_task(
    str(directory), 'speculative_t5x:feature_head_gin_fixture', PREFIX
  )
  config = gin_utils.model_config('tiny', VOCAB_SIZE)  # configs/models/tiny.gin.
  target = models.random_model(config, seed=1)
  checkpoints.save_params(directory / 'target', target.params)
  tsv = {split: os.path.join(data, f'{split}.tsv') for split in ('train', 'validation')}
  files = ['configs/models/tiny.gin', 'configs/pairs/pair.gin', 'configs/tasks/tsv.gin']
  bindings = dict(
    CHECKPOINT_PATH=str(directory / 'target'),
    VOCAB_SIZE=VOCAB_SIZE,
    TSV_FILES=dict(tsv, test=tsv['validation']),
    VOCABULARY=vocabulary,
    TASK_NAME='speculative_t5x:feature_head_gin_task',
    PREFIX=PREFIX,
  )
  return dict(directory=directory, target=target, files=files, bindings=bindings)


def run_configured(fixture, run_file, function, **bindings):
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags(
      [REPO],
      fixture['files'] + [run_file],
      [f'{k} = {v!r}' for k, v in {**fixture['bindings'], **bindings}.items()],
    )
    return gin.get_configurable(function)()
  finally:
    gin.clear_config()


HEAD_BINDINGS = dict(
  HEAD_WIDTH=16,
  BATCH_SIZE=4,
  MAX_DECODE_LEN=8,
  NUM_EXAMPLES=None,
  **{
    'train_feature_head.train_on_task.head_dim': 8,
    'train_feature_head.train_on_task.head_mlp_dim': 32,
    'train_feature_head.train_on_task.eval_examples': 4,
    'train_feature_head.train_on_task.eval_every': 2,
    'train_feature_head.train_on_task.checkpoint_every': 2,
    'train_feature_head.train_on_task.progress': False,
  },
)


def test_the_gin_main_trains_resumes_refuses_other_settings_and_infer_decodes_with_it(
  gin_fixture, tmp_path
):
  model_dir = str(tmp_path / 'head')
  train = lambda **kw: run_configured(
    gin_fixture,
    'configs/runs/train_feature_head.gin',
    train_feature_head.train_on_task,
    MODEL_DIR=model_dir,
    **{**HEAD_BINDINGS, **kw},
  )
  first = train(HEAD_STEPS=2)
  assert first.step == 2 and [r['step'] for r in first.eval_metrics] == [0, 2]
  resumed = train(HEAD_STEPS=4)
  assert resumed.step == 4 and [r['step'] for r in resumed.train_metrics] == [4]
  with pytest.raises(ValueError, match=r'head_config\.emb_dim=16 \(this run: 32\)'):
    train(HEAD_STEPS=6, HEAD_WIDTH=32)
  with pytest.raises(ValueError, match='fused'):
    train(HEAD_STEPS=6, FEATURE_LAYERS='eagle')

  # The head read back for its target, and infer with it through gin: greedy = baseline.
  head = models.FeatureHeadCheckpoint(model_dir).for_target(gin_fixture['target'])
  jax.tree.map(np.testing.assert_array_equal, head.params, resumed.params)
  outputs = {}
  for name, files in (('baseline', []), ('head', ['configs/runs/feature_head_draft.gin'])):
    output_dir = tmp_path / name
    gin.clear_config()
    try:
      gin_utils.parse_gin_flags(
        [REPO],
        gin_fixture['files'] + ['configs/runs/infer.gin'] + files,
        [
          f'{k} = {v!r}'
          for k, v in {
            **gin_fixture['bindings'],
            'INFER_OUTPUT_DIR': str(output_dir),
            'TASK_FEATURE_LENGTHS': {'inputs': 32, 'targets': 8},
            'BATCH_SIZE': 4,
            'GAMMA': 3,
            'infer.infer.split': 'validation',
            'infer.infer.progress': False,
            **({'HEAD_CHECKPOINT_PATH': model_dir} if files else {}),
          }.items()
        ]
        + ([] if files else ['DRAFT = None']),
      )
      summary = gin.get_configurable(infer.infer)()
    finally:
      gin.clear_config()
    outputs[name] = infer.read_records(
      os.path.join(output_dir, 'speculative_t5x:feature_head_gin_task-validation.jsonl')
    )
    assert summary['decoded_examples'] == len(outputs[name]) > 0
  assert [r['prediction'] for r in outputs['head']] == [
    r['prediction'] for r in outputs['baseline']
  ]
  assert sum(r['iterations'] for r in outputs['head']) <= sum(
    r['iterations'] for r in outputs['baseline']
  )


def test_a_head_checkpoint_for_another_target_is_refused_naming_both(gin_fixture, tmp_path):
  target = gin_fixture['target']
  head = random_head(target)
  train_dir = tmp_path / 'head'
  inputs = padded_inputs(0, 4, 6, target.vocab_size)
  train_feature_head.train_feature_head(
    str(train_dir), target, head.config, inputs, max_decode_len=4, batch_size=2, num_steps=1
  )
  other = tiny_model(seed=0, vocab_size=VOCAB_SIZE, emb_dim=32, layers=2)
  with pytest.raises(ValueError, match='width 128.*but the target has.*width 32'):
    models.FeatureHeadCheckpoint(str(train_dir)).for_target(other)
  with pytest.raises(ValueError, match='holds no feature_head_settings.json'):
    models.FeatureHeadCheckpoint(str(tmp_path)).for_target(target)


# ------------------------------------------------------------------------------
# One writer per head directory; readers need no lock.
# ------------------------------------------------------------------------------
def test_a_second_head_trainer_is_refused_while_readers_still_read(gin_fixture, tmp_path):
  target = gin_fixture['target']
  head = random_head(target)
  model_dir = tmp_path / 'head'
  inputs = padded_inputs(0, 4, 6, target.vocab_size)
  args = dict(max_decode_len=4, batch_size=2, num_steps=1)
  trained = train_feature_head.train_feature_head(
    str(model_dir), target, head.config, inputs, **args
  )
  before = sorted(os.listdir(model_dir))
  with testing_utils.lock_held_elsewhere(model_dir) as holder:
    with pytest.raises(output_lock.OutputLockedError) as error:
      train_feature_head.train_feature_head(
        str(model_dir), target, head.config, inputs, **dict(args, num_steps=2)
      )
    assert f'{model_dir} is being written by another job: test holder, process {holder} ' in (
      str(error.value)
    )
    # A reader of the finished head takes no lock: it reads while a writer holds the directory.
    read = models.FeatureHeadCheckpoint(str(model_dir)).for_target(target)
    jax.tree.map(np.testing.assert_array_equal, read.params, trained.params)
  assert sorted(os.listdir(model_dir)) == before


@pytest.mark.slow
def test_two_head_trainers_started_together_on_one_model_dir_one_proceeds(gin_fixture, tmp_path):
  bindings = {**gin_fixture['bindings'], **HEAD_BINDINGS, 'HEAD_STEPS': 4}
  alone = run_configured(
    gin_fixture,
    'configs/runs/train_feature_head.gin',
    train_feature_head.train_on_task,
    MODEL_DIR=str(tmp_path / 'alone'),
    **bindings,
  )
  model_dir = str(tmp_path / 'together')
  flags = [
    f'--gin_file={path}' for path in gin_fixture['files'] + ['configs/runs/train_feature_head.gin']
  ] + [f'--gin.{k}={v!r}' for k, v in {**bindings, 'MODEL_DIR': model_dir}.items()]
  results = testing_utils.run_writers_together(
    'speculative_t5x.training.train_feature_head', flags, tmp_path
  )
  finished = [result for result in results if result[1] == 0]
  assert len(finished) == 1, [result[2][-3000:] for result in results]
  ((winner, _, _),) = finished
  ((_, _, stderr),) = [result for result in results if result[1] != 0]
  assert (
    f'{model_dir} is being written by another job: '
    f'speculative_t5x.training.train_feature_head, process {winner} '
  ) in stderr, stderr[-3000:]
  # The survivor's head is a lone run's.
  head = models.FeatureHeadCheckpoint(model_dir).for_target(gin_fixture['target'])
  jax.tree.map(np.testing.assert_array_equal, head.params, alone.params)
  assert sorted(os.listdir(model_dir)) == sorted(os.listdir(tmp_path / 'alone'))
