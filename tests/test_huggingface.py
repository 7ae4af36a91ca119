"""Parity with Hugging Face transformers' T5 (PyTorch): import, export, layouts."""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x.checkpoints import huggingface
from speculative_t5x import network

safetensors_numpy = pytest.importorskip(
  'safetensors.numpy', reason='Hugging Face checkpoints need safetensors'
)
torch = pytest.importorskip('torch', reason='the Hugging Face parity tests need PyTorch')
transformers = pytest.importorskip(
  'transformers', reason='the Hugging Face parity tests need transformers'
)

TOLERANCE = 1e-4


def _hf_model(feed_forward_proj='gated-gelu', tie_word_embeddings=False, seed=0):
  """A random transformers T5 with 3 encoder and 2 decoder layers, in eval mode."""
  torch.manual_seed(seed)
  config = transformers.T5Config(
    vocab_size=96,
    d_model=32,
    d_kv=8,
    d_ff=48,
    num_layers=3,
    num_decoder_layers=2,
    num_heads=4,
    feed_forward_proj=feed_forward_proj,
    dropout_rate=0.0,
    tie_word_embeddings=tie_word_embeddings,
  )
  model = transformers.T5ForConditionalGeneration(config).eval()
  with torch.no_grad():  # transformers initializes norms to 1; make their mapping visible.
    for name, parameter in model.named_parameters():
      if 'layer_norm' in name:
        parameter.uniform_(0.5, 1.5)
  return model


def _inputs(seed=0, batch=3, input_length=9, target_length=7, vocab=96):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, vocab, (batch, input_length))
  for row, length in enumerate([9, 5, 2]):
    inputs[row, length:] = 0
  targets = rng.integers(2, vocab, (batch, target_length))
  decoder_inputs = np.concatenate([np.zeros((batch, 1), int), targets[:, :-1]], axis=1)
  return inputs, decoder_inputs, targets


def _hf_outputs(model, inputs, decoder_inputs):
  """(encoder outputs [B, L, d_model], logits [B, T, vocab]) as numpy float32."""
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(inputs),
      attention_mask=torch.tensor(inputs > 0),
      decoder_input_ids=torch.tensor(decoder_inputs),
    )
  return out.encoder_last_hidden_state.numpy(), out.logits.numpy()


@functools.partial(jax.jit, static_argnums=0)
def _our_outputs(config, params, inputs, decoder_inputs, targets):
  module = network.Transformer(config)
  encoded = module.apply(
    {'params': params}, inputs, enable_dropout=False, method=network.Transformer.encode
  )
  logits = module.apply(
    {'params': params},
    encoded,
    inputs,
    decoder_inputs,
    targets,
    enable_dropout=False,
    method=network.Transformer.decode,
  )
  return encoded, logits


def _assert_parity(model_dir, expected, inputs, decoder_inputs, targets):
  """Loads model_dir and checks encoder outputs (at non-padding) and logits."""
  config, params = huggingface.load_t5(model_dir)
  encoded, logits = _our_outputs(
    dataclasses.replace(config, dtype=jnp.float32), params, inputs, decoder_inputs, targets
  )
  valid = inputs > 0
  assert np.abs(np.asarray(encoded)[valid] - expected[0][valid]).max() <= TOLERANCE
  assert np.abs(np.asarray(logits) - expected[1]).max() <= TOLERANCE
  return config, params


def _write_transformers_4_layout(model, model_dir, tie_word_embeddings):
  """Writes model as transformers 4 saved T5 1.1: own lm_head.weight, no scale key."""
  os.makedirs(model_dir)
  tensors = {name: value.detach().numpy().copy() for name, value in model.state_dict().items()}
  safetensors_numpy.save_file(
    tensors, os.path.join(model_dir, 'model.safetensors'), metadata={'format': 'pt'}
  )
  hf_config = model.config.to_dict()
  del hf_config['scale_decoder_outputs']
  hf_config.update(tie_word_embeddings=tie_word_embeddings, transformers_version='4.46.0')
  with open(os.path.join(model_dir, 'config.json'), 'w') as f:
    json.dump(hf_config, f)


def test_transformers_5_layout_untied_unscaled(tmp_path):
  """transformers 5 saves `tie_word_embeddings=False` as shared.weight + no scaling."""
  model = _hf_model()
  model.save_pretrained(tmp_path / 'hf')
  tensors = safetensors_numpy.load_file(tmp_path / 'hf' / 'model.safetensors')
  assert 'lm_head.weight' not in tensors  # The layout this test is about.
  data = _inputs()
  config, params = _assert_parity(tmp_path / 'hf', _hf_outputs(model, *data[:2]), *data)
  assert not config.logits_via_embedding
  assert config.mlp_activations == ('gelu', 'linear')
  assert (config.num_encoder_layers, config.num_decoder_layers) == (3, 2)
  np.testing.assert_array_equal(
    params['decoder']['logits_dense']['kernel'], params['token_embedder']['embedding'].T
  )
  # The same model saved in shards loads to the same parameters.
  model.save_pretrained(tmp_path / 'sharded', max_shard_size='20KB')
  assert os.path.exists(tmp_path / 'sharded' / 'model.safetensors.index.json')
  sharded_config, sharded_params = huggingface.load_t5(tmp_path / 'sharded')
  assert sharded_config == config
  jax.tree.map(np.testing.assert_array_equal, sharded_params, params)


def test_transformers_4_layout_with_separate_lm_head_and_export(tmp_path):
  """Public T5 1.1 / Flan-T5 checkpoints: own lm_head, "tie_word_embeddings": false."""
  model = _hf_model(seed=1)
  with torch.no_grad():  # Untie the head, as in transformers 4.
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.2)
  data = _inputs(seed=1)
  expected = _hf_outputs(model, *data[:2])
  _write_transformers_4_layout(model, tmp_path / 'hf4', tie_word_embeddings=False)
  config, params = _assert_parity(tmp_path / 'hf4', expected, *data)
  assert not config.logits_via_embedding

  # Export: transformers 5 loads the untied head without scaling, and the
  # directory reads back to the same parameters.
  huggingface.save_t5(config, params, tmp_path / 'export')
  exported = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / 'export').eval()
  assert not exported.config.scale_decoder_outputs
  assert np.abs(_hf_outputs(exported, *data[:2])[1] - expected[1]).max() <= TOLERANCE
  config_back, params_back = huggingface.load_t5(tmp_path / 'export')
  assert config_back == config
  jax.tree.map(np.testing.assert_array_equal, params_back, params)

  # A transformers 4 config with true tie_word_embeddings scales the outputs;
  # with an lm_head present the scale is folded into logits_dense.
  model.config.scale_decoder_outputs = True
  _write_transformers_4_layout(model, tmp_path / 'hf4_scaled', tie_word_embeddings=True)
  config, _ = _assert_parity(tmp_path / 'hf4_scaled', _hf_outputs(model, *data[:2]), *data)
  assert not config.logits_via_embedding


def test_tied_scaled_t5_1_0_is_logits_via_embedding_and_exports(tmp_path):
  """T5 1.0: ReLU MLP (`wi`), tied embedding scaled by d_model**-0.5."""
  model = _hf_model('relu', tie_word_embeddings=True, seed=2)
  assert model.config.scale_decoder_outputs
  model.save_pretrained(tmp_path / 'hf')
  data = _inputs(seed=2)
  expected = _hf_outputs(model, *data[:2])
  config, params = _assert_parity(tmp_path / 'hf', expected, *data)
  assert config.logits_via_embedding and config.mlp_activations == ('relu',)
  assert 'logits_dense' not in params['decoder']
  assert 'wi' in params['encoder']['layers_0']['mlp']
  # transformers 4 layout with the tied lm_head.weight stored: the same model.
  _write_transformers_4_layout(model, tmp_path / 'hf4', tie_word_embeddings=True)
  config4, params4 = huggingface.load_t5(tmp_path / 'hf4')
  assert config4 == config
  jax.tree.map(np.testing.assert_array_equal, params4, params)

  huggingface.save_t5(config, params, tmp_path / 'export')
  exported = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / 'export').eval()
  assert np.abs(_hf_outputs(exported, *data[:2])[1] - expected[1]).max() <= TOLERANCE


def test_import_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match='config.json'):
    huggingface.load_t5(tmp_path)
  model = _hf_model()
  model.save_pretrained(tmp_path / 'hf')
  os.remove(tmp_path / 'hf' / 'model.safetensors')
  (tmp_path / 'hf' / 'pytorch_model.bin').write_bytes(b'')
  with pytest.raises(FileNotFoundError, match='model.safetensors.*save_pretrained'):
    huggingface.load_t5(tmp_path / 'hf')

  def rewrite_config(directory, **changes):
    model.save_pretrained(directory)
    with open(directory / 'config.json') as f:
      hf_config = json.load(f)
    hf_config.update(changes)
    with open(directory / 'config.json', 'w') as f:
      json.dump(hf_config, f)

  rewrite_config(tmp_path / 'silu', feed_forward_proj='gated-silu')
  with pytest.raises(ValueError, match='feed_forward_proj'):
    huggingface.load_t5(tmp_path / 'silu')
  rewrite_config(tmp_path / 'umt5', model_type='umt5')
  with pytest.raises(ValueError, match='umt5'):
    huggingface.load_t5(tmp_path / 'umt5')
  rewrite_config(tmp_path / 'buckets', relative_attention_num_buckets=64)
  with pytest.raises(ValueError, match='relative_attention_num_buckets'):
    huggingface.load_t5(tmp_path / 'buckets')
  rewrite_config(tmp_path / 'wide', d_ff=64)
  with pytest.raises(ValueError, match='shape'):
    huggingface.load_t5(tmp_path / 'wide')
  rewrite_config(tmp_path / 'shallow', num_layers=2)
  with pytest.raises(ValueError, match='does not use.*encoder.block.2'):
    huggingface.load_t5(tmp_path / 'shallow')


def test_export_rejects_mlps_transformers_lacks(tmp_path):
  config = network.T5Config(
    vocab_size=8,
    emb_dim=4,
    num_heads=1,
    head_dim=4,
    mlp_dim=4,
    num_encoder_layers=1,
    num_decoder_layers=1,
    mlp_activations=('silu', 'linear'),
  )
  params, _ = network.random_params(config)
  with pytest.raises(ValueError, match='silu'):
    huggingface.save_t5(config, params, tmp_path)
