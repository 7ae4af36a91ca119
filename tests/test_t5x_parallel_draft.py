"""A parallel draft (PARD) through T5X: the predict path, the restore, the model class, the gin files.

Without t5x: `t5x_adapter.speculative_predict_batch` with a
`ParallelDraftNetwork` (greedy: the baseline's tokens; sampled: `generate`'s
with the same parallel draft), the draft grafts (a parallel draft's
checkpoint in `training.parallel_distill`'s layout and in a T5X checkpoint;
a chain draft started as a parallel one for training; a draft of the other
kind refused, naming the gin file). With the real T5X (marked `t5x`): the
speculative model's greedy outputs equal stock T5X's, its initial variables
partitioned by their logical axes; the draft-training model in T5X's train
step trains the draft network and its mask alone with `parallel_distill`'s
loss; its settings recorded in MODEL_DIR and checked when T5X resumes; the
gin files. docs/t5x.md's commands with a parallel draft run in
tests/test_t5x_commands.py (`t5x.infer` on a `parallel_distill` model
directory) and tests/test_t5x_distill.py (`t5x.train`, then `t5x.infer`).
"""

import functools
import os

import flax
from flax import traverse_util
from flax.linen import partitioning as nn_partitioning
import jax
import numpy as np
import pytest

from speculative_t5x import checkpoints
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import run_settings
from speculative_t5x import settings
from speculative_t5x import t5x_adapter
from speculative_t5x.training import parallel_distill
from test_t5x_adapter import (  # The chain draft's pair and batch, and T5X's stock model.
  BATCH,
  DRAFT,
  GAMMA,
  MODULE,
  REPO_ROOT,
  TARGET,
  _with_draft,
  assert_predictions_are_generates,
  jitted_predict,
  t5x_env,  # noqa: F401  (a fixture)
)
from test_t5x_distill import (  # The draft-training pairs of T5X's train step.
  DECODER_ONLY_DRAFT,
  DECODER_ONLY_TARGET,
  DRAFT_CONFIG,
  TARGET_CONFIG,
  VOCAB,
  _adafactor,
  _batch,
  _bits,
)
from test_t5x_decoder_only import prefix_lm_batch
from testing_utils import (
  EOS,
  assert_trees_equal,
  decoded_lengths,
  import_t5x,
  speculative_t5x_models,
  tiny_decoder_only_model,
  tiny_model,
  write_t5x_legacy,
)

PARALLEL = t5x_adapter.ParallelDraftNetwork(network.Transformer(DRAFT.config))
# A mask vector other than the mean embedding: a trained draft's.
MASK = np.random.default_rng(2).standard_normal(DRAFT.config.emb_dim).astype(np.float32)
PARALLEL_PARAMS = {'network': DRAFT.params, 'mask_embedding': MASK}


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


# ------------------------------------------------------------------------------
# The predict path (no t5x).
# ------------------------------------------------------------------------------
_predict = jitted_predict(PARALLEL)


def test_parallel_draft_predictions_are_generates_with_that_draft():
  """params['draft'] = {'network', 'mask_embedding'} drafts as `ParallelDraft` does in `generate`.

  Greedy: the baseline's tokens. Sampled with one key, the target's own
  network as the draft (q_1 is then p_1, so that later depths, which read
  the masks, are judged): `generate`'s tokens and statistics with the same
  parallel draft, and others with another mask.
  """
  assert 1 < decoded_lengths(_predict(_with_draft(PARALLEL_PARAMS))[0]).min()
  own = {'network': TARGET.params, 'mask_embedding': MASK}
  decodes, aux = assert_predictions_are_generates(
    _predict, _with_draft(own), TARGET.as_parallel_draft(MASK)
  )
  assert aux['accepted'].sum() > aux['iterations'].sum() // 2  # q_1 = p_1: mostly accepted.
  # The mask is read from params['draft']: another one drafts other tokens.
  other, other_aux = _predict(_with_draft({**own, 'mask_embedding': -MASK}), temperature=1.0)
  assert not (
    np.array_equal(other, decodes) and np.array_equal(other_aux['accepted'], aux['accepted'])
  )


def test_a_draft_of_the_other_kind_is_refused_before_decoding():
  predict = functools.partial(
    t5x_adapter.speculative_predict_batch,
    batch=BATCH,
    eos_id=EOS,
    settings=settings.SpeculativeSettings(gamma=GAMMA),
  )
  with pytest.raises(ValueError, match='holds a chain draft network.*speculative_parallel_draft'):
    predict(MODULE, PARALLEL, _with_draft(DRAFT.params))
  with pytest.raises(ValueError, match='holds a parallel draft.*speculative_parallel_draft.gin'):
    predict(MODULE, MODULE, _with_draft(PARALLEL_PARAMS))


# ------------------------------------------------------------------------------
# Restoring (no t5x).
# ------------------------------------------------------------------------------
def _state(draft_tree):
  return {'target': {**network.abstract_params(TARGET.config)[0], 'draft': draft_tree}}


PARALLEL_STATE = _state(_abstract(PARALLEL_PARAMS))
CHAIN_STATE = _state(network.abstract_params(DRAFT.config)[0])


def test_graft_reads_a_parallel_draft_of_either_layout(tmp_path):
  """`parallel_distill`'s layout (our orbax directory) and a T5X checkpoint holding one."""
  ours = tmp_path / 'parallel_distill'
  checkpoints.save_params(ours, PARALLEL_PARAMS, step=7)
  t5x = write_t5x_legacy(tmp_path / 't5x', 9, _with_draft(PARALLEL_PARAMS))
  for path in (ours, t5x):
    grafted = t5x_adapter.graft_draft_checkpoint(os.fspath(path))(
      {'target': TARGET.params}, PARALLEL_STATE
    )
    assert_trees_equal(grafted['target']['draft'], PARALLEL_PARAMS)
    assert_trees_equal(t5x_adapter.strip_draft_params(grafted['target']), TARGET.params)


def test_graft_refuses_a_draft_of_the_other_kind_naming_the_gin_file(tmp_path):
  chain = write_t5x_legacy(tmp_path / 'chain', 1, DRAFT.params)
  parallel = tmp_path / 'parallel'
  checkpoints.save_params(parallel, PARALLEL_PARAMS)
  read = {'target': TARGET.params}
  with pytest.raises(
    ValueError,
    match=r'holds a chain draft network.*speculative_parallel_draft\.gin.*speculative_xxl_small'
    r'.*distill_parallel_draft\.gin.*parallel_distill',
  ):
    t5x_adapter.graft_draft_checkpoint(os.fspath(chain))(read, PARALLEL_STATE)
  with pytest.raises(ValueError, match=r'holds a parallel draft.*speculative_parallel_draft\.gin'):
    t5x_adapter.graft_draft_checkpoint(os.fspath(parallel))(read, CHAIN_STATE)
  decoder_only = tiny_decoder_only_model(seed=1)
  with pytest.raises(ValueError, match=r'speculative_decoder_only_parallel_draft\.gin'):
    t5x_adapter.check_checkpoint_matches(
      {'network': decoder_only.params, 'mask_embedding': MASK},
      network.abstract_params(decoder_only.config)[0],
      role='draft',
    )
  # A parallel draft of another size: its network's mismatch, named as a chain draft's.
  wider = tiny_model(seed=1, emb_dim=48)
  with pytest.raises(ValueError, match='draft checkpoint.*does not match.*DRAFT_SIZE'):
    t5x_adapter.check_checkpoint_matches(
      {'network': wider.params, 'mask_embedding': np.zeros(48, np.float32)},
      PARALLEL_STATE['target']['draft'],
      role='draft',
    )


def test_start_distillation_starts_a_parallel_draft_from_a_chain_draft(tmp_path):
  """Its mask at the mean token embedding (`Model.as_parallel_draft`'s start); a parallel one continues."""
  read = {'target': TARGET.params, 'state': {'step': np.int32(1000)}}
  chain = write_t5x_legacy(tmp_path / 'chain', 1, DRAFT.params)
  started = t5x_adapter.start_distillation(os.fspath(chain))(read, PARALLEL_STATE)
  assert sorted(started) == ['target']
  assert_trees_equal(started['target']['draft']['network'], DRAFT.params)
  np.testing.assert_allclose(
    started['target']['draft']['mask_embedding'], DRAFT.as_parallel_draft().mask_embedding
  )
  parallel = tmp_path / 'parallel'
  checkpoints.save_params(parallel, PARALLEL_PARAMS)
  continued = t5x_adapter.start_distillation(os.fspath(parallel))(read, PARALLEL_STATE)
  assert_trees_equal(continued['target']['draft'], PARALLEL_PARAMS)
  # Without DRAFT_CHECKPOINT_PATH, a chain draft in the initial checkpoint is not adapted silently.
  with pytest.raises(
    ValueError, match='INITIAL_CHECKPOINT_PATH.*chain draft.*DRAFT_CHECKPOINT_PATH'
  ):
    t5x_adapter.start_distillation(None)({'target': _with_draft(DRAFT.params)}, PARALLEL_STATE)


# ------------------------------------------------------------------------------
# With the real t5x: the speculative model.
# ------------------------------------------------------------------------------
@pytest.mark.t5x
def test_t5x_parallel_draft_predictions_equal_stock_t5x_greedy(t5x_env):  # noqa: F811
  """The speculative T5X model with a parallel draft: T5X's greedy outputs, its variables partitioned.

  Its initial variables hold the draft network and the mask (the mean of
  the draft's token embeddings) under params['draft'] with logical axes,
  which T5X's partitioner maps by the target's rules.
  """
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top

  vocabulary = t5x_env['vocabulary']
  model = speculative_t5x_models().SpeculativeEncoderDecoderModel(
    MODULE, vocabulary, vocabulary, optimizer_def=None, draft_module=PARALLEL, gamma=GAMMA
  )
  expected, _ = jax.jit(t5x_env['stock'].predict_batch_with_aux)(TARGET.params, BATCH)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_with_draft(PARALLEL_PARAMS), BATCH)
  np.testing.assert_array_equal(decodes, expected)
  assert 1 < decoded_lengths(expected).min()
  assert np.all(aux['drafted'] > 0)

  variables = model.get_initial_variables(
    jax.random.PRNGKey(0), t5x_env['shapes'], t5x_env['types']
  )
  draft = variables['params']['draft']
  assert_trees_equal(_abstract(draft), _abstract(PARALLEL_PARAMS))
  np.testing.assert_allclose(
    draft['mask_embedding'], parallel_draft.mean_token_embedding(draft['network']), rtol=1e-6
  )
  state = t5x_train_state.InferenceState.create(variables)  # Validates params_axes.
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  specs = traverse_util.flatten_dict(
    flax.core.unfreeze(partitioner.get_mesh_axes(state).params['draft']), sep='/'
  )
  rules = partitioner.logical_axis_rules
  assert specs['mask_embedding'] == nn_partitioning.logical_to_mesh_axes(('embed',), rules)
  target_specs = traverse_util.flatten_dict(
    flax.core.unfreeze(partitioner.get_mesh_axes(state).params), sep='/'
  )
  for path, spec in specs.items():
    if path.startswith('network/'):
      assert spec == target_specs[path[len('network/') :]], path


@pytest.mark.t5x
@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_t5x_decoder_only_parallel_draft_decodes_greedy_as_the_chain_draft(bidirectional):
  """The decoder-only model with a parallel draft: the chain draft's (T5X's) greedy outputs."""
  import seqio  # pylint: disable=g-import-not-at-top

  target, draft = tiny_decoder_only_model(seed=0, scale=3.0), tiny_decoder_only_model(seed=1)
  build = functools.partial(
    speculative_t5x_models().SpeculativeDecoderOnlyModel,
    network.DecoderOnly(target.config),
    seqio.PassThroughVocabulary(size=target.vocab_size, eos_id=EOS),
    optimizer_def=None,
    inputs_bidirectional_attention=bidirectional,
    gamma=GAMMA,
  )
  chain = build(draft_module=network.DecoderOnly(draft.config))
  parallel = build(draft_module=t5x_adapter.ParallelDraftNetwork(network.DecoderOnly(draft.config)))
  batch = prefix_lm_batch()
  expected, _ = jax.jit(chain.predict_batch_with_aux)(
    {**target.params, 'draft': draft.params}, batch
  )
  decodes, aux = jax.jit(parallel.predict_batch_with_aux)(
    {**target.params, 'draft': {'network': draft.params, 'mask_embedding': MASK}}, batch
  )
  np.testing.assert_array_equal(decodes, expected)
  assert decoded_lengths(expected).min() > 1 and np.all(aux['drafted'] > 0)


# ------------------------------------------------------------------------------
# With the real t5x: the draft-training model.
# ------------------------------------------------------------------------------
LOSS = dict(depth=3, keep=0.5, depth_weights=(1.0, 0.8, 0.6), temperature=1.0)


def _training_model(kind='encoder_decoder', **loss):
  import seqio  # pylint: disable=g-import-not-at-top

  vocabulary = seqio.PassThroughVocabulary(size=VOCAB, eos_id=EOS)
  t5x_models = speculative_t5x_models()
  if kind == 'encoder_decoder':
    return t5x_models.DraftDistillationEncoderDecoderModel(
      network.Transformer(TARGET_CONFIG),
      vocabulary,
      vocabulary,
      _adafactor(),
      draft_module=t5x_adapter.ParallelDraftNetwork(network.Transformer(DRAFT_CONFIG)),
      gamma=3,
      **loss,
    )
  return t5x_models.DraftDistillationDecoderOnlyModel(
    network.DecoderOnly(DECODER_ONLY_TARGET),
    vocabulary,
    _adafactor(),
    draft_module=t5x_adapter.ParallelDraftNetwork(network.DecoderOnly(DECODER_ONLY_DRAFT)),
    gamma=3,
    **loss,
  )


@pytest.mark.t5x
@pytest.mark.parametrize('kind', ['encoder_decoder', 'decoder_only'])
def test_t5x_train_step_trains_the_parallel_draft_alone(kind):
  """T5X's train step: `parallel_distill.layout_sums`' loss; the draft network and mask train, the target not.

  The loss and betas are `layout_sums`' on T5X's step key; 30 steps raise
  depth 1's beta and the deepest depth's, the target stays bit for bit, the
  optimizer state covers the draft (network and mask) alone.
  """
  import_t5x()
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top
  from t5x import trainer as t5x_trainer  # pylint: disable=g-import-not-at-top

  model = _training_model(kind, **LOSS)
  batch = _batch(seed=4)
  if kind == 'decoder_only':
    del batch['encoder_input_tokens']
  shapes = {name: value.shape for name, value in batch.items()}
  types = {name: value.dtype for name, value in batch.items()}
  variables = model.get_initial_variables(jax.random.PRNGKey(0), shapes, types)
  state = t5x_train_state.FlaxOptimTrainState.create(model.optimizer_def, variables)
  assert list(state.param_states) == ['draft']
  assert set(state.param_states['draft']) == {'network', 'mask_embedding'}
  target_before = _bits(t5x_adapter.strip_draft_params(state.params))
  draft_before = _bits(state.params['draft'])

  # One loss: parallel_distill's, on this batch and key.
  key = jax.random.PRNGKey(7)
  loss, metrics = model.loss_fn(state.params, batch, key)
  target_params, draft_params = t5x_adapter.split_draft_params(state.params)
  config = parallel_distill.loss_config(
    model.module.config,
    model.draft_module.config,
    acceptance_weighting=False,
    divergence='tvd',
    beta=0.5,
    topk=0,
    topp=0.0,
    **LOSS,
  )
  teacher = model._compute_logits(target_params, batch)  # pylint: disable=protected-access
  sums = parallel_distill.layout_sums(config, draft_params, teacher, batch, key)
  np.testing.assert_allclose(loss, sums['loss'], rtol=1e-5)
  for k in (1, 2, 3):
    np.testing.assert_allclose(
      metrics[f'beta_depth{k}'].compute(),
      sums[f'beta_depth{k}'] / sums[f'tokens_depth{k}'],
      rtol=1e-5,
    )

  step = jax.jit(lambda state, rng: t5x_trainer.train_with_lr(state, batch, 0.05, rng, model, None))
  history = []
  for i in range(30):
    state, metrics = step(state, jax.random.PRNGKey(i))
    history.append({k: float(metrics[k].compute()) for k in ('beta_depth1', 'beta_depth3')})
  assert int(state.step) == 30
  assert history[-1]['beta_depth1'] > history[0]['beta_depth1'] + 0.1, history
  assert history[-1]['beta_depth3'] > history[0]['beta_depth3'] + 0.05, history
  assert _bits(t5x_adapter.strip_draft_params(state.params)) == target_before
  after = _bits(state.params['draft'])
  assert after['mask_embedding'] != draft_before['mask_embedding']
  assert after != draft_before


@pytest.mark.t5x
def test_t5x_parallel_training_refuses_bad_settings_and_batches():
  with pytest.raises(ValueError, match=r'keep is the rate of kept anchors per depth, in \(0, 1\]'):
    _training_model(keep=0.0)
  with pytest.raises(ValueError, match='depth_weights must be 4 finite weights'):
    _training_model(depth_weights=(1.0, 1.0))
  with pytest.raises(ValueError, match="Unknown divergence 'kl'"):
    _training_model(divergence='kl')
  with pytest.raises(ValueError, match='prefix LM'):
    import seqio  # pylint: disable=g-import-not-at-top

    speculative_t5x_models().DraftDistillationDecoderOnlyModel(
      network.DecoderOnly(DECODER_ONLY_TARGET),
      seqio.PassThroughVocabulary(size=VOCAB, eos_id=EOS),
      _adafactor(),
      inputs_bidirectional_attention=True,
      draft_module=t5x_adapter.ParallelDraftNetwork(network.DecoderOnly(DECODER_ONLY_DRAFT)),
      gamma=3,
    )
  model = _training_model()
  batch = _batch(seed=1)
  packed = {**batch, 'decoder_segment_ids': (batch['decoder_target_tokens'] > 0).astype(np.int32)}
  params = {**network.random_params(TARGET_CONFIG)[0], 'draft': {}}
  with pytest.raises(ValueError, match='unpacked batches.*pack=False'):
    model.loss_fn(params, packed, None)


@pytest.mark.t5x
def test_t5x_parallel_training_settings_are_checked_when_t5x_resumes(tmp_path):
  """Recorded in MODEL_DIR at the start; with a checkpoint there (T5X resumes), other ones are refused."""
  model_dir = os.fspath(tmp_path / 'model')
  _training_model(model_dir=model_dir, **LOSS)
  path = os.path.join(model_dir, run_settings.PARALLEL_DRAFT_SETTINGS_FILE)
  recorded = run_settings.read(path)
  assert recorded['depth'] == 3 and recorded['config']['emb_dim'] == DRAFT_CONFIG.emb_dim
  # No checkpoint yet: T5X starts afresh, and so may other settings.
  _training_model(model_dir=model_dir, **{**LOSS, 'keep': 0.25})
  _training_model(model_dir=model_dir, **LOSS)
  os.makedirs(os.path.join(model_dir, 'checkpoint_20'))
  _training_model(model_dir=model_dir, **LOSS)  # The same settings: resumed.
  with pytest.raises(ValueError, match=r'other settings.*keep=0\.5 \(this run: 0\.25\).*MODEL_DIR'):
    _training_model(model_dir=model_dir, **{**LOSS, 'keep': 0.25})
  assert run_settings.read(path) == recorded


# ------------------------------------------------------------------------------
# With the real t5x: the gin files.
# ------------------------------------------------------------------------------
def _gin_model(files, bindings):
  """The MODEL and the restore transformation that T5X's model file then `files` configure."""
  import gin  # pylint: disable=g-import-not-at-top
  import t5x  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))
  gin.clear_config()
  try:
    gin.add_config_file_search_path(REPO_ROOT)
    gin.parse_config_files_and_bindings(
      [os.path.join(t5x_root, files[0]), *files[1:]], bindings, finalize_config=False
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
    (restore,) = [
      reference.scoped_configurable_fn()
      for reference in gin.query_parameter('utils.RestoreCheckpointConfig.state_transformation_fns')
    ]
  finally:
    gin.clear_config()
  return model, restore


@pytest.mark.t5x
@pytest.mark.parametrize(
  'model_file, gin_file, configure, module',
  [
    (
      't5x/examples/t5/t5_1_1/base.gin',
      'speculative_parallel_draft.gin',
      network.t5_1_1_config,
      network.Transformer,
    ),
    (
      't5x/examples/decoder_only/models/base.gin',
      'speculative_decoder_only_parallel_draft.gin',
      network.decoder_only_config,
      network.DecoderOnly,
    ),
  ],
)
def test_t5x_parallel_draft_gin_files_build_the_model(model_file, gin_file, configure, module):
  import_t5x()
  model, restore = _gin_model(
    [model_file, f'configs/t5x/{gin_file}'],
    ["DRAFT_CHECKPOINT_PATH = '/ckpt/draft'", "TARGET_SIZE = 'base'", "DRAFT_SIZE = 'tiny'"],
  )
  draft = configure('tiny', dtype='bfloat16', dropout_rate=0.0)
  assert model.draft_module == t5x_adapter.ParallelDraftNetwork(module(draft))
  assert model.module.config == configure('base', dtype='bfloat16', dropout_rate=0.0)
  assert model.settings == settings.SpeculativeSettings(gamma=4)
  assert restore.__qualname__.startswith('graft_draft_checkpoint')


@pytest.mark.t5x
@pytest.mark.parametrize(
  'model_file, gin_file, configure',
  [
    ('t5x/examples/t5/t5_1_1/base.gin', 'distill_parallel_draft.gin', network.t5_1_1_config),
    (
      't5x/examples/decoder_only/models/base.gin',
      'distill_decoder_only_parallel_draft.gin',
      network.decoder_only_config,
    ),
  ],
)
def test_t5x_distill_parallel_draft_gin_files_build_the_training_model(
  tmp_path, model_file, gin_file, configure
):
  import_t5x()
  model_dir = os.fspath(tmp_path / 'model')
  model, restore = _gin_model(
    [model_file, f'configs/t5x/{gin_file}'],
    [
      "TARGET_SIZE = 'base'",
      "DRAFT_SIZE = 'tiny'",
      'DEPTH = 3',
      'DEPTH_WEIGHTS = (1.0, 0.5, 0.25)',
      f'MODEL_DIR = {model_dir!r}',  # T5X's run file (finetune.gin) binds it.
    ],
  )
  assert model.draft_module.config == configure('tiny', dtype='bfloat16', dropout_rate=0.0)
  assert isinstance(model.draft_module, t5x_adapter.ParallelDraftNetwork)
  assert model.settings.gamma == 3  # GAMMA = DEPTH.
  recorded = run_settings.read(os.path.join(model_dir, run_settings.PARALLEL_DRAFT_SETTINGS_FILE))
  assert recorded['depth'] == 3 and recorded['depth_weights'] == [1.0, 0.5, 0.25]
  assert isinstance(model.optimizer_def, speculative_t5x_models().DraftOnlyOptimizer)
  assert restore.__qualname__.startswith('start_distillation')
