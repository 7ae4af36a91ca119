"""Training a draft through T5X: the model class, the restore, the data, `t5x.train`.

Without t5x: `t5x_adapter.start_distillation` (the restore transformation of
configs/t5x/distill*.gin) on state dicts as T5X reads them, and the seqio task
over T5X's inference files (`data.target_outputs`). With the real T5X (marked
`t5x`; `make test-t5x`): `t5x_models.DraftDistillationEncoderDecoderModel` and
its decoder-only sibling in T5X's own train step (the loss falls, beta rises,
the target's parameters stay bit for bit, no optimizer state is kept for
them; the loss is `training.losses`', the loss of `training.distill`), the
errors raised before training, and `python -m t5x.train` with
configs/t5x/distill_xxl_small.gin on tiny networks, sharded over 8 host CPU
devices.
"""

import dataclasses
import json
import os

import flax
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
  from t5x import trainer as t5x_trainer  # pylint: disable=g-import-not-at-top

  import_t5x()
  model = (_encoder_decoder_model if kind == 'encoder_decoder' else _decoder_only_model)(
    divergence='tvd', temperature=1.0
  )
  batch = _batch(seed=4)
  if kind == 'decoder_only':
    del batch['encoder_input_tokens']
  state = _initial_state(model, batch)
  before = _bits(t5x_adapter.strip_draft_params(state.params))
  draft_before = _bits(state.params['draft'])

  # No optimizer state for the target: T5X's MultiOptimizer keeps None there.
  param_states = _flat(jax.tree.map(lambda x: x, state.param_states, is_leaf=lambda x: x is None))
  assert param_states and all(
    (value is None) != path.startswith('draft/') for path, value in param_states.items()
  ), sorted(path for path, value in param_states.items() if value is not None)[:5]

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
