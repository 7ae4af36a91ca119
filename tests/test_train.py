"""Tests for speculative_t5x.training.train: loss, learning, checkpoints, resumption, gin.

The fixture task is a TSV task over systematic English/German phrases written
here, with a SentencePiece vocabulary trained on them, so that a tiny network
learns it in a few dozen steps: an encoder-decoder, and a decoder-only network
as a prefix LM and as a language model of the targets.
"""

import os
import signal
import subprocess

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import seqio

from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x.data import tasks
from speculative_t5x.training import train
import testing_utils

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = 'translate: '
FEATURE_LENGTHS = {'inputs': 48, 'targets': 32}


@pytest.fixture(scope='module')
def fixture_task(tmp_path_factory):
  """(task name, TSV directory, vocabulary path) of a 36-pair task."""
  return testing_utils.phrase_task(
    tmp_path_factory.mktemp('data'), 'speculative_t5x:train_test_fixture', PREFIX
  )


def _config(vocab_size, **overrides):
  fields = dict(
    vocab_size=vocab_size,
    dtype='float32',
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
  )
  fields.update(overrides)
  return network.T5Config(**fields)


# ------------------------------------------------------------------------------
# The loss, against T5X's formulas written out with one-hot targets.
# ------------------------------------------------------------------------------
def _t5x_loss(logits, targets, label_smoothing, z_loss):
  """T5X's compute_weighted_cross_entropy per token, in float64 numpy."""
  logits = np.asarray(logits, np.float64)
  vocab = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  soft = np.where(np.arange(vocab) == np.asarray(targets)[..., None], confidence, low)
  log_z = np.log(np.sum(np.exp(logits), -1))
  log_softmax = logits - log_z[..., None]
  constant = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
  return -np.sum(soft * log_softmax, -1) - constant + z_loss * log_z**2, soft, log_z


@pytest.mark.parametrize('label_smoothing, z_loss', [(0.0, 0.0), (0.1, 1e-4), (0.3, 0.01)])
def test_cross_entropy_matches_t5x(label_smoothing, z_loss):
  logits = np.array(
    [
      [[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0]],
      [[-0.5, 0.0, 0.5, 1.0], [4.0, 1.0, -1.0, 0.0]],
    ],
    np.float32,
  )
  targets = np.array([[0, 2], [3, 1]])
  expected, soft, log_z = _t5x_loss(logits, targets, label_smoothing, z_loss)
  fn = lambda x: train.cross_entropy_with_logits(
    x, targets, label_smoothing=label_smoothing, z_loss=z_loss
  )
  out = fn(jnp.asarray(logits))
  np.testing.assert_allclose(out['loss'], expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['z_loss'], z_loss * log_z**2, rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(
    out['cross_entropy'],
    -np.log(np.take_along_axis(np.exp(logits - log_z[..., None]), targets[..., None], -1))[..., 0],
    rtol=1e-5,
  )
  np.testing.assert_array_equal(out['correct'], [[1, 1], [1, 0]])
  # T5X's custom gradient: (1 + 2 z log Z) softmax - soft targets.
  grad = jax.grad(lambda x: jnp.sum(fn(x)['loss']))(jnp.asarray(logits))
  softmax = np.exp(logits - log_z[..., None])
  np.testing.assert_allclose(
    grad, (1 + 2 * z_loss * log_z)[..., None] * softmax - soft, rtol=1e-4, atol=1e-6
  )


def test_loss_weights_per_normalizing_factor():
  # Row 0 packs sequences of 2 and 3 tokens, row 1 holds one of 1 token.
  batch = {
    'decoder_target_tokens': jnp.array([[5, 1, 6, 7, 1, 0], [1, 0, 0, 0, 0, 0]]),
    'decoder_segment_ids': jnp.array([[1, 1, 2, 2, 2, 0], [1, 0, 0, 0, 0, 0]]),
    'decoder_loss_weights': jnp.array([[1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]]),
  }
  tokens = np.array([[1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]], np.float32)
  for factor, normalizer in (
    (None, 1.0),
    (4.0, 4.0),
    ('NUM_REAL_TARGET_TOKENS', 6.0),
    ('NUM_TOTAL_TARGET_TOKENS', 12.0),
  ):
    weights, value = train.loss_weights(batch, factor)
    np.testing.assert_array_equal(weights, tokens)
    assert float(value) == normalizer
  weights, value = train.loss_weights(batch, 'AVERAGE_PER_SEQUENCE')
  third = 1 / 3
  np.testing.assert_allclose(
    weights, [[0.5, 0.5, third, third, third, 0], [1, 0, 0, 0, 0, 0]], rtol=1e-6
  )
  np.testing.assert_allclose(value, 3.0, rtol=1e-6)


# ------------------------------------------------------------------------------
# Data.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize('passes, chunk', [(1, 8), (2, 8), (3, 8), (2, 3)])
def test_each_chunk_of_data_steps_serves_data_passes_training_steps_in_turn(passes, chunk):
  """Training step s reads data step `data_step(s, P, chunk)`: each chunk's batches P times."""
  steps = np.arange(1, 2 * chunk * passes + 2)
  read = [train.data_step(int(s), passes, chunk) for s in steps]
  first_chunk = list(range(1, chunk + 1)) * passes
  second_chunk = list(range(chunk + 1, 2 * chunk + 1)) * passes
  assert read == first_chunk + second_chunk + [2 * chunk + 1]


def test_dataset_packs_or_pads(fixture_task):
  task, _, _ = fixture_task
  padded = next(
    train.get_dataset(task, 'validation', FEATURE_LENGTHS, 3, pack=False).as_numpy_iterator()
  )
  assert sorted(padded) == [
    'decoder_input_tokens',
    'decoder_loss_weights',
    'decoder_target_tokens',
    'encoder_input_tokens',
  ]
  assert padded['encoder_input_tokens'].shape == (3, FEATURE_LENGTHS['inputs'])
  # One example per row: EOS (1) once per row, targets shifted right behind BOS (0).
  np.testing.assert_array_equal(np.sum(padded['decoder_target_tokens'] == 1, 1), [1, 1, 1])
  np.testing.assert_array_equal(
    padded['decoder_input_tokens'][:, 1:], padded['decoder_target_tokens'][:, :-1]
  )
  packed = next(train.get_dataset(task, 'validation', FEATURE_LENGTHS, 3).as_numpy_iterator())
  assert packed['decoder_segment_ids'].max() > 1  # Several examples per row.
  assert np.sum(packed['decoder_target_tokens'] == 1) == np.sum(
    packed['decoder_segment_ids'].max(1)
  )
  # The training stream is a function of the seed; skipping resumes it.
  stream = lambda seed, skip=0: [
    b['encoder_input_tokens']
    for b in train.get_dataset(
      task, 'train', FEATURE_LENGTHS, 4, shuffle=True, seed=seed, repeat=True, skip_batches=skip
    )
    .take(12 - skip)
    .as_numpy_iterator()
  ]
  first = stream(5)
  np.testing.assert_array_equal(np.stack(first[7:]), np.stack(stream(5, skip=7)))
  assert not np.array_equal(np.stack(first), np.stack(stream(6)))


# ------------------------------------------------------------------------------
# Training, through the gin entry point: a reference run, and a run killed and
# resumed (in another process) that must end where the reference ends.
# ------------------------------------------------------------------------------
TRAIN_STEPS = 150
CHECKPOINT_EVERY = 50


@pytest.fixture(scope='module')
def gin_config(fixture_task, tmp_path_factory):
  """(gin files, bindings) of a tiny network on the fixture task."""
  task, directory, vocabulary_path = fixture_task
  configs = tmp_path_factory.mktemp('configs')
  model_gin = configs / 'model.gin'
  model_gin.write_text("""
from __gin__ import dynamic_registration
from speculative_t5x import network

network.T5Config:
  vocab_size = 64
  dtype = 'float32'
  emb_dim = 32
  num_heads = 2
  head_dim = 16
  mlp_dim = 64
  num_encoder_layers = 1
  num_decoder_layers = 1
  dropout_rate = %DROPOUT_RATE
""")
  task_gin = configs / 'task.gin'
  task_gin.write_text(f"""
from __gin__ import dynamic_registration
from speculative_t5x.data import tasks
from speculative_t5x.training import train

TASK = @tasks.register_tsv_task()
tasks.register_tsv_task:
  name = {task!r}
  split_to_filepattern = {{'train': '{directory}/train.tsv',
                          'validation': '{directory}/validation.tsv'}}
  vocabulary = {vocabulary_path!r}
  extra_ids = 0
  prefix = {PREFIX!r}
TASK_FEATURE_LENGTHS = {FEATURE_LENGTHS!r}
train.train.checkpoint_every = {CHECKPOINT_EVERY}
train.train.eval_every = 50
train.train.log_every = 10
train.train.progress = False
""")
  files = [str(model_gin), os.path.join(REPO, 'configs/runs/train.gin'), str(task_gin)]
  # Dropout on, so that the resumed run must also reproduce the dropout masks.
  bindings = {'TRAIN_STEPS': TRAIN_STEPS, 'BATCH_SIZE': 4, 'DROPOUT_RATE': 0.1, 'RANDOM_SEED': 3}
  return files, bindings


def _train_with_gin(files, bindings):
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(files, [f'{k} = {v!r}' for k, v in bindings.items()])
    return gin.get_configurable(train.train)()
  finally:
    gin.clear_config()


@pytest.fixture(scope='module')
def reference(gin_config, tmp_path_factory):
  """(TrainResult, model_dir) of an uninterrupted run."""
  files, bindings = gin_config
  model_dir = str(tmp_path_factory.mktemp('reference') / 'model')
  return _train_with_gin(files, {**bindings, 'MODEL_DIR': model_dir}), model_dir


def _complete_steps(model_dir):
  return sorted(
    int(name)
    for name in os.listdir(model_dir)
    if name.isdigit() and os.path.exists(os.path.join(model_dir, name, 'commit_success.txt'))
  )


def test_training_lowers_the_loss(reference):
  result, model_dir = reference
  assert result.step == TRAIN_STEPS
  assert [record['step'] for record in result.train_metrics] == list(range(10, 151, 10))
  losses = [record['loss'] for record in result.train_metrics]
  assert losses[-1] < 0.3 * losses[0], losses
  assert all(record['tokens_per_second'] > 0 for record in result.train_metrics[1:])
  assert [record['step'] for record in result.eval_metrics] == [50, 100, 150]
  first_eval, _, last_eval = result.eval_metrics
  assert last_eval['cross_entropy'] < 0.3 * first_eval['cross_entropy'], result.eval_metrics
  assert last_eval['accuracy'] > 0.8, result.eval_metrics
  # train.gin keeps the 2 latest checkpoints: orbax step directories with both items.
  assert _complete_steps(model_dir) == [100, 150]
  assert sorted(os.listdir(os.path.join(model_dir, '150'))) == sorted(
    ['_CHECKPOINT_METADATA', 'commit_success.txt', 'params', 'opt_state']
  )
  with ocp.CheckpointManager(model_dir, item_names=train.ITEM_NAMES) as manager:
    restored = manager.restore(150, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  jax.tree_util.tree_map(
    np.testing.assert_array_equal, restored.params, jax.device_get(result.params)
  )
  assert jax.tree_util.tree_structure(restored.params) == jax.tree_util.tree_structure(
    network.random_params(_config(64))[0]
  )
  lines = open(os.path.join(model_dir, train.METRICS_FILE)).read().splitlines()
  assert len(lines) == len(result.train_metrics) + len(result.eval_metrics)


def test_bad_arguments_name_the_problem(fixture_task, tmp_path):
  task, _, _ = fixture_task
  args = dict(feature_lengths=FEATURE_LENGTHS, batch_size=2, num_steps=2, progress=False)
  with pytest.raises(ValueError, match='vocab_size >= 64'):
    train.train(str(tmp_path), _config(32), task, **args)
  with pytest.raises(ValueError, match='feature_lengths must map'):
    train.train(str(tmp_path), _config(64), task, **{**args, 'feature_lengths': {'inputs': 8}})
  with pytest.raises(ValueError, match='batch_size must be an integer >= 1'):
    train.train(str(tmp_path), _config(64), task, **{**args, 'batch_size': 0})
  with pytest.raises(ValueError, match='Unknown loss_normalizing_factor'):
    train.train(str(tmp_path), _config(64), task, loss_normalizing_factor='TOKENS', **args)
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(gin_config, reference, tmp_path):
  files, bindings = gin_config
  reference_result, reference_dir = reference
  killed_dir = str(tmp_path / 'killed')
  # Killed at step 120, once the save of step 100 is complete: mid-run by construction.
  command = testing_utils.main_killed_at(
    'speculative_t5x.training.train',
    'train',
    'after_step',
    at=120,
    wait_for=os.path.join(killed_dir, '100', 'commit_success.txt'),
  )
  command += [f'--gin_file={path}' for path in files]
  command += [f'--gin.{name}={value!r}' for name, value in bindings.items()]
  command += [f'--gin.MODEL_DIR={killed_dir!r}']
  process = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  assert process.returncode == -signal.SIGKILL, process.stderr.decode()[-3000:]
  steps_at_kill = _complete_steps(killed_dir)
  assert steps_at_kill == [50, 100]
  # The killed run's writer lock is left behind; the resumed run takes it over (and
  # removes it at its end: the directories are listed alike below).
  assert os.path.exists(os.path.join(killed_dir, output_lock.LOCK_FILE))

  resumed = _train_with_gin(files, {**bindings, 'MODEL_DIR': killed_dir})
  # It started from the last checkpoint, not from scratch, and ended like the reference.
  assert resumed.train_metrics[0]['step'] == steps_at_kill[-1] + 10
  assert resumed.step == TRAIN_STEPS
  assert sorted(os.listdir(killed_dir)) == sorted(os.listdir(reference_dir))
  assert _complete_steps(killed_dir) == _complete_steps(reference_dir)
  # Same data order, dropout keys and optimizer state: the same parameters.
  jax.tree_util.tree_map(
    np.testing.assert_array_equal,
    jax.device_get(resumed.params),
    jax.device_get(reference_result.params),
  )


def test_finished_run_resumes_to_nothing_and_checks_the_network(gin_config, reference):
  files, bindings = gin_config
  _, model_dir = reference
  again = _train_with_gin(files, {**bindings, 'MODEL_DIR': model_dir})
  assert again.step == TRAIN_STEPS and not again.train_metrics
  assert _complete_steps(model_dir) == [100, 150]
  # A resumed run with another network is refused, naming the field and both values.
  with pytest.raises(ValueError, match=r'config\.emb_dim=32 \(this run: 48\)'):
    _train_with_gin(
      files,
      {**bindings, 'MODEL_DIR': model_dir, 'TRAIN_STEPS': 200, 'network.T5Config.emb_dim': 48},
    )


DIRECT_ARGS = dict(feature_lengths=FEATURE_LENGTHS, batch_size=4, progress=False)


def _gin_flags(files, bindings):
  return [f'--gin_file={path}' for path in files] + [
    f'--gin.{name}={value!r}' for name, value in bindings.items()
  ]


def test_a_second_trainer_is_refused_before_any_computation(gin_config, fixture_task, tmp_path):
  files, bindings = gin_config
  task, _, _ = fixture_task
  model_dir = tmp_path / 'model'
  with testing_utils.lock_held_elsewhere(model_dir) as holder:
    with pytest.raises(output_lock.OutputLockedError) as error:
      train.train(str(model_dir), _config(64), task, **dict(DIRECT_ARGS, num_steps=2))
    assert f'{model_dir} is being written by another job: test holder, process {holder} ' in (
      str(error.value)
    )
    # The command line, before gin builds the arguments.
    gin.clear_config()
    sigterm = signal.getsignal(signal.SIGTERM)  # The main handles SIGTERM.
    try:
      gin.parse_config_files_and_bindings(
        files, [f'{k} = {v!r}' for k, v in {**bindings, 'MODEL_DIR': str(model_dir)}.items()]
      )
      with pytest.raises(output_lock.OutputLockedError, match=f'process {holder} '):
        train.main(['train'])
    finally:
      gin.clear_config()
      signal.signal(signal.SIGTERM, sigterm)
  assert os.listdir(model_dir) == []


def test_a_reader_loads_a_trained_model_while_a_writer_holds_its_directory(reference):
  result, model_dir = reference
  with testing_utils.lock_held_elsewhere(model_dir):
    model = models.load_trained(model_dir)  # Takes no lock.
  jax.tree_util.tree_map(np.testing.assert_array_equal, model.params, jax.device_get(result.params))


@pytest.mark.slow
def test_two_runs_started_together_on_one_model_dir_one_proceeds(gin_config, reference, tmp_path):
  files, bindings = gin_config
  reference_result, reference_dir = reference
  model_dir = str(tmp_path / 'model')
  results = testing_utils.run_writers_together(
    'speculative_t5x.training.train',
    _gin_flags(files, {**bindings, 'MODEL_DIR': model_dir}),
    tmp_path,
  )
  finished = [result for result in results if result[1] == 0]
  assert len(finished) == 1, [result[2][-3000:] for result in results]
  ((winner, _, _),) = finished
  ((_, _, stderr),) = [result for result in results if result[1] != 0]
  assert (
    f'{model_dir} is being written by another job: speculative_t5x.training.train, '
    f'process {winner} '
  ) in stderr, stderr[-3000:]
  # The survivor's run is a lone run's.
  assert sorted(os.listdir(model_dir)) == sorted(os.listdir(reference_dir))
  assert _complete_steps(model_dir) == _complete_steps(reference_dir)
  with ocp.CheckpointManager(model_dir, item_names=train.ITEM_NAMES) as manager:
    restored = manager.restore(150, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  jax.tree_util.tree_map(
    np.testing.assert_array_equal, restored.params, jax.device_get(reference_result.params)
  )


# ------------------------------------------------------------------------------
# Decoder-only networks: T5X's DecoderOnlyModel data path (LM and prefix LM).
# ------------------------------------------------------------------------------
PREFIX_LM_LENGTHS = {'inputs': 24, 'targets': 16}
LM_LENGTHS = {'targets': 16}


def _decoder_only_config(**overrides):
  fields = dict(
    vocab_size=64,
    dtype='float32',
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=64,
    num_layers=2,
    dropout_rate=0.0,
  )
  fields.update(overrides)
  return network.DecoderOnlyConfig(**fields)


def _first_batch(task, feature_lengths, config, pack=True):
  dataset = train.get_dataset(
    task,
    'validation',
    feature_lengths,
    3,
    pack=pack,
    converter_cls=train.feature_converter_cls(config),
  )
  return next(dataset.as_numpy_iterator())


def test_decoder_only_features_are_t5x_lm_and_prefix_lm(fixture_task):
  task, _, _ = fixture_task
  config = _decoder_only_config()
  assert train.feature_converter_cls(config) is seqio.DecoderFeatureConverter
  assert train.feature_converter_cls(_config(64)) is seqio.EncDecFeatureConverter
  # Prefix LM: one row per example, inputs (with the prefix) then targets.
  prefix_lm = _first_batch(task, PREFIX_LM_LENGTHS, config, pack=False)
  assert 'encoder_input_tokens' not in prefix_lm
  assert prefix_lm['decoder_target_tokens'].shape == (3, 40)
  for row in range(3):
    targets = prefix_lm['decoder_target_tokens'][row]
    inputs_end = list(targets).index(1) + 1  # The inputs end with their EOS.
    # Causal attention (bidirectional when asked) over the inputs and BOS; loss on targets only.
    np.testing.assert_array_equal(
      prefix_lm['decoder_causal_attention'][row], np.arange(40) <= inputs_end
    )
    np.testing.assert_array_equal(
      prefix_lm['decoder_loss_weights'][row], (np.arange(40) >= inputs_end) & (targets > 0)
    )
  # LM of the targets alone: no causal-attention feature, loss on every token.
  lm = _first_batch(task, LM_LENGTHS, config, pack=False)
  assert 'decoder_causal_attention' not in lm
  np.testing.assert_array_equal(lm['decoder_loss_weights'], lm['decoder_target_tokens'] > 0)
  assert train._real_tokens(lm) == np.count_nonzero(lm['decoder_target_tokens'])


def test_decoder_only_logits_attend_bidirectionally_only_when_asked(fixture_task):
  task, _, _ = fixture_task
  config = _decoder_only_config()
  batch = _first_batch(task, PREFIX_LM_LENGTHS, config)
  params = network.random_params(config, 1)[0]
  causal = train.make_logits_fn(config)(params, batch, None)
  bidirectional = train.make_logits_fn(config, True)(params, batch, None)
  module = network.DecoderOnly(config)
  args = (batch['decoder_input_tokens'], batch['decoder_target_tokens'])
  segments = (batch['decoder_segment_ids'], batch['decoder_positions'])
  expected = lambda attention: module.apply(
    {'params': params}, *args, *segments, attention, enable_dropout=False
  )
  np.testing.assert_array_equal(causal, expected(None))
  np.testing.assert_array_equal(bidirectional, expected(batch['decoder_causal_attention']))
  assert not np.allclose(causal, bidirectional)


@pytest.fixture(scope='module')
def decoder_only_gin(fixture_task, tmp_path_factory):
  """(gin files, bindings) of a tiny decoder-only prefix LM, through train_decoder_only.gin."""
  task, directory, vocabulary_path = fixture_task
  configs = tmp_path_factory.mktemp('decoder_only_configs')
  model_gin = configs / 'model.gin'
  model_gin.write_text("""
from __gin__ import dynamic_registration
from speculative_t5x import network

network.DecoderOnlyConfig:
  vocab_size = 64
  dtype = 'float32'
  emb_dim = 32
  num_heads = 2
  head_dim = 16
  mlp_dim = 64
  num_layers = 2
  dropout_rate = %DROPOUT_RATE
""")
  task_gin = configs / 'task.gin'
  task_gin.write_text(f"""
from __gin__ import dynamic_registration
from speculative_t5x.training import train

TASK = {task!r}
train.train.eval_every = 40
train.train.log_every = 10
train.train.progress = False
""")
  files = [str(model_gin), os.path.join(REPO, 'configs/runs/train_decoder_only.gin'), str(task_gin)]
  bindings = {
    'TASK_FEATURE_LENGTHS': PREFIX_LM_LENGTHS,
    'INPUTS_BIDIRECTIONAL_ATTENTION': True,
    'TRAIN_STEPS': 80,
    'CHECKPOINT_PERIOD': 40,
    'BATCH_SIZE': 4,
    'DROPOUT_RATE': 0.1,  # The resumed run must reproduce the dropout masks too.
    'RANDOM_SEED': 2,
  }
  return files, bindings


@pytest.fixture(scope='module')
def prefix_lm_reference(decoder_only_gin, tmp_path_factory):
  """(TrainResult, model_dir) of an uninterrupted bidirectional prefix-LM run."""
  files, bindings = decoder_only_gin
  model_dir = str(tmp_path_factory.mktemp('prefix_lm') / 'model')
  return _train_with_gin(files, {**bindings, 'MODEL_DIR': model_dir}), model_dir


def _assert_learned(result, steps):
  losses = [record['loss'] for record in result.train_metrics]
  assert result.step == steps and losses[-1] < 0.5 * losses[0], losses
  first_eval, last_eval = result.eval_metrics[0], result.eval_metrics[-1]
  assert last_eval['cross_entropy'] < first_eval['cross_entropy'], result.eval_metrics


def test_decoder_only_prefix_lm_learns_and_records_its_settings(prefix_lm_reference):
  result, model_dir = prefix_lm_reference
  _assert_learned(result, 80)
  assert jax.tree_util.tree_structure(result.params) == jax.tree_util.tree_structure(
    network.random_params(_decoder_only_config())[0]
  )
  settings = train.read_settings(model_dir)
  assert settings['network'] == 'DecoderOnlyConfig'
  assert settings['config']['num_layers'] == 2 and settings['config']['dtype'] == 'float32'
  assert settings['feature_lengths'] == PREFIX_LM_LENGTHS
  assert settings['inputs_bidirectional_attention'] is True
  assert _complete_steps(model_dir) == [40, 80]


@pytest.mark.slow  # The prefix LM above trains the decoder-only network fast.
def test_decoder_only_plain_lm_learns(fixture_task, tmp_path):
  task, _, _ = fixture_task
  result = train.train(
    str(tmp_path),
    _decoder_only_config(),
    task,
    feature_lengths=LM_LENGTHS,
    batch_size=4,
    num_steps=60,
    learning_rate=0.03,
    eval_every=30,
    log_every=10,
    progress=False,
  )
  _assert_learned(result, 60)
  assert train.read_settings(str(tmp_path))['inputs_bidirectional_attention'] is False
  # 'tokens' counts every real token trained on: those of the stream's first 60 batches.
  stream = train.get_dataset(
    task,
    'train',
    LM_LENGTHS,
    4,
    shuffle=True,
    seed=0,
    repeat=True,
    converter_cls=seqio.DecoderFeatureConverter,
  )
  assert sum(record['tokens'] for record in result.train_metrics) == sum(
    np.count_nonzero(batch['decoder_target_tokens'])
    for batch in stream.take(60).as_numpy_iterator()
  )


def test_decoder_only_resumed_run_equals_the_uninterrupted_one(
  decoder_only_gin, prefix_lm_reference, tmp_path
):
  files, bindings = decoder_only_gin
  reference_result, reference_dir = prefix_lm_reference
  model_dir = str(tmp_path / 'model')
  # Stopped after its first checkpoint (a resumed run restarts from the latest one).
  first = _train_with_gin(files, {**bindings, 'MODEL_DIR': model_dir, 'TRAIN_STEPS': 40})
  assert first.step == 40 and _complete_steps(model_dir) == [40]
  with pytest.raises(ValueError, match=r'inputs_bidirectional_attention=True \(this run: False\)'):
    _train_with_gin(
      files, {**bindings, 'MODEL_DIR': model_dir, 'INPUTS_BIDIRECTIONAL_ATTENTION': False}
    )
  resumed = _train_with_gin(files, {**bindings, 'MODEL_DIR': model_dir})
  assert resumed.train_metrics[0]['step'] == 50
  assert sorted(os.listdir(model_dir)) == sorted(os.listdir(reference_dir))
  jax.tree_util.tree_map(
    np.testing.assert_array_equal,
    jax.device_get(resumed.params),
    jax.device_get(reference_result.params),
  )


def test_bad_decoder_only_combinations_name_the_problem(fixture_task, tmp_path):
  task, directory, vocabulary_path = fixture_task
  args = dict(batch_size=2, num_steps=2, progress=False)
  decoder_only = _decoder_only_config()
  with pytest.raises(ValueError, match='encoder-decoder.*inputs_bidirectional_attention=False'):
    train.train(
      str(tmp_path),
      _config(64),
      task,
      feature_lengths=FEATURE_LENGTHS,
      inputs_bidirectional_attention=True,
      **args,
    )
  with pytest.raises(ValueError, match="has no 'inputs' \\(a plain LM\\)"):
    train.train(
      str(tmp_path),
      decoder_only,
      task,
      feature_lengths=LM_LENGTHS,
      inputs_bidirectional_attention=True,
      **args,
    )
  with pytest.raises(ValueError, match="map 'targets' \\(a language model\\) or"):
    train.train(str(tmp_path), decoder_only, task, feature_lengths={'inputs': 8}, **args)
  with pytest.raises(ValueError, match='set DecoderOnlyConfig.vocab_size >= 64'):
    train.train(
      str(tmp_path),
      _decoder_only_config(vocab_size=32),
      task,
      feature_lengths=PREFIX_LM_LENGTHS,
      **args,
    )
  # A task of targets alone has no inputs for a prefix LM.
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  for split in ('train', 'validation', 'test'):
    (corpus / f'{split}.txt').write_text('Die Datei wurde gespeichert .\n')
  lm_task = tasks.register_english_lm_task(
    str(corpus), vocabulary_path, prompt_words=0, name='speculative_t5x:train_test_lm'
  )
  with pytest.raises(ValueError, match="feature_lengths=\\{'targets': L\\}"):
    train.train(
      str(tmp_path / 'model'), decoder_only, lm_task, feature_lengths=PREFIX_LM_LENGTHS, **args
    )
  with pytest.raises(ValueError, match='DecoderOnlyConfig'):
    train.make_train_step(
      _config(64),
      optax.adafactor(0.01),
      label_smoothing=0.0,
      z_loss=0.0,
      loss_normalizing_factor=None,
      inputs_bidirectional_attention=True,
    )
  assert sorted(os.listdir(tmp_path)) == ['corpus']
