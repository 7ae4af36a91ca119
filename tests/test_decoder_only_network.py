"""Tests of the decoder-only network: tree, masks, block-cached decoding, prefills, T5X.

The first part needs no t5x: hand-made masks, cached decoding against teacher
forcing, T5X's cache protocol as T5X's decode functions drive it, checkpoints
in T5X's formats written as T5X writes them. The second part runs against the
real t5x (marked `t5x`; it is not on PyPI, `make test-t5x` installs it): T5X's
own decoder-only network (tree, axes, logits, masks), T5X's `DecoderOnlyModel`
predicting with this module, and checkpoints written by T5X's checkpointers.
"""

import dataclasses
import functools
import json
import os

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import checkpoints
from speculative_t5x.checkpoints import huggingface
from speculative_t5x import network
from testing_utils import assert_trees_equal, import_t5x, write_t5x_legacy, write_t5x_orbax

VOCAB = 64
# A tiny float32 model; T5X's decoder-only layout with T5 1.1's gated MLP.
CONFIG = network.DecoderOnlyConfig(
  vocab_size=VOCAB,
  dtype=jnp.float32,
  emb_dim=32,
  num_heads=4,
  num_layers=2,
  head_dim=8,
  mlp_dim=48,
  dropout_rate=0.0,
)
# T5X's decoder-only default MLP (ReLU, one `wi`) with tied logits.
TIED_RELU = dataclasses.replace(CONFIG, mlp_activations=('relu',), logits_via_embedding=True)
MODULE = network.DecoderOnly(CONFIG)
PARAMS = network.random_params(CONFIG, seed=1)[0]


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, inputs, targets, causal_attention=None, segments=None):
  return network.DecoderOnly(config).apply(
    {'params': params},
    inputs,
    targets,
    decoder_segment_ids=segments,
    decoder_causal_attention=causal_attention,
    enable_dropout=False,
  )


_init_cache = jax.jit(network.init_decoder_cache, static_argnums=(0, 3))
_decode_block = jax.jit(network.apply_decode_block, static_argnums=0)
_prefill = jax.jit(network.prefill_decoder_cache, static_argnums=0, static_argnames='bidirectional')


def _prefix_lm_batch(rng, prompt_lengths, length, padding_from=None):
  """T5X's DecoderFeatureConverter layout of [prompt, continuation] rows.

  Returns (decoder_input_tokens, decoder_target_tokens, decoder_causal_attention),
  int32 [B, length]: targets are prompt then continuation tokens, inputs the
  targets shifted right after BOS 0 (prompt token i at position i), and the
  causal-attention mask 1 at positions 0..P (BOS and the prompt). Rows are
  padded from `padding_from[b]` on if given.
  """
  batch = len(prompt_lengths)
  targets = rng.integers(2, VOCAB, (batch, length))
  if padding_from is not None:
    targets[np.arange(length)[None] >= np.asarray(padding_from)[:, None]] = 0
  inputs = np.concatenate([np.zeros((batch, 1), int), targets[:, :-1]], axis=1)
  causal_attention = (np.arange(length)[None] <= np.asarray(prompt_lengths)[:, None]).astype(int)
  return inputs.astype(np.int32), targets.astype(np.int32), causal_attention.astype(np.int32)


# ------------------------------------------------------------------------------
# Config and parameter tree.
# ------------------------------------------------------------------------------
def _expected_tree(config):
  """T5X's decoder-only tree: {path: (shape, logical axes)}."""
  emb, joined, mlp = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  tree = {
    'decoder/token_embedder/embedding': ((config.vocab_size, emb), ('vocab', 'embed')),
    'decoder/relpos_bias/rel_embedding': ((config.num_heads, 32), ('heads', 'relpos_buckets')),
    'decoder/decoder_norm/scale': ((emb,), ('embed',)),
  }
  if not config.logits_via_embedding:
    tree['decoder/logits_dense/kernel'] = ((emb, config.vocab_size), ('embed', 'vocab'))
  wi = ['wi'] if len(config.mlp_activations) == 1 else ['wi_0', 'wi_1']
  for i in range(config.num_layers):
    layer = f'decoder/layers_{i}/'
    tree[layer + 'pre_self_attention_layer_norm/scale'] = ((emb,), ('embed',))
    tree[layer + 'pre_mlp_layer_norm/scale'] = ((emb,), ('embed',))
    for name in ('query', 'key', 'value'):
      tree[layer + f'self_attention/{name}/kernel'] = ((emb, joined), ('embed', 'joined_kv'))
    tree[layer + 'self_attention/out/kernel'] = ((joined, emb), ('joined_kv', 'embed'))
    for name in wi:
      tree[layer + f'mlp/{name}/kernel'] = ((emb, mlp), ('embed', 'mlp'))
    tree[layer + 'mlp/wo/kernel'] = ((mlp, emb), ('mlp', 'embed'))
  return tree


def _tree(params, params_axes):
  flat = {'/'.join(k): v.shape for k, v in traverse_util.flatten_dict(params).items()}
  axes = {
    '/'.join(k)[: -len('_axes')]: v.names
    for k, v in traverse_util.flatten_dict(params_axes).items()
  }
  assert axes.keys() == flat.keys()
  return {name: (flat[name], axes[name]) for name in flat}


@pytest.mark.parametrize('config', [CONFIG, TIED_RELU], ids=['gated_untied', 'relu_tied'])
def test_parameter_tree_shapes_and_axes(config):
  assert _tree(*network.abstract_params(config)) == _expected_tree(config)
  params, params_axes = network.random_params(config)
  assert _tree(params, params_axes) == _expected_tree(config)
  assert {np.asarray(x).dtype for x in jax.tree.leaves(params)} == {np.dtype(np.float32)}


@pytest.mark.parametrize('config', [CONFIG, TIED_RELU], ids=['gated_untied', 'relu_tied'])
def test_decoder_weight_bytes_counts_what_a_step_reads(config):
  """Everything but the embedding table, which a step only gathers from (unless tied)."""
  flat = traverse_util.flatten_dict(network.abstract_params(config)[0])
  read = sum(
    leaf.size
    for path, leaf in flat.items()
    if path[-2:] != ('token_embedder', 'embedding') or config.logits_via_embedding
  )
  assert network.decoder_weight_bytes(config) == 4 * read


def test_config_and_module_errors():
  with pytest.raises(ValueError, match=r'DecoderOnlyConfig.num_layers must be an integer >= 1'):
    dataclasses.replace(CONFIG, num_layers=0)
  with pytest.raises(ValueError, match='DecoderOnlyConfig.dropout_rate'):
    dataclasses.replace(CONFIG, dropout_rate=1.0)
  with pytest.raises(ValueError, match='Unknown MLP activation'):
    dataclasses.replace(CONFIG, mlp_activations=('swishy',))
  with pytest.raises(ValueError, match='mlp_activations is empty'):
    dataclasses.replace(CONFIG, mlp_activations=[])
  with pytest.raises(TypeError, match='num_decoder_layers'):
    network.DecoderOnlyConfig(vocab_size=VOCAB, num_decoder_layers=2)  # A T5Config field.
  assert dataclasses.replace(CONFIG, mlp_activations=['relu']).mlp_activations == ('relu',)
  t5_config = network.T5Config(vocab_size=VOCAB)
  tokens = jnp.ones((1, 1), jnp.int32)
  with pytest.raises(TypeError, match='DecoderOnly takes a DecoderOnlyConfig'):
    jax.eval_shape(
      lambda: network.DecoderOnly(t5_config).init(jax.random.PRNGKey(0), tokens, tokens)
    )
  with pytest.raises(TypeError, match='Transformer takes a T5Config'):
    jax.eval_shape(
      lambda: network.Transformer(CONFIG).init(jax.random.PRNGKey(0), tokens, tokens, tokens)
    )
  with pytest.raises(TypeError, match='T5Config or network.DecoderOnlyConfig'):
    network.module_for({'vocab_size': VOCAB})
  assert isinstance(network.module_for(CONFIG), network.DecoderOnly)
  assert isinstance(network.module_for(t5_config), network.Transformer)


# ------------------------------------------------------------------------------
# Masks.
# ------------------------------------------------------------------------------
def test_make_decoder_mask_hand_made_cases():
  # Two packed prefix-LM examples (inputs [6, 7] -> 8, [3, 4] -> 5), then padding.
  mask = network.make_decoder_mask(
    jnp.array([[6, 7, 8, 3, 4, 5, 0]]),
    decoder_causal_attention=jnp.array([[1, 1, 0, 1, 1, 0, 0]]),
    decoder_segment_ids=jnp.array([[1, 1, 1, 2, 2, 2, 0]]),
  )
  expected = [
    [1, 1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0],
    [0, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 0],
  ]
  assert mask.dtype == bool and mask.shape == (1, 1, 7, 7)
  np.testing.assert_array_equal(mask[0, 0], np.array(expected, bool))
  # A prompt of length 2 (BOS and prompt at 0..2), a continuation, padding.
  targets = jnp.array([[5, 6, 7, 8, 0], [5, 6, 7, 8, 9]])
  prefix_lm = network.make_decoder_mask(targets, jnp.array([[1, 1, 1, 0, 0]] * 2))
  np.testing.assert_array_equal(
    prefix_lm[0, 0],
    np.array(
      [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]], bool
    ),
  )
  np.testing.assert_array_equal(
    network.make_decoder_mask(targets)[1, 0], np.tril(np.ones((5, 5), bool))
  )


def test_packed_rows_equal_separate_rows():
  """Packed prefix-LM examples (segment ids) give the logits of each example alone."""
  rng = np.random.default_rng(2)
  examples = [(3, 7), (2, 5)]  # (prompt length P, length), BOS included.
  separate = [np.zeros((2, 12), np.int32) for _ in range(3)]  # inputs, targets, causal.
  packed = [np.zeros((1, 12), np.int32) for _ in range(4)]  # ... and segment ids.
  start = 0
  for b, (prompt, length) in enumerate(examples):
    inputs, targets, causal = _prefix_lm_batch(rng, [prompt], length)
    for array, value in zip(separate, (inputs, targets, causal)):
      array[b, :length] = value[0]
    for array, value in zip(packed, (inputs, targets, causal, np.full((1, length), b + 1))):
      array[0, start : start + length] = value[0]
    start += length
  expected = np.asarray(_forward(CONFIG, PARAMS, *separate))
  logits = np.asarray(_forward(CONFIG, PARAMS, *packed))
  np.testing.assert_allclose(logits[0, :7], expected[0, :7], atol=1e-5)
  np.testing.assert_allclose(logits[0, 7:12], expected[1, :5], atol=1e-5)


# ------------------------------------------------------------------------------
# Block-cached decoding and prefills equal teacher forcing.
# ------------------------------------------------------------------------------
def test_decode_block_equals_single_steps_and_teacher_forcing():
  """Blocks of several sizes at ragged per-row starts, over stale cache entries."""
  rng = np.random.default_rng(0)
  batch, length = 3, 12
  inputs, targets, _ = _prefix_lm_batch(rng, [0] * batch, length)
  full = np.asarray(_forward(CONFIG, PARAMS, inputs, targets))
  cache = _init_cache(CONFIG, PARAMS, inputs, length + 8)
  logits, cache = _decode_block(CONFIG, PARAMS, cache, inputs, jnp.zeros(batch, jnp.int32))
  np.testing.assert_allclose(logits, full, atol=1e-5)  # One block of the whole sequence.
  garbage = jnp.asarray(rng.integers(2, VOCAB, (batch, 8)), jnp.int32)
  for k in (1, 2, 3, 5):
    starts = rng.integers(0, length - k + 1, batch)
    assert len(set(starts)) > 1
    # Rejected tokens of an earlier block at and after each row's start.
    _, stale = _decode_block(CONFIG, PARAMS, cache, garbage, jnp.asarray(starts, jnp.int32))
    block = jnp.asarray(np.stack([inputs[b, s : s + k] for b, s in enumerate(starts)]))
    logits, after = _decode_block(CONFIG, PARAMS, stale, block, jnp.asarray(starts, jnp.int32))
    assert logits.shape == (batch, k, VOCAB)
    for b, s in enumerate(starts):
      np.testing.assert_allclose(logits[b], full[b, s : s + k], atol=1e-5)
    steps = stale
    for j in range(k):
      step_logits, steps = _decode_block(
        CONFIG, PARAMS, steps, block[:, j : j + 1], jnp.asarray(starts + j, jnp.int32)
      )
      np.testing.assert_allclose(step_logits[:, 0], logits[:, j], atol=1e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), steps, after)


def _decode_from(config, params, cache, inputs, starts, rng, max_block=3):
  """Decodes the rest of each row from its start in random-size blocks.

  Returns {(row, position): logits} for every position from the row's start on.
  """
  batch, length = inputs.shape
  padded = np.concatenate([inputs, np.zeros((batch, max_block), np.int32)], axis=1)
  positions, seen = np.array(starts), {}
  while positions.min() < length:
    k = int(rng.integers(1, max_block + 1))
    block = np.stack([padded[b, p : p + k] for b, p in enumerate(positions)])
    logits, cache = _decode_block(
      config, params, cache, jnp.asarray(block), jnp.asarray(positions, jnp.int32)
    )
    for b, p in enumerate(positions):
      for j in range(min(k, length - p)):
        seen[b, p + j] = np.asarray(logits[b, j])
    positions = np.minimum(positions + k, length)
  return seen


@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_prefill_then_decode_block_equals_teacher_forcing(bidirectional):
  """Ragged prompt lengths; the block past each prompt holds junk (stale entries)."""
  rng = np.random.default_rng(1)
  prompt_lengths, length = np.array([0, 3, 6]), 12
  inputs, targets, causal_attention = _prefix_lm_batch(rng, prompt_lengths, length)
  mask = causal_attention if bidirectional else None
  full = np.asarray(_forward(CONFIG, PARAMS, inputs, targets, mask))
  if bidirectional:  # The prefix LM differs from a causal LM after the prompt.
    causal = np.asarray(_forward(CONFIG, PARAMS, inputs, targets))
    assert np.abs(full[2, 6:] - causal[2, 6:]).max() > 1e-2
  width = prompt_lengths.max() + 1
  junk = rng.integers(2, VOCAB, (3, width))
  block = np.where(np.arange(width)[None] <= prompt_lengths[:, None], inputs[:, :width], junk)
  cache = _init_cache(CONFIG, PARAMS, inputs, length + 3)
  cache = _prefill(
    CONFIG,
    PARAMS,
    cache,
    jnp.asarray(block, jnp.int32),
    jnp.asarray(prompt_lengths, jnp.int32),
    bidirectional=bidirectional,
  )
  seen = _decode_from(CONFIG, PARAMS, cache, inputs, prompt_lengths, rng)
  assert len(seen) == sum(length - prompt_lengths)
  for (b, position), logits in seen.items():
    np.testing.assert_allclose(logits, full[b, position], atol=1e-5, err_msg=f'{b}, {position}')


@pytest.mark.parametrize('mode', ['no_prefill', 'causal_prefill', 'prefix_lm_prefill'])
def test_t5x_decode_protocol_equals_teacher_forcing(mode):
  """T5X's cache protocol as DecoderOnlyModel and decoding.temperature_sample drive it.

  `_compute_kv_cache`: a decode=True call on dummy tokens creates the cache, a
  prefill=True call writes the prompt (`decoder_input_tokens *
  decoder_causal_attention`, the mask as targets) and sets a per-row
  `cache_index`. The decode function then repeats every cache leaf for
  num_decodes = 2 (`cache_map(..., apply_to_index=True)` once `cache_index` is
  a vector) and feeds one token per row at each row's index.
  """
  rng = np.random.default_rng(3)
  prompt_lengths = np.zeros(3, int) if mode == 'no_prefill' else np.array([0, 3, 5])
  length = 10
  inputs, targets, causal_attention = _prefix_lm_batch(rng, prompt_lengths, length)
  mask = causal_attention if mode == 'prefix_lm_prefill' else None
  full = np.asarray(_forward(CONFIG, PARAMS, inputs, targets, mask))
  ones = np.ones_like(inputs)
  _, variables = jax.jit(
    lambda p: MODULE.apply(
      {'params': p}, ones, ones, enable_dropout=False, decode=True, mutable=['cache']
    )
  )(PARAMS)
  cache = variables['cache']
  assert cache['decoder']['cache_index'].shape == ()
  assert cache['decoder']['layers_1']['self_attention']['cached_key'].shape == (3, 4, 8, length)
  if mode != 'no_prefill':
    _, variables = jax.jit(
      lambda p, c: MODULE.apply(
        {'params': p, 'cache': c},
        decoder_input_tokens=inputs * causal_attention,
        decoder_target_tokens=causal_attention,
        decoder_causal_attention=mask,
        mutable=['cache'],
        enable_dropout=False,
        prefill=True,
        prefill_lengths=jnp.asarray(prompt_lengths, jnp.int32),
      )
    )(PARAMS, cache)
    cache = variables['cache']
    np.testing.assert_array_equal(cache['decoder']['cache_index'], prompt_lengths)
  expand = lambda x: jnp.repeat(x, 2, axis=0) if x.ndim else x
  cache = jax.tree.map(expand, cache)

  @jax.jit
  def step(cache, token):
    return MODULE.apply(
      {'params': PARAMS, 'cache': cache},
      token,
      token,
      enable_dropout=False,
      decode=True,
      max_decode_length=length,
      mutable=['cache'],
    )

  index, inputs, full = expand(prompt_lengths), expand(inputs), expand(full)
  for _ in range(length - prompt_lengths.min()):
    token = np.take_along_axis(inputs, np.minimum(index, length - 1)[:, None], axis=1)
    logits, variables = step(cache, jnp.asarray(token))
    cache = variables['cache']
    for row in np.flatnonzero(index < length):  # Rows at the end keep running, unread.
      np.testing.assert_allclose(logits[row, 0], full[row, index[row]], atol=1e-5)
    index = index + 1
  np.testing.assert_array_equal(
    np.broadcast_to(cache['decoder']['cache_index'], index.shape), index
  )


def test_decode_protocol_and_block_errors():
  tokens = jnp.ones((2, 4), jnp.int32)
  lengths = jnp.array([1, 2], jnp.int32)
  shapes = network.abstract_params(CONFIG)[0]
  apply = lambda variables, *args, **kwargs: jax.eval_shape(
    lambda v: MODULE.apply(v, *args, mutable=['cache'], enable_dropout=False, **kwargs),
    variables,
  )
  with pytest.raises(ValueError, match='prefill and decode cannot both be True'):
    apply({'params': shapes}, tokens, tokens, decode=True, prefill=True, prefill_lengths=lengths)
  with pytest.raises(ValueError, match='prefill=True needs prefill_lengths'):
    apply({'params': shapes}, tokens, tokens, prefill=True)
  with pytest.raises(ValueError, match='first decode=True call'):
    apply({'params': shapes}, tokens, tokens, prefill=True, prefill_lengths=lengths)
  _, variables = apply({'params': shapes}, tokens, tokens, decode=True)
  with pytest.raises(ValueError, match=r'\[batch, 1\]'):
    apply({'params': shapes, **variables}, tokens, tokens, decode=True)
  with pytest.raises(ValueError, match='prefill_lengths \\[batch\\]'):
    apply(
      {'params': shapes, **variables}, tokens, tokens, prefill=True, prefill_lengths=lengths[:1]
    )

  init_cache = lambda batch, length: jax.eval_shape(
    lambda p: network.init_decoder_cache(CONFIG, p, jnp.ones((batch, 3), jnp.int32), length),
    shapes,
  )
  decode_block = lambda cache, *args: jax.eval_shape(
    functools.partial(network.apply_decode_block, CONFIG), shapes, cache, *args
  )
  prefill = lambda cache, *args: jax.eval_shape(
    functools.partial(network.prefill_decoder_cache, CONFIG, bidirectional=True),
    shapes,
    cache,
    *args,
  )
  with pytest.raises(ValueError, match='decode_block needs the cache made by DecoderOnly'):
    decode_block({}, tokens, lengths)
  with pytest.raises(ValueError, match='prefill needs the cache made by DecoderOnly'):
    prefill({}, tokens, lengths)
  cache = init_cache(2, 6)
  assert jax.tree.map(lambda x: x.shape, cache) == {
    'decoder': {
      f'layers_{i}': {'self_attention': {'cached_key': (2, 4, 8, 6), 'cached_value': (2, 4, 8, 6)}}
      for i in range(2)
    }
  }
  with pytest.raises(ValueError, match='start_positions \\[batch\\]'):
    decode_block(cache, tokens, jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match='prefix_lengths \\[batch\\]'):
    prefill(cache, tokens[:1], lengths)
  with pytest.raises(ValueError, match='does not fit a cache of length 6'):
    prefill(cache, jnp.ones((2, 7), jnp.int32), lengths)
  with pytest.raises(ValueError, match='cache_length must be an integer >= 1'):
    init_cache(2, 0)


# ------------------------------------------------------------------------------
# Checkpoints.
# ------------------------------------------------------------------------------
def test_t5x_format_checkpoints_load_bit_identically(tmp_path):
  """Legacy and orbax T5X checkpoints (written as T5X writes them) and ours."""
  legacy = write_t5x_legacy(tmp_path / 'legacy', 4, PARAMS)
  orbax = write_t5x_orbax(tmp_path / 'orbax', 4, PARAMS)
  checkpoints.save_params(tmp_path / 'ours', PARAMS)
  for path in (legacy, tmp_path / 'legacy', orbax, tmp_path / 'ours'):
    assert_trees_equal(checkpoints.load_params(path, CONFIG), PARAMS, numpy_leaves=True)
  checkpoints.check_params(PARAMS, CONFIG)
  deeper = dataclasses.replace(CONFIG, num_layers=3)
  with pytest.raises(
    ValueError,
    match=r'decoder/layers_2/.* is missing.* num_layers=3.*an encoder-decoder checkpoint',
  ):
    checkpoints.load_params(legacy, deeper)
  with pytest.raises(ValueError, match='decoder/layers_2/'):
    checkpoints.load_params(orbax, deeper)
  t5 = network.T5Config(
    vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_decoder_layers=2
  )
  with pytest.raises(
    ValueError, match=r'encoder.* is missing.*num_encoder_layers=6.*DecoderOnlyConfig'
  ):
    checkpoints.load_params(legacy, t5)


def test_huggingface_import_is_t5_only(tmp_path):
  (tmp_path / huggingface.CONFIG_FILE).write_text(json.dumps({'model_type': 't5'}))
  with pytest.raises(ValueError, match='T5 encoder-decoders .* only, not a DecoderOnlyConfig'):
    checkpoints.load_params(tmp_path, CONFIG)
  with pytest.raises(ValueError, match='huggingface.save_t5 handles T5 encoder-decoders'):
    huggingface.save_t5(CONFIG, PARAMS, os.fspath(tmp_path / 'out'))


# ------------------------------------------------------------------------------
# With the real t5x.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def t5x():
  """T5X's modules: its decoder-only network and layers, models, decoding, checkpoints."""
  import_t5x()
  import seqio  # pylint: disable=g-import-not-at-top
  from t5x import checkpoints as t5x_checkpoints  # pylint: disable=g-import-not-at-top
  from t5x import decoding  # pylint: disable=g-import-not-at-top
  from t5x import models  # pylint: disable=g-import-not-at-top
  from t5x import partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state  # pylint: disable=g-import-not-at-top
  from t5x.examples.decoder_only import layers  # pylint: disable=g-import-not-at-top
  from t5x.examples.decoder_only import network as t5x_network  # pylint: disable=g-import-not-at-top

  return dict(
    seqio=seqio,
    checkpoints=t5x_checkpoints,
    decoding=decoding,
    models=models,
    partitioning=partitioning,
    train_state=train_state,
    layers=layers,
    network=t5x_network,
  )


def _t5x_module(t5x, config):
  """T5X's `DecoderWrapper` with the same hyperparameters (T5X has no float32 logits flag)."""
  fields = {
    field.name: getattr(config, field.name)
    for field in dataclasses.fields(config)
    if field.name != 'float32_attention_logits'
  }
  return t5x['network'].DecoderWrapper(t5x['network'].TransformerConfig(**fields))


@pytest.mark.t5x
@pytest.mark.parametrize('config', [CONFIG, TIED_RELU], ids=['gated_untied', 'relu_tied'])
def test_tree_shapes_and_axes_equal_t5x(t5x, config):
  tokens = jnp.ones((2, 5), jnp.int32)
  theirs = jax.eval_shape(
    lambda: _t5x_module(t5x, config).init(
      jax.random.PRNGKey(0), tokens, tokens, enable_dropout=False
    )
  )
  assert _tree(theirs['params'], theirs['params_axes']) == _tree(*network.abstract_params(config))


@pytest.mark.t5x
@pytest.mark.parametrize('config', [CONFIG, TIED_RELU], ids=['gated_untied', 'relu_tied'])
def test_logits_equal_t5x_on_t5x_initialized_params(t5x, config):
  """Teacher forcing: causal, prefix LM, packed; rows padded at different lengths."""
  module = _t5x_module(t5x, config)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = jax.jit(lambda key: module.init(key, tokens, tokens, enable_dropout=False))(
    jax.random.PRNGKey(4)
  )['params']
  rng = np.random.default_rng(4)
  inputs, targets, causal_attention = _prefix_lm_batch(rng, [0, 2, 5], 10, padding_from=[10, 8, 7])
  segments = (targets > 0) * (1 + (np.arange(10)[None] >= 6))
  theirs = jax.jit(
    lambda p, c, s: module.apply(
      {'params': p},
      inputs,
      targets,
      decoder_segment_ids=s,
      decoder_causal_attention=c,
      enable_dropout=False,
    )
  )
  for mask, segment_ids in ((None, None), (causal_attention, None), (causal_attention, segments)):
    np.testing.assert_allclose(
      _forward(config, params, inputs, targets, mask, segment_ids),
      theirs(params, mask, segment_ids),
      atol=1e-5,
    )


@pytest.mark.t5x
def test_make_decoder_mask_equals_t5x(t5x):
  rng = np.random.default_rng(5)
  targets = rng.integers(0, 3, (4, 9))  # Padding (0) anywhere.
  causal_attention = (np.arange(9)[None] <= rng.integers(0, 9, 4)[:, None]).astype(int)
  segments = np.sort(rng.integers(0, 3, (4, 9)), axis=1)
  for mask in (None, causal_attention):
    for segment_ids in (None, segments):
      theirs = t5x['layers'].make_decoder_mask(targets, jnp.float32, mask, segment_ids)
      np.testing.assert_array_equal(
        network.make_decoder_mask(jnp.asarray(targets), mask, segment_ids), theirs > 0
      )


@pytest.mark.t5x
@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_t5x_decoder_only_model_scores_and_predicts_with_this_module(t5x, bidirectional):
  """T5X's DecoderOnlyModel with this module equals it with T5X's own network.

  Prefill, per-row `cache_index`, num_decodes expansion and the sampling loop
  are all T5X's (`_compute_kv_cache`, `decoding.temperature_sample`).
  """
  vocabulary = t5x['seqio'].PassThroughVocabulary(size=VOCAB, eos_id=1)
  ours, stock = (
    t5x['models'].DecoderOnlyModel(
      module,
      vocabulary,
      optimizer_def=None,
      decode_fn=t5x['decoding'].temperature_sample,
      inputs_bidirectional_attention=bidirectional,
    )
    for module in (MODULE, _t5x_module(t5x, CONFIG))
  )
  prompt_lengths = np.array([0, 3, 5])
  inputs, targets, causal_attention = _prefix_lm_batch(np.random.default_rng(6), prompt_lengths, 10)
  batch = {
    'decoder_input_tokens': inputs,
    'decoder_target_tokens': targets,
    'decoder_causal_attention': causal_attention,
    'decoder_loss_weights': (1 - causal_attention).astype(np.int32),
  }
  score = lambda model: jax.jit(model.score_batch)(PARAMS, batch)
  np.testing.assert_allclose(score(ours), score(stock), rtol=1e-5)
  greedy = lambda model: jax.jit(model.predict_batch_with_aux)(PARAMS, batch)
  (decodes, aux), (stock_decodes, stock_aux) = greedy(ours), greedy(stock)
  np.testing.assert_array_equal(decodes, stock_decodes)
  np.testing.assert_allclose(aux['scores'], stock_aux['scores'], atol=1e-4)
  # T5X removes the prompt; every row decoded something.
  assert decodes.shape == (3, 10) and (decodes[:, 0] != 0).all()
  sample = lambda model: jax.jit(
    lambda p, b, key: model.predict_batch_with_aux(
      p, b, key, num_decodes=2, return_all_decodes=True, decoder_params={'topk': 0}
    )
  )(PARAMS, batch, jax.random.PRNGKey(7))
  (decodes, aux), (stock_decodes, stock_aux) = sample(ours), sample(stock)
  assert decodes.shape == (3, 2, 10)
  np.testing.assert_array_equal(decodes, stock_decodes)
  np.testing.assert_allclose(aux['scores'], stock_aux['scores'], atol=1e-4)


@pytest.mark.t5x
@pytest.mark.parametrize('checkpoint_format', ['legacy', 'orbax'])
def test_t5x_checkpointer_checkpoints_load_bit_identically(t5x, tmp_path, checkpoint_format):
  """Decoder-only checkpoints written by T5X's own checkpointers (as its train.py)."""
  vocabulary = t5x['seqio'].PassThroughVocabulary(size=VOCAB, eos_id=1)
  stock = t5x['models'].DecoderOnlyModel(_t5x_module(t5x, CONFIG), vocabulary, optimizer_def=None)
  axes = jax.eval_shape(
    lambda: stock.get_initial_variables(
      jax.random.PRNGKey(0), {'decoder_input_tokens': (2, 8)}, {'decoder_input_tokens': jnp.int32}
    )
  )['params_axes']
  state = t5x['train_state'].InferenceState.create({'params': PARAMS, 'params_axes': axes})
  partitioner = t5x['partitioning'].PjitPartitioner(num_partitions=1)
  if checkpoint_format == 'legacy':
    t5x['checkpoints'].Checkpointer(state, partitioner, os.fspath(tmp_path)).save(state)
  else:
    manager = t5x['checkpoints'].OrbaxCheckpointManagerInterface(
      os.fspath(tmp_path), state, partitioner
    )
    manager.save(state)
    manager.close()
  assert (
    checkpoints.checkpoint_format(tmp_path)
    == {
      'legacy': checkpoints.T5X_LEGACY,
      'orbax': checkpoints.T5X_ORBAX,
    }[checkpoint_format]
  )
  for path in (tmp_path, tmp_path / 'checkpoint_0'):
    assert_trees_equal(checkpoints.load_params(path, CONFIG), PARAMS, numpy_leaves=True)
