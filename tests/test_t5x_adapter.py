"""The T5X integration: draft grafting, the speculative predict path, and the T5X model.

The first part needs no t5x: it tests the functions of `t5x_adapter` that the
model class calls (parameter trees, grafting a T5X checkpoint, the predict
computation) on this project's networks. The second part runs against the
real t5x (marked `t5x`; it is not on PyPI, `make test-t5x` installs it; see
`t5x_models.T5X_MISSING`): the model class inside T5X's own restore,
partitioning and prediction code, compared with T5X's stock
`EncoderDecoderModel` on T5X's own network, and the gin files of configs/t5x.
The `python -m t5x.infer` commands of docs/t5x.md run in tests/test_t5x_commands.py.
"""

import dataclasses
import functools
import importlib
import os
import sys

import flax
from flax import serialization
from flax import traverse_util
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import settings
from speculative_t5x import t5x_adapter
from testing_utils import (
  EOS,
  assert_trees_equal,
  decoded_lengths,
  import_t5x,
  padded_inputs,
  speculative_t5x_models,
  tiny_model,
  write_t5x_legacy,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAMMA = 3
MAX_DECODE_LEN = 12
# Target and draft share one config (different parameters), so that one
# compiled predict program serves every draft below.
TARGET = tiny_model(seed=0, scale=3.0)
DRAFT = tiny_model(seed=1, scale=3.0)
MODULE = network.Transformer(TARGET.config)
INPUTS = padded_inputs(seed=3, batch=4, length=9, vocab_size=TARGET.vocab_size)
BATCH = {
  'encoder_input_tokens': INPUTS,
  'decoder_input_tokens': np.zeros((len(INPUTS), MAX_DECODE_LEN), np.int32),
}


def _with_draft(draft_params):
  return {**TARGET.params, t5x_adapter.DRAFT_KEY: draft_params}


# ------------------------------------------------------------------------------
# Parameter trees.
# ------------------------------------------------------------------------------
def test_add_draft_variables_mirrors_params_and_axes():
  shapes = {'encoder_input_tokens': (2, 5), 'decoder_input_tokens': (2, 3)}
  small = network.t5_1_1_config('tiny', vocab_size=32, num_encoder_layers=1, num_decoder_layers=1)
  target_variables, draft_variables = (
    jax.eval_shape(lambda m=m: t5x_adapter.init_network_variables(m, jax.random.PRNGKey(0), shapes))
    for m in (MODULE, network.Transformer(small))
  )
  variables = t5x_adapter.add_draft_variables(target_variables, draft_variables)
  assert sorted(variables['params']) == ['decoder', 'draft', 'encoder', 'token_embedder']
  # T5X's InferenceState requires params_axes to describe params leaf for leaf.
  axes = traverse_util.flatten_dict(
    flax.core.unfreeze(nn_partitioning.get_axis_names(variables['params_axes']))
  )
  assert axes.keys() == traverse_util.flatten_dict(variables['params']).keys()
  assert tuple(axes['draft', 'token_embedder', 'embedding']) == ('vocab', 'embed')
  assert variables['params']['draft']['token_embedder']['embedding'].shape == (32, 128)
  assert 'draft' not in target_variables['params']  # Not modified.

  with pytest.raises(ValueError, match="already has a 'draft' entry"):
    t5x_adapter.add_draft_variables(variables, draft_variables)
  with pytest.raises(ValueError, match="need 'params_axes'"):
    t5x_adapter.add_draft_variables(target_variables, {'params': draft_variables['params']})


def test_split_and_strip_draft_params():
  target_params, draft_params = t5x_adapter.split_draft_params(_with_draft(DRAFT.params))
  assert sorted(target_params) == sorted(TARGET.params)
  assert draft_params is DRAFT.params
  assert sorted(t5x_adapter.strip_draft_params(TARGET.params)) == sorted(TARGET.params)
  with pytest.raises(ValueError, match="no 'draft' subtree.*graft_draft_checkpoint"):
    t5x_adapter.split_draft_params(TARGET.params)


# ------------------------------------------------------------------------------
# Grafting a draft checkpoint into T5X's restored state.
# ------------------------------------------------------------------------------
def _target_state_dict(draft_config):
  """The abstract state T5X restores into: the model's params with a draft."""
  target = network.abstract_params(TARGET.config)[0]
  draft = network.abstract_params(draft_config)[0]
  return {'target': {**target, 'draft': draft}, 'state': {'step': np.int32(0)}}


def test_graft_draft_checkpoint_into_a_legacy_t5x_state(tmp_path):
  draft_config = network.t5_1_1_config(
    'tiny',
    vocab_size=32,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=1,
    dtype='float32',
  )
  draft_params = network.random_params(draft_config, seed=5)[0]
  draft_dir = write_t5x_legacy(tmp_path / 'draft', 4, draft_params).parent
  # What T5X's legacy Checkpointer hands to the state transformations: the
  # msgpack's optimizer state, with tensorstore specs for the large arrays.
  target_step = write_t5x_legacy(tmp_path / 'target', 9, TARGET.params)
  state_dict = serialization.msgpack_restore((target_step / 'checkpoint').read_bytes())['optimizer']
  target_state_dict = _target_state_dict(draft_config)

  graft = t5x_adapter.graft_draft_checkpoint(os.fspath(draft_dir))
  grafted = graft(state_dict, target_state_dict)
  assert_trees_equal(grafted['target']['draft'], draft_params)
  assert (
    grafted['target']['draft']['encoder']['layers_1']['mlp']['wo']['kernel'].dtype == np.float32
  )
  assert grafted['state'] is state_dict['state']
  for name in TARGET.params:  # The target's entries are untouched.
    assert grafted['target'][name] is state_dict['target'][name]
  assert 'draft' not in state_dict['target']  # Not modified.

  # Resuming from a checkpoint that already has a draft keeps it.
  assert graft(grafted, target_state_dict, is_resuming=True) is grafted
  resumed = graft(state_dict, target_state_dict, is_resuming=True)
  assert_trees_equal(resumed['target']['draft'], draft_params)
  cast = t5x_adapter.graft_draft_checkpoint(os.fspath(draft_dir), dtype='bfloat16')(
    state_dict, target_state_dict
  )
  assert cast['target']['draft']['token_embedder']['embedding'].dtype == jnp.bfloat16

  # A draft checkpoint of another size names the first mismatch.
  with pytest.raises(
    ValueError,
    match=r'decoder/decoder_norm/scale has shape \(16,\), but the '
    r'draft network needs \(32,\) \(0 missing, 9 unexpected, '
    r'27 mis-shaped\).*DRAFT_SIZE',
  ):
    graft(state_dict, _target_state_dict(TARGET.config))
  # A target checkpoint of another size (T5X's restore would report only a key
  # mismatch) names TARGET_SIZE, before the draft is read.
  other_target = network.abstract_params(tiny_model(seed=0, layers=2).config)[0]
  with pytest.raises(
    ValueError,
    match=r'target checkpoint \(CHECKPOINT_PATH\) does not match.*'
    r'decoder/layers_1/encoder_decoder_attention/key/kernel \(shape \(32, 32\)\) is missing '
    r'\(23 missing.*'
    r'num_encoder_layers 1.*num_encoder_layers 2.*TARGET_SIZE',
  ):
    graft(state_dict, {**target_state_dict, 'target': {**other_target, 'draft': draft_params}})
  # A draft of another vocabulary says so, rather than blaming DRAFT_SIZE.
  other_vocab = network.abstract_params(dataclasses.replace(draft_config, vocab_size=48))[0]
  with pytest.raises(
    ValueError,
    match=r'draft checkpoint \(DRAFT_CHECKPOINT_PATH\) has a vocabulary '
    r"of 32 entries .* network's has 48 .*trained on the target's "
    'vocabulary',
  ):
    graft(state_dict, {**target_state_dict, 'target': {**TARGET.params, 'draft': other_vocab}})
  with pytest.raises(ValueError, match="has no 'draft' parameters.*give the pair file last"):
    graft(state_dict, {'target': network.abstract_params(TARGET.config)[0]})
  with pytest.raises(FileNotFoundError, match='absent'):
    t5x_adapter.graft_draft_checkpoint(os.fspath(tmp_path / 'absent'))(
      state_dict, target_state_dict
    )
  with pytest.raises(ValueError, match='set DRAFT_CHECKPOINT_PATH'):
    t5x_adapter.graft_draft_checkpoint(None)


def test_checkpoint_mismatch_names_both_sizes_and_the_fix():
  small, base = (
    network.abstract_params(network.t5_1_1_config(size))[0] for size in ('small', 'base')
  )
  with pytest.raises(ValueError) as error:
    t5x_adapter.check_checkpoint_matches(small, base, role='target')
  message = str(error.value)
  assert (
    'The checkpoint has emb_dim 512, mlp_dim 1024, num_decoder_layers 8, '
    "num_encoder_layers 8 (T5 1.1 'small')" in message
  )
  assert (
    'configured with emb_dim 768, mlp_dim 2048, num_decoder_layers 12, '
    "num_encoder_layers 12 (T5 1.1 'base')" in message
  )
  assert '--gin.TARGET_SIZE=' in message
  assert '--gin.target/speculative_network.t5_1_1_config.<field>=' in message
  with pytest.raises(
    ValueError,
    match=r'DRAFT_CHECKPOINT_PATH.*--gin\.DRAFT_SIZE=.*'
    r'--gin\.draft/speculative_network',
  ):
    t5x_adapter.check_checkpoint_matches(small, base, role='draft')
  # Leaves without a shape (orbax metadata) are compared by path only.
  t5x_adapter.check_checkpoint_matches(jax.tree.map(lambda _: object(), small), small, role='draft')


def test_decoder_only_checkpoint_mismatch_gives_decoder_only_advice():
  base, draft = (
    network.abstract_params(network.decoder_only_config(size))[0]
    for size in ('base', 'gpt_like_draft')
  )
  with pytest.raises(ValueError) as error:
    t5x_adapter.check_checkpoint_matches(
      draft,
      network.abstract_params(network.decoder_only_config('gpt_like_target'))[0],
      role='draft',
    )
  message = str(error.value)
  assert "emb_dim 256, mlp_dim 1024, num_layers 2 (decoder-only 'gpt_like_draft')" in message
  assert "num_layers 12 (decoder-only 'gpt_like_target')" in message
  assert '--gin.draft/speculative_network.decoder_only_config.<field>=' in message
  assert 'DecoderOnlyConfig' in message and 'gpt_like_target' in message
  assert 't5_1_1' not in message and 'T5 1.1' not in message
  # Another vocabulary: the decoder-only gin file binds it once, VOCAB_SIZE.
  with pytest.raises(ValueError, match=r'vocabulary of 8192 entries.*--gin\.VOCAB_SIZE=8192'):
    t5x_adapter.check_checkpoint_matches(draft, base, role='target')


# ------------------------------------------------------------------------------
# The predict computation, without t5x.
# ------------------------------------------------------------------------------
NUM_DECODES = 2


@functools.partial(jax.jit, static_argnames='draft_threshold')
def _predict_all(params, rng, temperature, draft_threshold=0.0):
  """Every decode of each input; temperature 0 is greedy. One program for all draft params."""
  return t5x_adapter.speculative_predict_batch(
    MODULE,
    MODULE,
    params,
    BATCH,
    eos_id=EOS,
    settings=settings.SpeculativeSettings(gamma=GAMMA),
    rng=rng,
    decoder_params={'topk': 0, 'temperature': temperature, 'draft_threshold': draft_threshold},
    num_decodes=NUM_DECODES,
    return_all_decodes=True,
  )


def test_greedy_predictions_equal_the_baseline():
  baseline = models.generate(TARGET, None, INPUTS, max_decode_len=MAX_DECODE_LEN)
  lengths = decoded_lengths(baseline.tokens)
  assert 1 < lengths.min() and lengths.max() == MAX_DECODE_LEN  # Rows end differently.
  expected = np.repeat(np.asarray(baseline.tokens)[:, None], NUM_DECODES, axis=1)
  per_decode_lengths = np.repeat(lengths[:, None], NUM_DECODES, axis=1)

  decodes, aux = _predict_all(_with_draft(DRAFT.params), jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(decodes, expected)
  assert sorted(aux) == [
    'accepted',
    'batch_gamma',
    'batch_mean_beta',
    'batch_target_calls',
    'drafted',
    'emitted',
    'iterations',
    'scores',
  ]
  for name in ('scores', 'iterations', 'accepted', 'emitted', 'drafted'):
    assert aux[name].shape == (len(INPUTS), NUM_DECODES), name
  assert aux['batch_mean_beta'].shape == aux['batch_target_calls'].shape == (len(INPUTS),)
  np.testing.assert_array_equal(aux['scores'], 0.0)  # log 1 under argmax.
  np.testing.assert_array_equal(aux['emitted'], per_decode_lengths)
  assert np.all(aux['accepted'] + aux['iterations'] >= aux['emitted'])
  np.testing.assert_array_equal(aux['batch_target_calls'], np.max(aux['iterations']))
  assert np.all((0.0 <= aux['batch_mean_beta']) & (aux['batch_mean_beta'] < 1.0))
  np.testing.assert_array_equal(aux['drafted'], GAMMA * aux['iterations'])

  # An adaptive draft length: fewer draft tokens, the same outputs.
  decodes, aux = _predict_all(_with_draft(DRAFT.params), jax.random.PRNGKey(0), 0.0, 0.5)
  np.testing.assert_array_equal(decodes, expected)
  assert np.all(aux['drafted'] < GAMMA * aux['iterations'])

  # The target as its own draft: every draft token accepted, one target call
  # per gamma + 1 tokens, beta = 1.
  decodes, aux = _predict_all(_with_draft(TARGET.params), jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(decodes, expected)
  np.testing.assert_array_equal(aux['iterations'], -(-per_decode_lengths // (GAMMA + 1)))
  np.testing.assert_array_equal(aux['accepted'], GAMMA * aux['iterations'])
  np.testing.assert_array_equal(aux['batch_target_calls'], -(-MAX_DECODE_LEN // (GAMMA + 1)))
  np.testing.assert_array_equal(aux['batch_mean_beta'], 1.0)


def test_sampled_predictions_are_sorted_and_follow_the_key():
  params = _with_draft(DRAFT.params)
  decodes, aux = _predict_all(params, jax.random.PRNGKey(1), 1.0)
  scores = np.asarray(aux['scores'])
  assert np.all(scores < 0) and np.all(np.diff(scores, axis=1) >= 0)  # Ascending, as T5X.
  flat = np.asarray(decodes).reshape(-1, MAX_DECODE_LEN)
  np.testing.assert_array_equal(aux['emitted'], decoded_lengths(flat).reshape(scores.shape))
  assert len({tuple(row) for row in flat}) > len(INPUTS)
  other, _ = _predict_all(params, jax.random.PRNGKey(2), 1.0)
  assert not np.array_equal(decodes, other)


def test_predict_calls_the_decode_fn_and_formats_aux():
  """The wiring around the decode function, pinned with a recording decode_fn."""
  batch_size, num_decodes = len(INPUTS), 3
  # Decode i of row b is the constant row 10 * b + i; its score is -i.
  decodes = np.arange(batch_size)[:, None, None] * 10 + np.arange(num_decodes)[None, :, None]
  decodes = np.broadcast_to(decodes, (batch_size, num_decodes, MAX_DECODE_LEN))
  scores = -np.broadcast_to(np.arange(num_decodes, dtype=np.float32), (batch_size, num_decodes))
  per_decode = np.arange(batch_size * num_decodes, dtype=np.int32).reshape(batch_size, -1)
  stats = decoding.SpeculativeStats(
    target_calls=np.int32(6),
    iterations=per_decode,
    accepted=2 * per_decode,
    emitted=3 * per_decode,
    drafted=4 * per_decode,
    draft_steps=np.int32(20),
    beta_sum=np.float32(3.0),
    beta_count=np.int32(4),
  )
  recorded = {}
  block = np.asarray(BATCH['decoder_input_tokens'][:, :2]) + 5

  def decode_fn(**kwargs):
    recorded.update(kwargs)
    return decodes, scores, stats

  @jax.jit
  def run(params, rng):
    best, aux = t5x_adapter.speculative_predict_batch(
      MODULE,
      MODULE,
      params,
      BATCH,
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=4, lenience=0.5),
      decode_fn=decode_fn,
      rng=rng,
      decoder_params={'gamma': 5, 'temperature': 0.7, 'draft_threshold': 0.3},
      num_decodes=num_decodes,
    )
    # The target's block scorer, and a teacher-forced forward pass to compare with.
    block_logits, _ = recorded['score_block'](
      block, jnp.zeros(batch_size, jnp.int32), recorded['cache']
    )
    forward_logits = MODULE.apply(
      {'params': TARGET.params}, INPUTS, block, np.ones_like(block), enable_dropout=False
    )
    return best, aux, recorded['decode_rng'], recorded['inputs'], block_logits, forward_logits

  rng = jax.random.PRNGKey(7)
  best, aux, decode_rng, inputs, block_logits, forward_logits = run(_with_draft(DRAFT.params), rng)
  assert sorted(recorded) == [
    'cache',
    'decode_rng',
    'draft',
    'draft_cache',
    'draft_threshold',
    'eos_id',
    'gamma',
    'inputs',
    'lenience',
    'num_decodes',
    'score_block',
    'temperature',
    'tree',
    'verification',
  ]
  assert (recorded['gamma'], recorded['lenience'], recorded['eos_id']) == (5, 0.5, EOS)
  assert (recorded['temperature'], recorded['num_decodes']) == (0.7, num_decodes)
  assert recorded['draft_threshold'] == 0.3
  np.testing.assert_array_equal(decode_rng, rng)
  np.testing.assert_array_equal(inputs, np.zeros((batch_size, MAX_DECODE_LEN)))
  assert recorded['draft'].config == DRAFT.config
  # Both caches hold the output plus one block of gamma + 1 (decoder_params' gamma).
  for cache in (recorded['cache'], recorded['draft_cache']['decoder']):
    keys = cache['decoder']['layers_0']['self_attention']['cached_key']  # [B, heads, kv, L]
    assert (keys.shape[0], keys.shape[-1]) == (batch_size, MAX_DECODE_LEN + 5 + 1)
  np.testing.assert_allclose(block_logits, forward_logits, rtol=1e-5, atol=1e-5)

  # Without return_all_decodes: the last (most likely) decode and its stats.
  np.testing.assert_array_equal(best, decodes[:, -1])
  np.testing.assert_array_equal(aux['scores'], -2.0)
  for name, factor in (('iterations', 1), ('accepted', 2), ('emitted', 3), ('drafted', 4)):
    np.testing.assert_array_equal(aux[name], factor * per_decode[:, -1])
  np.testing.assert_array_equal(aux['batch_target_calls'], [6] * batch_size)
  np.testing.assert_array_equal(aux['batch_mean_beta'], [0.75] * batch_size)


def test_predict_errors_name_the_problem():
  predict = functools.partial(
    t5x_adapter.speculative_predict_batch,
    eos_id=EOS,
    settings=settings.SpeculativeSettings(gamma=GAMMA),
  )
  with pytest.raises(ValueError, match="no 'draft' subtree"):
    predict(MODULE, MODULE, TARGET.params, BATCH)
  with pytest.raises(ValueError, match='either as `rng` or as'):
    predict(
      MODULE,
      MODULE,
      _with_draft(DRAFT.params),
      BATCH,
      rng=jax.random.PRNGKey(0),
      decoder_params={'decode_rng': jax.random.PRNGKey(1)},
    )
  with pytest.raises(ValueError, match=r'lenience must be a scalar in \(0, 1\]'):
    predict(MODULE, MODULE, _with_draft(DRAFT.params), BATCH, decoder_params={'lenience': 0.0})
  with pytest.raises(ValueError, match=r'draft_threshold must be a number in \[0, 1\); got 1.5'):
    predict(
      MODULE, MODULE, _with_draft(DRAFT.params), BATCH, decoder_params={'draft_threshold': 1.5}
    )
  with pytest.raises(
    ValueError, match='draft_module must be a speculative_t5x.network.Transformer'
  ):
    predict(MODULE, object(), _with_draft(DRAFT.params), BATCH)
  other_vocab = network.Transformer(tiny_model(seed=1, vocab_size=48).config)
  with pytest.raises(ValueError, match='one shared vocabulary'):
    predict(MODULE, other_vocab, _with_draft(DRAFT.params), BATCH)


def test_missing_t5x_raises_import_error_with_instructions(monkeypatch):
  monkeypatch.setitem(sys.modules, 't5x', None)
  monkeypatch.setitem(sys.modules, 't5x.models', None)
  monkeypatch.delitem(sys.modules, 'speculative_t5x.t5x_models', raising=False)
  with pytest.raises(ImportError, match='t5x is not on PyPI.*google-research/t5x'):
    importlib.import_module('speculative_t5x.t5x_models')


# ------------------------------------------------------------------------------
# With the real t5x.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def t5x_env():
  """T5X's modules, the stock model on T5X's network, and ours on the same sizes."""
  import_t5x()
  import seqio  # pylint: disable=g-import-not-at-top
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top

  fields = {
    name: getattr(TARGET.config, name)
    for name in (
      'vocab_size',
      'emb_dim',
      'num_heads',
      'num_encoder_layers',
      'num_decoder_layers',
      'head_dim',
      'mlp_dim',
      'mlp_activations',
      'logits_via_embedding',
    )
  }
  vocabulary = seqio.PassThroughVocabulary(size=TARGET.vocab_size, eos_id=EOS)
  stock = t5x_models.EncoderDecoderModel(
    t5x_network.Transformer(t5x_network.T5Config(**fields, dtype='float32', dropout_rate=0.0)),
    vocabulary,
    vocabulary,
    optimizer_def=None,
    decode_fn=t5x_decoding.temperature_sample,
  )
  model = speculative_t5x_models().SpeculativeEncoderDecoderModel(
    MODULE, vocabulary, vocabulary, optimizer_def=None, draft_module=MODULE, gamma=GAMMA
  )
  shapes = {
    name: (len(INPUTS), INPUTS.shape[1] if name.startswith('encoder') else MAX_DECODE_LEN)
    for name in (
      'encoder_input_tokens',
      'decoder_input_tokens',
      'decoder_target_tokens',
      'decoder_loss_weights',
    )
  }
  types = {name: jnp.int32 for name in shapes}
  return dict(stock=stock, model=model, shapes=shapes, types=types, vocabulary=vocabulary)


@pytest.mark.t5x
def test_t5x_predictions_equal_stock_t5x_greedy(t5x_env):
  """Ours (speculative, our network) vs T5X's temperature_sample(topk=1) on T5X's network."""
  stock, model = t5x_env['stock'], t5x_env['model']
  # Teacher-forcing features for the loss and scores: 7 target tokens per row.
  targets = (INPUTS[:, :1] + np.arange(MAX_DECODE_LEN)) % (TARGET.vocab_size - 2) + 2
  targets[:, 7:] = 0
  batch = {
    **BATCH,
    'decoder_target_tokens': targets,
    'decoder_input_tokens': np.pad(targets[:, :-1], ((0, 0), (1, 0))),
    'decoder_loss_weights': (targets > 0).astype(np.float32),
  }
  params = _with_draft(DRAFT.params)
  expected, expected_aux = jax.jit(stock.predict_batch_with_aux)(TARGET.params, batch)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(params, batch)
  assert 1 < decoded_lengths(expected).min()
  np.testing.assert_array_equal(decodes, expected)
  np.testing.assert_allclose(aux['scores'], expected_aux['scores'], atol=1e-6)
  np.testing.assert_array_equal(aux['emitted'], decoded_lengths(expected))
  # Scoring and the loss see the target only.
  np.testing.assert_allclose(
    jax.jit(model.score_batch)(params, batch),
    jax.jit(stock.score_batch)(TARGET.params, batch),
    rtol=1e-5,
  )
  (loss, metrics), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(
    params, batch, None
  )
  np.testing.assert_allclose(loss, jax.jit(stock.loss_fn)(TARGET.params, batch, None)[0], rtol=1e-5)
  assert 'accuracy' in metrics
  assert all(np.all(np.asarray(grad) == 0) for grad in jax.tree.leaves(grads['draft']))
  assert any(np.any(np.asarray(grad) != 0) for grad in jax.tree.leaves(grads['decoder']))


@pytest.mark.t5x
def test_t5x_decoder_prompts_equal_stock_t5x_greedy(t5x_env):
  """prompt_with_targets: T5X prefills its own network's cache; we prefill both of ours."""
  stock, model = t5x_env['stock'], t5x_env['model']
  prompts = np.zeros((len(INPUTS), MAX_DECODE_LEN), np.int32)
  for row, prompt_length in enumerate([0, 3, 5, MAX_DECODE_LEN - 1]):
    prompts[row, 1 : prompt_length + 1] = (np.arange(prompt_length) * (row + 2)) % 20 + 2
  prompts[2, 5] = EOS  # An EOS in a prompt is removed (T5X's rule), so it does not end the row.
  batch = {**BATCH, 'decoder_input_tokens': prompts}
  expected, expected_aux = jax.jit(
    functools.partial(stock.predict_batch_with_aux, prompt_with_targets=True)
  )(TARGET.params, batch)
  decodes, aux = jax.jit(functools.partial(model.predict_batch_with_aux, prompt_with_targets=True))(
    _with_draft(DRAFT.params), batch
  )
  np.testing.assert_array_equal(decodes, expected)
  np.testing.assert_allclose(aux['scores'], expected_aux['scores'], atol=1e-6)
  # The decodes keep each prompt (EOS removed) in its slots, as T5X's do.
  stripped = prompts * (prompts != EOS)
  in_prompt = stripped[:, 1:] != 0
  np.testing.assert_array_equal(np.asarray(decodes)[:, :-1][in_prompt], stripped[:, 1:][in_prompt])


@pytest.mark.t5x
def test_t5x_decoder_params_reach_the_decode_function_as_in_stock_t5x(t5x_env):
  """T5X's decode arguments in decoder_params (a logit callback, unscaled scores, the hard
  limit): T5X's predict hands them to its temperature_sample, ours to speculative_sample."""
  stock, model = t5x_env['stock'], t5x_env['model']

  def logit_callback_fn(logits, state):  # No token twice in a row; token 5 later and later.
    ids = jnp.arange(logits.shape[-1])
    logits = jnp.where(ids == 5, logits + 0.5 * state.cur_index[:, None], logits)
    return jnp.where((ids == state.cur_token) & (ids != EOS), -jnp.inf, logits)

  decoder_params = dict(
    logit_callback_fn=logit_callback_fn,
    rescale_log_probs=False,
    max_decode_steps=9,
    max_decode_steps_hard_limit=7,
  )
  expected, expected_aux = jax.jit(
    functools.partial(stock.predict_batch_with_aux, decoder_params=dict(decoder_params))
  )(TARGET.params, BATCH)
  decodes, aux = jax.jit(
    functools.partial(model.predict_batch_with_aux, decoder_params=dict(decoder_params))
  )(_with_draft(DRAFT.params), BATCH)
  np.testing.assert_array_equal(decodes, expected)
  assert np.sum(np.asarray(decodes) != 0, axis=1).max() == 7
  without = jax.jit(stock.predict_batch_with_aux)(TARGET.params, BATCH)[0]
  assert not np.array_equal(expected, without)  # The callback changed the tokens.
  np.testing.assert_allclose(aux['scores'], expected_aux['scores'], rtol=1e-5)
  assert np.all(np.asarray(aux['scores']) < 0)  # Unscaled greedy scores are not 0.


@pytest.mark.t5x
def test_t5x_initial_variables_are_partitioned_like_the_target(t5x_env):
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top

  model = t5x_env['model']
  variables = jax.eval_shape(
    lambda: model.get_initial_variables(jax.random.PRNGKey(0), t5x_env['shapes'], t5x_env['types'])
  )
  stock_variables = jax.eval_shape(
    lambda: t5x_env['stock'].get_initial_variables(
      jax.random.PRNGKey(0), t5x_env['shapes'], t5x_env['types']
    )
  )
  # The draft's tree is T5X's own network's tree.
  assert jax.tree.structure(variables['params']['draft']) == jax.tree.structure(
    stock_variables['params']
  )
  state = t5x_train_state.InferenceState.create(variables)  # Validates params_axes.
  mesh_axes = t5x_partitioning.PjitPartitioner(num_partitions=1).get_mesh_axes(state).params
  target_axes = {name: subtree for name, subtree in mesh_axes.items() if name != 'draft'}
  assert jax.tree.leaves(mesh_axes['draft'], is_leaf=lambda x: x is None) == jax.tree.leaves(
    target_axes, is_leaf=lambda x: x is None
  )


@pytest.mark.t5x
@pytest.mark.parametrize('target_format, draft_format', [('legacy', 'orbax'), ('orbax', 'legacy')])
def test_t5x_restore_grafts_the_draft(t5x_env, tmp_path, target_format, draft_format):
  """T5X's checkpointers write both checkpoints; T5X's restore (as infer.py) grafts the draft."""
  from t5x import checkpoints as t5x_checkpoints  # pylint: disable=g-import-not-at-top
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top
  from t5x import utils as t5x_utils  # pylint: disable=g-import-not-at-top

  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  stock_axes = jax.eval_shape(
    lambda: t5x_env['stock'].get_initial_variables(
      jax.random.PRNGKey(0), t5x_env['shapes'], t5x_env['types']
    )
  )['params_axes']

  def save(params, directory, checkpoint_format):
    state = t5x_train_state.InferenceState.create({'params': params, 'params_axes': stock_axes})
    directory.mkdir()
    if checkpoint_format == 'legacy':
      t5x_checkpoints.Checkpointer(state, partitioner, directory).save(state)
    else:
      manager = t5x_checkpoints.OrbaxCheckpointManagerInterface(
        os.fspath(directory), state, partitioner
      )
      manager.save(state)
      manager.close()
    return os.fspath(directory / 'checkpoint_0')

  target_path = save(TARGET.params, tmp_path / 'target', target_format)
  draft_path = save(DRAFT.params, tmp_path / 'draft', draft_format)
  initializer = t5x_utils.TrainStateInitializer(
    optimizer_def=None,
    init_fn=t5x_env['model'].get_initial_variables,
    input_shapes=t5x_env['shapes'],
    input_types=t5x_env['types'],
    partitioner=partitioner,
  )
  restore_config = t5x_utils.RestoreCheckpointConfig(
    path=target_path,
    mode='specific',
    dtype='float32',
    strict=False,
    state_transformation_fns=[t5x_adapter.graft_draft_checkpoint(draft_path)],
  )
  state, _ = t5x_utils.create_checkpoint_manager_and_restore(
    initializer, partitioner, restore_config, target_path, None, use_orbax=True
  )
  assert_trees_equal(state.params['draft'], DRAFT.params)
  assert_trees_equal(t5x_adapter.strip_draft_params(state.params), TARGET.params)

  # A target network of another depth than the checkpoint's: the error names
  # TARGET_SIZE (T5X's own would be a raw key mismatch).
  wider = network.Transformer(tiny_model(seed=0, layers=2).config)
  wider_model = speculative_t5x_models().SpeculativeEncoderDecoderModel(
    wider,
    t5x_env['vocabulary'],
    t5x_env['vocabulary'],
    optimizer_def=None,
    draft_module=MODULE,
    gamma=GAMMA,
  )
  wider_initializer = t5x_utils.TrainStateInitializer(
    optimizer_def=None,
    init_fn=wider_model.get_initial_variables,
    input_shapes=t5x_env['shapes'],
    input_types=t5x_env['types'],
    partitioner=partitioner,
  )
  with pytest.raises(
    ValueError,
    match=r'target checkpoint \(CHECKPOINT_PATH\).*'
    r'num_encoder_layers 1.*num_encoder_layers 2.*Set TARGET_SIZE',
  ):
    t5x_utils.create_checkpoint_manager_and_restore(
      wider_initializer, partitioner, restore_config, target_path, None, use_orbax=True
    )


USER_GIN = """
seqio.SentencePieceVocabulary.sentencepiece_model_file = '/user/spm.model'
seqio.SentencePieceVocabulary.extra_ids = 100
"""


@pytest.mark.t5x
@pytest.mark.parametrize('user_first', [True, False])
@pytest.mark.parametrize(
  'pair, draft_size, gamma',
  [
    ('speculative_xxl_small.gin', 'small', 7),
    ('speculative_xxl_base.gin', 'base', 7),
    ('speculative_xxl_large.gin', 'large', 7),
  ],
)
def test_t5x_gin_files_build_the_speculative_model(
  t5x_env, tmp_path, pair, draft_size, gamma, user_first
):
  """T5X's model file, then a user's file and the pair file in either order: both hold."""
  import gin  # pylint: disable=g-import-not-at-top
  import t5x  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))
  user_file = tmp_path / 'user.gin'
  user_file.write_text('import seqio\n' + USER_GIN)
  pair_file = f'configs/t5x/{pair}'
  files = [
    't5x/examples/t5/t5_1_1/base.gin',
    *([os.fspath(user_file), pair_file] if user_first else [pair_file, os.fspath(user_file)]),
  ]
  gin.clear_config()
  try:
    for path in (REPO_ROOT, t5x_root):
      gin.add_config_file_search_path(path)
    gin.parse_config_files_and_bindings(
      files, ["DRAFT_CHECKPOINT_PATH = '/ckpt/draft'"], finalize_config=False
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
    graft_fns = [
      reference.scoped_configurable_fn()
      for reference in gin.query_parameter('utils.RestoreCheckpointConfig.state_transformation_fns')
    ]
  finally:
    gin.clear_config()
  assert type(model).__name__ == 'SpeculativeEncoderDecoderModel'
  # base.gin's DROPOUT_RATE is gin.REQUIRED: the pair's networks do not use it.
  assert model.module.config == network.t5_1_1_config('xxl', dtype='bfloat16', dropout_rate=0.0)
  assert model.draft_module.config == network.t5_1_1_config(
    draft_size, dtype='bfloat16', dropout_rate=0.0
  )
  assert model.settings == settings.SpeculativeSettings(gamma=gamma)
  assert model.decode_fn.__wrapped__ is decoding.speculative_sample
  # The user's vocabulary, not base.gin's default, whichever file came first.
  assert model.output_vocabulary == model.input_vocabulary
  assert model.output_vocabulary.sentencepiece_model_file == '/user/spm.model'
  assert model.output_vocabulary.extra_ids == 100
  assert len(graft_fns) == 1 and callable(graft_fns[0])


@pytest.mark.t5x
def test_t5x_model_rejects_bad_arguments(t5x_env):
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

  vocabulary = t5x_env['vocabulary']
  build = functools.partial(
    speculative_t5x_models().SpeculativeEncoderDecoderModel, MODULE, vocabulary, vocabulary, None
  )
  with pytest.raises(ValueError, match='decode_fn must be a speculative decode function'):
    build(decode_fn=t5x_decoding.temperature_sample, draft_module=MODULE, gamma=GAMMA)
  with pytest.raises(ValueError, match='gamma must be an integer >= 1'):
    build(draft_module=MODULE, gamma=0)
  with pytest.raises(ValueError, match=r'draft_threshold must be a number in \[0, 1\)'):
    build(draft_module=MODULE, gamma=GAMMA, draft_threshold=-0.1)
  with pytest.raises(ValueError, match='draft_module must be a speculative_t5x.network'):
    build(draft_module=t5x_env['stock'].module, gamma=GAMMA)


# ------------------------------------------------------------------------------
# A feature head as the draft: its parameters under params['draft_head'].
# ------------------------------------------------------------------------------
HEAD_CONFIG = feature_head.config_for(
  TARGET.config, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64
)
HEAD_PARAMS = feature_head.init_params(HEAD_CONFIG, seed=5)


def _with_head(head_params=HEAD_PARAMS):
  return {**TARGET.params, t5x_adapter.HEAD_KEY: head_params}


def jitted_predict(draft_module):
  """`speculative_predict_batch` of BATCH with `draft_module`, jitted: `(params, temperature) -> (decodes, aux)`.

  Sampling (temperature > 0) uses the key PRNGKey(4) and topk 0.
  """

  @functools.partial(jax.jit, static_argnames='temperature')
  def predict(params, temperature=0.0):
    return t5x_adapter.speculative_predict_batch(
      MODULE,
      draft_module,
      params,
      BATCH,
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=GAMMA),
      rng=jax.random.PRNGKey(4),
      decoder_params={'temperature': temperature, 'topk': 0},
    )

  return predict


def assert_predictions_are_generates(predict, params, draft):
  """`predict`'s greedy decodes of `params` are the baseline's; sampled, `generate`'s with `draft`.

  The sampled ones (temperature 1, `predict`'s key) equal `generate`'s
  tokens and statistics with that draft and key. Returns them: (decodes, aux).
  """
  decodes, aux = predict(params)
  baseline = models.generate(TARGET, None, INPUTS, max_decode_len=MAX_DECODE_LEN)
  np.testing.assert_array_equal(decodes, baseline.tokens)
  assert np.all(aux['drafted'] == GAMMA * aux['iterations'])

  decodes, aux = predict(params, temperature=1.0)
  out = models.generate(
    TARGET,
    draft,
    INPUTS,
    max_decode_len=MAX_DECODE_LEN,
    gamma=GAMMA,
    temperature=1.0,
    rng=jax.random.PRNGKey(4),
  )
  np.testing.assert_array_equal(decodes, out.tokens)
  for name in ('iterations', 'accepted', 'emitted', 'drafted'):
    np.testing.assert_array_equal(aux[name], getattr(out.stats, name), err_msg=name)
  return decodes, aux


_predict_with_head = jitted_predict(HEAD_CONFIG)


def test_feature_head_predictions_equal_generate_with_the_head():
  """T5X's predict path drafts with the head of params['draft_head']: `generate`'s decodes.

  Greedy: the baseline's tokens. Sampled (the same key): `generate`'s tokens
  and acceptance with that head, and other acceptance with other weights.
  """
  head = drafts.FeatureDraft.for_target(TARGET, HEAD_PARAMS, HEAD_CONFIG)
  _, aux = assert_predictions_are_generates(_predict_with_head, _with_head(), head)
  assert aux['accepted'].sum() > 0
  _, other_aux = _predict_with_head(
    _with_head(feature_head.init_params(HEAD_CONFIG, seed=6)), temperature=1.0
  )
  assert not np.array_equal(other_aux['accepted'], aux['accepted'])


def test_feature_head_for_another_target_is_refused():
  other = feature_head.config_for(
    dataclasses.replace(TARGET.config, emb_dim=2 * TARGET.config.emb_dim), emb_dim=32
  )
  with pytest.raises(ValueError, match='feature head was built for a target with .*width 64'):
    t5x_adapter.check_networks(MODULE, other)
  with pytest.raises(ValueError, match="no 'draft_head' subtree.*graft_head_checkpoint"):
    t5x_adapter.speculative_predict_batch(
      MODULE,
      HEAD_CONFIG,
      _with_draft(DRAFT.params),
      BATCH,
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=GAMMA),
    )


def test_graft_head_checkpoint_checks_the_head_and_the_target(tmp_path):
  head_dir = write_t5x_legacy(tmp_path / 'head', 3, {t5x_adapter.HEAD_KEY: HEAD_PARAMS})
  expected = {
    'target': {
      **network.abstract_params(TARGET.config)[0],
      t5x_adapter.HEAD_KEY: feature_head.abstract_params(HEAD_CONFIG),
    }
  }
  graft = t5x_adapter.graft_head_checkpoint(os.fspath(head_dir))
  grafted = graft({'target': TARGET.params}, expected)
  assert_trees_equal(grafted['target'][t5x_adapter.HEAD_KEY], HEAD_PARAMS)
  assert_trees_equal(t5x_adapter.strip_draft_params(grafted['target']), TARGET.params)
  wider = feature_head.config_for(TARGET.config, emb_dim=48, num_heads=2, head_dim=16, mlp_dim=64)
  expected['target'][t5x_adapter.HEAD_KEY] = feature_head.abstract_params(wider)
  with pytest.raises(ValueError, match='feature head checkpoint.*does not match.*HEAD_EMB_DIM'):
    graft({'target': TARGET.params}, expected)


@pytest.mark.t5x
def test_t5x_feature_head_predictions_equal_stock_t5x_greedy(t5x_env):
  """The speculative T5X model with a feature head: T5X's greedy outputs, the head partitioned.

  Its parameters are under params['draft_head'] with their logical axes,
  which T5X's partitioner maps by the target's rules.
  """
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top

  vocabulary = t5x_env['vocabulary']
  model = speculative_t5x_models().SpeculativeEncoderDecoderModel(
    MODULE, vocabulary, vocabulary, optimizer_def=None, draft_module=HEAD_CONFIG, gamma=GAMMA
  )
  expected, _ = jax.jit(t5x_env['stock'].predict_batch_with_aux)(TARGET.params, BATCH)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_with_head(), BATCH)
  np.testing.assert_array_equal(decodes, expected)
  assert np.all(aux['drafted'] > 0)

  variables = jax.eval_shape(
    lambda: model.get_initial_variables(jax.random.PRNGKey(0), t5x_env['shapes'], t5x_env['types'])
  )
  shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)
  assert shapes(variables['params'][t5x_adapter.HEAD_KEY]) == shapes(
    feature_head.abstract_params(HEAD_CONFIG)
  )
  state = t5x_train_state.InferenceState.create(variables)  # Validates params_axes.
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  mesh_axes = partitioner.get_mesh_axes(state).params[t5x_adapter.HEAD_KEY]
  logical = traverse_util.flatten_dict(
    flax.core.unfreeze(variables['params_axes'][t5x_adapter.HEAD_KEY]), sep='/'
  )
  specs = traverse_util.flatten_dict(flax.core.unfreeze(mesh_axes), sep='/')
  for path, spec in specs.items():
    axes = logical[path + '_axes'].names
    assert spec == nn_partitioning.logical_to_mesh_axes(axes, partitioner.logical_axis_rules)
  assert any('model' in spec for spec in specs.values())  # Sharded, not all replicated.


@pytest.mark.t5x
@pytest.mark.parametrize(
  'model_file, head_file, configure',
  [
    ('t5x/examples/t5/t5_1_1/base.gin', 'speculative_feature_head.gin', network.t5_1_1_config),
    (
      't5x/examples/decoder_only/models/base.gin',
      'speculative_decoder_only_feature_head.gin',
      network.decoder_only_config,
    ),
  ],
)
def test_t5x_feature_head_gin_files_build_the_model(t5x_env, model_file, head_file, configure):
  import gin  # pylint: disable=g-import-not-at-top
  import t5x  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))
  gin.clear_config()
  try:
    gin.add_config_file_search_path(REPO_ROOT)
    gin.parse_config_files_and_bindings(
      # By path: t5x/examples/decoder_only/models is no package.
      [os.path.join(t5x_root, model_file), f'configs/t5x/{head_file}'],
      ["HEAD_CHECKPOINT_PATH = '/ckpt/head'", "TARGET_SIZE = 'base'", 'HEAD_EMB_DIM = 64'],
      finalize_config=False,
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
    (graft,) = [
      reference.scoped_configurable_fn()
      for reference in gin.query_parameter('utils.RestoreCheckpointConfig.state_transformation_fns')
    ]
  finally:
    gin.clear_config()
  target = configure('base', dtype='bfloat16', dropout_rate=0.0)
  assert model.module.config == target
  assert model.draft_module == feature_head.config_for(target, emb_dim=64)
  assert model.settings == settings.SpeculativeSettings(gamma=5)
  assert graft.__qualname__.startswith('graft_head_checkpoint')
