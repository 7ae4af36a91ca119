"""Sharding rules, and a sharded forward pass on 8 host CPU devices."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from speculative_t5x import partitioning
from testing_utils import import_t5x


def test_rules_are_t5x_standard_rules_for_1d_model_parallelism():
  assert list(partitioning.standard_logical_axis_rules()) == [
    ('batch', 'data'),
    ('vocab', 'model'),
    ('embed', None),
    ('mlp', 'model'),
    ('heads', 'model'),
    ('kv', None),
    ('joined_kv', 'model'),
    ('relpos_buckets', None),
    ('abspos_buckets', None),
    ('length', None),
    ('layers', None),
    ('stack', None),
    ('mlp_activations', None),
  ]


@pytest.mark.t5x
def test_rules_are_t5x_own_standard_rules():
  """The restated rules above are T5X's own (t5x.partitioning), for 1-D partitioning."""
  import_t5x()
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top

  assert list(partitioning.standard_logical_axis_rules()) == list(
    t5x_partitioning.standard_logical_axis_rules(
      activation_partitioning_dims=1, parameter_partitioning_dims=1
    )
  )


def test_make_mesh_needs_all_devices():
  with pytest.raises(ValueError, match='needs'):
    partitioning.make_mesh(jax.device_count() + 1, 1)


# Runs in a fresh process: the device count is fixed when JAX starts.
_SHARDED_SCRIPT = textwrap.dedent("""
    import dataclasses, functools
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    from speculative_t5x import network, partitioning

    assert jax.device_count() == 8, jax.devices()
    config = network.T5Config(vocab_size=64, dtype=jnp.float32, emb_dim=32, num_heads=4,
                              num_encoder_layers=2, num_decoder_layers=2, head_dim=8,
                              mlp_dim=48, dropout_rate=0.0)
    params, params_axes = network.random_params(config, seed=0)
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 64, (4, 6))
    inputs[1, 3:] = 0
    targets = rng.integers(2, 64, (4, 5))
    decoder_inputs = np.concatenate([np.zeros((4, 1), int), targets[:, :-1]], axis=1)
    starts = np.array([0, 1, 2, 0], np.int32)

    def run(params, inputs, decoder_inputs, targets, starts, cache_shardings=None):
      forward = jax.jit(lambda p, *x: network.Transformer(config).apply(
          {'params': p}, *x, enable_dropout=False))
      init_cache = jax.jit(network.init_decoder_cache, static_argnums=(0, 3),
                       out_shardings=cache_shardings)
      decode_block = jax.jit(functools.partial(network.apply_decode_block, config),
                         out_shardings=(None, cache_shardings))
      logits = forward(params, inputs, decoder_inputs, targets)
      cache = init_cache(config, params, inputs, 8)
      block_logits, cache = decode_block(params, cache, decoder_inputs[:, :3], starts)
      return logits, block_logits, cache

    expected = run(params, inputs, decoder_inputs, targets, starts)

    mesh = partitioning.make_mesh(2, 4)
    shardings = partitioning.params_shardings(params, params_axes, mesh)
    assert shardings['token_embedder']['embedding'].spec == P('model', None)
    encoder_layer = shardings['encoder']['layers_0']
    decoder_layer = shardings['decoder']['layers_1']
    assert encoder_layer['attention']['query']['kernel'].spec == P(None, 'model')
    assert decoder_layer['self_attention']['out']['kernel'].spec == P('model', None)
    assert decoder_layer['mlp']['wi_0']['kernel'].spec == P(None, 'model')
    assert shardings['decoder']['relpos_bias']['rel_embedding'].spec == P('model', None)
    assert shardings['decoder']['decoder_norm']['scale'].spec == P(None)
    cache_shardings = partitioning.cache_shardings(expected[2], mesh)
    layer_cache = cache_shardings['decoder']['layers_0']
    assert layer_cache['self_attention']['cached_key'].spec == P('data', 'model', None, None)
    assert layer_cache['self_attention']['cached_value'].spec == P('data', 'model', None, None)
    cross_cache = layer_cache['encoder_decoder_attention']
    assert cross_cache['cached_key'].spec == P('data', 'model', None, None)
    assert cross_cache['cached_value'].spec == P('data', 'model', None, None)
    assert cache_shardings['decoder']['encoder_mask'].spec == P('data', None)

    batch = lambda x: jax.device_put(x, partitioning.batch_sharding(x.shape, mesh))
    sharded_params = jax.device_put(params, shardings)
    got = run(sharded_params, batch(inputs), batch(decoder_inputs), batch(targets), batch(starts),
              cache_shardings)
    assert not got[0].sharding.is_fully_replicated
    for want, have in zip(expected[:2], got[:2]):
      np.testing.assert_allclose(np.asarray(have), np.asarray(want), atol=1e-5)
    jax.tree.map(lambda want, have: np.testing.assert_allclose(have, want, atol=1e-5),
                 expected[2], got[2])

    # Dimensions the mesh does not divide are replicated: 6 heads on 4 devices.
    config6 = dataclasses.replace(config, num_heads=6)
    shapes6, axes6 = network.abstract_params(config6)
    shardings6 = partitioning.params_shardings(shapes6, axes6, mesh)
    assert shardings6['decoder']['relpos_bias']['rel_embedding'].spec == P(None, None)
    key_kernel = shardings6['decoder']['layers_0']['self_attention']['key']['kernel']
    assert key_kernel.spec == P(None, 'model')  # 6 * 8 = 48 features divide.
    t5x_cache = {'decoder': {'cache_index': jax.ShapeDtypeStruct((), jnp.int32),
                             'layers_0': {'self_attention': {
                                 'cached_key': jax.ShapeDtypeStruct((3, 6, 8, 8), jnp.float32)}}}}
    t5x_shardings = partitioning.cache_shardings(t5x_cache, mesh)
    assert t5x_shardings['decoder']['cache_index'].spec == P()
    t5x_key = t5x_shardings['decoder']['layers_0']['self_attention']['cached_key']
    assert t5x_key.spec == P(None, None, None, None)  # Neither batch 3 nor 6 heads divide.
    print('sharded == unsharded')
""")


def test_sharded_forward_and_decode_block_equal_unsharded_on_2x4_mesh():
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=' '.join(
      [os.environ.get('XLA_FLAGS', ''), '--xla_force_host_platform_device_count=8']
    ),
  )
  result = subprocess.run(
    [sys.executable, '-c', _SHARDED_SCRIPT],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'sharded == unsharded' in result.stdout
