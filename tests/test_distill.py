"""Tests for speculative_t5x.training.distill: divergences, their gradients, distillation, resumption."""

import dataclasses
import os
import re
import shutil
import signal
import subprocess

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from speculative_t5x.training import distill
from speculative_t5x.training import losses
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x.training import train
import testing_utils

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = 'translate: '
FEATURE_LENGTHS = {'inputs': 32, 'targets': 24}


# ------------------------------------------------------------------------------
# Divergences against float64 numpy, on random distributions with zeros.
# ------------------------------------------------------------------------------
def _numpy_divergence(p, q, kind, beta):
  """The module docstring's formulas in float64, logs floored at LOG_FLOOR."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  log = lambda x: np.log(np.maximum(x, losses.LOG_FLOOR))
  kl = lambda a, b: np.sum(np.where(a > 0, a * (log(a) - log(b)), 0.0), -1)
  if kind == 'forward_kl':
    return kl(p, q)
  if kind == 'reverse_kl':
    return kl(q, p)
  if kind == 'jsd':
    m = beta * p + (1 - beta) * q
    return beta * kl(p, m) + (1 - beta) * kl(q, m)
  return 1.0 - np.sum(np.minimum(p, q), -1)  # TVD as 1 - beta.


def _random_distributions(seed, shape):
  """Random rows with zeros, one-hots, q = p and disjoint supports among them."""
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.full(shape[-1], 0.5), shape[:-1])
  q = rng.dirichlet(np.full(shape[-1], 0.5), shape[:-1])
  p[0, :3] = 0.0
  q[1, -3:] = 0.0
  p[2] = np.eye(shape[-1])[0]
  q[3] = p[3]
  p[4], q[4] = np.eye(shape[-1])[1], np.eye(shape[-1])[2]
  normalize = lambda x: x / x.sum(-1, keepdims=True)
  return normalize(p).astype(np.float32), normalize(q).astype(np.float32)


@pytest.mark.parametrize('kind', losses.DIVERGENCES)
@pytest.mark.parametrize('beta', [0.5, 0.9])
def test_divergences_match_float64_numpy(kind, beta):
  p, q = _random_distributions(0, (8, 11))
  got = np.asarray(losses.divergence(p, q, kind, beta))
  np.testing.assert_allclose(got, _numpy_divergence(p, q, kind, beta), rtol=2e-5, atol=2e-6)
  assert np.all(np.isfinite(got)) and np.all(got >= -1e-6)
  np.testing.assert_allclose(got[3], 0.0, atol=1e-6)  # q = p.


def test_tvd_is_one_minus_the_acceptance_probability():
  p, q = _random_distributions(1, (8, 11))
  np.testing.assert_allclose(
    losses.divergence(p, q, 'tvd'), 1.0 - np.minimum(p, q).sum(-1), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize(
  'mode', [dict(temperature=0.0, topk=0, topp=0.0), dict(temperature=0.7, topk=0, topp=0.0)]
)
def test_tvd_gradient_matches_finite_differences(mode):
  """d mean TVD / d draft logits, float64, against central differences."""
  rng = np.random.default_rng(2)
  target_logits = rng.normal(size=(3, 7)) * 2
  draft_logits = rng.normal(size=(3, 7)) * 2
  with jax.enable_x64(True):

    def loss(logits):
      p, q = losses.loss_distributions(jnp.asarray(target_logits), logits, **mode)
      return jnp.mean(losses.divergence(p.astype(jnp.float64), q, 'tvd'))

    # Within float64 precision the standardized distributions are float32
    # (`sampling.standardize`), so the step is large enough to dominate that.
    gradient = np.asarray(jax.grad(loss)(jnp.asarray(draft_logits)))
    step = 1e-3
    numeric = np.zeros_like(draft_logits)
    for index in np.ndindex(draft_logits.shape):
      delta = np.zeros_like(draft_logits)
      delta[index] = step
      numeric[index] = (
        loss(jnp.asarray(draft_logits + delta)) - loss(jnp.asarray(draft_logits - delta))
      ) / (2 * step)
  assert np.abs(gradient).max() > 1e-3
  np.testing.assert_allclose(gradient, numeric, atol=2e-4)


def test_greedy_loss_is_the_target_argmax_under_the_softmax():
  rng = np.random.default_rng(3)
  target_logits = jnp.asarray(rng.normal(size=(4, 9)), jnp.float32)
  draft_logits = jnp.asarray(rng.normal(size=(4, 9)), jnp.float32)
  p, q = losses.loss_distributions(target_logits, draft_logits, temperature=0.0, topk=0, topp=0.0)
  argmax = np.argmax(np.asarray(target_logits), -1)
  softmax = np.asarray(jax.nn.softmax(draft_logits))[np.arange(4), argmax]
  np.testing.assert_allclose(losses.divergence(p, q, 'forward_kl'), -np.log(softmax), rtol=1e-5)
  np.testing.assert_allclose(losses.divergence(p, q, 'tvd'), 1.0 - softmax, rtol=1e-5)


# ------------------------------------------------------------------------------
# Distillation of a tiny pair on the phrase task.
# ------------------------------------------------------------------------------
def _config(emb_dim):
  return network.T5Config(
    vocab_size=64,
    dtype='float32',
    emb_dim=emb_dim,
    num_heads=2,
    head_dim=8,
    mlp_dim=2 * emb_dim,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
  )


@pytest.fixture(scope='module')
def phrase_task(tmp_path_factory):
  task = testing_utils.phrase_task(
    str(tmp_path_factory.mktemp('data')), 'speculative_t5x:distill_test_fixture', PREFIX
  )
  # The validation split holds every phrase (testing_utils' has every fifth, 8), so that
  # held-out alpha can be measured on all 36 (its train split holds them all too).
  _, directory, _ = task
  shutil.copy(os.path.join(directory, 'train.tsv'), os.path.join(directory, 'validation.tsv'))
  return task


@pytest.fixture(scope='module')
def pair(phrase_task, tmp_path_factory):
  """(target, draft): a target trained 120 steps, a smaller random draft."""
  task, _, _ = phrase_task
  target = train.train(
    str(tmp_path_factory.mktemp('target')),
    _config(32),
    task,
    feature_lengths=FEATURE_LENGTHS,
    batch_size=8,
    num_steps=120,
    learning_rate=0.03,
    eval_every=None,
    progress=False,
  )
  return models.Model(_config(32), target.params), models.random_model(_config(16), seed=1)


DISTILL_ARGS = dict(
  feature_lengths=FEATURE_LENGTHS,
  batch_size=8,
  learning_rate=0.03,
  eval_examples=8,
  checkpoint_every=10,
  log_every=10,
  progress=False,
)


@pytest.mark.parametrize(
  'data_mix',
  [{'draft': 1.0}, pytest.param({'target': 1.0, 'ground_truth': 1.0}, marks=pytest.mark.slow)],
)
def test_distillation_raises_held_out_alpha(pair, phrase_task, tmp_path, data_mix):
  target, draft = pair
  result = distill.distill(
    str(tmp_path),
    target,
    draft,
    phrase_task[0],
    num_steps=40,
    eval_every=40,
    data_mix=data_mix,
    # Every phrase: 8 held-out sequences leave too wide a standard error (ddof=1).
    **{**DISTILL_ARGS, 'eval_examples': 36},
  )
  before, after = result.eval_metrics[0], result.eval_metrics[-1]
  assert [before['step'], after['step']] == [0, 40]
  for temperature in (0.0, 1.0):
    name = distill.alpha_key(temperature)
    margin = after[name] - before[name]
    assert margin > 3 * np.hypot(before[name + '_stderr'], after[name + '_stderr']), (
      before,
      after,
    )
  assert sum(sum(r['sources'].values()) for r in result.train_metrics) == 40
  assert set().union(*(r['sources'] for r in result.train_metrics)) == set(data_mix)
  # The curve is in metrics.jsonl, beside the checkpoints in train's layout.
  lines = open(os.path.join(tmp_path, train.METRICS_FILE)).read().splitlines()
  assert len(lines) == len(result.train_metrics) + len(result.eval_metrics)
  assert sorted(os.listdir(tmp_path / '40')) == sorted(
    ['_CHECKPOINT_METADATA', 'commit_success.txt', 'params', 'opt_state']
  )


def test_resumed_distillation_ends_bit_identically(pair, phrase_task, tmp_path):
  target, draft = pair
  args = dict(eval_every=None, data_mix={'draft': 1, 'target': 1}, **DISTILL_ARGS)
  reference = distill.distill(
    str(tmp_path / 'a'), target, draft, phrase_task[0], num_steps=30, **args
  )
  first = distill.distill(str(tmp_path / 'b'), target, draft, phrase_task[0], num_steps=20, **args)
  resumed = distill.distill(
    str(tmp_path / 'b'), target, draft, phrase_task[0], num_steps=30, **args
  )
  assert resumed.train_metrics[0]['step'] == 30 and first.step == 20
  jax.tree.map(np.testing.assert_array_equal, resumed.params, reference.params)
  # The caller's draft is still usable: the donated training state is a copy of it.
  jax.tree.map(np.asarray, draft.params)


def _step_sequences(pair, phrase_task, data_passes, *, num_steps, start_step=0):
  target, draft = pair
  return distill.StepSequences(
    target,
    draft.config,
    phrase_task[0],
    FEATURE_LENGTHS,
    batch_size=4,
    num_steps=num_steps,
    sources=('target', 'ground_truth'),
    probabilities=np.array([0.5, 0.5]),
    sample_mode=dict(temperature=0.0, topk=0, topp=0.0),
    greedy_targets=True,
    data_passes=data_passes,
    seed=0,
    start_step=start_step,
  )


@pytest.mark.parametrize('start_step', [0, 19])
def test_each_step_reads_its_data_steps_sequences_with_data_passes(pair, phrase_task, start_step):
  """With 3 passes, step s gets what one pass gives step data_step(s): batch, source, outputs.

  From step 20 as a resumed run starts: in the first chunk's last pass, the chunk read whole.
  """
  chunk = distill.GREEDY_CHUNK_STEPS
  once = _step_sequences(pair, phrase_task, 1, num_steps=2 * chunk)
  single = {step: once.features(step, None) for step in range(1, 2 * chunk + 1)}
  # The second chunk serves 4 steps: its first 4 data steps are read.
  num_steps = 3 * chunk + 4
  thrice = _step_sequences(pair, phrase_task, 3, start_step=start_step, num_steps=num_steps)
  for step in range(start_step + 1, num_steps + 1):
    source, features = thrice.features(step, None)
    expected_source, expected = single[train.data_step(step, 3, chunk)]
    assert source == expected_source
    jax.tree.map(np.testing.assert_array_equal, features, expected)
  assert {source for source, _ in single.values()} == {'target', 'ground_truth'}


def test_bad_arguments_name_the_problem(pair, phrase_task, tmp_path):
  target, draft = pair
  args = dict(num_steps=2, **DISTILL_ARGS)
  with pytest.raises(ValueError, match="Unknown divergence 'kl'"):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], divergence='kl', **args)
  with pytest.raises(ValueError, match='needs 0 < beta < 1, got beta=1'):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], divergence='jsd', beta=1, **args)
  with pytest.raises(ValueError, match=r"Unknown data sources \['drafts'\]"):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], data_mix={'drafts': 1}, **args)
  with pytest.raises(ValueError, match='not all 0'):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], data_mix={'draft': 0}, **args)
  with pytest.raises(ValueError, match=r'data_passes 2 .* samples from the draft'):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], data_passes=2, **args)
  with pytest.raises(ValueError, match='data_passes must be an integer >= 1; got 0'):
    distill.distill(str(tmp_path), target, draft, phrase_task[0], data_passes=0, **args)
  other = models.random_model(dataclasses.replace(_config(16), vocab_size=80))
  with pytest.raises(ValueError, match='same vocab_size'):
    distill.distill(str(tmp_path), target, other, phrase_task[0], **args)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
  'name, recorded, value',
  [('divergence', 'forward_kl', 'tvd'), ('temperature', 0.0, 1.0), ('data_passes', 1, 2)],
)
def test_resuming_with_other_settings_is_refused(
  pair, phrase_task, tmp_path, name, recorded, value
):
  """A resumed run whose loss or decoding mode differs from the recorded one stops."""
  target, draft = pair
  args = dict(
    DISTILL_ARGS, eval_every=None, divergence='forward_kl', temperature=0.0, data_mix={'target': 1}
  )
  distill.distill(str(tmp_path), target, draft, phrase_task[0], num_steps=2, **args)
  # The error names the setting, its recorded value and this run's.
  expected = re.escape(f'{name}={recorded!r} (this run: {value!r})')
  with pytest.raises(ValueError, match=expected):
    distill.distill(
      str(tmp_path), target, draft, phrase_task[0], num_steps=4, **{**args, name: value}
    )
  assert train.checkpoint_manager(str(tmp_path)).latest_step() == 2  # Nothing trained on.


# ------------------------------------------------------------------------------
# The gin main, killed and resumed in another process.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def distill_gin(pair, phrase_task, tmp_path_factory):
  """(gin files, bindings, run_in_process(model_dir)) of distill's gin main on the pair."""
  target, draft = pair
  task, directory, vocabulary = phrase_task
  from speculative_t5x import checkpoints

  tmp_path = tmp_path_factory.mktemp('distill_gin')
  checkpoints.save_params(str(tmp_path / 'target'), target.params, step=1)
  checkpoints.save_params(str(tmp_path / 'draft'), draft.params, step=1)
  pair_gin = tmp_path / 'pair.gin'
  config_lines = lambda scope, c: '\n'.join(
    f'{scope}network.T5Config.{name} = {getattr(c, name)!r}'
    for name in ('vocab_size', 'dtype', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim')
    + ('num_encoder_layers', 'num_decoder_layers')
  )
  pair_gin.write_text(f"""
from __gin__ import dynamic_registration
from speculative_t5x import network
from speculative_t5x.data import tasks
include 'configs/pairs/pair.gin'
{config_lines('target/', target.config)}
{config_lines('draft/', draft.config)}
TASK = @tasks.register_tsv_task()
tasks.register_tsv_task:
  name = 'speculative_t5x:distill_gin_fixture'
  split_to_filepattern = {{'train': '{directory}/train.tsv',
                          'validation': '{directory}/validation.tsv'}}
  vocabulary = {vocabulary!r}
  extra_ids = 0
  prefix = {PREFIX!r}
""")
  bindings = {
    'CHECKPOINT_PATH': str(tmp_path / 'target'),
    'DRAFT_CHECKPOINT_PATH': str(tmp_path / 'draft'),
    'TASK_FEATURE_LENGTHS': FEATURE_LENGTHS,
    'DISTILL_STEPS': 60,
    'BATCH_SIZE': 4,
    'DATA_MIX': {'draft': 1.0, 'target': 1.0},
    'distill.distill.checkpoint_every': 20,
    'distill.distill.eval_every': None,
    'distill.distill.progress': False,
  }
  files = [str(pair_gin), os.path.join(REPO, 'configs/runs/distill.gin')]

  def run_in_process(model_dir):
    gin.clear_config()
    try:
      gin.add_config_file_search_path(REPO)
      gin.parse_config_files_and_bindings(
        files, [f'{k} = {v!r}' for k, v in {**bindings, 'MODEL_DIR': model_dir}.items()]
      )
      return gin.get_configurable(distill.distill)()
    finally:
      gin.clear_config()

  return files, bindings, run_in_process


@pytest.fixture(scope='module')
def distill_gin_reference(distill_gin, tmp_path_factory):
  """The `DistillResult` of an uninterrupted run of `distill_gin`."""
  _, _, run_in_process = distill_gin
  return run_in_process(str(tmp_path_factory.mktemp('distill_reference') / 'model'))


def _gin_flags(files, bindings, model_dir):
  return (
    [f'--gin_file={path}' for path in files]
    + [f'--gin.{name}={value!r}' for name, value in bindings.items()]
    + [f'--gin.MODEL_DIR={model_dir!r}']
  )


@pytest.mark.slow
def test_killed_distillation_resumes_to_the_uninterrupted_result(
  distill_gin, distill_gin_reference, tmp_path
):
  files, bindings, run_in_process = distill_gin
  killed_dir = str(tmp_path / 'killed')
  # Killed at step 30, once the save of step 20 is complete: mid-run by construction.
  command = testing_utils.main_killed_at(
    'speculative_t5x.training.distill',
    'distill',
    'after_step',
    at=30,
    wait_for=os.path.join(killed_dir, '20', 'commit_success.txt'),
  )
  command += _gin_flags(files, bindings, killed_dir)
  process = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  assert process.returncode == -signal.SIGKILL, process.stderr.decode()[-3000:]
  assert sorted(
    int(name)
    for name in os.listdir(killed_dir)
    if os.path.exists(f'{killed_dir}/{name}/commit_success.txt')
  ) == [20]
  # The killed run's writer lock is left behind; the resumed run takes it over.
  assert os.path.exists(os.path.join(killed_dir, output_lock.LOCK_FILE))
  resumed = run_in_process(killed_dir)
  assert resumed.train_metrics[0]['step'] > 10
  jax.tree.map(np.testing.assert_array_equal, resumed.params, distill_gin_reference.params)
  assert not os.path.exists(os.path.join(killed_dir, output_lock.LOCK_FILE))


def test_a_second_distillation_is_refused_before_any_computation(pair, phrase_task, tmp_path):
  target, draft = pair
  model_dir = tmp_path / 'draft'
  with testing_utils.lock_held_elsewhere(model_dir) as holder:
    with pytest.raises(output_lock.OutputLockedError) as error:
      distill.distill(str(model_dir), target, draft, phrase_task[0], num_steps=2, **DISTILL_ARGS)
    assert f'{model_dir} is being written by another job: test holder, process {holder} ' in (
      str(error.value)
    )
  assert os.listdir(model_dir) == []


@pytest.mark.slow
def test_two_distillations_started_together_on_one_model_dir_one_proceeds(
  distill_gin, distill_gin_reference, tmp_path
):
  files, bindings, _ = distill_gin
  model_dir = str(tmp_path / 'model')
  results = testing_utils.run_writers_together(
    'speculative_t5x.training.distill', _gin_flags(files, bindings, model_dir), tmp_path
  )
  finished = [result for result in results if result[1] == 0]
  assert len(finished) == 1, [result[2][-3000:] for result in results]
  ((winner, _, _),) = finished
  ((_, _, stderr),) = [result for result in results if result[1] != 0]
  assert (
    f'{model_dir} is being written by another job: speculative_t5x.training.distill, '
    f'process {winner} '
  ) in stderr, stderr[-3000:]
  # The survivor's draft is a lone run's.
  with train.checkpoint_manager(model_dir) as manager:
    assert manager.latest_step() == 60
    params = manager.restore(60, args=ocp.args.Composite(params=ocp.args.StandardRestore())).params
  jax.tree.map(np.testing.assert_array_equal, params, distill_gin_reference.params)
  assert not os.path.exists(os.path.join(model_dir, output_lock.LOCK_FILE))


@pytest.mark.slow  # The demo's greedy distillation; its loss is checked fast above.
def test_greedy_target_outputs_in_chunks_and_their_one_hot_teacher(pair):
  """The chunked greedy decode gives each step's own greedy outputs, and the step that takes
  the target's distribution from them computes the loss of the step that calls the target."""
  target, draft = pair
  inputs = [
    np.asarray(testing_utils.padded_inputs(seed, 8, 6, target.vocab_size)) for seed in (0, 1)
  ]
  decode = models.make_decoder(target, None, max_decode_len=FEATURE_LENGTHS['targets'])
  chunked = distill._greedy_outputs(target, inputs, FEATURE_LENGTHS['targets'])
  assert len(chunked) == 2
  for rows, outputs in zip(inputs, chunked):
    np.testing.assert_array_equal(outputs, np.asarray(decode(rows, jax.random.PRNGKey(0)).tokens))
  features = distill.sequence_features(inputs[0], chunked[0])
  config = distill.DistillConfig(target.config, draft.config, 'forward_kl', 0.5, 0.0, 0, 0.0)
  tx = optax.adafactor(0.01)
  sums = {}
  for teacher_from_sequences in (False, True):
    step = distill.make_distill_step(
      dataclasses.replace(config, teacher_from_sequences=teacher_from_sequences), tx
    )
    state = train.TrainState(
      step=jnp.int32(0), params=draft.params, opt_state=tx.init(draft.params)
    )
    sums[teacher_from_sequences] = jax.device_get(step(state, target.params, features)[1])
  for name in ('loss', 'beta', 'weight'):
    np.testing.assert_allclose(sums[True][name], sums[False][name], rtol=1e-5)
  assert distill._chunk_start(1) == distill._chunk_start(distill.GREEDY_CHUNK_STEPS) == 1
  assert distill._chunk_start(distill.GREEDY_CHUNK_STEPS + 1) == distill.GREEDY_CHUNK_STEPS + 1
