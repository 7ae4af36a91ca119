"""Model checkpoints for `network.Transformer` and `network.DecoderOnly`.

Reading, writing, recognizing. Every reader returns the parameters as T5X's
tree (`token_embedder/embedding`, `encoder/layers_0/attention/query/kernel`,
...; a decoder-only model's all under `decoder/`) of host numpy arrays, in the
stored dtype unless `dtype` asks for a cast; callers place or shard them. Four
formats are read, and `load_params(path, config)` tells them apart:

  * Ours (orbax), shared with the trainer: a `CheckpointManager` directory with
    one subdirectory per step (orbax's default names: `<directory>/<step>/`) and
    the items `params` and, when training wrote it, `opt_state`, each saved
    with `ocp.args.StandardSave`. `save_params` / `restore_params`.
  * T5X legacy (`t5x.checkpoints.Checkpointer`): `checkpoint_<step>/checkpoint`,
    a msgpack of `{'version': 3, 'optimizer': {'target': params, 'state':
    {'step', 'param_states'}}}` in which each partitioned array is replaced by
    the JSON of its tensorstore spec (zarr driver, kvstore path relative to the
    step directory, e.g. `target.encoder.layers_0.attention.query.kernel/`), and
    unpartitioned ones are stored inline. `load_t5x_params`.
  * T5X orbax (`t5x.checkpoints.OrbaxCheckpointManagerInterface`):
    `checkpoint_<step>/state/`, an orbax PyTree item (recognized by its
    `_METADATA` file) holding `{'target': params, 'state': ...}`. Only
    `target` is read. `load_t5x_params`.
  * Hugging Face: a transformers `T5ForConditionalGeneration` directory
    (`config.json` + safetensors; T5 encoder-decoders only), read and written
    by the `huggingface` module, which `load_params` calls.

`check_params(params, config)` (from `checkpoints.common`, shared with the
Hugging Face importer) compares a tree with the configured network and names
the first missing, unexpected or mis-shaped parameter; the loaders run it on
shapes alone, before reading any array, when given a `config`.

Missing checkpoints (and a plain file given as a checkpoint directory) raise
FileNotFoundError naming the path and what was looked for; a file that exists
but does not parse as its format (truncated, overwritten) raises
`CorruptCheckpointError`, a ValueError naming the file and the format; other
malformed or mismatched checkpoints raise ValueError.
"""

import copy
import os
import posixpath
import re
from typing import Any, Dict, Iterator, Optional, Tuple

from etils import epath
from flax import serialization
from flax import traverse_util
import jax
import jax.numpy as jnp

import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from speculative_t5x import network
from speculative_t5x.checkpoints.common import JSON_ERRORS
from speculative_t5x.checkpoints.common import T5X_CHECKPOINT_FILE
from speculative_t5x.checkpoints.common import (
  CorruptCheckpointError as CorruptCheckpointError,
)  # Re-exported.
from speculative_t5x.checkpoints.common import Params
from speculative_t5x.checkpoints.common import PathLike
from speculative_t5x.checkpoints.common import absolute_path
from speculative_t5x.checkpoints.common import check_params as check_params  # Re-exported.
from speculative_t5x.checkpoints.common import check_shapes
from speculative_t5x.checkpoints.common import checkpoint_directory
from speculative_t5x.checkpoints.common import compare_shapes as compare_shapes  # Re-exported.
from speculative_t5x.checkpoints.common import flat_shapes as flat_shapes  # Re-exported.
from speculative_t5x.checkpoints.common import parsing


# Format names returned by `checkpoint_format`.
ORBAX = 'orbax'
T5X_LEGACY = 't5x_legacy'
T5X_ORBAX = 't5x_orbax'
HUGGINGFACE = 'huggingface'

# Our layout: the items of each step (the trainer writes both).
PARAMS_ITEM = 'params'
OPT_STATE_ITEM = 'opt_state'
ITEM_NAMES = (PARAMS_ITEM, OPT_STATE_ITEM)
# T5X's layouts, in each checkpoint_<step> directory.
T5X_STATE_ITEM = 'state'  # The orbax item T5X writes the train state to.
ORBAX_METADATA_FILE = '_METADATA'  # Marks an orbax PyTree item.
_T5X_STEP_DIR = re.compile(r'checkpoint_(\d+)')
# Keys that identify a serialized tensorstore spec among msgpack leaves.
_TS_SPEC_KEYS = frozenset({'driver', 'kvstore', 'metadata'})
_ORBAX_FORMAT = 'orbax checkpoint metadata (JSON)'
_T5X_ORBAX_FORMAT = 'the orbax metadata of a T5X checkpoint (JSON)'


def _cast(params: Params, dtype: Optional[Any]) -> Params:
  if dtype is None:
    return params
  return jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype), copy=False), params)


def _numpy_restore_args(metadata_tree: Any, dtype: Optional[Any]) -> Any:
  """orbax RestoreArgs that read every array of a tree to host numpy, cast to dtype."""
  dtype = None if dtype is None else jnp.dtype(dtype)
  return jax.tree.map(
    lambda _: ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype), metadata_tree
  )


def _listing(path: epath.Path, limit: int = 10) -> str:
  names = sorted(child.name for child in path.iterdir())
  return f'{names[:limit]}{"..." if len(names) > limit else ""}'


# ------------------------------------------------------------------------------
# Our checkpoints (orbax; the layout the trainer writes).
# ------------------------------------------------------------------------------
def save_params(directory: PathLike, params: Params, step: int = 0) -> None:
  """Writes a params-only checkpoint in the trainer's layout.

  `<directory>/<step>/params/`, written by
  `ocp.CheckpointManager(directory, item_names=ITEM_NAMES)` with
  `ocp.args.StandardSave(params)`; returns once the write is complete.

  Args:
    directory: the model directory (created if missing; local or gs://).
    params: nested dict of arrays (numpy or jax) in the T5X tree.
    step: the step to write; must not exist yet.
  """
  directory = absolute_path(epath.Path(directory))
  with ocp.CheckpointManager(
    directory, item_names=ITEM_NAMES, options=ocp.CheckpointManagerOptions()
  ) as manager:
    if step in manager.all_steps():
      raise ValueError(
        f'{directory} already has a checkpoint for step {step}; choose another step or directory.'
      )
    manager.save(step, args=ocp.args.Composite(**{PARAMS_ITEM: ocp.args.StandardSave(params)}))


def restore_params(
  directory: PathLike,
  step: Optional[int] = None,
  dtype: Optional[Any] = None,
  *,
  config: Optional[network.NetworkConfig] = None,
) -> Params:
  """Reads the `params` item of a checkpoint in the trainer's layout.

  Works on what `save_params` writes and on the trainer's checkpoints (which
  also hold `opt_state`; only `params` is read).

  Args:
    directory: the model directory holding `<step>/params/`.
    step: the step to read; the latest by default.
    dtype: cast every array to this dtype on restore (e.g. 'bfloat16');
      None keeps the stored dtypes.
    config: if given, the stored shapes are checked against
      `network.module_for(config)` (see `check_params`) before anything is read.

  Returns:
    Nested dict of numpy arrays.
  """
  directory = checkpoint_directory(directory)
  # Handlers for both items, though only `params` is read: orbax warns about
  # items it has no handler for.
  handlers = {name: ocp.PyTreeCheckpointHandler() for name in ITEM_NAMES}
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  with ocp.CheckpointManager(directory, item_handlers=handlers, options=options) as manager:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(
        f'No orbax checkpoint in {directory}: expected step directories <step>/{PARAMS_ITEM}/ '
        f'as save_params and the trainer write them; found {_listing(directory)}.'
      )
    step = max(steps) if step is None else step
    if step not in steps:
      raise ValueError(
        f'{directory} has no checkpoint for step {step}; it has steps {sorted(steps)}.'
      )
    with parsing(
      directory / str(step) / PARAMS_ITEM / ORBAX_METADATA_FILE, _ORBAX_FORMAT, JSON_ERRORS
    ):
      metadata = manager.item_metadata(step).get(PARAMS_ITEM)
    if metadata is None:
      raise FileNotFoundError(
        f'The checkpoint of step {step} in {directory} has no {PARAMS_ITEM!r} item.'
      )
    metadata = metadata.tree
    if config is not None:
      check_shapes(metadata, config, f'The checkpoint {directory} (step {step})')
    restored = manager.restore(
      step,
      args=ocp.args.Composite(
        **{
          PARAMS_ITEM: ocp.args.PyTreeRestore(
            metadata, restore_args=_numpy_restore_args(metadata, dtype)
          )
        }
      ),
    )
  return restored[PARAMS_ITEM]


# ------------------------------------------------------------------------------
# T5X checkpoints (legacy msgpack + tensorstore, and orbax).
# ------------------------------------------------------------------------------
def _t5x_orbax_item(step_dir: epath.Path) -> Optional[epath.Path]:
  """The orbax item holding a T5X train state in a step directory, if any."""
  for item in (step_dir / T5X_STATE_ITEM, step_dir):
    if (item / ORBAX_METADATA_FILE).exists():
      return item
  return None


def _is_t5x_step_dir(path: epath.Path) -> bool:
  return (path / T5X_CHECKPOINT_FILE).is_file() or _t5x_orbax_item(path) is not None


def _t5x_latest_step_dir(path: epath.Path) -> Optional[epath.Path]:
  """`path` if it is a step directory, else its `checkpoint_<step>` of largest step."""
  if _is_t5x_step_dir(path):
    return path
  steps = {
    int(match.group(1)): child
    for child in path.iterdir()
    if (match := _T5X_STEP_DIR.fullmatch(child.name)) and child.is_dir()
  }
  return steps[max(steps)] if steps else None


def _absolute_ts_spec(spec: Dict[str, Any], step_dir: str) -> Dict[str, Any]:
  """The spec to open an array T5X stored at a path relative to its step directory.

  As T5X's reader does, drops the stored chunking and compression (the array's
  own `.zarray` has them), keeps the shape (tensorstore checks it), and
  rewrites the kvstore: `gcs` with the bucket and prefix of a gs:// step
  directory, else `file`. T5X stores `gcs` specs with a placeholder bucket for
  checkpoints written to GCS and `file` (once `gfile`) specs otherwise, always
  with relative paths, so checkpoints can be copied between the two.

  Args:
    spec: the JSON of a tensorstore spec, as stored in the msgpack.
    step_dir: the `checkpoint_<step>` directory (local path or gs:// URL).
  """
  spec = copy.deepcopy(spec)
  if spec.get('dtype') == 'uint16' or spec['metadata'].get('dtype') == '<u2':
    raise ValueError(
      'This T5X checkpoint stores bfloat16 as uint16 (checkpoint version 2); '
      'T5X does not read it either. Re-save it with a current T5X.'
    )
  for key in ('chunks', 'compressor'):
    spec['metadata'].pop(key, None)
  kvstore = spec['kvstore']
  # tensorstore < 0.1.14 specs kept the path at the top level.
  relative = spec.pop('path', None) or kvstore.get('path')
  if kvstore.get('driver') not in ('file', 'gfile', 'gcs') or not relative:
    raise ValueError(f'Unsupported tensorstore location in a T5X checkpoint: {kvstore}.')
  gcs = re.fullmatch(r'gs://([^/]+)/(.*)', step_dir, re.DOTALL)
  if gcs:
    spec['kvstore'] = {
      'driver': 'gcs',
      'bucket': gcs.group(1),
      'path': posixpath.join(gcs.group(2), relative),
    }
  else:
    spec['kvstore'] = {'driver': 'file', 'path': os.path.join(step_dir, relative)}
  return spec


def _t5x_target_leaves(
  tree: Any, prefix: Tuple[str, ...] = ()
) -> Iterator[Tuple[Tuple[str, ...], Any]]:
  """(path, inline numpy array or tensorstore spec dict) for each stored parameter."""
  if isinstance(tree, dict) and not _TS_SPEC_KEYS <= tree.keys():
    for key, value in tree.items():
      yield from _t5x_target_leaves(value, prefix + (key,))
  else:
    yield prefix, tree


def _load_t5x_legacy(
  step_dir: epath.Path, config: Optional[network.NetworkConfig], dtype: Optional[Any]
) -> Params:
  checkpoint_file = step_dir / T5X_CHECKPOINT_FILE
  raw = checkpoint_file.read_bytes()
  if raw.startswith(b'model_checkpoint_path'):
    raise ValueError(
      f'{checkpoint_file} is a TensorFlow (Mesh TensorFlow) checkpoint index, not '
      'a T5X checkpoint; convert it with t5x/scripts/convert_tf_checkpoint.py.'
    )
  # msgpack's errors for truncated or foreign bytes are all ValueErrors.
  with parsing(checkpoint_file, 'a T5X legacy checkpoint (msgpack)', (ValueError,)):
    contents = serialization.msgpack_restore(raw)
  if not isinstance(contents, dict) or 'optimizer' not in contents:
    keys = sorted(contents) if isinstance(contents, dict) else type(contents).__name__
    raise ValueError(
      f'{checkpoint_file} is not a T5X checkpoint: expected a msgpack with keys '
      f"'version' and 'optimizer', found {keys}."
    )
  if contents.get('version', 0) < 2:
    raise ValueError(
      f'{checkpoint_file} has T5X checkpoint version {contents.get("version", 0)}; '
      'versions before 2 are not supported (T5X does not read them either).'
    )
  if 'target' not in contents['optimizer']:
    raise ValueError(f"{checkpoint_file} has no 'optimizer/target' parameters.")
  leaves = dict(_t5x_target_leaves(contents['optimizer']['target']))
  specs, shapes = {}, {}
  for path, leaf in leaves.items():
    if isinstance(leaf, dict):
      specs[path] = _absolute_ts_spec(leaf, os.fspath(step_dir))
      shapes[path] = tuple(leaf['metadata']['shape'])
    elif isinstance(leaf, np.ndarray):
      shapes[path] = leaf.shape
    else:
      raise ValueError(
        f'{checkpoint_file} stores parameter {"/".join(path)} as '
        f'{type(leaf).__name__}, not as an array or a tensorstore spec.'
      )
  if config is not None:
    check_shapes(traverse_util.unflatten_dict(shapes), config, f'The T5X checkpoint {step_dir}')
  # Open and read all arrays concurrently (many requests in flight on GCS).
  opening = {path: ts.open(spec, open=True, read=True) for path, spec in specs.items()}
  arrays = {path: leaf for path, leaf in leaves.items() if path not in specs}
  try:
    reading = {}
    for path, future in opening.items():
      reading[path] = future.result().read()
    for path, future in reading.items():
      arrays[path] = future.result()
  except ValueError as error:  # tensorstore's error for a missing or malformed array.
    raise ValueError(
      f'Cannot read parameter {"/".join(path)} of the T5X checkpoint {step_dir} '
      f'from {specs[path]["kvstore"]["path"]}: {error}'
    ) from error
  return _cast(traverse_util.unflatten_dict(arrays), dtype)


def _load_t5x_orbax(
  item: epath.Path, config: Optional[network.NetworkConfig], dtype: Optional[Any]
) -> Params:
  # The handler, not a Checkpointer: the step-level _CHECKPOINT_METADATA is one
  # directory up, and a Checkpointer on the item warns that it is missing.
  handler = ocp.PyTreeCheckpointHandler()
  with parsing(item / ORBAX_METADATA_FILE, _T5X_ORBAX_FORMAT, JSON_ERRORS):
    tree = handler.metadata(item).tree
  if 'target' not in tree:
    raise ValueError(
      f"{item} is an orbax checkpoint without T5X's 'target' parameters "
      f'(its top-level entries: {sorted(tree)}).'
    )
  target = tree['target']
  if config is not None:
    check_shapes(target, config, f'The T5X checkpoint {item}')
  restored = handler.restore(
    item,
    args=ocp.args.PyTreeRestore(
      {'target': target},
      restore_args={'target': _numpy_restore_args(target, dtype)},
      partial_restore=True,
    ),
  )
  return restored['target']


def load_t5x_params(
  path: PathLike,
  dtype: Optional[Any] = None,
  *,
  config: Optional[network.NetworkConfig] = None,
) -> Params:
  """Reads the parameters (`target`) of a T5X checkpoint.

  Reads both formats T5X writes: legacy (`checkpoint_<step>/checkpoint`
  msgpack + tensorstore arrays, float32 or bfloat16, local or gs://) and orbax
  (`checkpoint_<step>/state/` with `_METADATA`). Optimizer state is not read.

  Args:
    path: a `checkpoint_<step>` directory (or its `checkpoint` msgpack file),
      or the model directory holding them (then the largest step is read).
    dtype: cast every parameter to this dtype (e.g. 'float32'); None keeps the
      stored dtypes.
    config: if given, the stored shapes are checked against
      `network.module_for(config)` (see `check_params`) before any array is read.

  Returns:
    Nested dict of numpy arrays in the T5X tree.
  """
  path = checkpoint_directory(path)
  step_dir = _t5x_latest_step_dir(path)
  if step_dir is None:
    raise FileNotFoundError(
      f'No T5X checkpoint at {path}: expected a checkpoint_<step> directory holding a '
      f'{T5X_CHECKPOINT_FILE!r} msgpack file (legacy) or an orbax {T5X_STATE_ITEM!r} item '
      f'with {ORBAX_METADATA_FILE}, or a directory of them; found {_listing(path)}.'
    )
  if not _is_t5x_step_dir(step_dir):
    raise FileNotFoundError(
      f'{step_dir} holds neither a {T5X_CHECKPOINT_FILE!r} msgpack file nor an orbax '
      f'{T5X_STATE_ITEM!r} item; found {_listing(step_dir)}. An interrupted save? Pass an '
      'earlier checkpoint_<step> directory.'
    )
  item = _t5x_orbax_item(step_dir)
  if item is not None:
    return _load_t5x_orbax(item, config, dtype)
  return _load_t5x_legacy(step_dir, config, dtype)


# ------------------------------------------------------------------------------
# One entry point for inference.
# ------------------------------------------------------------------------------
def _is_orbax_step_dir(path: epath.Path) -> bool:
  return path.name.isdigit() and (path / PARAMS_ITEM).is_dir()


def checkpoint_format(path: PathLike) -> str:
  """Which checkpoint `path` holds: ORBAX, T5X_LEGACY, T5X_ORBAX or HUGGINGFACE.

  Recognized, in this order: a Hugging Face directory (`config.json`); our
  layout (`<step>/params/` below `path`, or `path` itself such a step
  directory); a T5X checkpoint (`checkpoint_<step>` directories below `path`,
  or `path` itself one; the latest step decides legacy or orbax).
  """
  from speculative_t5x.checkpoints import huggingface  # pylint: disable=g-import-not-at-top

  path = checkpoint_directory(path)
  if (path / huggingface.CONFIG_FILE).is_file():
    return HUGGINGFACE
  if _is_orbax_step_dir(path) or any(_is_orbax_step_dir(child) for child in path.iterdir()):
    return ORBAX
  step_dir = _t5x_latest_step_dir(path)
  if step_dir is not None and _is_t5x_step_dir(step_dir):
    return T5X_LEGACY if _t5x_orbax_item(step_dir) is None else T5X_ORBAX
  raise FileNotFoundError(
    f'No checkpoint at {path}. Looked for a Hugging Face directory ({huggingface.CONFIG_FILE} + '
    f'{huggingface.WEIGHTS_FILE}), orbax steps (<step>/{PARAMS_ITEM}/, written by save_params or the '
    f'trainer), and T5X checkpoints (checkpoint_<step>/{T5X_CHECKPOINT_FILE} or '
    f'checkpoint_<step>/{T5X_STATE_ITEM}/{ORBAX_METADATA_FILE}); found {_listing(path)}.'
  )


def load_params(
  path: PathLike, config: Optional[network.NetworkConfig] = None, dtype: Optional[Any] = None
) -> Params:
  """Reads the parameters of any checkpoint this module knows (`checkpoint_format`).

  Args:
    path: our orbax model directory (or one `<step>` directory of it, else the
      latest step is read); a T5X model directory (latest step) or
      `checkpoint_<step>` directory, legacy or orbax; or a Hugging Face
      directory.
    config: if given, the parameters are checked against `module_for(config)`
      (`check_params`; for T5X and orbax checkpoints before any array is read). A
      Hugging Face directory records its own architecture
      (`huggingface.t5_config(path)` returns it); a given config must then agree
      with it in every field but the compute settings (dtype, dropout,
      float32 attention logits). T5X and orbax checkpoints record none.
    dtype: cast every parameter to this dtype; None keeps the stored dtypes
      (float32 for Hugging Face directories).

  Returns:
    Nested dict of numpy arrays in the T5X tree.
  """
  kind = checkpoint_format(path)
  path = checkpoint_directory(path)
  if kind == HUGGINGFACE:
    from speculative_t5x.checkpoints import huggingface  # pylint: disable=g-import-not-at-top

    return _cast(huggingface.load_t5(os.fspath(path), config)[1], dtype)
  if kind == ORBAX:
    if _is_orbax_step_dir(path):
      return restore_params(path.parent, int(path.name), dtype, config=config)
    return restore_params(path, None, dtype, config=config)
  return load_t5x_params(path, dtype, config=config)
