"""Decoding on `kernels.pack_params`: the network's dense layers on the CPU kernel."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import kernels
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import measure
from speculative_t5x.kernels import cpu_matmul
from testing_utils import needs_cpu_kernel
from testing_utils import padded_inputs
from testing_utils import tiny_decoder_only_model
from testing_utils import tiny_model


def _models():
  tied = tiny_model(1, vocab_size=40, emb_dim=48)
  tied = models.Model(dataclasses.replace(tied.config, logits_via_embedding=True), tied.params)
  return {
    'untied': tiny_model(0, vocab_size=40, emb_dim=48, scale=4.0),
    'tied': tied,
    'decoder_only': tiny_decoder_only_model(2, vocab_size=40, emb_dim=48, scale=4.0),
  }


def _block_logits(model, params, block_tokens):
  inputs = jnp.asarray(padded_inputs(3, 2, 6, model.vocab_size))
  cache = network.init_decoder_cache(model.config, params, inputs, 16)
  starts = jnp.zeros((2,), jnp.int32)
  logits, _ = network.apply_decode_block(model.config, params, cache, block_tokens, starts)
  return np.asarray(logits)


@pytest.mark.parametrize('name', ['untied', 'tied', 'decoder_only'])
def test_packed_decoding_matches_plain_within_float32(name):
  needs_cpu_kernel()
  model = _models()[name]
  packed = model.decode_params
  assert isinstance(packed, kernels.PackedParams)
  flat = jax.tree_util.tree_leaves_with_path(packed.packed)
  names = {jax.tree_util.keystr(path) for path, _ in flat}
  assert any('mlp' in n for n in names) and any('self_attention' in n for n in names)
  assert any('embedding' in n for n in names) == (name == 'tied')
  assert not any(n.startswith("['encoder']") for n in names)
  tokens = jnp.asarray([[0, 5, 6, 7], [0, 9, 3, 2]], jnp.int32)
  plain = _block_logits(model, model.params, tokens)
  kernel = _block_logits(model, packed, tokens)
  np.testing.assert_allclose(kernel, plain, rtol=1e-5, atol=1e-5 * np.abs(plain).max())
  # The plain kernels dropped: the packed ones alone give the same logits.
  dropped = kernels.pack_params(model.config, model.params, keep_unpacked=False)
  assert len(jax.tree.leaves(dropped.params)) < len(jax.tree.leaves(model.params))
  np.testing.assert_array_equal(_block_logits(model, dropped, tokens), kernel)


@pytest.mark.parametrize('name', ['untied', 'decoder_only'])
def test_greedy_speculative_equals_baseline_on_the_kernel(name):
  needs_cpu_kernel()
  target = _models()[name]
  draft = tiny_model(7, vocab_size=40, emb_dim=32) if name == 'untied' else None
  if draft is None:
    draft = tiny_decoder_only_model(8, vocab_size=40, emb_dim=32)
  inputs = padded_inputs(5, 3, 6, target.vocab_size)
  baseline = models.generate(target, None, inputs, max_decode_len=14)
  for gamma in (1, 3):
    speculative = models.generate(target, draft, inputs, max_decode_len=14, gamma=gamma)
    np.testing.assert_array_equal(speculative.tokens, baseline.tokens)


def test_unchanged_where_the_kernel_is_off(monkeypatch):
  model = _models()['untied']
  monkeypatch.setenv(cpu_matmul.ENV_SWITCH, '0')
  assert kernels.pack_params(model.config, model.params) is model.params
  bfloat16 = dataclasses.replace(model.config, dtype='bfloat16')
  monkeypatch.delenv(cpu_matmul.ENV_SWITCH)
  assert kernels.pack_params(bfloat16, model.params) is model.params


def _head(target, **fields):
  config = feature_head.config_for(
    target.config, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, **fields
  )
  return drafts.FeatureDraft.for_target(target, feature_head.init_params(config, 3), config)


def _head_block(head, tokens):
  """(predicted, hidden, logits of the last entry) of a 4-entry block at per-row starts."""
  inputs = jnp.asarray(padded_inputs(3, 2, 6, head.vocab_size))
  encoded = None
  if head.config.cross_attention:
    encoded = jax.random.normal(jax.random.PRNGKey(1), inputs.shape + (head.config.target_emb_dim,))
  cache = head.init_cache(inputs, 16, encoded=encoded)
  features = jax.random.normal(jax.random.PRNGKey(2), tokens.shape + (head.config.feature_width,))
  state = head.after_verify(cache, features, tokens, jnp.asarray([0, 5]), jnp.asarray([3, 1]))
  return (np.asarray(state['feature']), np.asarray(state['logits']))


@pytest.mark.parametrize('name,output', [('untied', 'own'), ('decoder_only', 'target')])
def test_a_feature_head_on_the_kernel_matches_plain_within_float32(name, output):
  needs_cpu_kernel()
  head = _head(_models()[name], output=output)
  packed = head.packed()
  assert isinstance(packed.params, kernels.PackedParams) and packed.packed() is packed
  names = {
    jax.tree_util.keystr(path)
    for path, _ in jax.tree_util.tree_leaves_with_path(packed.params.packed)
  }
  # Every dense layer of the head runs per draft step: all are packed.
  for layer in ('pre_projection', 'post_projection', 'mlp', 'self_attention', 'query'):
    assert any(layer in n for n in names), (layer, names)
  assert any('logits_dense' in n for n in names) == (output == 'own')
  # A step reads the packed copy instead of the kernel: the same bytes as the plain head.
  assert measure.draft_weight_bytes(packed) == measure.draft_weight_bytes(head)
  tokens = jnp.asarray([[5, 6, 7, 8], [9, 3, 2, 4]], jnp.int32)
  for plain, kernel in zip(_head_block(head, tokens), _head_block(packed, tokens)):
    np.testing.assert_allclose(kernel, plain, rtol=1e-5, atol=1e-5 * np.abs(plain).max())


def test_a_feature_head_stays_plain_where_the_kernel_is_off(monkeypatch):
  head = _head(_models()['untied'])
  monkeypatch.setenv(cpu_matmul.ENV_SWITCH, '0')
  assert head.packed().params is head.params
  assert models.as_draft(head).params is head.params


def test_alpha_and_the_records_read_packed_drafts_as_the_plain_ones():
  needs_cpu_kernel()
  target = _models()['untied']
  head = _head(target)
  inputs = padded_inputs(3, 2, 6, target.vocab_size)
  outputs = np.asarray(models.generate(target, None, inputs, max_decode_len=8).tokens)
  # The benchmark measures alpha on the draft a decode call runs (packed).
  np.testing.assert_array_equal(
    acceptance.draft_logits(models.as_draft(head), inputs, outputs),
    acceptance.draft_logits(head, inputs, outputs),
  )
  model_draft = tiny_model(7, vocab_size=40, emb_dim=32)
  for draft, plain in (
    (models.as_draft(model_draft), model_draft.params),
    (head.packed(), head.params),
  ):
    described = benchmark.describe_draft(draft)
    assert described['parameters'] == network.parameter_count(plain), described
