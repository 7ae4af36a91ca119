"""Training a draft through T5X: the model class, the restore, the data, `t5x.train`.

Without t5x: `t5x_adapter.start_distillation` (the restore transformation of
configs/t5x/distill*.gin) and `graft_draft_checkpoint` on state dicts as T5X
reads them, and the seqio task over T5X's inference files
(`data.target_outputs`). With the real T5X (marked `t5x`; `make test-t5x`):
`t5x_models.DraftDistillationEncoderDecoderModel` and its decoder-only
sibling in T5X's own train step (the loss falls, beta rises, the target's
parameters stay bit for bit, no optimizer state is kept for them; the loss
is `training.losses`', the loss of `training.distill`), the errors raised
before training, the gin files; and, slow, docs/t5x.md's commands: `python -m
t5x.train` with configs/t5x/distill_xxl_small.gin on tiny networks sharded
over 8 host CPU devices (the loss falls, held-out beta rises, the target is
bit-identical, the draft partitioned as the target), the same run stopped at
step 20 and resumed, the trained checkpoint decoding through `t5x.infer`
with the speculative gin as stock T5X greedy does, and step 1 of the data
recipe (`t5x.infer` with configs/t5x/target_outputs.gin) read by step 2's
task. Also slow: the decoder-only command; `t5x.train` and
`training.distill` on the same data reaching the same held-out alpha, and
the T5X-trained draft's alpha by `acceptance` equal to the beta T5X
reported; a feature head trained by `t5x.train` (distill_feature_head.gin)
and decoded by `t5x.infer` (speculative_feature_head.gin); a parallel draft
adapted by `t5x.train` (distill_parallel_draft.gin) from the chain draft,
refused to resume with other settings, and decoded by `t5x.infer`
(speculative_parallel_draft.gin).
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import flax
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import checkpoints
from speculative_t5x import feature_head
from speculative_t5x import network
from speculative_t5x import t5x_adapter
from speculative_t5x.training import losses
from testing_utils import (
  EOS,
  import_t5x,
  padded_inputs,
  phrase_task,
  speculative_t5x_models,
  write_t5x_legacy,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 32
TARGET_CONFIG = network.t5_1_1_config(
  'tiny',
  vocab_size=VOCAB,
  emb_dim=32,
  num_heads=2,
  head_dim=16,
  mlp_dim=64,
  num_encoder_layers=1,
  num_decoder_layers=1,
  dtype='float32',
)
# A smaller draft than the target: its parameters are not the target's shapes.
DRAFT_CONFIG = network.t5_1_1_config(
  'tiny',
  vocab_size=VOCAB,
  emb_dim=16,
  num_heads=2,
  head_dim=8,
  mlp_dim=32,
  num_encoder_layers=1,
  num_decoder_layers=1,
  dtype='float32',
)


def _flat(tree):
  return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def _bits(tree):
  """{path: bytes}: equal iff the trees are equal bit for bit (-0.0 and NaN included)."""
  return {path: np.asarray(leaf).tobytes() for path, leaf in _flat(tree).items()}


# ------------------------------------------------------------------------------
# The restore transformation (no t5x).
# ------------------------------------------------------------------------------
def _abstract_state(target_config, draft_config):
  """The state T5X restores into: the target's params with the draft's, and an optimizer state."""
  target = network.abstract_params(target_config)[0]
  draft = network.abstract_params(draft_config)[0]
  return {'target': {**target, 'draft': draft}, 'state': {'step': np.int32(0)}}


def test_start_distillation_restores_the_target_and_grafts_or_leaves_the_draft(tmp_path):
  target_params = network.random_params(TARGET_CONFIG, seed=0)[0]
  draft_params = network.random_params(DRAFT_CONFIG, seed=1)[0]
  draft_dir = write_t5x_legacy(tmp_path / 'draft', 7, draft_params)
  # What T5X reads from the target's checkpoint: its params and its own optimizer state.
  read = {'target': target_params, 'state': {'step': np.int32(1000), 'param_states': {'x': 1}}}
  expected = _abstract_state(TARGET_CONFIG, DRAFT_CONFIG)

  grafted = t5x_adapter.start_distillation(os.fspath(draft_dir))(read, expected)
  assert sorted(grafted) == ['target']  # The target's step and optimizer state are dropped.
  assert _bits(grafted['target']['draft']) == _bits(draft_params)
  assert _bits(t5x_adapter.strip_draft_params(grafted['target'])) == _bits(target_params)

  scratch = t5x_adapter.start_distillation(None)(read, expected)
  assert scratch == {'target': target_params}  # T5X's fallback_to_scratch adds the draft.

  # Resuming: MODEL_DIR's combined checkpoint, as saved.
  resumed = {'target': {**target_params, 'draft': draft_params}, 'state': {'step': 20}}
  transform = t5x_adapter.start_distillation(os.fspath(draft_dir))
  assert transform(resumed, expected, is_resuming=True) is resumed


def test_graft_draft_checkpoint_reads_the_draft_of_a_trained_checkpoint(tmp_path):
  """Inference from a draft-training checkpoint: its own draft, from under params['draft']."""
  target_params = network.random_params(TARGET_CONFIG, seed=0)[0]
  draft_params = network.random_params(DRAFT_CONFIG, seed=1)[0]
  trained = write_t5x_legacy(tmp_path / 'trained', 30, {**target_params, 'draft': draft_params})
  grafted = t5x_adapter.graft_draft_checkpoint(os.fspath(trained))(
    {'target': target_params}, _abstract_state(TARGET_CONFIG, DRAFT_CONFIG)
  )
  assert _bits(grafted['target']['draft']) == _bits(draft_params)


def test_start_distillation_grafts_a_feature_head(tmp_path):
  """A head-training model (params['draft_head']): the head's checkpoint grafted there, or none."""
  target_params = network.random_params(TARGET_CONFIG, seed=0)[0]
  head = jax.tree.map(np.asarray, feature_head.init_params(HEAD_CONFIG, seed=1))
  head_dir = write_t5x_legacy(tmp_path / 'head', 2, {t5x_adapter.HEAD_KEY: head})
  expected = {
    'target': {
      **network.abstract_params(TARGET_CONFIG)[0],
      t5x_adapter.HEAD_KEY: feature_head.abstract_params(HEAD_CONFIG),
    },
    'state': {'step': np.int32(0)},
  }
  read = {'target': target_params, 'state': {'step': np.int32(1000)}}
  grafted = t5x_adapter.start_distillation(os.fspath(head_dir))(read, expected)
  assert sorted(grafted) == ['target']
  assert _bits(grafted['target'][t5x_adapter.HEAD_KEY]) == _bits(head)
  assert _bits(t5x_adapter.strip_draft_params(grafted['target'])) == _bits(target_params)
  assert t5x_adapter.start_distillation(None)(read, expected) == {'target': target_params}


def test_start_distillation_refuses_a_target_checkpoint_of_another_size(tmp_path):
  other = network.random_params(DRAFT_CONFIG, seed=2)[0]  # The draft's size, not the target's.
  expected = _abstract_state(TARGET_CONFIG, DRAFT_CONFIG)
  with pytest.raises(ValueError, match='target checkpoint.*TARGET_SIZE'):
    t5x_adapter.start_distillation(None)({'target': other}, expected)
  with pytest.raises(ValueError, match='DraftDistillationEncoderDecoderModel'):
    t5x_adapter.start_distillation(None)(
      {'target': other}, {'target': network.abstract_params(TARGET_CONFIG)[0]}
    )


def test_start_distillation_refuses_a_draft_of_another_vocabulary(tmp_path):
  target_params = network.random_params(TARGET_CONFIG, seed=0)[0]
  wrong = network.random_params(dataclasses.replace(DRAFT_CONFIG, vocab_size=2 * VOCAB), seed=1)[0]
  draft_dir = write_t5x_legacy(tmp_path / 'draft', 1, wrong)
  with pytest.raises(ValueError, match="draft checkpoint.*vocabulary of 64 entries.*target's"):
    t5x_adapter.start_distillation(os.fspath(draft_dir))(
      {'target': target_params}, _abstract_state(TARGET_CONFIG, DRAFT_CONFIG)
    )


# ------------------------------------------------------------------------------
# The target's outputs as a seqio task (no t5x).
# ------------------------------------------------------------------------------
def _write_t5x_infer_file(path, records):
  """What T5X's infer.write_inferences_to_file writes with output_ids=True, one JSON a line."""
  with open(path, 'w', encoding='utf-8') as f:
    for inputs, text, tokens in records:
      record = {
        'inputs': {'inputs_pretokenized': inputs, 'targets_pretokenized': 'reference'},
        'prediction': text,
        'prediction_tokens': tokens,
      }
      f.write(json.dumps(record) + '\n')


def test_target_outputs_task_reads_t5x_inference_files(tmp_path):
  from speculative_t5x.data import target_outputs  # seqio and TensorFlow only here.

  _, _, vocabulary = phrase_task(os.fspath(tmp_path), 'st5x_phrases_outputs', 'translate: ')
  records = [
    ('translate: the red house', 'das rote Haus', [5, 9, 17, EOS]),
    ('translate: a cat', 'eine', [21, 4, 4, 4, 4, 4]),  # Cut at the length limit: no EOS.
  ]
  _write_t5x_infer_file(tmp_path / 'task-predict.jsonl-00000-of-00001', records)
  task = target_outputs.register_target_outputs_task(
    'st5x_target_outputs',
    {'train': os.fspath(tmp_path / 'task-predict.jsonl-*')},
    vocabulary,
    extra_ids=0,
  )
  examples = list(
    task.get_dataset({'inputs': 64, 'targets': 5}, 'train', shuffle=False).as_numpy_iterator()
  )
  spm = task.output_features['inputs'].vocabulary
  for example, (inputs, _, tokens) in zip(examples, records, strict=True):
    # The target's ids as written (trimmed to the feature length), not its text re-tokenized.
    assert example['targets'].tolist() == tokens[:5]
    assert example['inputs'].tolist() == spm.encode(inputs) + [EOS]
    assert example['inputs_pretokenized'].decode() == inputs

  _write_t5x_infer_file(tmp_path / 'bad.jsonl', [('translate: a', 'x', [3, EOS])])
  with open(tmp_path / 'bad.jsonl', encoding='utf-8') as f:
    record = json.loads(f.read())
  del record['prediction_tokens']
  (tmp_path / 'bad.jsonl').write_text(json.dumps(record) + '\n')
  bad = target_outputs.register_target_outputs_task(
    'st5x_target_outputs_bad', {'train': os.fspath(tmp_path / 'bad.jsonl')}, vocabulary, extra_ids=0
  )
  with pytest.raises(ValueError, match='output_ids=True.*target_outputs.gin'):
    bad.get_dataset({'inputs': 16, 'targets': 5}, 'train', shuffle=False)


# ------------------------------------------------------------------------------
# The model class in T5X's train step.
# ------------------------------------------------------------------------------
def _adafactor():
  from t5x import adafactor  # pylint: disable=g-import-not-at-top

  return adafactor.Adafactor(
    decay_rate=0.8, step_offset=0, logical_factor_rules=adafactor.standard_logical_factor_rules()
  )


def _encoder_decoder_model(draft_config=DRAFT_CONFIG, **distillation):
  import seqio  # pylint: disable=g-import-not-at-top

  vocabulary = seqio.PassThroughVocabulary(size=VOCAB, eos_id=EOS)
  return speculative_t5x_models().DraftDistillationEncoderDecoderModel(
    network.Transformer(TARGET_CONFIG),
    vocabulary,
    vocabulary,
    _adafactor(),
    draft_module=network.Transformer(draft_config),
    gamma=3,
    **distillation,
  )


DECODER_ONLY_TARGET = network.decoder_only_config(
  'tiny', vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, dtype='float32'
)
DECODER_ONLY_DRAFT = network.decoder_only_config(
  'tiny',
  vocab_size=VOCAB,
  emb_dim=16,
  num_heads=2,
  head_dim=8,
  mlp_dim=32,
  num_layers=1,
  dtype='float32',
)


def _decoder_only_model(**distillation):
  import seqio  # pylint: disable=g-import-not-at-top

  return speculative_t5x_models().DraftDistillationDecoderOnlyModel(
    network.DecoderOnly(DECODER_ONLY_TARGET),
    seqio.PassThroughVocabulary(size=VOCAB, eos_id=EOS),
    _adafactor(),
    draft_module=network.DecoderOnly(DECODER_ONLY_DRAFT),
    gamma=3,
    **distillation,
  )


def _batch(seed, batch=8, length=10):
  """T5X's features of sequences (tokens, EOS, padding) after random encoder inputs."""
  targets = padded_inputs(seed, batch, length, VOCAB)
  weights = (targets > 0).astype(np.float32)
  return {
    'encoder_input_tokens': padded_inputs(seed + 1, batch, 7, VOCAB),
    'decoder_input_tokens': np.pad(targets, ((0, 0), (1, 0)))[:, :-1],
    'decoder_target_tokens': targets,
    'decoder_loss_weights': weights,
  }


def _initial_state(model, batch, seed=0):
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top

  shapes = {name: value.shape for name, value in batch.items()}
  types = {name: value.dtype for name, value in batch.items()}
  variables = model.get_initial_variables(jax.random.PRNGKey(seed), shapes, types)
  return t5x_train_state.FlaxOptimTrainState.create(model.optimizer_def, variables)


@pytest.mark.t5x
@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_t5x_train_step_trains_the_draft_alone(kind):
  import_t5x()
  from t5x import trainer as t5x_trainer  # pylint: disable=g-import-not-at-top

  model = (_encoder_decoder_model if kind == 'encoder_decoder' else _decoder_only_model)(
    divergence='tvd', temperature=1.0
  )
  batch = _batch(seed=4)
  if kind == 'decoder_only':
    del batch['encoder_input_tokens']
  state = _initial_state(model, batch)
  before = _bits(t5x_adapter.strip_draft_params(state.params))
  draft_before = _bits(state.params['draft'])

  # Optimizer state for the draft alone: T5X's Adafactor state of each draft parameter.
  assert list(state.param_states) == ['draft']
  assert _flat(state.param_states['draft']).keys() == draft_before.keys()

  step = jax.jit(lambda state, rng: t5x_trainer.train_with_lr(state, batch, 0.05, rng, model, None))
  history = []
  for i in range(30):
    state, metrics = step(state, jax.random.PRNGKey(i))
    history.append({name: float(metrics[name].compute()) for name in ('loss', 'beta')})
  assert {'loss', 'beta', 'accuracy', 'loss_per_nonpadding_target_token'} <= set(metrics)
  assert int(state.step) == 30
  # The draft learned the target: TVD = 1 - beta, so the loss is the weighted
  # sum of 1 - beta over the batch's real tokens.
  num_tokens = batch['decoder_loss_weights'].sum()
  for record in history:
    np.testing.assert_allclose(record['loss'], num_tokens * (1.0 - record['beta']), rtol=1e-4)
  assert history[-1]['loss'] < 0.7 * history[0]['loss'], history
  assert history[-1]['beta'] > history[0]['beta'] + 0.1, history
  # Only the draft changed, and the target not by a single bit.
  assert _bits(t5x_adapter.strip_draft_params(state.params)) == before
  assert _bits(state.params['draft']) != draft_before


@pytest.mark.t5x
@pytest.mark.parametrize(
  'divergence, temperature, topk',
  [('tvd', 0.0, 0), ('forward_kl', 1.0, 0), ('jsd', 0.7, 0), ('reverse_kl', 1.0, 5)],
)
def test_loss_fn_is_the_loss_of_training_losses(divergence, temperature, topk):
  """The T5X model's loss and beta: `losses.distillation_sums` on this project's logits."""
  model = _encoder_decoder_model(
    divergence=divergence, jsd_beta=0.3, temperature=temperature, topk=topk
  )
  batch = _batch(seed=6)
  params = _initial_state(model, batch, seed=3).params
  loss, metrics = model.loss_fn(params, batch, None)
  target_params, draft_params = t5x_adapter.split_draft_params(params)
  expected = losses.distillation_sums(
    network.compute_logits(TARGET_CONFIG, target_params, batch),
    network.compute_logits(DRAFT_CONFIG, draft_params, batch),
    jnp.asarray(batch['decoder_loss_weights']),
    divergence_name=divergence,
    beta=0.3,
    temperature=temperature,
    topk=topk,
    topp=0.0,
  )
  np.testing.assert_allclose(loss, expected['loss'], rtol=1e-5)
  num_tokens = batch['decoder_loss_weights'].sum()
  np.testing.assert_allclose(metrics['beta'].compute(), expected['beta'] / num_tokens, rtol=1e-5)


HEAD_CONFIG = feature_head.config_for(
  TARGET_CONFIG, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32
)


def _head_model(**loss):
  import seqio  # pylint: disable=g-import-not-at-top

  vocabulary = seqio.PassThroughVocabulary(size=VOCAB, eos_id=EOS)
  return speculative_t5x_models().DraftDistillationEncoderDecoderModel(
    network.Transformer(TARGET_CONFIG),
    vocabulary,
    vocabulary,
    _adafactor(),
    draft_module=HEAD_CONFIG,
    gamma=3,
    **loss,
  )


@pytest.mark.t5x
def test_t5x_train_step_trains_a_feature_head_alone():
  """A feature head under params['draft_head'], trained by T5X's step with train_feature_head's loss."""
  import_t5x()
  from t5x import trainer as t5x_trainer  # pylint: disable=g-import-not-at-top

  from speculative_t5x.training import train_feature_head  # pylint: disable=g-import-not-at-top

  model = _head_model(temperature=1.0, unroll_steps=3, decay=0.8)
  batch = _batch(seed=4)
  state = _initial_state(model, batch)
  key = t5x_adapter.HEAD_KEY
  assert list(state.param_states) == [key]
  assert _flat(state.param_states[key]).keys() == _flat(state.params[key]).keys()
  target_before = _bits(t5x_adapter.strip_draft_params(state.params))
  head_before = _bits(state.params[key])

  # One loss: train_feature_head's, on this batch.
  loss, metrics = model.loss_fn(state.params, batch, None)
  config = train_feature_head.HeadLossConfig(
    HEAD_CONFIG, TARGET_CONFIG, unroll_steps=3, decay=0.8, temperature=1.0
  )
  target_params = t5x_adapter.strip_draft_params(state.params)
  _, sums = train_feature_head.head_loss(
    config,
    state.params[key],
    target_params,
    train_feature_head.with_target_outputs(config, target_params, batch),
  )
  np.testing.assert_allclose(loss, sums['loss'], rtol=1e-5)
  np.testing.assert_allclose(metrics['beta'].compute(), sums['beta'] / sums['weight'], rtol=1e-5)

  step = jax.jit(lambda state, rng: t5x_trainer.train_with_lr(state, batch, 0.05, rng, model, None))
  history = []
  for i in range(30):
    state, metrics = step(state, jax.random.PRNGKey(i))
    history.append({name: float(metrics[name].compute()) for name in ('loss', 'beta')})
  assert int(state.step) == 30
  # Soft cross entropy: its floor is the target's entropy, not 0.
  assert history[-1]['loss'] < 0.9 * history[0]['loss'], history
  assert history[-1]['beta'] > history[0]['beta'] + 0.1, history
  assert _bits(t5x_adapter.strip_draft_params(state.params)) == target_before
  assert _bits(state.params[key]) != head_before

  packed = {**batch, 'decoder_segment_ids': (batch['decoder_target_tokens'] > 0).astype(np.int32)}
  with pytest.raises(ValueError, match='unpacked batches.*pack=False'):
    model.loss_fn(state.params, packed, None)
  with pytest.raises(ValueError, match="divergence='jsd' is for draft networks"):
    _head_model(divergence='jsd')


@pytest.mark.t5x
def test_bad_settings_fail_before_training():
  with pytest.raises(ValueError, match='vocabulary'):
    _encoder_decoder_model(draft_config=dataclasses.replace(DRAFT_CONFIG, vocab_size=2 * VOCAB))
  with pytest.raises(ValueError, match="Unknown divergence 'kl'.*forward_kl"):
    _encoder_decoder_model(divergence='kl')
  with pytest.raises(ValueError, match="'jsd' divergence needs 0 < beta < 1"):
    _encoder_decoder_model(divergence='jsd', jsd_beta=1.0)
  with pytest.raises(ValueError, match='topk'):
    _encoder_decoder_model(topk=-1)


# ------------------------------------------------------------------------------
# python -m t5x.train with configs/t5x/distill_xxl_small.gin.
# ------------------------------------------------------------------------------
TRAIN_TASK_MODULE = """
from speculative_t5x.data import tasks

tasks.register_tsv_task({name!r}, {splits!r}, {vocabulary!r}, extra_ids=0, prefix='translate: ')
"""
TRAIN_TASK = 'st5x_distill_phrases'
TRAIN_STEPS = 30
EVAL_PERIOD = 10


def readme_train_command(gin_file='distill_xxl_small.gin'):
  """The argv of the `python -m t5x.train` command of docs/t5x.md's "Train a draft with T5X".

  The command that gives configs/t5x/`gin_file`: 'distill_xxl_small.gin'
  (encoder-decoder), 'distill_decoder_only.gin' or 'distill_feature_head.gin'.
  """
  with open(os.path.join(REPO_ROOT, 'docs', 't5x.md'), encoding='utf-8') as f:
    text = f.read()
  section = text.split('\n## Train a draft with T5X\n', 1)[1].split('\n## ', 1)[0]
  blocks = re.findall(r'^```[^\n]*\n(.*?)^```', section, flags=re.M | re.S)
  (command,) = [
    block
    for block in blocks
    if block.startswith('python -m t5x.train') and f'configs/t5x/{gin_file} ' in block
  ]
  return shlex.split(command.replace('\\\n', ' '))


def _scalars(directory):
  """{tag: {step: value}} of the TensorBoard event files T5X wrote in `directory`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  scalars = {}
  for name in sorted(os.listdir(directory)):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
      for value in event.summary.value:
        array = np.asarray(
          tf.make_ndarray(value.tensor) if value.HasField('tensor') else value.simple_value
        )
        if array.dtype.kind in 'fiu':  # Not the gin config T5X writes as text.
          scalars.setdefault(value.tag, {})[event.step] = float(array)
  return scalars


class DistillRun:
  """docs/t5x.md's `python -m t5x.train` (distill_xxl_small.gin) on tiny networks (run once)."""

  def __init__(self, work_dir):
    from test_t5x_commands import save_t5x_checkpoint  # pylint: disable=g-import-not-at-top

    self.work_dir = work_dir
    data_dir = os.path.join(work_dir, 'data')
    os.makedirs(data_dir)
    _, _, self.vocabulary = phrase_task(data_dir, 'st5x_distill_phrases_local', 'translate: ')
    splits = {split: os.path.join(data_dir, f'{split}.tsv') for split in ('train', 'validation')}
    with open(os.path.join(work_dir, 'st5x_distill_task.py'), 'w', encoding='utf-8') as f:
      f.write(TRAIN_TASK_MODULE.format(name=TRAIN_TASK, splits=splits, vocabulary=self.vocabulary))
    # 'tiny' networks over the task's 64-piece vocabulary; the draft is the
    # target perturbed (a draft checkpoint to graft, not yet the target).
    self.config = network.t5_1_1_config('tiny', vocab_size=64, dtype='float32')
    params, params_axes = network.random_params(self.config, seed=0)
    params['decoder']['logits_dense']['kernel'] *= 3.0  # Sharp distributions: beta well below 1.
    rng = np.random.default_rng(1)
    draft = jax.tree.map(
      lambda x: (x + 0.5 * np.std(x) * rng.standard_normal(x.shape)).astype(x.dtype), params
    )
    self.target_params = params
    self.checkpoints = {
      role: save_t5x_checkpoint(p, params_axes, os.path.join(work_dir, role))
      for role, p in (('target', params), ('draft', draft))
    }
    self.model_dir = os.path.join(work_dir, 'model')
    self.result = self._train(self.model_dir)
    self._resumed = None

  def resumed(self):
    """The same command in a model directory holding only the run's step-20 checkpoint.

    As if the run had stopped after saving step 20: T5X resumes from it (both
    networks, the optimizer state, the step and the dataset's position).
    """
    if self._resumed is None:
      model_dir = os.path.join(self.work_dir, 'resumed')
      shutil.copytree(
        os.path.join(self.model_dir, 'checkpoint_20'), os.path.join(model_dir, 'checkpoint_20')
      )
      self._resumed = model_dir, self._train(model_dir)
    return self._resumed

  def argv(self, model_dir):
    """docs/t5x.md's `t5x.train` command, run with tiny sizes and this task on 8 devices.

    Substituted: this checkout, the checkpoints written above, the task (a
    module of this test's), short feature lengths and steps, the model
    directory. Appended: `tiny_train_flags`, batches of 8, a larger learning
    rate for 30 steps, summaries and held-out evaluation every 10 steps
    (before training too).
    """
    values = {
      '--gin.INITIAL_CHECKPOINT_PATH': repr(self.checkpoints['target']),
      '--gin.DRAFT_CHECKPOINT_PATH': repr(self.checkpoints['draft']),
      '--gin.MIXTURE_OR_TASK_NAME': repr(TRAIN_TASK),
      '--gin.MIXTURE_OR_TASK_MODULE': "'st5x_distill_task'",
      '--gin.TASK_FEATURE_LENGTHS': "{'inputs': 32, 'targets': 32}",
      '--gin.TRAIN_STEPS': str(TRAIN_STEPS),
      '--gin.MODEL_DIR': repr(model_dir),
    }
    return readme_train_argv(values) + [
      *tiny_train_flags(self.vocabulary),
      '--gin.BATCH_SIZE=8',
      '--gin.utils.create_learning_rate_scheduler.base_learning_rate=0.05',
      f'--gin.EVAL_PERIOD={EVAL_PERIOD}',
      '--gin.EVAL_STEPS=1',
      f'--gin.utils.SaveCheckpointConfig.period={EVAL_PERIOD}',
      '--gin.utils.SaveCheckpointConfig.save_dataset=True',  # A resumed run reads on.
    ]

  def _train(self, model_dir):
    return run_t5x_train(self.argv(model_dir), self.work_dir)


def readme_train_argv(values, gin_file='distill_xxl_small.gin'):
  """docs/t5x.md's `t5x.train` command (`readme_train_command`), this checkout's, `values` substituted.

  `values` maps a flag (`--gin.MODEL_DIR`) or a whole argument
  (`--gin_file=/path/to/x.gin`) to its replacement value or argument.
  """
  values = {'--gin_search_paths': REPO_ROOT, **values}
  argv = []
  for arg in readme_train_command(gin_file):
    if arg in values:
      argv.append(values.pop(arg))
      continue
    flag = arg.split('=', 1)[0]
    argv.append(f'{flag}={values.pop(flag)}' if flag in values else arg)
  assert not values, f'not in the command of docs/t5x.md: {sorted(values)}'
  assert argv[:3] == ['python', '-m', 't5x.train']
  return [sys.executable, *argv[1:]]


def tiny_train_flags(vocabulary, configure='t5_1_1_config'):
  """What every `t5x.train` run here appends to the documented command.

  The checkpoints' size (tiny, over the task's vocabulary of 64 pieces at
  `vocabulary`, float32; `configure` names the `network` function of the
  sizes), fixed seeds, no inference evaluation, held-out
  evaluation before training too, and T5X's PjitPartitioner on a (2, 4)
  ('data', 'model') mesh: see
  test_t5x_commands.test_encoder_decoder_command_sharded_over_8_devices.
  """
  return [
    "--gin.TARGET_SIZE='tiny'",
    "--gin.DRAFT_SIZE='tiny'",
    f'--gin.speculative_network.{configure}.vocab_size=64',
    f"--gin.speculative_network.{configure}.dtype='float32'",
    f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file={vocabulary!r}',
    '--gin.seqio.SentencePieceVocabulary.extra_ids=0',
    '--gin.USE_CACHED_TASKS=False',
    '--gin.RANDOM_SEED=0',
    '--gin.train/utils.DatasetConfig.seed=0',
    '--gin.__main__.train.infer_eval_dataset_cfg=None',
    '--gin.__main__.train.run_eval_before_training=True',
    *MESH_FLAGS,
  ]


MESH_FLAGS = (
  '--gin.partitioning.PjitPartitioner.num_partitions=None',
  '--gin.partitioning.PjitPartitioner.model_parallel_submesh=(1, 4)',
)


def run_t5x_train(argv, work_dir):
  """Runs `argv` (a `python -m t5x.train` command) from `work_dir` on 8 host CPU devices.

  `work_dir` (holding the task module) is put on PYTHONPATH. Returns the
  completed process; a failure shows T5X's traceback.
  """
  env = {
    **os.environ,
    'JAX_PLATFORMS': 'cpu',
    'XLA_FLAGS': (
      os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
    ).strip(),
    'PYTHONPATH': os.pathsep.join(filter(None, [work_dir, os.environ.get('PYTHONPATH')])),
  }
  result = subprocess.run(argv, cwd=work_dir, env=env, capture_output=True, text=True, timeout=1200)
  traceback = max(result.stderr.rfind('Traceback (most recent call last)'), 0)
  assert result.returncode == 0, result.stderr[traceback:][-6000:]
  assert 'global_mesh devices shape: (2, 4)' in result.stderr
  return result


@pytest.fixture(scope='module')
def distill_run(tmp_path_factory):
  import_t5x()
  return DistillRun(os.fspath(tmp_path_factory.mktemp('distill')))


@pytest.mark.t5x
@pytest.mark.slow
def test_t5x_train_distills_the_draft_sharded_over_8_devices(distill_run):
  train = _scalars(os.path.join(distill_run.model_dir, 'train'))
  held_out = _scalars(os.path.join(distill_run.model_dir, 'training_eval', TRAIN_TASK))
  steps = [EVAL_PERIOD * i for i in range(1, TRAIN_STEPS // EVAL_PERIOD + 1)]
  assert sorted(train['loss']) == sorted(train['beta']) == steps
  loss, beta = [train['loss'][s] for s in steps], [train['beta'][s] for s in steps]
  # Held-out: the validation split's loss and beta (alpha on its sequences), before training too.
  assert sorted(held_out['beta']) == [0, *steps]
  held_out_beta = [held_out['beta'][s] for s in [0, *steps]]
  print('train loss', loss, 'train beta', beta, 'held-out beta', held_out_beta)
  assert loss[-1] < loss[0] and beta[-1] > beta[0], (loss, beta)
  assert held_out_beta[-1] > held_out_beta[0] + 0.05, held_out_beta

  # The trained checkpoint: the target as restored, bit for bit; the draft trained.
  trained = checkpoints.load_params(distill_run.model_dir)
  target, draft = t5x_adapter.split_draft_params(trained)
  assert _bits(target) == _bits(distill_run.target_params)
  assert _bits(draft) != _bits(checkpoints.load_params(distill_run.checkpoints['draft']))

  # model-info.txt: every draft parameter partitioned as its target twin (one size here), and
  # optimizer state for the draft's parameters alone.
  from test_t5x_commands import _model_info  # pylint: disable=g-import-not-at-top

  info = _model_info(distill_run.model_dir)
  params = {n: v for n, v in info.items() if n != 'step' and not n.startswith('param_states/')}
  draft_info = {n[len('draft/') :]: v for n, v in params.items() if n.startswith('draft/')}
  target_info = {n: v for n, v in params.items() if not n.startswith('draft/')}
  assert len(draft_info) == len(jax.tree.leaves(distill_run.target_params))
  assert draft_info == target_info
  assert draft_info['token_embedder/embedding'] == ('(vocab=64, embed=128)', "('model', None)")
  states = {n[len('param_states/') :] for n in info if n.startswith('param_states/')}
  assert {path.rsplit('/', 1)[0] for path in states} == {f'draft/{path}' for path in draft_info}


@pytest.mark.t5x
@pytest.mark.slow
def test_t5x_train_resumes_a_stopped_distillation(distill_run):
  model_dir, _ = distill_run.resumed()
  assert sorted(os.listdir(model_dir)) == [
    'checkpoint_20',
    'checkpoint_30',
    'config.gin',
    'model-info.txt',
    'train',
    'training_eval',
  ]
  # It continued where the run stopped: the steps 21-30 of the uninterrupted run, the same
  # batches (T5X restored the dataset's position) and so the same loss and parameters.
  resumed = _scalars(os.path.join(model_dir, 'train'))
  uninterrupted = _scalars(os.path.join(distill_run.model_dir, 'train'))
  assert sorted(resumed['loss']) == [TRAIN_STEPS]
  np.testing.assert_allclose(resumed['loss'][30], uninterrupted['loss'][30], rtol=1e-5)
  np.testing.assert_allclose(resumed['beta'][30], uninterrupted['beta'][30], rtol=1e-5)
  params = checkpoints.load_params(os.path.join(model_dir, 'checkpoint_30'))
  expected = checkpoints.load_params(os.path.join(distill_run.model_dir, 'checkpoint_30'))
  params, expected = _flat(params), _flat(expected)
  assert params.keys() == expected.keys()
  for path, want in expected.items():
    np.testing.assert_allclose(params[path], want, rtol=1e-5, atol=1e-6, err_msg=path)
  target = {path: leaf for path, leaf in params.items() if not path.startswith('draft/')}
  assert _bits(target) == _bits(distill_run.target_params)


@pytest.mark.t5x
@pytest.mark.parametrize(
  'model_file, distill_file, sizes',
  [
    ('t5x/examples/t5/t5_1_1/base.gin', 'distill_xxl_small.gin', ('xxl', 'small')),
    ('t5x/examples/t5/t5_1_1/base.gin', 'distill_xxl_base.gin', ('xxl', 'base')),
    ('t5x/examples/t5/t5_1_1/base.gin', 'distill_xxl_large.gin', ('xxl', 'large')),
    ('t5x/examples/decoder_only/models/base.gin', 'distill_decoder_only.gin', ('base', 'tiny')),
  ],
)
def test_distill_gin_files_build_the_draft_training_model(model_file, distill_file, sizes):
  """T5X's model file, then a distillation file: the model, its loss, optimizer and restore."""
  import gin  # pylint: disable=g-import-not-at-top

  t5x = import_t5x()
  from t5x import adafactor  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))
  bindings = ["DIVERGENCE = 'jsd'", 'JSD_BETA = 0.25', 'TEMPERATURE = 1.0']
  if distill_file == 'distill_decoder_only.gin':
    bindings += [f'TARGET_SIZE = {sizes[0]!r}', f'DRAFT_SIZE = {sizes[1]!r}']
  gin.clear_config()
  try:
    gin.add_config_file_search_path(REPO_ROOT)
    gin.parse_config_files_and_bindings(
      [os.path.join(t5x_root, model_file), f'configs/t5x/{distill_file}'],
      bindings,
      finalize_config=False,
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
    restore = {
      name: gin.query_parameter(f'utils.RestoreCheckpointConfig.{name}')
      for name in ('fallback_to_scratch', 'state_transformation_fns')
    }
    transforms = [
      reference.scoped_configurable_fn() for reference in restore.pop('state_transformation_fns')
    ]
  finally:
    gin.clear_config()
  decoder_only = distill_file == 'distill_decoder_only.gin'
  assert type(model).__name__ == (
    'DraftDistillationDecoderOnlyModel' if decoder_only else 'DraftDistillationEncoderDecoderModel'
  )
  configure = network.decoder_only_config if decoder_only else network.t5_1_1_config
  assert model.module.config == configure(sizes[0], dtype='bfloat16', dropout_rate=0.0)
  assert model.draft_module.config == configure(sizes[1], dtype='bfloat16', dropout_rate=0.0)
  assert model.distillation == dict(
    divergence_name='jsd', beta=0.25, temperature=1.0, topk=0, topp=0.0
  )
  # T5X's Adafactor of the model file, on the draft's parameters alone.
  assert isinstance(model.optimizer_def, speculative_t5x_models().DraftOnlyOptimizer)
  assert isinstance(model.optimizer_def.inner, adafactor.Adafactor)
  assert restore == {'fallback_to_scratch': True}
  assert len(transforms) == 1 and transforms[0].__qualname__.startswith('start_distillation')


@pytest.mark.t5x
def test_distill_feature_head_gin_file_builds_the_head_training_model():
  """T5X's model file, then distill_feature_head.gin: the head, its loss, optimizer and restore."""
  import gin  # pylint: disable=g-import-not-at-top

  t5x = import_t5x()
  from t5x import adafactor  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))
  gin.clear_config()
  try:
    gin.add_config_file_search_path(REPO_ROOT)
    gin.parse_config_files_and_bindings(
      [
        os.path.join(t5x_root, 't5x/examples/t5/t5_1_1/base.gin'),
        'configs/t5x/distill_feature_head.gin',
      ],
      ["TARGET_SIZE = 'small'", 'HEAD_EMB_DIM = 64', 'UNROLL_STEPS = 4'],
      finalize_config=False,
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
    (transform,) = [
      reference.scoped_configurable_fn()
      for reference in gin.query_parameter('utils.RestoreCheckpointConfig.state_transformation_fns')
    ]
    pack = gin.query_parameter('train/utils.DatasetConfig.pack')
  finally:
    gin.clear_config()
  target = network.t5_1_1_config('small', dtype='bfloat16', dropout_rate=0.0)
  assert type(model).__name__ == 'DraftDistillationEncoderDecoderModel'
  assert model.draft_module == feature_head.config_for(target, emb_dim=64)
  assert model._head_loss.unroll_steps == 4 and model._head_loss.temperature == 1.0  # pylint: disable=protected-access
  assert isinstance(model.optimizer_def, speculative_t5x_models().DraftOnlyOptimizer)
  assert model.optimizer_def.key == t5x_adapter.HEAD_KEY
  assert isinstance(model.optimizer_def.inner, adafactor.Adafactor)
  assert transform.__qualname__.startswith('start_distillation') and pack is False


@pytest.mark.t5x
@pytest.mark.slow
def test_target_outputs_recipe_t5x_infer_then_the_task(tmp_path):
  """Step 1 with stock T5X (plus configs/t5x/target_outputs.gin), step 2 the task over its files."""
  import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import target_outputs  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top

  import_t5x()
  runs = commands.EncoderDecoderRuns(os.fspath(tmp_path))
  output_dir = tmp_path / 'outputs'
  argv = runs.stock_argv(output_dir) + [
    f'--gin_search_paths={REPO_ROOT}',
    '--gin_file=configs/t5x/target_outputs.gin',
  ]
  stock = commands.run_t5x_infer(argv, output_dir, os.fspath(tmp_path))
  assert len(stock.records) == commands.NUM_EXAMPLES
  task = target_outputs.register_target_outputs_task(
    'st5x_target_outputs_recipe',
    {'train': os.fspath(output_dir / '*.jsonl-*')},
    runs.vocabulary,
    extra_ids=100,
  )
  lengths = {'inputs': 64, 'targets': commands.TARGETS_LENGTH}
  examples = list(task.get_dataset(lengths, 'train', shuffle=False).as_numpy_iterator())
  # The original task's inputs (the ids the target saw), as the test module registers it.
  original = tasks.register_tsv_task(
    'st5x_target_outputs_original',
    {'test': os.path.join(tmp_path, 'data', 'test.tsv')},
    runs.vocabulary,
    extra_ids=100,
    prefix=commands.WMT_PREFIX,
  )
  originals = list(original.get_dataset(lengths, 'test', shuffle=False).as_numpy_iterator())
  vocabulary = task.output_features['targets'].vocabulary
  for example, record, source in zip(examples, stock.records, originals, strict=True):
    assert example['inputs'].tolist() == source['inputs'].tolist()
    assert example['targets'].tolist() == record['prediction_tokens']
    assert vocabulary.decode(example['targets'].tolist()) == record['prediction']


@pytest.mark.t5x
@pytest.mark.slow
def test_trained_checkpoint_decodes_through_t5x_infer_as_stock_t5x(distill_run, tmp_path):
  """The trained checkpoint serves t5x.infer with speculative_xxl_small.gin as is.

  Both checkpoint paths are the trained checkpoint (the draft is read from
  under params['draft']); greedy outputs equal stock T5X's on the target's
  own checkpoint (the trained one's target is bit for bit the same).
  """
  import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top

  trained = os.path.join(distill_run.model_dir, f'checkpoint_{TRAIN_STEPS}')
  runs = InferRuns(
    distill_run.work_dir,
    TRAIN_TASK,
    'st5x_distill_task',
    {'inputs': 32, 'targets': 32},
    distill_run.vocabulary,
  )
  ours = runs.run(
    os.fspath(tmp_path / 'speculative'),
    [
      '--gin_file=configs/t5x/speculative_xxl_small.gin',
      f'--gin.CHECKPOINT_PATH={trained!r}',
      f'--gin.DRAFT_CHECKPOINT_PATH={trained!r}',
      "--gin.DRAFT_SIZE='tiny'",
    ],
  )
  stock = runs.stock(os.fspath(tmp_path / 'stock'), distill_run.checkpoints['target'])
  assert len(stock.predictions) == 8 and len(set(stock.predictions)) > 1
  assert ours.predictions == stock.predictions
  commands.check_aux(ours.records, gamma=7, max_length=32)


class InferRuns:
  """`python -m t5x.infer` over a task's validation split on the tiny 64-piece networks here.

  T5X's t5_1_1 base.gin and infer.gin, float32, predict_with_aux; ours adds
  a speculative gin file, stock T5X its own network at the same size, greedy.
  """

  def __init__(self, work_dir, task, module, lengths, vocabulary):
    self.work_dir = work_dir
    self.common = [
      '--gin_file=t5x/examples/t5/t5_1_1/base.gin',
      '--gin_file=t5x/configs/runs/infer.gin',
      f'--gin.MIXTURE_OR_TASK_NAME={task!r}',
      f'--gin.MIXTURE_OR_TASK_MODULE={module!r}',
      f'--gin.TASK_FEATURE_LENGTHS={lengths!r}',
      "--gin.utils.DatasetConfig.split='validation'",
      f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file={vocabulary!r}',
      '--gin.seqio.SentencePieceVocabulary.extra_ids=0',
      "--gin.utils.RestoreCheckpointConfig.dtype='float32'",
      "--gin.infer.mode='predict_with_aux'",
      '--gin.DROPOUT_RATE=0.0',  # T5X's base.gin leaves it gin.REQUIRED.
    ]

  def run(self, output_dir, speculative_flags):
    """Ours: the gin file and checkpoints of `speculative_flags`, a tiny target."""
    import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top

    argv = [
      sys.executable,
      '-m',
      't5x.infer',
      f'--gin_search_paths={REPO_ROOT}',
      *self.common,
      *speculative_flags,
      f'--gin.INFER_OUTPUT_DIR={output_dir!r}',
      "--gin.TARGET_SIZE='tiny'",
      '--gin.speculative_network.t5_1_1_config.vocab_size=64',
      "--gin.speculative_network.t5_1_1_config.dtype='float32'",
    ]
    return commands.run_t5x_infer(argv, output_dir, self.work_dir)

  def stock(self, output_dir, checkpoint):
    """Stock T5X's greedy outputs with the 'tiny' target of `checkpoint`."""
    import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top

    greedy_gin = os.path.join(output_dir + '.gin')
    with open(greedy_gin, 'w', encoding='utf-8') as f:
      f.write(commands.STOCK_GREEDY_GIN)
    config = network.t5_1_1_config('tiny', vocab_size=64)
    fields = ('emb_dim', 'num_heads', 'num_encoder_layers', 'num_decoder_layers', 'head_dim')
    argv = [
      sys.executable,
      '-m',
      't5x.infer',
      *self.common,
      f'--gin_file={greedy_gin}',
      f'--gin.CHECKPOINT_PATH={checkpoint!r}',
      f'--gin.INFER_OUTPUT_DIR={output_dir!r}',
      *(f'--gin.network.T5Config.{field}={getattr(config, field)!r}' for field in fields),
      f'--gin.network.T5Config.mlp_dim={config.mlp_dim!r}',
      '--gin.network.T5Config.vocab_size=64',
      "--gin.network.T5Config.dtype='float32'",
    ]
    return commands.run_t5x_infer(argv, output_dir, self.work_dir)


# ------------------------------------------------------------------------------
# Two trainers, one loss: t5x.train and training.distill on the same data.
# ------------------------------------------------------------------------------
PARITY_TASK = 'st5x_parity_outputs'
PARITY_TASK_MODULE = """
from speculative_t5x.data import target_outputs

target_outputs.register_target_outputs_task({name!r}, {splits!r}, {vocabulary!r}, extra_ids=0)
"""
PARITY_LENGTHS = {'inputs': 48, 'targets': 32}
PARITY_STEPS = 40
PARITY_EVAL_PERIOD = 10
PARITY_BATCH = 16
PARITY_EXAMPLES = {'train': 96, 'validation': 32}
PARITY_LEARNING_RATE = 0.01
# optax's Adam in both trainers (T5X's optimizers.adam is it, wrapped): one
# update rule, so that the runs differ only where the trainers do.
ADAM_GIN = """
from __gin__ import dynamic_registration
from t5x import optimizers

OPTIMIZER = @optimizers.adam()
optimizers.adam.learning_rate = {learning_rate}
"""


def phrase_inputs(seed, count):
  """`count` input texts of two random clauses of testing_utils' phrases."""
  from testing_utils import NOUNS, VERBS  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  texts = []
  for _ in range(count):
    (v1, n1), (v2, n2) = rng.integers(len(VERBS), size=2), rng.integers(len(NOUNS), size=2)
    texts.append(
      f'translate: {VERBS[v1][0]} {NOUNS[n1][0]} and {VERBS[v2][0].lower()} {NOUNS[n2][0]}'
    )
  return texts


class TargetOutputsData:
  """The recipe's data (docs/t5x.md) for a tiny target, and a draft checkpoint.

  The target's greedy outputs on random phrase inputs (train and validation
  splits), in T5X's inference files, read by
  `target_outputs.register_target_outputs_task` (here and, for T5X, in the
  task module `st5x_parity_task`); the files are written with this
  project's greedy decoder, whose outputs are T5X's (test_t5x_commands; step
  1 through `t5x.infer` is test_target_outputs_recipe_t5x_infer_then_the_task).
  T5X checkpoints of the target and of a draft (the target perturbed).
  """

  def __init__(self, work_dir):
    from test_t5x_commands import save_t5x_checkpoint  # pylint: disable=g-import-not-at-top

    from speculative_t5x import models  # pylint: disable=g-import-not-at-top
    from speculative_t5x.data import target_outputs  # pylint: disable=g-import-not-at-top
    from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top

    self.work_dir = work_dir
    data_dir = os.path.join(work_dir, 'data')
    os.makedirs(data_dir)
    _, _, self.vocabulary = phrase_task(data_dir, 'st5x_parity_phrases', 'translate: ')
    vocabulary = tasks.get_vocabulary(self.vocabulary, 0)
    self.config = network.t5_1_1_config('tiny', vocab_size=64, dtype='float32')
    params, params_axes = network.random_params(self.config, seed=0)
    kernel = params['decoder']['logits_dense']['kernel']
    kernel *= 3.0  # Sharp distributions: alpha well below 1.
    kernel[:, 0] = (kernel[:, 2] + kernel[:, 3]) / 2  # PAD's logit between two others': no argmax.
    rng = np.random.default_rng(1)
    draft = jax.tree.map(
      lambda x: (x + 0.3 * np.std(x) * rng.standard_normal(x.shape)).astype(x.dtype), params
    )
    self.target = models.Model(self.config, params)
    self.draft = models.Model(self.config, draft)
    self.checkpoints = {
      role: save_t5x_checkpoint(p, params_axes, os.path.join(work_dir, role))
      for role, p in (('target', params), ('draft', draft))
    }
    # The recipe's step 1: the target's greedy outputs, as t5x.infer writes them.
    decode = models.make_decoder(
      self.target, None, max_decode_len=PARITY_LENGTHS['targets'], temperature=0.0
    )
    splits, self.inputs = {}, {}
    for split, count in PARITY_EXAMPLES.items():
      texts = phrase_inputs(seed=len(split), count=count)
      inputs = np.zeros((count, PARITY_LENGTHS['inputs']), np.int32)
      for row, text in enumerate(texts):
        ids = vocabulary.encode(text) + [EOS]
        inputs[row, : len(ids)] = ids
      outputs = np.asarray(decode(inputs, jax.random.PRNGKey(0)).tokens)
      lengths = np.where(
        (outputs == EOS).any(1), np.argmax(outputs == EOS, 1) + 1, outputs.shape[1]
      )
      tokens = [row[:length].tolist() for row, length in zip(outputs, lengths, strict=True)]
      assert all(0 not in row for row in tokens), 'a padding id inside an output'
      os.makedirs(os.path.join(data_dir, split))
      splits[split] = os.path.join(data_dir, split, f'{PARITY_TASK}-predict.jsonl-00000-of-00001')
      _write_t5x_infer_file(
        splits[split],
        [(t, vocabulary.decode(ids), ids) for t, ids in zip(texts, tokens, strict=True)],
      )
      self.inputs[split] = inputs
    with open(os.path.join(work_dir, 'st5x_parity_task.py'), 'w', encoding='utf-8') as f:
      f.write(
        PARITY_TASK_MODULE.format(name=PARITY_TASK, splits=splits, vocabulary=self.vocabulary)
      )
    self.task = target_outputs.register_target_outputs_task(
      PARITY_TASK, splits, self.vocabulary, extra_ids=0
    )

  def records(self, split):
    """The JSON records of the split's file."""
    path = os.path.join(self.work_dir, 'data', split)
    (name,) = os.listdir(path)
    with open(os.path.join(path, name), encoding='utf-8') as f:
      return [json.loads(line) for line in f]

  def trained_draft(self, model_dir, key=t5x_adapter.DRAFT_KEY):
    """The draft (or head) a `t5x.train` run left in `model_dir`; its target checked bit for bit."""
    target, draft = t5x_adapter.split_draft_params(checkpoints.load_params(model_dir), key)
    assert _bits(target) == _bits(self.target.params)
    return draft


class ParityRun:
  """One draft distilled twice from one target: by `t5x.train` and by `training.distill`.

  On `TargetOutputsData`, both trainers start from the same draft checkpoint,
  train for greedy decoding with the forward KL (the cross entropy of the
  target's argmax), batches of 16 unpacked examples in seqio's order with
  seed 0, the per-token mean loss and optax's Adam at 0.01, for 40 steps:
  T5X with docs/t5x.md's command on 8 host CPU devices, `distill` on one, its
  data mix the task's targets ('ground_truth': here the target's outputs).
  """

  def __init__(self, data):
    self.data = data
    self.work_dir = os.path.join(data.work_dir, 'parity')
    os.makedirs(self.work_dir)
    self.t5x_dir = os.path.join(self.work_dir, 't5x')
    self.t5x_result = run_t5x_train(self.t5x_argv(), data.work_dir)
    self.distill = self._distill()

  def t5x_argv(self):
    """docs/t5x.md's command, with Adam, unpacked batches, per-token loss and per-step summaries."""
    adam_gin = os.path.join(self.work_dir, 'adam.gin')
    with open(adam_gin, 'w', encoding='utf-8') as f:
      f.write(ADAM_GIN.format(learning_rate=PARITY_LEARNING_RATE))
    values = {
      '--gin.INITIAL_CHECKPOINT_PATH': repr(self.data.checkpoints['target']),
      '--gin.DRAFT_CHECKPOINT_PATH': repr(self.data.checkpoints['draft']),
      '--gin.MIXTURE_OR_TASK_NAME': repr(PARITY_TASK),
      '--gin.MIXTURE_OR_TASK_MODULE': "'st5x_parity_task'",
      '--gin.TASK_FEATURE_LENGTHS': repr(PARITY_LENGTHS),
      '--gin.TRAIN_STEPS': str(PARITY_STEPS),
      '--gin.MODEL_DIR': repr(self.t5x_dir),
    }
    return readme_train_argv(values) + [
      f'--gin_file={adam_gin}',
      *tiny_train_flags(self.data.vocabulary),
      "--gin.DIVERGENCE='forward_kl'",
      "--gin.LOSS_NORMALIZING_FACTOR='NUM_REAL_TARGET_TOKENS'",  # distill's mean over tokens.
      f'--gin.BATCH_SIZE={PARITY_BATCH}',
      '--gin.train/utils.DatasetConfig.pack=False',
      '--gin.train_eval/utils.DatasetConfig.pack=False',
      '--gin.__main__.train.stats_period=1',  # The training loss and beta of every step.
      f'--gin.EVAL_PERIOD={PARITY_EVAL_PERIOD}',
      f'--gin.EVAL_STEPS={PARITY_EXAMPLES["validation"] // PARITY_BATCH}',
      f'--gin.utils.SaveCheckpointConfig.period={PARITY_STEPS}',
    ]

  def _distill(self):
    import optax  # pylint: disable=g-import-not-at-top

    from speculative_t5x.training import distill  # pylint: disable=g-import-not-at-top

    return distill.distill(
      os.path.join(self.work_dir, 'distill'),
      self.data.target,
      self.data.draft,
      self.data.task,
      feature_lengths=PARITY_LENGTHS,
      batch_size=PARITY_BATCH,
      num_steps=PARITY_STEPS,
      divergence='forward_kl',
      temperature=0.0,
      data_mix={'ground_truth': 1.0},
      learning_rate=PARITY_LEARNING_RATE,
      optimizer=optax.adam,
      seed=0,
      checkpoint_every=PARITY_STEPS,
      eval_every=PARITY_EVAL_PERIOD,
      eval_examples=PARITY_EXAMPLES['validation'],
      eval_temperatures=(0.0,),
      log_every=1,
      progress=False,
    )

  def t5x_draft(self):
    """The draft T5X trained (its final checkpoint), a `models.Model`."""
    from speculative_t5x import models  # pylint: disable=g-import-not-at-top

    return models.Model(self.data.config, self.data.trained_draft(self.t5x_dir))

  def distill_draft(self):
    """The draft `training.distill` trained, a `models.Model`."""
    from speculative_t5x import models  # pylint: disable=g-import-not-at-top

    return models.Model(self.data.config, self.distill.params)


@pytest.fixture(scope='module')
def target_outputs_data(tmp_path_factory):
  import_t5x()
  return TargetOutputsData(os.fspath(tmp_path_factory.mktemp('target_outputs')))


@pytest.fixture(scope='module')
def parity_run(target_outputs_data):
  return ParityRun(target_outputs_data)


def _held_out_alpha(parity_run, drafts):
  """{name: AlphaResult}: `acceptance.measure_alpha` of `drafts` at T = 0 on the validation inputs."""
  from speculative_t5x import acceptance  # pylint: disable=g-import-not-at-top

  inputs = parity_run.data.inputs['validation']
  return acceptance.measure_alpha(
    parity_run.data.target,
    drafts,
    inputs,
    temperature=0.0,
    max_decode_len=PARITY_LENGTHS['targets'],
    min_tokens=1,  # One batch of every input: greedy outputs do not vary.
    batch_size=len(inputs),
  )


@pytest.mark.t5x
@pytest.mark.slow
def test_t5x_train_and_distill_reach_the_same_held_out_alpha(parity_run):
  """Same data, steps, seed and optimizer: one loss, so one trajectory and one held-out alpha."""
  train = _scalars(os.path.join(parity_run.t5x_dir, 'train'))
  held_out = _scalars(os.path.join(parity_run.t5x_dir, 'training_eval', PARITY_TASK))
  steps = list(range(1, PARITY_STEPS + 1))
  assert sorted(train['loss']) == sorted(train['beta']) == steps
  distill_train = {record['step']: record for record in parity_run.distill.train_metrics}
  distill_eval = {record['step']: record for record in parity_run.distill.eval_metrics}
  assert sorted(distill_train) == steps
  eval_steps = list(range(0, PARITY_STEPS + 1, PARITY_EVAL_PERIOD))
  assert sorted(held_out['beta']) == sorted(distill_eval) == eval_steps
  print('step  t5x loss  distill loss  t5x beta  distill beta')
  for step in steps:
    print(
      f'{step:4d}  {train["loss"][step]:8.4f}  {distill_train[step]["loss"]:12.4f}  '
      f'{train["beta"][step]:8.4f}  {distill_train[step]["alpha"]:12.4f}'
    )
  print('step  t5x held-out beta  distill held-out alpha (stderr)')
  for step in eval_steps:
    record = distill_eval[step]
    print(
      f'{step:4d}  {held_out["beta"][step]:17.4f}  {record["alpha_T0"]:.4f} ({record["alpha_T0_stderr"]:.4f})'
    )

  # Step 1: the same parameters on the same batch (seqio's order, seed 0, in both), one loss.
  np.testing.assert_allclose(train['loss'][1], distill_train[1]['loss'], rtol=1e-4)
  np.testing.assert_allclose(train['beta'][1], distill_train[1]['alpha'], rtol=1e-4)
  # Before training: the same draft on the same held-out sequences, measured by both.
  np.testing.assert_allclose(held_out['beta'][0], distill_eval[0]['alpha_T0'], rtol=1e-5)

  alphas = _held_out_alpha(
    parity_run, {'t5x': parity_run.t5x_draft(), 'distill': parity_run.distill_draft()}
  )
  start = _held_out_alpha(parity_run, {'start': parity_run.data.draft})['start']
  t5x, distilled = alphas['t5x'], alphas['distill']
  print(
    f'held-out alpha: start {start.alpha:.4f} ({start.stderr:.4f}), t5x {t5x.alpha:.4f} '
    f'({t5x.stderr:.4f}), distill {distilled.alpha:.4f} ({distilled.stderr:.4f})'
  )
  joint = np.hypot(t5x.stderr, distilled.stderr)
  assert abs(t5x.alpha - distilled.alpha) < 2 * joint, (t5x, distilled)
  for trained in (t5x, distilled):  # Both trained: far above the start, in standard errors.
    assert trained.alpha - start.alpha > 3 * np.hypot(trained.stderr, start.stderr), trained


@pytest.mark.t5x
@pytest.mark.slow
def test_alpha_of_the_t5x_trained_draft_is_the_beta_t5x_reported(parity_run):
  """`acceptance` measures the trained draft's alpha where T5X's summaries reported beta.

  T5X's held-out beta (training_eval, the last step) is on the target's
  greedy outputs for the validation inputs; `acceptance.measure_alpha`
  decodes the target greedily on the same inputs and teacher-forces both
  networks along its outputs, from the trained checkpoint.
  """
  held_out = _scalars(os.path.join(parity_run.t5x_dir, 'training_eval', PARITY_TASK))
  reported = held_out['beta'][PARITY_STEPS]
  measured = _held_out_alpha(parity_run, {'t5x': parity_run.t5x_draft()})['t5x']
  print(f'T5X reported beta {reported:.5f}; alpha {measured.alpha:.5f} ({measured.stderr:.5f})')
  assert measured.num_tokens == sum(
    len(record['prediction_tokens']) for record in parity_run.data.records('validation')
  )
  assert abs(measured.alpha - reported) < measured.stderr, (measured, reported)


# ------------------------------------------------------------------------------
# A feature head trained by t5x.train, decoded by t5x.infer.
# ------------------------------------------------------------------------------
HEAD_STEPS = 40
# 4 heads of 16: the heads axis is sharded over 'model' (4 here), as the target's.
HEAD_FLAGS = ('--gin.HEAD_EMB_DIM=64', '--gin.HEAD_HEAD_DIM=16', '--gin.HEAD_MLP_DIM=128')


@pytest.mark.t5x
@pytest.mark.slow
def test_t5x_trains_a_feature_head_that_t5x_infer_decodes_with(target_outputs_data, tmp_path):
  """docs/t5x.md's feature-head `t5x.train` command, then `t5x.infer` with its checkpoint.

  On `TargetOutputsData` (8 host CPU devices, (2, 4) mesh, 40 steps of 16,
  optax's Adam at 0.01, T = 1): held-out beta rises, the target stays bit
  for bit, T5X's optimizer state covers the head alone, and
  speculative_feature_head.gin decodes with the trained checkpoint (both
  paths): stock T5X's greedy outputs, draft tokens accepted.
  """
  import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top

  data = target_outputs_data
  model_dir = os.fspath(tmp_path / 'head')
  adam_gin = tmp_path / 'adam.gin'
  adam_gin.write_text(ADAM_GIN.format(learning_rate=0.01))
  values = {
    '--gin.INITIAL_CHECKPOINT_PATH': repr(data.checkpoints['target']),
    '--gin.MIXTURE_OR_TASK_NAME': repr(PARITY_TASK),
    '--gin.MIXTURE_OR_TASK_MODULE': "'st5x_parity_task'",
    '--gin.TASK_FEATURE_LENGTHS': repr(PARITY_LENGTHS),
    '--gin.TRAIN_STEPS': str(HEAD_STEPS),
    '--gin.MODEL_DIR': repr(model_dir),
  }
  argv = readme_train_argv(values, 'distill_feature_head.gin') + [
    f'--gin_file={adam_gin}',
    *tiny_train_flags(data.vocabulary),
    *HEAD_FLAGS,
    f'--gin.BATCH_SIZE={PARITY_BATCH}',
    f'--gin.EVAL_PERIOD={PARITY_EVAL_PERIOD}',
    f'--gin.EVAL_STEPS={PARITY_EXAMPLES["validation"] // PARITY_BATCH}',
    f'--gin.utils.SaveCheckpointConfig.period={HEAD_STEPS}',
  ]
  run_t5x_train(argv, data.work_dir)
  train = _scalars(os.path.join(model_dir, 'train'))
  held_out = _scalars(os.path.join(model_dir, 'training_eval', PARITY_TASK))
  steps = list(range(0, HEAD_STEPS + 1, PARITY_EVAL_PERIOD))
  held_out_beta = [held_out['beta'][step] for step in steps]
  train_loss = [train['loss'][step] for step in steps[1:]]
  print('feature head: train loss', train_loss, 'held-out beta (T = 1)', held_out_beta)
  assert train_loss[-1] < train_loss[0]
  assert held_out_beta[-1] > held_out_beta[0] + 0.1, held_out_beta
  head = data.trained_draft(model_dir, t5x_adapter.HEAD_KEY)  # The target bit for bit.
  from test_t5x_commands import _model_info  # pylint: disable=g-import-not-at-top

  info = _model_info(model_dir)
  # Adam's state (mu and nu per head parameter) for the head alone.
  states = {n[len('param_states/') :] for n in info if n.startswith('param_states/')}
  assert {path.split('/', 1)[0] for path in states} == {t5x_adapter.HEAD_KEY}
  for moment in ('mu', 'nu'):
    assert {p.split(f'/{moment}/', 1)[1] for p in states if f'/{moment}/' in p} == set(_flat(head))

  trained = os.path.join(model_dir, f'checkpoint_{HEAD_STEPS}')
  runs = InferRuns(data.work_dir, PARITY_TASK, 'st5x_parity_task', PARITY_LENGTHS, data.vocabulary)
  ours = runs.run(
    os.fspath(tmp_path / 'speculative'),
    [
      '--gin_file=configs/t5x/speculative_feature_head.gin',
      f'--gin.CHECKPOINT_PATH={trained!r}',
      f'--gin.HEAD_CHECKPOINT_PATH={trained!r}',
      *HEAD_FLAGS,
    ],
  )
  stock = runs.stock(os.fspath(tmp_path / 'stock'), data.checkpoints['target'])
  assert len(stock.predictions) == PARITY_EXAMPLES['validation']
  assert ours.predictions == stock.predictions
  commands.check_aux(ours.records, gamma=5, max_length=PARITY_LENGTHS['targets'])
  accepted = sum(r['aux']['accepted'] for r in ours.records)
  print(
    'feature head in t5x.infer: accepted',
    accepted,
    'of',
    sum(r['aux']['drafted'] for r in ours.records),
  )


PARALLEL_STEPS = 10


@pytest.mark.t5x
@pytest.mark.slow
def test_t5x_adapts_a_parallel_draft_that_t5x_infer_decodes_with(target_outputs_data, tmp_path):
  """docs/t5x.md's parallel-draft `t5x.train` command, then `t5x.infer` with its checkpoint.

  On `TargetOutputsData` (8 host CPU devices, (2, 4) mesh, 10 steps of 16):
  the chain draft's checkpoint starts the parallel draft (its mask the mean
  token embedding, then trained), the target stays bit for bit, T5X's
  optimizer state covers the draft network and its mask alone, per-depth
  betas are summarized; the same command resuming from the model directory
  with another DEPTH is refused naming it; speculative_parallel_draft.gin
  decodes with the trained checkpoint (both paths): stock T5X's greedy
  outputs.
  """
  import test_t5x_commands as commands  # pylint: disable=g-import-not-at-top

  from speculative_t5x import run_settings  # pylint: disable=g-import-not-at-top

  data = target_outputs_data
  model_dir = os.fspath(tmp_path / 'parallel')
  values = {
    '--gin.DRAFT_SIZE': "'tiny'",
    '--gin.INITIAL_CHECKPOINT_PATH': repr(data.checkpoints['target']),
    '--gin.DRAFT_CHECKPOINT_PATH': repr(data.checkpoints['draft']),
    '--gin.MIXTURE_OR_TASK_NAME': repr(PARITY_TASK),
    '--gin.MIXTURE_OR_TASK_MODULE': "'st5x_parity_task'",
    '--gin.TASK_FEATURE_LENGTHS': repr(PARITY_LENGTHS),
    '--gin.TRAIN_STEPS': str(PARALLEL_STEPS),
    '--gin.MODEL_DIR': repr(model_dir),
  }
  argv = readme_train_argv(values, 'distill_parallel_draft.gin') + [
    *tiny_train_flags(data.vocabulary),
    f'--gin.BATCH_SIZE={PARITY_BATCH}',
    f'--gin.EVAL_PERIOD={PARALLEL_STEPS}',
    '--gin.EVAL_STEPS=1',
    f'--gin.utils.SaveCheckpointConfig.period={PARALLEL_STEPS}',
  ]
  run_t5x_train(argv, data.work_dir)
  train = _scalars(os.path.join(model_dir, 'train'))
  assert {f'beta_depth{k}' for k in range(1, 5)} <= set(train), sorted(train)
  draft = data.trained_draft(model_dir)  # The target bit for bit.
  assert _bits(draft['network']) != _bits(data.draft.params)
  start = data.draft.as_parallel_draft().mask_embedding
  assert not np.allclose(draft['mask_embedding'], start)
  from test_t5x_commands import _model_info  # pylint: disable=g-import-not-at-top

  states = {n for n in _model_info(model_dir) if n.startswith('param_states/')}
  assert {n.split('/')[1] for n in states} == {t5x_adapter.DRAFT_KEY}
  assert any(n.startswith('param_states/draft/mask_embedding') for n in states)
  recorded = run_settings.read(os.path.join(model_dir, run_settings.PARALLEL_DRAFT_SETTINGS_FILE))
  assert recorded['depth'] == 4 and recorded['keep'] == 0.5

  env = {
    **os.environ,
    'JAX_PLATFORMS': 'cpu',
    'PYTHONPATH': os.pathsep.join(filter(None, [data.work_dir, os.environ.get('PYTHONPATH')])),
  }
  resumed = subprocess.run(
    [*argv, '--gin.DEPTH=2'],
    cwd=data.work_dir,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert resumed.returncode != 0
  assert 'depth=4 (this run: 2)' in resumed.stderr, resumed.stderr[-3000:]

  trained = os.path.join(model_dir, f'checkpoint_{PARALLEL_STEPS}')
  runs = InferRuns(data.work_dir, PARITY_TASK, 'st5x_parity_task', PARITY_LENGTHS, data.vocabulary)
  ours = runs.run(
    os.fspath(tmp_path / 'speculative'),
    [
      '--gin_file=configs/t5x/speculative_parallel_draft.gin',
      f'--gin.CHECKPOINT_PATH={trained!r}',
      f'--gin.DRAFT_CHECKPOINT_PATH={trained!r}',
      "--gin.DRAFT_SIZE='tiny'",
    ],
  )
  stock = runs.stock(os.fspath(tmp_path / 'stock'), data.checkpoints['target'])
  assert len(stock.predictions) == PARITY_EXAMPLES['validation']
  assert ours.predictions == stock.predictions
  commands.check_aux(ours.records, gamma=4, max_length=PARITY_LENGTHS['targets'])
