"""Sharding: T5X's logical axis rules, a (data, model) mesh, and shardings.

Parameters carry T5X's logical axis names (`params_axes`); the rules below map
them to the mesh axes 'data' and 'model' as T5X's
`standard_logical_axis_rules()` does for 1-D parameter and activation
partitioning: batch over 'data'; vocab, mlp, heads and joined_kv over 'model';
embed and kv replicated. A dimension that its mesh axes do not divide is
replicated instead (T5X would fail), so e.g. T5 1.1 small's 6 heads still load
on a 4-way 'model' axis.
"""

from typing import Any, Optional, Sequence, Tuple

from flax import linen as nn
from flax import traverse_util
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from speculative_t5x import network

LogicalRules = Sequence[Tuple[str, Optional[str]]]


def standard_logical_axis_rules() -> LogicalRules:
  """T5X's rules for 1-D model parallelism (and its replicated axes)."""
  return (
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
  )


def make_mesh(data: int, model: int, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'model') mesh over `devices` (default: all of `jax.devices()`)."""
  devices = jax.devices() if devices is None else list(devices)
  if data < 1 or model < 1 or data * model != len(devices):
    raise ValueError(
      f'A {data} x {model} mesh needs {data * model} devices, got '
      f'{len(devices)}; choose data * model == {len(devices)}.'
    )
  return Mesh(mesh_utils.create_device_mesh((data, model), devices), ('data', 'model'))


def _divisible_spec(spec: PartitionSpec, shape: Tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """`spec` with every dimension its mesh axes do not divide replicated."""
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))

  def axis_size(axes):
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))

  return PartitionSpec(
    *(
      axes if axes is None or dim % axis_size(axes) == 0 else None for axes, dim in zip(spec, shape)
    )
  )


def _logical_sharding(logical_axes, shape, mesh, rules) -> NamedSharding:
  spec = nn.logical_to_mesh_axes(logical_axes, rules)
  return NamedSharding(mesh, _divisible_spec(spec, shape, mesh))


def params_shardings(
  params: Any, params_axes: Any, mesh: Mesh, rules: Optional[LogicalRules] = None
) -> Any:
  """NamedShardings for a parameter tree from its logical axes.

  Args:
    params: the parameter tree (arrays or `jax.ShapeDtypeStruct`s).
    params_axes: the `params_axes` collection of `Transformer.init`.
    mesh: a mesh with axes named by the rules (see `make_mesh`).
    rules: logical-to-mesh rules; default `standard_logical_axis_rules()`.

  Returns:
    A tree like `params` of `jax.sharding.NamedSharding`.
  """
  rules = standard_logical_axis_rules() if rules is None else rules
  names = traverse_util.flatten_dict(nn.partitioning.get_axis_names(params_axes))
  flat = traverse_util.flatten_dict(params)
  if set(names) != set(flat):
    raise ValueError(
      f'params_axes does not describe params: differing paths {sorted(set(names) ^ set(flat))[:5]}.'
    )
  return traverse_util.unflatten_dict(
    {
      path: _logical_sharding(tuple(names[path]), leaf.shape, mesh, rules)
      for path, leaf in flat.items()
    }
  )


def cache_shardings(cache: Any, mesh: Mesh, rules: Optional[LogicalRules] = None) -> Any:
  """NamedShardings for a decoder cache of `network.Transformer`.

  Batch over 'data' and heads over 'model' (where divisible); `cache_index`
  scalars replicated. Accepts the cache of `init_decoder_cache` or of T5X's
  `decode=True` protocol, as arrays or `jax.ShapeDtypeStruct`s.
  """
  rules = standard_logical_axis_rules() if rules is None else rules
  logical_axes = {
    'cached_key': network.KV_CACHE_AXES,
    'cached_value': network.KV_CACHE_AXES,
    'encoder_mask': network.ENCODER_MASK_AXES,
    'cache_index': (),
  }
  flat = traverse_util.flatten_dict(cache)
  unknown = sorted({path[-1] for path in flat} - set(logical_axes))
  if unknown:
    raise ValueError(f'Not a network.Transformer decoder cache: unknown leaves {unknown}.')
  return traverse_util.unflatten_dict(
    {
      path: _logical_sharding(logical_axes[path[-1]], leaf.shape, mesh, rules)
      for path, leaf in flat.items()
    }
  )


def batch_sharding(shape: Tuple[int, ...], mesh: Mesh) -> NamedSharding:
  """Sharding of a batch-leading input array: batch over 'data' if divisible."""
  return NamedSharding(mesh, _divisible_spec(PartitionSpec('data'), shape, mesh))
