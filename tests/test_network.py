"""Tests of the T5 1.1 network: tree, sizes, inits, masks and cached decoding."""

import dataclasses
import functools

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import network

# A tiny float32 model; 4 heads and even sizes so that other tests can shard it.
CONFIG = network.T5Config(
  vocab_size=64,
  dtype=jnp.float32,
  emb_dim=32,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=48,
  dropout_rate=0.0,
)


def _batch(rng, batch=3, input_length=7, target_length=12, vocab=64):
  """Encoder tokens with per-row padding, decoder inputs and targets (no padding)."""
  inputs = rng.integers(2, vocab, (batch, input_length))
  for row, length in enumerate(rng.integers(2, input_length + 1, batch)):
    inputs[row, length:] = 0
  targets = rng.integers(2, vocab, (batch, target_length))
  decoder_inputs = np.concatenate([np.zeros((batch, 1), int), targets[:, :-1]], axis=1)
  return inputs, decoder_inputs, targets


@functools.partial(jax.jit, static_argnums=0)
def _forward(
  config, params, inputs, decoder_inputs, targets, input_segments=None, target_segments=None
):
  return network.Transformer(config).apply(
    {'params': params},
    inputs,
    decoder_inputs,
    targets,
    encoder_segment_ids=input_segments,
    decoder_segment_ids=target_segments,
    enable_dropout=False,
  )


_init_decoder_cache = jax.jit(network.init_decoder_cache, static_argnums=(0, 3))
_apply_decode_block = jax.jit(network.apply_decode_block, static_argnums=0)


# ------------------------------------------------------------------------------
# Relative position buckets.
# ------------------------------------------------------------------------------
def test_relative_position_bucket_hand_values():
  # memory - query; causal: 16 exact buckets, then log-spaced up to 128.
  relative = np.array([0, -1, -15, -16, -31, -32, -63, -64, -127, -128, -1000, 5])
  np.testing.assert_array_equal(
    network.relative_position_bucket(relative, False), [0, 1, 15, 16, 21, 21, 26, 26, 31, 31, 31, 0]
  )
  # Bidirectional: 16 buckets per direction, later memory positions offset 16.
  relative = np.array([0, -1, 1, -7, -8, -15, -16, 16, -127, -128, 200, -200])
  np.testing.assert_array_equal(
    network.relative_position_bucket(relative, True), [0, 1, 17, 7, 8, 9, 10, 26, 15, 15, 31, 15]
  )


@pytest.mark.parametrize('bidirectional', [True, False])
def test_bucket_lookup_of_dynamic_positions_matches_formula(bidirectional):
  queries = np.arange(0, 300, 7)[None]
  keys = np.arange(0, 300)[None]
  model = network.RelativePositionBiases(num_heads=1, dtype=jnp.float32)
  # A table whose bias is the bucket number itself.
  table = {'params': {'rel_embedding': np.arange(network.NUM_BUCKETS, dtype=np.float32)[None]}}
  biases = model.apply(table, jnp.asarray(queries), jnp.asarray(keys), bidirectional)
  expected = network.relative_position_bucket(keys[0][None, :] - queries[0][:, None], bidirectional)
  np.testing.assert_array_equal(np.asarray(biases)[0, 0], expected)


# ------------------------------------------------------------------------------
# Parameter tree, counts and initializers.
# ------------------------------------------------------------------------------
def _expected_small_tree():
  """T5 1.1 small in T5X's tree: emb 512, 6 heads x 64, mlp 1024, 8 + 8 layers."""
  attention = {
    'query/kernel': (512, 384),
    'key/kernel': (512, 384),
    'value/kernel': (512, 384),
    'out/kernel': (384, 512),
  }
  mlp = {
    'mlp/wi_0/kernel': (512, 1024),
    'mlp/wi_1/kernel': (512, 1024),
    'mlp/wo/kernel': (1024, 512),
  }
  tree = {
    'token_embedder/embedding': (32128, 512),
    'encoder/relpos_bias/rel_embedding': (6, 32),
    'encoder/encoder_norm/scale': (512,),
    'decoder/relpos_bias/rel_embedding': (6, 32),
    'decoder/decoder_norm/scale': (512,),
    'decoder/logits_dense/kernel': (512, 32128),
  }
  for i in range(8):
    enc, dec = f'encoder/layers_{i}/', f'decoder/layers_{i}/'
    tree[enc + 'pre_attention_layer_norm/scale'] = (512,)
    tree[enc + 'pre_mlp_layer_norm/scale'] = (512,)
    tree[dec + 'pre_self_attention_layer_norm/scale'] = (512,)
    tree[dec + 'pre_cross_attention_layer_norm/scale'] = (512,)
    tree[dec + 'pre_mlp_layer_norm/scale'] = (512,)
    for name, shape in attention.items():
      tree[enc + 'attention/' + name] = shape
      tree[dec + 'self_attention/' + name] = shape
      tree[dec + 'encoder_decoder_attention/' + name] = shape
    for name, shape in mlp.items():
      tree[enc + name] = shape
      tree[dec + name] = shape
  return tree


def test_small_parameter_tree_names_shapes_and_axes():
  params, params_axes = network.abstract_params(network.t5_1_1_config('small'))
  flat = {'/'.join(k): v for k, v in traverse_util.flatten_dict(params).items()}
  assert {k: v.shape for k, v in flat.items()} == _expected_small_tree()
  assert {v.dtype for v in flat.values()} == {np.dtype(np.float32)}
  axes = {
    '/'.join(k)[: -len('_axes')]: v.names
    for k, v in traverse_util.flatten_dict(params_axes).items()
  }
  assert set(axes) == set(flat)
  assert axes['token_embedder/embedding'] == ('vocab', 'embed')
  assert axes['encoder/relpos_bias/rel_embedding'] == ('heads', 'relpos_buckets')
  assert axes['encoder/layers_0/attention/query/kernel'] == ('embed', 'joined_kv')
  assert axes['decoder/layers_7/encoder_decoder_attention/out/kernel'] == ('joined_kv', 'embed')
  assert axes['decoder/layers_3/mlp/wi_1/kernel'] == ('embed', 'mlp')
  assert axes['decoder/layers_3/mlp/wo/kernel'] == ('mlp', 'embed')
  assert axes['decoder/decoder_norm/scale'] == ('embed',)
  assert axes['decoder/logits_dense/kernel'] == ('embed', 'vocab')


# The parameter counts of google/t5-v1_1-{small,base,large,xl,xxl}.
@pytest.mark.parametrize(
  'size,count',
  [
    ('small', 76_961_152),
    ('base', 247_577_856),
    ('large', 783_150_080),
    ('xl', 2_849_757_184),
    ('xxl', 11_135_332_352),
  ],
)
def test_parameter_counts_of_named_sizes(size, count):
  params, _ = network.abstract_params(network.t5_1_1_config(size))
  assert network.parameter_count(params) == count


def test_logits_via_embedding_has_no_logits_dense_and_t5_1_0_mlp_has_wi():
  config = dataclasses.replace(CONFIG, logits_via_embedding=True, mlp_activations=('relu',))
  flat = traverse_util.flatten_dict(network.abstract_params(config)[0])
  assert ('decoder', 'logits_dense', 'kernel') not in flat
  assert flat[('encoder', 'layers_0', 'mlp', 'wi', 'kernel')].shape == (32, 48)
  assert ('encoder', 'layers_0', 'mlp', 'wi_0', 'kernel') not in flat


def test_init_follows_t5x_initializers_and_random_params_matches_scales():
  config = dataclasses.replace(
    CONFIG,
    vocab_size=512,
    emb_dim=128,
    head_dim=16,
    mlp_dim=256,
    num_encoder_layers=1,
    num_decoder_layers=1,
  )
  tokens = jnp.ones((1, 1), jnp.int32)
  init = jax.jit(
    lambda key: network.Transformer(config).init(key, tokens, tokens, tokens, enable_dropout=False)
  )
  emb, heads_dim = 128, 4 * 16
  expected_std = {
    'token_embedder/embedding': 1.0,
    'encoder/layers_0/attention/query/kernel': 1 / np.sqrt(emb) / np.sqrt(16),
    'encoder/layers_0/attention/key/kernel': 1 / np.sqrt(emb),
    'decoder/layers_0/encoder_decoder_attention/value/kernel': 1 / np.sqrt(emb),
    'decoder/layers_0/self_attention/out/kernel': 1 / np.sqrt(heads_dim),
    'encoder/layers_0/mlp/wi_0/kernel': 1 / np.sqrt(emb),
    'decoder/layers_0/mlp/wo/kernel': 1 / np.sqrt(256),
    'decoder/logits_dense/kernel': 1 / np.sqrt(emb),
  }
  limit = np.sqrt(6 / (4 + 32))  # variance_scaling(1, 'fan_avg', 'uniform') of [heads, 32]
  for params in (init(jax.random.PRNGKey(0))['params'], network.random_params(config)[0]):
    flat = {'/'.join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}
    for name, std in expected_std.items():
      assert abs(flat[name].std() / std - 1) < 0.1, name
    relpos = flat['decoder/relpos_bias/rel_embedding']
    assert np.abs(relpos).max() <= limit and abs(relpos.std() / (limit / np.sqrt(3)) - 1) < 0.15
    np.testing.assert_array_equal(flat['encoder/layers_0/pre_mlp_layer_norm/scale'], 1.0)


def test_config_errors():
  with pytest.raises(ValueError, match='num_heads'):
    dataclasses.replace(CONFIG, num_heads=0)
  with pytest.raises(ValueError, match='activation'):
    dataclasses.replace(CONFIG, mlp_activations=('swishy', 'linear'))
  with pytest.raises(ValueError, match='Unknown T5 1.1 size'):
    network.t5_1_1_config('medium')
  config = network.t5_1_1_config('xl', dtype='bfloat16', vocab_size=100)  # gin binds names.
  assert (config.emb_dim, config.num_heads, config.mlp_dim, config.vocab_size) == (
    2048,
    32,
    5120,
    100,
  )
  assert config.mlp_activations == ('gelu', 'linear') and not config.logits_via_embedding


# ------------------------------------------------------------------------------
# Cached decoding equals teacher forcing.
# ------------------------------------------------------------------------------
def test_decode_block_matches_teacher_forcing_with_rollbacks():
  """Random blocks, rows at different positions, rejected tokens rolled back."""
  rng = np.random.default_rng(0)
  params, _ = network.random_params(CONFIG, seed=1)
  inputs, decoder_inputs, targets = _batch(rng)
  batch, length = targets.shape
  full = np.asarray(_forward(CONFIG, params, inputs, decoder_inputs, targets))
  max_block = 4
  cache = _init_decoder_cache(CONFIG, params, inputs, length + max_block)
  # Every cache is [B, heads, head_dim, positions] (T5X's layout), the cross-attention ones too.
  cross = cache['decoder']['layers_0']['encoder_decoder_attention']
  assert cross['cached_key'].shape == (batch, 4, 8, inputs.shape[1])
  assert cross['cached_value'].shape == (batch, 4, 8, inputs.shape[1])
  # Tokens past the end are arbitrary; rows that are done keep writing there.
  padded = np.concatenate([decoder_inputs, rng.integers(2, 64, (batch, max_block))], axis=1)
  positions = np.zeros(batch, int)
  checked = np.zeros((batch, length), bool)
  rejections = 0
  while positions.min() < length:
    k = int(rng.integers(1, max_block + 1))
    accepted = rng.integers(0, k + 1, batch)  # Leading correct tokens per row.
    block = np.stack([padded[b, p : p + k] for b, p in enumerate(positions)])
    wrong = 2 + (block - 2 + rng.integers(1, 61, block.shape)) % 62  # Differs from block.
    block = np.where(np.arange(k)[None] < accepted[:, None], block, wrong)
    logits, cache = _apply_decode_block(
      CONFIG, params, cache, jnp.asarray(block, jnp.int32), jnp.asarray(positions, jnp.int32)
    )
    assert logits.shape == (batch, k, 64)
    for b in range(batch):
      for j in range(min(accepted[b], length - positions[b])):
        np.testing.assert_allclose(logits[b, j], full[b, positions[b] + j], atol=1e-5)
        checked[b, positions[b] + j] = True
    rejections += int(np.sum(accepted < k))
    positions = np.minimum(positions + accepted, length)
  assert checked.all() and rejections > 5


def test_prefill_then_decode_block_matches_teacher_forcing():
  """The encoder-decoder's prefill writes a causal block; decoding continues at <= W."""
  rng = np.random.default_rng(5)
  params, _ = network.random_params(CONFIG, seed=5)
  inputs, decoder_inputs, targets = _batch(rng)
  full = np.asarray(_forward(CONFIG, params, inputs, decoder_inputs, targets))
  prefill = jax.jit(network.prefill_decoder_cache, static_argnums=0)
  cache = _init_decoder_cache(CONFIG, params, inputs, 16)
  width, k = 5, 3
  cache = prefill(CONFIG, params, cache, decoder_inputs[:, :width], jnp.full(3, width - 1))
  starts = np.array([width, 2, 4])
  block = np.stack([decoder_inputs[b, s : s + k] for b, s in enumerate(starts)])
  logits, _ = _apply_decode_block(
    CONFIG, params, cache, jnp.asarray(block, jnp.int32), jnp.asarray(starts, jnp.int32)
  )
  for b, s in enumerate(starts):
    np.testing.assert_allclose(logits[b], full[b, s : s + k], atol=1e-5)
  with pytest.raises(ValueError, match='no prefix-LM decoder'):
    jax.eval_shape(
      functools.partial(network.prefill_decoder_cache, CONFIG, bidirectional=True),
      params,
      cache,
      decoder_inputs[:, :width],
      jnp.full(3, width - 1),
    )


def test_t5x_decode_protocol_matches_teacher_forcing_after_batch_expansion():
  """The cache protocol T5X's decoding.temperature_sample drives, num_decodes=2."""
  module = network.Transformer(CONFIG)
  params, _ = network.random_params(CONFIG, seed=2)
  inputs, decoder_inputs, targets = _batch(np.random.default_rng(1))
  length = targets.shape[1]
  full = np.asarray(_forward(CONFIG, params, inputs, decoder_inputs, targets))
  # As T5X's EncoderDecoderModel._compute_kv_cache: shapes from dummy inputs.
  _, variables = jax.jit(
    lambda p: module.apply(
      {'params': p},
      jnp.ones_like(inputs),
      jnp.ones_like(targets),
      jnp.ones_like(targets),
      decode=True,
      enable_dropout=False,
      mutable=['cache'],
    )
  )(params)
  flat = traverse_util.flatten_dict(variables['cache'])
  assert flat[('decoder', 'cache_index')].shape == ()
  # module.init(..., decode=True) makes the same cache, sized from the decoder input.
  initialized = jax.eval_shape(
    lambda: module.init(
      jax.random.PRNGKey(0), inputs, targets, targets, decode=True, enable_dropout=False
    )
  )
  assert jax.tree.map(lambda x: (x.shape, x.dtype), initialized['cache']) == jax.tree.map(
    lambda x: (x.shape, x.dtype), variables['cache']
  )
  assert flat[('decoder', 'layers_1', 'self_attention', 'cached_value')].shape == (3, 4, 8, length)
  # As T5X's cache_map / flat_batch_beam_expand: repeat every leaf but cache_index.
  expand = lambda x: jnp.repeat(x, 2, axis=0)
  cache = traverse_util.unflatten_dict(
    {k: v if k[-1] == 'cache_index' else expand(v) for k, v in flat.items()}
  )

  @jax.jit
  def step(cache, token):
    encoded = module.apply(
      {'params': params}, inputs, enable_dropout=False, method=network.Transformer.encode
    )
    return module.apply(
      {'params': params, 'cache': cache},
      expand(encoded),
      expand(inputs),
      token,
      token,
      enable_dropout=False,
      decode=True,
      max_decode_length=length,
      method=network.Transformer.decode,
      mutable=['cache'],
    )

  for t in range(length):
    logits, variables = step(cache, expand(decoder_inputs[:, t : t + 1]))
    cache = variables['cache']
    np.testing.assert_allclose(logits[:, 0], expand(full[:, t]), atol=1e-5)
  assert int(cache['decoder']['cache_index']) == length


def test_packed_examples_match_separate_examples():
  """Two examples packed in one row (segment ids) give their separate logits."""
  rng = np.random.default_rng(3)
  params, _ = network.random_params(CONFIG, seed=3)
  lengths = [(4, 5), (3, 4)]  # (input, target) lengths.
  examples = [(rng.integers(2, 64, n), rng.integers(2, 64, m)) for n, m in lengths]
  # Row b of `separate` holds example b alone; row 0 of `packed` holds both.
  separate = {
    name: np.zeros((3, 12 if name != 'inputs' else 7), int)
    for name in ('inputs', 'decoder_inputs', 'targets')
  }
  packed = {name: np.zeros_like(value) for name, value in separate.items()}
  packed['input_segments'] = np.zeros_like(packed['inputs'])
  packed['target_segments'] = np.zeros_like(packed['targets'])
  start_in = start_out = 0
  for b, (inputs, targets) in enumerate(examples):
    n, m = len(inputs), len(targets)
    separate['inputs'][b, :n] = packed['inputs'][0, start_in : start_in + n] = inputs
    separate['targets'][b, :m] = packed['targets'][0, start_out : start_out + m] = targets
    separate['decoder_inputs'][b, 1:m] = targets[:-1]
    packed['decoder_inputs'][0, start_out + 1 : start_out + m] = targets[:-1]
    packed['input_segments'][0, start_in : start_in + n] = b + 1
    packed['target_segments'][0, start_out : start_out + m] = b + 1
    start_in, start_out = start_in + n, start_out + m
  expected = np.asarray(
    _forward(CONFIG, params, separate['inputs'], separate['decoder_inputs'], separate['targets'])
  )
  logits = np.asarray(
    _forward(
      CONFIG,
      params,
      packed['inputs'],
      packed['decoder_inputs'],
      packed['targets'],
      packed['input_segments'],
      packed['target_segments'],
    )
  )
  np.testing.assert_allclose(logits[0, :5], expected[0, :5], atol=1e-5)
  np.testing.assert_allclose(logits[0, 5:9], expected[1, :4], atol=1e-5)


def test_bfloat16_compute_is_close_to_float32():
  """bfloat16 activations keep logits within 5% of their range (measured ~1%)."""
  params, _ = network.random_params(CONFIG, seed=4)
  inputs, decoder_inputs, targets = _batch(np.random.default_rng(4))
  config16 = dataclasses.replace(CONFIG, dtype=jnp.bfloat16)
  logits32 = np.asarray(_forward(CONFIG, params, inputs, decoder_inputs, targets))
  logits16 = _forward(config16, params, inputs, decoder_inputs, targets)
  assert logits16.dtype == jnp.float32  # logits_dense computes in float32, as in T5X.
  error = np.abs(np.asarray(logits16) - logits32).max()
  assert error < 0.05 * np.abs(logits32).max(), error
  # The block-cached path traces in bfloat16 too: a bfloat16 cache, float32 logits.
  cache = jax.eval_shape(lambda p: network.init_decoder_cache(config16, p, inputs, 12), params)
  assert cache['decoder']['layers_0']['self_attention']['cached_key'].dtype == jnp.bfloat16
  logits, _ = jax.eval_shape(
    functools.partial(network.apply_decode_block, config16),
    params,
    cache,
    decoder_inputs[:, :4],
    jnp.zeros(3, jnp.int32),
  )
  assert logits.dtype == jnp.float32 and logits.shape == (3, 4, 64)


def test_decode_block_errors():
  """Shape errors surface while tracing (jax.eval_shape: nothing is computed)."""
  params, _ = network.abstract_params(CONFIG)
  init_cache = lambda inputs, length: jax.eval_shape(
    lambda p, x: network.init_decoder_cache(CONFIG, p, x, length), params, inputs
  )
  decode_block = functools.partial(
    jax.eval_shape, functools.partial(network.apply_decode_block, CONFIG), params
  )
  tokens, inputs = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 5), jnp.int32)
  with pytest.raises(ValueError, match='init_decoder_cache'):
    decode_block({}, tokens, jnp.zeros(2, jnp.int32))
  cache = init_cache(inputs, 4)
  with pytest.raises(ValueError, match='start_positions'):
    decode_block(cache, tokens, jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match='does not fit'):
    decode_block(cache, jnp.ones((2, 5), jnp.int32), jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match='cache_length'):
    init_cache(inputs, 0)
