"""What every checkpoint reader shares: its errors, the shape check, the directory it reads.

`check_params(params, config)` compares a parameter tree with the configured
network and names the first missing, unexpected or mis-shaped parameter;
`compare_shapes` gives all the differences. `CorruptCheckpointError` is the
ValueError of a file that exists but does not parse as its format.
"""

import contextlib
import dataclasses
import functools
import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from etils import epath

from speculative_t5x import network

Params = Dict[str, Any]
PathLike = epath.PathLike

# T5X's legacy msgpack, in each checkpoint_<step> directory; it may stand for its directory.
T5X_CHECKPOINT_FILE = 'checkpoint'


class CorruptCheckpointError(ValueError):
  """A checkpoint file that exists but cannot be parsed as the format it belongs to.

  Attributes:
    path: the file, as a string.
    expected: the format the file should hold, in words (e.g. 'a T5X legacy
      checkpoint (msgpack)').
    cause: what the parser said.
    owner: whose checkpoint it is, in words (e.g. "the draft checkpoint
      (DRAFT_CHECKPOINT_PATH = '/ckpt/small')"), if the caller knows it.
  """

  def __init__(self, path: PathLike, expected: str, cause: str, owner: Optional[str] = None):
    self.path, self.expected, self.cause, self.owner = os.fspath(path), expected, cause, owner
    whose = f'{owner[0].upper()}{owner[1:]} is damaged: ' if owner else ''
    super().__init__(
      f'{whose}{self.path} cannot be read as {expected} ({cause}). The file is '
      'truncated or overwritten (an interrupted save or copy?): save or copy '
      'the checkpoint again.'
    )

  def with_owner(self, owner: str) -> 'CorruptCheckpointError':
    """The same error, its message saying whose checkpoint the file belongs to."""
    return CorruptCheckpointError(self.path, self.expected, self.cause, owner)


@contextlib.contextmanager
def parsing(path: PathLike, expected: str, errors: Tuple[type, ...]) -> Iterator[None]:
  """Turns a parser's `errors` raised inside the block into a CorruptCheckpointError.

  Args:
    path: the file being parsed.
    expected: the format it should hold, in words.
    errors: the exception types the parser raises for malformed input.
  """
  try:
    yield
  except errors as error:
    raise CorruptCheckpointError(path, expected, f'{type(error).__name__}: {error}') from error


# JSON files that cannot be parsed raise these (a binary file: UnicodeDecodeError).
JSON_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)


# ------------------------------------------------------------------------------
# Validation against the configured network.
# ------------------------------------------------------------------------------
def _describe(config: network.NetworkConfig) -> str:
  if network.is_decoder_only(config):
    layers = f'num_layers={config.num_layers}'
  else:
    layers = (
      f'num_encoder_layers={config.num_encoder_layers}, '
      f'num_decoder_layers={config.num_decoder_layers}'
    )
  return (
    f'vocab_size={config.vocab_size}, emb_dim={config.emb_dim}, '
    f'num_heads={config.num_heads}, head_dim={config.head_dim}, '
    f'mlp_dim={config.mlp_dim}, {layers}, '
    f'mlp_activations={config.mlp_activations}, '
    f'logits_via_embedding={config.logits_via_embedding}'
  )


Path = Tuple[str, ...]
Shape = Tuple[int, ...]


@functools.lru_cache(maxsize=16)
def expected_params(config: network.NetworkConfig) -> Params:
  """`network.abstract_params(config)[0]`, traced once per config (read-only)."""
  return network.abstract_params(config)[0]


def _leaf_shape(leaf: Any) -> Optional[Shape]:
  """A parameter leaf's shape, or None where the leaf does not say.

  Shape tuples are their own shape; arrays, `jax.ShapeDtypeStruct`s and
  orbax's array metadata have `.shape`; T5X's legacy msgpack holds a
  tensorstore spec dict (`{'driver', 'kvstore', 'metadata': {'shape'}}`) for
  each large array. Leaves of T5X's restored orbax state hold no global shape.
  """
  if isinstance(leaf, tuple):
    shape = leaf
  elif isinstance(leaf, Mapping):
    shape = leaf.get('metadata', {}).get('shape')
  else:
    shape = getattr(leaf, 'shape', None)
  return None if shape is None else tuple(int(dim) for dim in shape)


def flat_shapes(tree: Mapping[str, Any]) -> Dict[Path, Optional[Shape]]:
  """{path: shape, or None where the leaf has none} over a parameter tree.

  Args:
    tree: nested mappings whose leaves are shape tuples, have `.shape`
      (arrays, ShapeDtypeStructs, orbax array metadata) or are tensorstore
      spec dicts (leaves, not subtrees).
  """
  flat = {}
  for name, subtree in tree.items():
    if isinstance(subtree, Mapping) and 'driver' not in subtree:
      flat.update({(name, *path): shape for path, shape in flat_shapes(subtree).items()})
    else:
      flat[(name,)] = _leaf_shape(subtree)
  return flat


@dataclasses.dataclass(frozen=True)
class ShapeDifferences:
  """How a parameter tree differs from the tree a network needs (`compare_shapes`).

  Each list is sorted by path; paths are tuples of names.

  Attributes:
    mis_shaped: (path, found shape, expected shape) of parameters of both trees.
    missing: (path, expected shape) of parameters only the network has.
    unexpected: (path, found shape or None) of parameters only the tree has.
  """

  mis_shaped: Tuple[Tuple[Path, Shape, Shape], ...]
  missing: Tuple[Tuple[Path, Shape], ...]
  unexpected: Tuple[Tuple[Path, Optional[Shape]], ...]

  def __bool__(self) -> bool:
    return bool(self.mis_shaped or self.missing or self.unexpected)

  def summary(self, network_name: str) -> str:
    """The first difference in words (a mis-shaped one first), then the counts.

    Args:
      network_name: what needs the expected tree, for the message (e.g. 'the
        configured network', 'the draft network').

    Returns:
      e.g. 'encoder/layers_0/mlp/wi_0/kernel has shape (16, 48), but the
      configured network needs (16, 32) (0 missing, 0 unexpected, 3 mis-shaped)'.
    """
    if self.mis_shaped:
      path, found, want = self.mis_shaped[0]
      first = f'{"/".join(path)} has shape {found}, but {network_name} needs {want}'
    elif self.missing:
      path, want = self.missing[0]
      first = f'{"/".join(path)} (shape {want}) is missing'
    else:
      path, found = self.unexpected[0]
      shape = '' if found is None else f' (shape {found})'
      first = f'{"/".join(path)}{shape} is not part of {network_name}'
    return f'{first} ({self.counts()})'

  def counts(self) -> str:
    """e.g. '0 missing, 9 unexpected, 27 mis-shaped'."""
    return (
      f'{len(self.missing)} missing, {len(self.unexpected)} unexpected, '
      f'{len(self.mis_shaped)} mis-shaped'
    )


def compare_shapes(
  found_tree: Mapping[str, Any], expected_tree: Mapping[str, Any]
) -> ShapeDifferences:
  """The parameters `found_tree` lacks, has in excess or has in another shape.

  Leaves without a shape (see `flat_shapes`) are compared by path only.

  Args:
    found_tree: the parameters found (e.g. read from a checkpoint).
    expected_tree: the parameters a network needs (e.g.
      `network.abstract_params(config)[0]`).

  Returns:
    A `ShapeDifferences`, false when the trees match.
  """
  found, expected = flat_shapes(found_tree), flat_shapes(expected_tree)
  return ShapeDifferences(
    mis_shaped=tuple(
      (path, found[path], expected[path])
      for path in sorted(expected.keys() & found.keys())
      if found[path] is not None and expected[path] is not None and found[path] != expected[path]
    ),
    missing=tuple((path, expected[path]) for path in sorted(expected.keys() - found.keys())),
    unexpected=tuple((path, found[path]) for path in sorted(found.keys() - expected.keys())),
  )


def check_shapes(tree: Any, config: network.NetworkConfig, source: str) -> None:
  """Raises ValueError unless `tree` has exactly the network's parameter shapes.

  Args:
    tree: nested dict whose leaves are shape tuples or have `.shape` (arrays,
      ShapeDtypeStructs, orbax array metadata).
    config: the network's config.
    source: what `tree` came from, for the message.
  """
  differences = compare_shapes(tree, expected_params(config))
  if differences:
    if network.is_decoder_only(config):
      hint = 'an encoder-decoder checkpoint needs a network.T5Config'
    else:
      hint = (
        'e.g. network.t5_1_1_config(size); a decoder-only one needs a network.DecoderOnlyConfig'
      )
    raise ValueError(
      f'{source} does not match the configured network: '
      f'{differences.summary("the configured network")}. '
      f'The config has {_describe(config)}; pass the config of the size the '
      f'checkpoint was trained with ({hint}).'
    )


def check_params(params: Params, config: network.NetworkConfig) -> None:
  """Raises ValueError unless `params` has the tree and shapes of `module_for(config)`.

  The message names the first missing, unexpected or mis-shaped parameter
  (with both shapes) and counts the rest. Dtypes are not checked: the network
  computes in `config.dtype` whatever the parameters' dtype.

  Args:
    params: nested dict of arrays (or of anything with a `.shape`).
    config: the network's config.
  """
  check_shapes(params, config, 'The parameter tree')


def absolute_path(path: epath.Path) -> epath.Path:
  """orbax needs absolute paths; URLs (gs://) are, and `absolute()` would mangle them."""
  return path if '://' in os.fspath(path) else path.absolute()


def checkpoint_directory(path: PathLike) -> epath.Path:
  """The absolute directory `path` names (T5X's `checkpoint` file names its step directory)."""
  path = absolute_path(epath.Path(path))
  if path.name == T5X_CHECKPOINT_FILE and path.is_file():
    return path.parent
  if path.is_file():
    raise FileNotFoundError(
      f'No checkpoint at {path}: {path.name} is a file, not a checkpoint directory. Pass '
      f"the directory that holds the checkpoint (perhaps {path.parent}); only T5X's "
      f'checkpoint_<step>/{T5X_CHECKPOINT_FILE} file may stand for its directory.'
    )
  if not path.is_dir():
    raise FileNotFoundError(f'No checkpoint at {path}: the directory does not exist.')
  return path
