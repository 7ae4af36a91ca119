"""Tests for speculative_t5x.training.parallel_distill: the COD layout, training, resumption."""

import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import checkpoints
from speculative_t5x import gin_utils
from speculative_t5x import infer
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.training import parallel_distill
import testing_utils

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = 'translate: '
FEATURE_LENGTHS = {'inputs': 32, 'targets': 24}


def _config(emb_dim, layers=1):
  return network.T5Config(
    vocab_size=64,
    dtype='float32',
    emb_dim=emb_dim,
    num_heads=2,
    head_dim=8,
    mlp_dim=2 * emb_dim,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    dropout_rate=0.0,
  )


# ------------------------------------------------------------------------------
# The layout.
# ------------------------------------------------------------------------------
def test_cod_keeps_nested_anchors_and_sees_only_the_true_prefix_and_its_own_masks():
  length, depth, keep = 6, 3, 0.5
  tokens = jnp.array([[0, 11, 12, 13, 14, 15]], jnp.int32)
  weights = jnp.array([[1, 1, 1, 1, 1, 0]], jnp.float32)  # 5 real targets.
  layout = parallel_distill.cod_layout(
    tokens, weights, jax.random.PRNGKey(0), depth=depth, keep=keep
  )
  counts = parallel_distill.depth_counts(length, depth, keep)
  assert counts == (6, 3, 2)
  anchor = np.asarray(layout['anchor'][0])
  np.testing.assert_array_equal(anchor[:6], np.arange(6))
  assert list(anchor[9:11]) == list(anchor[6:8])  # Depth 3's anchors are depth 2's first.
  assert all(a < 5 for a in anchor[6:])  # Anchors with a real next target come first.
  np.testing.assert_array_equal(layout['decoder_masked'][0], np.arange(11) >= 6)
  np.testing.assert_array_equal(layout['decoder_input_tokens'][0, :6], tokens[0])
  depth_of = np.array([1] * 6 + [2] * 3 + [3] * 2)
  np.testing.assert_array_equal(layout['decoder_positions'][0], anchor + depth_of - 1)
  visible = np.asarray(layout['decoder_visible'][0])
  np.testing.assert_array_equal(visible[:6, :6], np.tri(6, dtype=bool))
  assert not visible[:6, 6:].any()  # True tokens never see masks.
  for query in range(6, 11):
    seen = set(np.flatnonzero(visible[query]))
    slot = (query - 6) if query < 9 else (query - 9)
    own = {6 + slot} | ({9 + slot} if query >= 9 else set())
    assert seen == set(range(anchor[query] + 1)) | own, query
  predicted = anchor + depth_of - 1
  np.testing.assert_array_equal(layout['predicted'][0], np.minimum(predicted, 5))
  np.testing.assert_array_equal(layout['weights'][0], (predicted < 5).astype(np.float32))


def test_a_layout_prediction_is_the_parallel_drafts_q():
  """Depth k of anchor t in training equals q_k of a decode call after t."""
  draft = models.random_model(_config(16, layers=2), seed=3).as_parallel_draft()
  length, gamma = 10, 3
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 64, (1, length)).astype(np.int32)
  tokens[0, 0] = 0
  layout = parallel_distill.cod_layout(
    jnp.asarray(tokens), jnp.ones((1, length)), jax.random.PRNGKey(1), depth=gamma, keep=1.0
  )
  inputs = jnp.array([[5, 9, 7, 1, 0]], jnp.int32)
  features = {name: layout[name] for name in parallel_distill.LAYOUT_FEATURES}
  features['encoder_input_tokens'] = inputs
  logits = network.compute_layout_logits(
    draft.config, draft.params, draft.mask_embedding, features
  )[0]
  anchor = np.asarray(layout['anchor'][0])
  depths = np.repeat(np.arange(1, gamma + 1), length)
  for position in (0, 4, 7):
    cache = draft.init_cache(inputs, 16)
    cache = draft.prefill(cache, jnp.asarray(tokens), jnp.array([position]))
    q_logits, _ = draft.block_logits(cache, jnp.asarray(tokens), jnp.array([position]), gamma)
    for k in range(1, gamma + 1):
      (column,) = np.flatnonzero((anchor == position) & (depths == k))
      np.testing.assert_allclose(q_logits[0, k - 1], logits[column], atol=2e-5)


# ------------------------------------------------------------------------------
# Training.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def phrase_task(tmp_path_factory):
  return testing_utils.phrase_task(
    str(tmp_path_factory.mktemp('data')), 'speculative_t5x:parallel_distill_test_fixture', PREFIX
  )[0]


@pytest.fixture(scope='module')
def pair():
  """(target, draft): random networks (a sharper target), one vocabulary."""
  target = models.random_model(_config(32), seed=0)
  params = jax.tree.map(np.array, target.params)
  params['decoder']['logits_dense']['kernel'] *= 4.0
  return models.Model(target.config, params), models.random_model(_config(16), seed=1)


ARGS = dict(
  feature_lengths=FEATURE_LENGTHS,
  batch_size=8,
  depth=3,
  keep=0.5,
  learning_rate=0.03,
  data_mix={'target': 1.0},  # The target's greedy outputs: a fixed teacher, no target call.
  checkpoint_every=5,
  log_every=5,
  progress=False,
)


@pytest.mark.parametrize('acceptance_weighting', [False, True])
def test_training_lowers_the_loss_and_resumes_bit_identically(
  pair, phrase_task, tmp_path, acceptance_weighting
):
  target, draft = pair
  args = dict(ARGS, acceptance_weighting=acceptance_weighting)
  reference = parallel_distill.parallel_distill(
    str(tmp_path / 'a'), target, draft, phrase_task, num_steps=30, **args
  )
  first, last = reference.train_metrics[0], reference.train_metrics[-1]
  assert last['loss'] < 0.9 * first['loss'], (first, last)
  assert last['alpha_depth2'] > first['alpha_depth2'], (first, last)
  half = parallel_distill.parallel_distill(
    str(tmp_path / 'b'), target, draft, phrase_task, num_steps=15, **args
  )
  resumed = parallel_distill.parallel_distill(
    str(tmp_path / 'b'), target, draft, phrase_task, num_steps=30, **args
  )
  assert half.step == 15 and resumed.train_metrics[0]['step'] == 20
  jax.tree.map(np.testing.assert_array_equal, resumed.draft, reference.draft)
  # The checkpoint loads as a parallel draft that decodes exactly.
  loaded = models.load_parallel_draft(str(tmp_path / 'b'))
  jax.tree.map(np.testing.assert_array_equal, loaded, reference.draft)
  inputs = testing_utils.padded_inputs(0, 4, 9, 64)
  baseline = models.generate(target, None, inputs, max_decode_len=12)
  out = models.generate(target, loaded, inputs, gamma=3, max_decode_len=12)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)


def test_resuming_with_other_settings_is_refused(pair, phrase_task, tmp_path):
  target, draft = pair
  parallel_distill.parallel_distill(str(tmp_path), target, draft, phrase_task, num_steps=5, **ARGS)
  with pytest.raises(ValueError, match='keep'):
    parallel_distill.parallel_distill(
      str(tmp_path), target, draft, phrase_task, num_steps=10, **dict(ARGS, keep=0.75)
    )


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(keep=0.0), r'keep is the rate of kept anchors per depth, in \(0, 1\]'),
    (dict(depth_weights=[1.0, 0.5]), 'depth_weights must be 3 finite weights'),
    (dict(depth=0), 'depth'),
  ],
)
def test_bad_arguments_name_the_problem(pair, phrase_task, tmp_path, kwargs, message):
  target, draft = pair
  with pytest.raises(ValueError, match=message):
    parallel_distill.parallel_distill(
      str(tmp_path), target, draft, phrase_task, num_steps=5, **dict(ARGS, **kwargs)
    )


def test_infer_through_gin_with_a_parallel_draft_checkpoint(tmp_path):
  """configs/runs/parallel_draft.gin: infer's greedy predictions are the baseline's."""
  task, data, vocabulary = testing_utils.phrase_task(
    str(tmp_path), 'speculative_t5x:parallel_draft_gin_fixture', PREFIX
  )
  target = models.random_model(
    gin_utils.model_config('tiny', 64), seed=1
  )  # configs/models/tiny.gin.
  checkpoints.save_params(tmp_path / 'target', target.params)
  draft_dir = str(tmp_path / 'parallel')
  parallel_distill.parallel_distill(
    draft_dir, target, models.random_model(_config(16), seed=2), task, num_steps=3, **ARGS
  )
  tsv = {split: os.path.join(data, f'{split}.tsv') for split in ('train', 'validation')}
  bindings = dict(
    CHECKPOINT_PATH=str(tmp_path / 'target'),
    VOCAB_SIZE=64,
    TSV_FILES=dict(tsv, test=tsv['validation']),
    VOCABULARY=vocabulary,
    TASK_NAME='speculative_t5x:parallel_draft_gin_task',
    PREFIX=PREFIX,
    TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8},
    BATCH_SIZE=4,
    GAMMA=3,
    **{'infer.infer.split': 'validation', 'infer.infer.progress': False},
  )
  files = [
    'configs/models/tiny.gin',
    'configs/pairs/pair.gin',
    'configs/tasks/tsv.gin',
    'configs/runs/infer.gin',
  ]
  outputs = {}
  for name, extra_files, extra in (
    ('baseline', [], ['DRAFT = None']),
    ('parallel', ['configs/runs/parallel_draft.gin'], [f'PARALLEL_DRAFT_PATH = {draft_dir!r}']),
  ):
    gin.clear_config()
    try:
      gin_utils.parse_gin_flags(
        [REPO],
        files + extra_files,
        [f'{k} = {v!r}' for k, v in dict(bindings, INFER_OUTPUT_DIR=str(tmp_path / name)).items()]
        + extra,
      )
      summary = gin.get_configurable(infer.infer)()
    finally:
      gin.clear_config()
    outputs[name] = infer.read_records(
      os.path.join(tmp_path / name, 'speculative_t5x:parallel_draft_gin_task-validation.jsonl')
    )
    assert summary['decoded_examples'] == len(outputs[name]) > 0
  assert [r['prediction'] for r in outputs['parallel']] == [
    r['prediction'] for r in outputs['baseline']
  ]
  settings = open(
    os.path.join(
      tmp_path / 'parallel', 'speculative_t5x:parallel_draft_gin_task-validation.settings.json'
    )
  ).read()
  assert 'ParallelDraft' in settings
