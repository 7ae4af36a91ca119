"""Checkpoint formats: ours (orbax), T5X legacy and orbax, Hugging Face; dispatch; errors.

The T5X fixtures are written the way T5X writes them (`t5x/checkpoints.py`:
`Checkpointer.save` / `_write_state_to_tensorstore` / `_get_spec` for the
legacy format, `OrbaxCheckpointManagerInterface.save` for orbax), so the reader
is tested against the on-disk format, not against itself.
"""

import dataclasses
import functools
import os
import shutil

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from speculative_t5x import checkpoints
from speculative_t5x.checkpoints import huggingface
from speculative_t5x import network
from testing_utils import assert_trees_equal, write_t5x_legacy, write_t5x_orbax

# Two encoder layers and one decoder layer, so that a swap of the stacks shows.
CONFIG = network.T5Config(
  vocab_size=64,
  emb_dim=16,
  num_heads=2,
  head_dim=8,
  mlp_dim=32,
  num_encoder_layers=2,
  num_decoder_layers=1,
  dtype='float32',
)
# The readers return host numpy arrays.
_assert_trees_equal = functools.partial(assert_trees_equal, numpy_leaves=True)


def _params(seed=0, config=CONFIG):
  return network.random_params(config, seed)[0]


def _write_trainer_checkpoint(model_dir, step, params):
  """Both items, as the trainer writes them."""
  opt_state = optax.adam(1e-3).init(params)
  with ocp.CheckpointManager(
    model_dir, item_names=checkpoints.ITEM_NAMES, options=ocp.CheckpointManagerOptions()
  ) as manager:
    manager.save(
      step,
      args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state)
      ),
    )


# ------------------------------------------------------------------------------
# T5X legacy.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize('dtype', [np.float32, jnp.bfloat16])
def test_t5x_legacy_round_trip(tmp_path, dtype):
  params = _params()
  step_dir = write_t5x_legacy(tmp_path, 7, params, dtype)
  zarr_dirs = sorted(name for name in os.listdir(step_dir) if name.startswith('target.'))
  assert 'target.encoder.layers_0.attention.query.kernel' in zarr_dirs
  assert 'target.encoder.encoder_norm.scale' not in zarr_dirs  # Stored inline.
  _assert_trees_equal(checkpoints.load_t5x_params(step_dir, config=CONFIG), params, dtype)
  # Casting on restore, both ways.
  _assert_trees_equal(
    checkpoints.load_t5x_params(step_dir, 'float32'),
    jax.tree.map(lambda x: np.asarray(x).astype(dtype), params),
    np.float32,
  )
  _assert_trees_equal(checkpoints.load_t5x_params(step_dir, jnp.bfloat16), params, jnp.bfloat16)


def test_t5x_legacy_written_on_gcs_reads_locally(tmp_path):
  params = _params()
  write_t5x_legacy(tmp_path, 1, params, kvstore_driver='gcs')
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path), params)


def test_t5x_parent_directory_means_latest_step(tmp_path):
  old, new = _params(seed=1), _params(seed=2)
  write_t5x_legacy(tmp_path, 9, old)
  write_t5x_legacy(tmp_path, 10, new)  # 10 > 9 numerically, not as text.
  (tmp_path / 'checkpoint_11.tmp-1700000000').mkdir()  # An unfinished save.
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path), new)
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path / 'checkpoint_9'), old)


def test_ts_spec_locations():
  """Relative paths resolve against the step directory; gs:// gets its bucket."""
  metadata = {'chunks': [2, 3], 'compressor': {'id': 'gzip', 'level': 1}, 'shape': [4, 3]}
  stored = {
    'driver': 'zarr',
    'dtype': 'bfloat16',
    'metadata': metadata,
    'kvstore': {'driver': 'gcs', 'bucket': 't5x-dummy-bucket', 'path': 'target.a.b/'},
  }
  assert checkpoints._absolute_ts_spec(stored, 'gs://my-bucket/runs/x/checkpoint_5') == {
    'driver': 'zarr',
    'dtype': 'bfloat16',
    'metadata': {'shape': [4, 3]},
    'kvstore': {'driver': 'gcs', 'bucket': 'my-bucket', 'path': 'runs/x/checkpoint_5/target.a.b/'},
  }
  # tensorstore < 0.1.14 kept the path at the top level; `gfile` is TensorFlow's file system.
  old = {
    'driver': 'zarr',
    'path': 'target.a.b',
    'metadata': {'shape': [4, 3]},
    'kvstore': {'driver': 'gfile'},
  }
  assert checkpoints._absolute_ts_spec(old, '/ckpt/checkpoint_5')['kvstore'] == {
    'driver': 'file',
    'path': '/ckpt/checkpoint_5/target.a.b',
  }
  assert stored['metadata'] is metadata and 'chunks' in metadata  # Not modified.
  with pytest.raises(ValueError, match='uint16'):
    checkpoints._absolute_ts_spec({**stored, 'dtype': 'uint16'}, '/ckpt/checkpoint_5')


def test_t5x_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match=f'{tmp_path / "absent"}.*does not exist'):
    checkpoints.load_t5x_params(tmp_path / 'absent')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(FileNotFoundError, match=r'No T5X checkpoint at .*empty.*checkpoint_<step>'):
    checkpoints.load_t5x_params(tmp_path / 'empty')

  # A size mismatch names the first mis-shaped parameter and both shapes.
  wide = dataclasses.replace(CONFIG, mlp_dim=48)
  step_dir = write_t5x_legacy(tmp_path / 'wide', 1, _params(config=wide))
  with pytest.raises(
    ValueError,
    match=r'decoder/layers_0/mlp/wi_0/kernel has shape \(16, 48\), '
    r'but the configured network needs \(16, 32\)',
  ):
    checkpoints.load_t5x_params(step_dir, config=CONFIG)
  # A parameter the config needs but the checkpoint lacks.
  tied = dataclasses.replace(CONFIG, logits_via_embedding=True)
  step_dir = write_t5x_legacy(tmp_path / 'tied', 1, _params(config=tied))
  with pytest.raises(
    ValueError, match=r'decoder/logits_dense/kernel \(shape \(16, 64\)\) is missing'
  ):
    checkpoints.load_t5x_params(step_dir, config=CONFIG)
  with pytest.raises(ValueError, match='logits_dense/kernel .* is not part of the configured'):
    checkpoints.load_t5x_params(tmp_path / 'wide', config=dataclasses.replace(tied, mlp_dim=48))
  # An array the msgpack refers to but whose zarr directory is gone.
  step_dir = write_t5x_legacy(tmp_path / 'partial', 1, _params())
  shutil.rmtree(step_dir / 'target.decoder.layers_0.mlp.wo.kernel')
  with pytest.raises(ValueError, match=r'parameter decoder/layers_0/mlp/wo/kernel .*NOT_FOUND'):
    checkpoints.load_t5x_params(step_dir)
  # An interrupted save: the step directory holds no checkpoint.
  (tmp_path / 'partial' / 'checkpoint_2').mkdir()
  with pytest.raises(FileNotFoundError, match='checkpoint_2 holds neither'):
    checkpoints.load_t5x_params(tmp_path / 'partial')


# ------------------------------------------------------------------------------
# T5X orbax.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize('dtype', [np.float32, jnp.bfloat16])
def test_t5x_orbax_round_trip(tmp_path, dtype):
  old, new = _params(seed=1), _params(seed=2)
  write_t5x_orbax(tmp_path, 3, old, dtype)
  step_dir = write_t5x_orbax(tmp_path, 12, new, dtype)
  assert (step_dir / 'state' / '_METADATA').is_file()
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path, config=CONFIG), new, dtype)
  _assert_trees_equal(checkpoints.load_t5x_params(tmp_path / 'checkpoint_3'), old, dtype)
  _assert_trees_equal(
    checkpoints.load_t5x_params(step_dir, 'float32'),
    jax.tree.map(lambda x: np.asarray(x).astype(dtype), new),
    np.float32,
  )
  with pytest.raises(ValueError, match='decoder/layers_0/mlp/wi_0/kernel has shape'):
    checkpoints.load_t5x_params(step_dir, config=dataclasses.replace(CONFIG, mlp_dim=48))


# ------------------------------------------------------------------------------
# Ours (orbax, shared with the trainer).
# ------------------------------------------------------------------------------
def test_save_and_restore_params(tmp_path, monkeypatch):
  params = _params()
  monkeypatch.chdir(tmp_path)  # orbax itself accepts only absolute paths.
  checkpoints.save_params('model', params, step=4)
  written = os.listdir(tmp_path / 'model' / '4')
  assert 'params' in written and 'opt_state' not in written
  _assert_trees_equal(checkpoints.restore_params('model'), params)
  _assert_trees_equal(
    checkpoints.restore_params(tmp_path / 'model', 4, 'bfloat16', config=CONFIG),
    params,
    jnp.bfloat16,
  )
  with pytest.raises(ValueError, match='already has a checkpoint for step 4'):
    checkpoints.save_params(tmp_path / 'model', params, step=4)


def test_restore_params_of_a_trainer_checkpoint(tmp_path):
  """Only `params` is read from a params + opt_state checkpoint; latest step first."""
  old, new = _params(seed=1), _params(seed=2)
  _write_trainer_checkpoint(tmp_path, 100, old)
  _write_trainer_checkpoint(tmp_path, 1000, new)
  _assert_trees_equal(checkpoints.restore_params(tmp_path), new)
  _assert_trees_equal(checkpoints.restore_params(tmp_path, step=100), old)
  with pytest.raises(ValueError, match=r'no checkpoint for step 5; it has steps \[100, 1000\]'):
    checkpoints.restore_params(tmp_path, step=5)
  with pytest.raises(ValueError, match='wi_0/kernel has shape'):
    checkpoints.restore_params(tmp_path, config=dataclasses.replace(CONFIG, mlp_dim=48))


def test_restore_params_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    checkpoints.restore_params(tmp_path / 'absent')
  with pytest.raises(FileNotFoundError, match=r'No orbax checkpoint in .*<step>/params/'):
    checkpoints.restore_params(tmp_path)
  with ocp.CheckpointManager(tmp_path, item_names=checkpoints.ITEM_NAMES) as manager:
    manager.save(
      1, args=ocp.args.Composite(opt_state=ocp.args.StandardSave({'count': np.zeros((), np.int32)}))
    )
  with pytest.raises(FileNotFoundError, match="step 1 .* has no 'params' item"):
    checkpoints.restore_params(tmp_path)


# ------------------------------------------------------------------------------
# Validation and dispatch.
# ------------------------------------------------------------------------------
def test_check_params_names_the_first_problem():
  params = _params()
  checkpoints.check_params(params, CONFIG)
  flat = traverse_util.flatten_dict(params)
  missing = traverse_util.unflatten_dict(
    {k: v for k, v in flat.items() if k != ('encoder', 'relpos_bias', 'rel_embedding')}
  )
  with pytest.raises(
    ValueError,
    match=r'encoder/relpos_bias/rel_embedding \(shape \(2, 32\)\) '
    r'is missing \(1 missing, 0 unexpected, 0 mis-shaped\)\. The config has vocab_size=64',
  ):
    checkpoints.check_params(missing, CONFIG)
  extra = traverse_util.unflatten_dict(
    {**flat, ('encoder', 'layers_2', 'mlp', 'wo', 'kernel'): np.zeros((32, 16))}
  )
  with pytest.raises(
    ValueError,
    match=r'encoder/layers_2/mlp/wo/kernel \(shape \(32, 16\)\) is '
    'not part of the configured network',
  ):
    checkpoints.check_params(extra, CONFIG)
  fewer_heads = dataclasses.replace(CONFIG, num_heads=1)
  with pytest.raises(
    ValueError,
    match=r'has shape \(16, 16\), but the configured network needs \(16, 8\) '
    r'\(0 missing, 0 unexpected, \d+ mis-shaped\)',
  ):
    checkpoints.check_params(params, fewer_heads)


def test_load_params_dispatches_on_the_format(tmp_path, monkeypatch):
  params = _params()
  monkeypatch.chdir(tmp_path)
  write_t5x_legacy(tmp_path / 't5x_legacy', 1, params)
  write_t5x_orbax(tmp_path / 't5x_orbax', 1, params)
  checkpoints.save_params(tmp_path / 'orbax', params, step=2)
  for kind, path in [
    (checkpoints.T5X_LEGACY, tmp_path / 't5x_legacy'),
    (checkpoints.T5X_LEGACY, tmp_path / 't5x_legacy' / 'checkpoint_1'),
    (checkpoints.T5X_LEGACY, tmp_path / 't5x_legacy' / 'checkpoint_1' / 'checkpoint'),
    (checkpoints.T5X_ORBAX, tmp_path / 't5x_orbax'),
    (checkpoints.T5X_ORBAX, tmp_path / 't5x_orbax' / 'checkpoint_1'),
    (checkpoints.ORBAX, tmp_path / 'orbax'),
    (checkpoints.ORBAX, tmp_path / 'orbax' / '2'),
  ]:
    assert checkpoints.checkpoint_format(path) == kind, path
    _assert_trees_equal(checkpoints.load_params(path, CONFIG), params)
    relative = str(path.relative_to(tmp_path))
    _assert_trees_equal(checkpoints.load_params(relative, dtype='bfloat16'), params, jnp.bfloat16)


def test_load_params_of_a_huggingface_directory(tmp_path):
  pytest.importorskip('safetensors', reason='Hugging Face checkpoints need safetensors')
  params = _params()
  hf_config = dataclasses.replace(CONFIG, dtype=jnp.bfloat16)
  huggingface.save_t5(hf_config, params, str(tmp_path))
  assert checkpoints.checkpoint_format(tmp_path) == checkpoints.HUGGINGFACE
  _assert_trees_equal(checkpoints.load_params(tmp_path, CONFIG), params)
  _assert_trees_equal(checkpoints.load_params(tmp_path, dtype='bfloat16'), params, jnp.bfloat16)
  # The directory records its architecture; a given config must agree with it.
  assert huggingface.t5_config(str(tmp_path)) == hf_config
  with pytest.raises(
    ValueError,
    match='logits_via_embedding=True, but the checkpoint .* has logits_via_embedding=False',
  ):
    checkpoints.load_params(tmp_path, dataclasses.replace(CONFIG, logits_via_embedding=True))


def test_load_params_without_a_checkpoint(tmp_path):
  with pytest.raises(FileNotFoundError, match=f'No checkpoint at {tmp_path / "absent"}'):
    checkpoints.load_params(tmp_path / 'absent', CONFIG)
  (tmp_path / 'notes.txt').write_text('')
  with pytest.raises(
    FileNotFoundError,
    match=r'(?s)Hugging Face.*<step>/params/.*'
    r'checkpoint_<step>/checkpoint.*notes\.txt',
  ):
    checkpoints.load_params(tmp_path, CONFIG)


def _cut_in_half(path):
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])
  return path


def _corrupt_t5x_legacy(tmp_path):
  return _cut_in_half(write_t5x_legacy(tmp_path, 1, _params()) / 'checkpoint'), 'msgpack'


def _corrupt_t5x_orbax(tmp_path):
  return _cut_in_half(write_t5x_orbax(tmp_path, 1, _params()) / 'state' / '_METADATA'), 'orbax'


def _corrupt_orbax(tmp_path):
  checkpoints.save_params(tmp_path, _params(), step=1)
  return _cut_in_half(tmp_path / '1' / 'params' / '_METADATA'), 'orbax'


def _corrupt_huggingface_config(tmp_path):
  pytest.importorskip('safetensors', reason='Hugging Face checkpoints need safetensors')
  huggingface.save_t5(CONFIG, _params(), str(tmp_path))
  return _cut_in_half(tmp_path / 'config.json'), 'JSON'


def _corrupt_huggingface_weights(tmp_path):
  pytest.importorskip('safetensors', reason='Hugging Face checkpoints need safetensors')
  huggingface.save_t5(CONFIG, _params(), str(tmp_path))
  (tmp_path / 'model.safetensors').write_bytes(b'\xff' * 16)  # "header too large".
  return tmp_path / 'model.safetensors', 'safetensors'


@pytest.mark.parametrize(
  'corrupt',
  [
    _corrupt_t5x_legacy,
    _corrupt_t5x_orbax,
    _corrupt_orbax,
    _corrupt_huggingface_config,
    _corrupt_huggingface_weights,
  ],
)
def test_a_damaged_file_is_named_with_the_format_it_should_hold(tmp_path, corrupt):
  damaged, expected_format = corrupt(tmp_path)
  with pytest.raises(
    checkpoints.CorruptCheckpointError, match=f'{damaged} cannot be read as .*{expected_format}'
  ) as error:
    checkpoints.load_params(tmp_path, CONFIG)
  assert error.value.path == str(damaged)
  assert isinstance(error.value, ValueError)


def test_a_plain_file_is_not_called_a_missing_directory(tmp_path):
  (tmp_path / 'weights.bin').write_bytes(b'\0')
  for load in (
    checkpoints.load_params,
    checkpoints.load_t5x_params,
    checkpoints.restore_params,
    lambda path: huggingface.load_t5(str(path)),
  ):
    with pytest.raises(
      FileNotFoundError,
      match=r'weights\.bin is a file, not a checkpoint '
      f'directory.*{tmp_path}',
    ):
      load(tmp_path / 'weights.bin')
