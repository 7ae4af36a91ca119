"""The T5X integration for decoder-only pairs: `SpeculativeDecoderOnlyModel`.

The first part needs no t5x: `t5x_adapter.speculative_predict_batch` on a
decoder-only pair (causal and prefix LM) gives `models.generate`'s tokens,
and `remove_prompts` is T5X's `remove_prefix`. The second part runs against
the real t5x (marked `t5x`; it is not on PyPI, `make test-t5x` installs it):
the model class inside T5X, compared with T5X's stock `DecoderOnlyModel` on
T5X's own decoder-only network, and the gin file
configs/t5x/speculative_decoder_only.gin. The `python -m t5x.infer`
command of docs/t5x.md for it runs in tests/test_t5x_commands.py.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import settings
from speculative_t5x import t5x_adapter
from testing_utils import (
  EOS,
  decoded_lengths,
  import_t5x,
  speculative_t5x_models,
  tiny_decoder_only_model,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAMMA = 3
LENGTH = 14  # T5X's decoder length: prompt and continuation together.
PROMPT_LENGTHS = np.array([0, 3, 5, 9])
TARGET = tiny_decoder_only_model(seed=0, layers=2, scale=3.0)
DRAFT = tiny_decoder_only_model(seed=1, layers=2, scale=3.0)  # One config: one program.
MODULE = network.DecoderOnly(TARGET.config)


def prefix_lm_batch(seed=0):
  """seqio.DecoderFeatureConverter's prefix-LM features: prompts of PROMPT_LENGTHS, then targets."""
  rng = np.random.default_rng(seed)
  batch = len(PROMPT_LENGTHS)
  targets = rng.integers(2, TARGET.vocab_size, (batch, LENGTH)).astype(np.int32)
  targets[np.arange(batch), PROMPT_LENGTHS + 4] = EOS  # Four target tokens, then EOS.
  targets[np.arange(LENGTH)[None] > (PROMPT_LENGTHS + 4)[:, None]] = 0
  inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
  causal_attention = (np.arange(LENGTH)[None] <= PROMPT_LENGTHS[:, None]).astype(np.int32)
  return {
    'decoder_input_tokens': inputs,
    'decoder_target_tokens': targets,
    'decoder_causal_attention': causal_attention,
    'decoder_loss_weights': ((targets > 0) & (causal_attention == 0)).astype(np.int32),
  }


def prompts_of(batch):
  """int32 [B, max P]: each row's prompt tokens, 0-padded (what `generate` takes)."""
  prompts = np.zeros((len(PROMPT_LENGTHS), PROMPT_LENGTHS.max()), np.int32)
  for row, length in enumerate(PROMPT_LENGTHS):
    prompts[row, :length] = batch['decoder_input_tokens'][row, 1 : length + 1]
  return prompts


def params_with_draft():
  return {**TARGET.params, t5x_adapter.DRAFT_KEY: DRAFT.params}


@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_predict_batch_equals_generate(bidirectional):
  batch = prefix_lm_batch()
  prompt = batch['decoder_input_tokens'] * batch['decoder_causal_attention']
  decodes, aux = t5x_adapter.speculative_predict_batch(
    MODULE,
    MODULE,
    params_with_draft(),
    batch,
    eos_id=EOS,
    settings=settings.SpeculativeSettings(gamma=GAMMA),
    decoder_params={'temperature': 0.0},
    decoder_prompt=prompt,
    inputs_bidirectional_attention=bidirectional,
  )
  target = dataclasses.replace(TARGET, inputs_bidirectional_attention=bidirectional)
  draft = dataclasses.replace(DRAFT, inputs_bidirectional_attention=bidirectional)
  out = models.generate(target, draft, prompts_of(batch), max_decode_len=LENGTH, gamma=GAMMA)
  continuations = layouts.remove_prompts(decodes, decoding.prompt_lengths(prompt))
  # The T5X output length counts the prompt: each row has LENGTH - P slots after it.
  room = np.arange(LENGTH)[None] < (LENGTH - PROMPT_LENGTHS)[:, None]
  np.testing.assert_array_equal(continuations, np.where(room, out.tokens, 0))
  np.testing.assert_array_equal(
    aux['emitted'], np.minimum(decoded_lengths(continuations), LENGTH - PROMPT_LENGTHS)
  )


def test_feature_head_predictions_equal_generate():
  """A feature head (params['draft_head']) drafting for a causal decoder-only target."""
  head_config = feature_head.config_for(
    TARGET.config, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64
  )
  head_params = feature_head.init_params(head_config, seed=2)
  batch = prefix_lm_batch()
  prompt = batch['decoder_input_tokens'] * batch['decoder_causal_attention']
  decodes, aux = t5x_adapter.speculative_predict_batch(
    MODULE,
    head_config,
    {**TARGET.params, t5x_adapter.HEAD_KEY: head_params},
    batch,
    eos_id=EOS,
    settings=settings.SpeculativeSettings(gamma=GAMMA),
    decoder_params={'temperature': 0.0},
    decoder_prompt=prompt,
  )
  head = drafts.FeatureDraft.for_target(TARGET, head_params, head_config)
  out = models.generate(TARGET, head, prompts_of(batch), max_decode_len=LENGTH, gamma=GAMMA)
  baseline = models.generate(TARGET, None, prompts_of(batch), max_decode_len=LENGTH)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  continuations = layouts.remove_prompts(decodes, decoding.prompt_lengths(prompt))
  room = np.arange(LENGTH)[None] < (LENGTH - PROMPT_LENGTHS)[:, None]
  np.testing.assert_array_equal(continuations, np.where(room, out.tokens, 0))
  assert np.all(aux['drafted'] > 0)


def test_remove_prompts_is_t5x_remove_prefix():
  decodes = jnp.array([[5, 6, 7, 8, 0], [5, 6, 7, 8, 9]])
  np.testing.assert_array_equal(
    layouts.remove_prompts(decodes, jnp.array([2, 0])), [[7, 8, 0, 0, 0], [5, 6, 7, 8, 9]]
  )
  all_decodes = jnp.stack([decodes, decodes + 10], axis=1)  # [B, num_decodes, L]
  np.testing.assert_array_equal(
    layouts.remove_prompts(all_decodes, jnp.array([3, 1]))[:, 1],
    [[18, 10, 0, 0, 0], [16, 17, 18, 19, 0]],
  )


def test_a_decoder_only_target_needs_its_prompt():
  with pytest.raises(ValueError, match='needs decoder_prompt'):
    t5x_adapter.speculative_predict_batch(
      MODULE,
      MODULE,
      params_with_draft(),
      prefix_lm_batch(),
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=GAMMA),
    )


# ------------------------------------------------------------------------------
# With the real t5x.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def t5x():
  import_t5x()
  import seqio  # pylint: disable=g-import-not-at-top
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from t5x.examples.decoder_only import network as t5x_network  # pylint: disable=g-import-not-at-top

  fields = {
    field.name: getattr(TARGET.config, field.name)
    for field in dataclasses.fields(TARGET.config)
    if field.name != 'float32_attention_logits'
  }
  return dict(
    seqio=seqio,
    decoding=t5x_decoding,
    models=t5x_models,
    t5x_module=t5x_network.DecoderWrapper(
      t5x_network.TransformerConfig(**{**fields, 'dropout_rate': 0.0})
    ),
    vocabulary=seqio.PassThroughVocabulary(size=TARGET.vocab_size, eos_id=EOS),
  )


def _models(t5x, bidirectional):
  """(T5X's stock DecoderOnlyModel on T5X's network, ours on this project's)."""
  stock = t5x['models'].DecoderOnlyModel(
    t5x['t5x_module'],
    t5x['vocabulary'],
    optimizer_def=None,
    decode_fn=t5x['decoding'].temperature_sample,
    inputs_bidirectional_attention=bidirectional,
  )
  ours = speculative_t5x_models().SpeculativeDecoderOnlyModel(
    MODULE,
    t5x['vocabulary'],
    optimizer_def=None,
    inputs_bidirectional_attention=bidirectional,
    draft_module=MODULE,
    gamma=GAMMA,
  )
  return stock, ours


@pytest.mark.t5x
@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_t5x_predictions_equal_stock_t5x_greedy(t5x, bidirectional):
  """Ours (speculative, our network) vs T5X's temperature_sample(topk=1) on T5X's network."""
  stock, ours = _models(t5x, bidirectional)
  batch = prefix_lm_batch()
  expected, expected_aux = jax.jit(stock.predict_batch_with_aux)(TARGET.params, batch)
  decodes, aux = jax.jit(ours.predict_batch_with_aux)(params_with_draft(), batch)
  assert (decoded_lengths(expected) > 1).all()
  np.testing.assert_array_equal(decodes, expected)
  np.testing.assert_allclose(aux['scores'], expected_aux['scores'], atol=1e-5)
  # Scoring and the loss see the target only.
  np.testing.assert_allclose(
    jax.jit(ours.score_batch)(params_with_draft(), batch),
    jax.jit(stock.score_batch)(TARGET.params, batch),
    rtol=1e-5,
  )
  (loss, _), grads = jax.jit(jax.value_and_grad(ours.loss_fn, has_aux=True))(
    params_with_draft(), batch, None
  )
  np.testing.assert_allclose(loss, jax.jit(stock.loss_fn)(TARGET.params, batch, None)[0], rtol=1e-5)
  assert all(np.all(np.asarray(grad) == 0) for grad in jax.tree.leaves(grads['draft']))


@pytest.mark.t5x
def test_t5x_initial_variables_hold_both_networks(t5x):
  _, ours = _models(t5x, False)
  shapes = {name: (2, LENGTH) for name in ('decoder_input_tokens', 'decoder_target_tokens')}
  variables = jax.eval_shape(lambda: ours.get_initial_variables(jax.random.PRNGKey(0), shapes))
  expected, _ = network.abstract_params(TARGET.config)
  for tree in (variables['params']['draft'], t5x_adapter.strip_draft_params(variables['params'])):
    assert jax.tree.map(lambda x: x.shape, tree) == jax.tree.map(lambda x: x.shape, expected)
  assert 'draft' in variables['params_axes']


@pytest.mark.t5x
def test_t5x_gin_file_builds_the_speculative_model(t5x):
  import gin  # pylint: disable=g-import-not-at-top
  import t5x as t5x_package  # pylint: disable=g-import-not-at-top

  t5x_root = os.path.dirname(os.path.dirname(os.path.abspath(t5x_package.__file__)))
  gin.clear_config()
  try:
    for path in (REPO_ROOT, t5x_root):
      gin.add_config_file_search_path(path)
    gin.parse_config_files_and_bindings(
      [
        # By path: t5x/examples/decoder_only/models has no __init__.py, so gin's
        # package-resource lookup of 't5x/examples/...' fails there.
        os.path.join(t5x_root, 't5x/examples/decoder_only/models/base.gin'),
        'configs/t5x/speculative_decoder_only.gin',
      ],
      [
        "TARGET_SIZE = 'base'",
        "DRAFT_SIZE = 'tiny'",
        "DRAFT_CHECKPOINT_PATH = '/ckpt/draft'",
        'INPUTS_BIDIRECTIONAL_ATTENTION = True',
      ],
      finalize_config=False,
    )
    model = gin.query_parameter('%MODEL').scoped_configurable_fn()
  finally:
    gin.clear_config()
  assert type(model).__name__ == 'SpeculativeDecoderOnlyModel'
  assert model.module.config == network.decoder_only_config(
    'base', dtype='bfloat16', dropout_rate=0.0
  )
  assert model.draft_module.config == network.decoder_only_config(
    'tiny', dtype='bfloat16', dropout_rate=0.0
  )
  assert model._inputs_bidirectional_attention and model.settings.gamma == 5


@pytest.mark.t5x
def test_t5x_model_rejects_bad_arguments(t5x):
  build = functools.partial(
    speculative_t5x_models().SpeculativeDecoderOnlyModel, MODULE, t5x['vocabulary'], None
  )
  with pytest.raises(ValueError, match='decode_fn must be a speculative decode function'):
    build(decode_fn=t5x['decoding'].temperature_sample, draft_module=MODULE, gamma=GAMMA)
  with pytest.raises(
    ValueError, match='draft_module must be a speculative_t5x.network.DecoderOnly'
  ):
    build(draft_module=network.Transformer(TARGET.config), gamma=GAMMA)
  _, ours = _models(t5x, False)
  batch = {k: v for k, v in prefix_lm_batch().items() if k != 'decoder_causal_attention'}
  with pytest.raises(ValueError, match='no decoder_causal_attention feature'):
    ours.predict_batch_with_aux(params_with_draft(), batch)
