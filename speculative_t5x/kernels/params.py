"""A network's decode-time parameters: its T5X tree plus a packed copy of the decoder's dense kernels.

Checkpoints and the T5X parameter tree stay as they are; `pack_params` makes,
once per model placement, a second Flax collection 'packed' that mirrors the
tree's paths for the decoder's dense kernels (attention projections, MLP,
untied logits; `cpu_matmul.pack`'s blocked layout; for a feature head, all of
its dense kernels) and, with logits from the tied embedding, the embedding's
transpose. `network`'s decode entry points
(`init_decoder_cache`, `apply_decode_block`, `prefill_decoder_cache`) take
either a plain tree or these `PackedParams`, and its `DenseGeneral` and
`Embed.attend` use a packed weight where the collection has one, else the
plain dot. Decode calls on either are within float32 rounding of each other;
a baseline and a speculative decode on the same `PackedParams` share the
kernel (and each row's result does not depend on the block size).

Memory: the packed copy is as large as what it packs (N padded to the
block width: nothing for the main job's shapes) -- the decoder's dense
kernels, plus V x E for tied logits -- held in one host region on 2 MB
pages where the OS allows (`huge_pages`). `keep_unpacked=False` drops the packed
kernels from the plain tree (the encoder's and the embedding's stay: the
encoder and the token lookup read them), so a process that only decodes
holds one copy; such `PackedParams` cannot be trained or scored by
`network.compute_logits`.
"""

from typing import Any, Dict, Optional, Tuple

import flax
from flax import traverse_util
import jax.numpy as jnp

from speculative_t5x.kernels import cpu_matmul
from speculative_t5x.kernels import huge_pages

PyTree = Any
COLLECTION = 'packed'


@flax.struct.dataclass
class PackedParams:
  """Parameters for decoding with the CPU kernel.

  Attributes:
    params: the T5X parameter tree (without the packed kernels if
      `pack_params(..., keep_unpacked=False)`).
    packed: the 'packed' collection: at each packed kernel's path (e.g.
      decoder/layers_0/mlp/wi_0/kernel) its `cpu_matmul.pack` blocks
      [ceil(N / NB), K, NB]; for tied logits, at the embedding's path, the
      blocks of its transpose [E, V].
  """

  params: PyTree
  packed: PyTree


def _packed_paths(
  config: Any, flat: Dict[Tuple[str, ...], Any], scope: Optional[str]
) -> Dict[Tuple[str, ...], Any]:
  """The 2-D dense kernels under `scope`, and the embedding where it gives the logits, by path."""
  chosen = {}
  for path, leaf in flat.items():
    if scope in (None, path[0]) and path[-1] == 'kernel' and leaf.ndim == 2:
      chosen[path] = leaf
    elif path[-1] == 'embedding' and getattr(config, 'logits_via_embedding', False):
      chosen[path] = leaf.T
  return chosen


def pack_params(
  config: Any, params: PyTree, *, keep_unpacked: bool = True, scope: Optional[str] = 'decoder'
) -> PyTree:
  """`PackedParams` for decoding with the CPU kernel, or `params` itself where it is not used.

  The kernel is used for float32 networks when `cpu_matmul.available()`
  (switched on, on the CPU, built); otherwise `params` is returned unchanged
  and decoding runs XLA's dot as before.

  Args:
    config: the network's `network.T5Config` or `network.DecoderOnlyConfig`,
      or a draft head's `feature_head.FeatureHeadConfig` (anything with a
      `dtype`; `logits_via_embedding` if its logits are the tied embedding's).
    params: its T5X parameter tree (dicts).
    keep_unpacked: False drops the packed kernels from the plain tree (see the
      module docstring).
    scope: the top-level module whose 2-D kernels decode ('decoder': a
      network's encoder runs once per call, on XLA's dot); None: every 2-D
      kernel (a feature head, all of whose layers run per draft step).
  """
  if jnp.dtype(config.dtype) != jnp.float32 or not cpu_matmul.available():
    return params
  flat = traverse_util.flatten_dict(flax.core.unfreeze(params))
  if any(
    len(getattr(leaf, 'sharding', None) and leaf.sharding.device_set or ()) > 1
    for leaf in flat.values()
  ):
    # The FFI call has no partitioning rule: sharded weights keep XLA's dot.
    return params
  chosen = _packed_paths(config, flat, scope)
  # One packed weight at a time, each copied onto huge pages before the next.
  arena = huge_pages.HugePageArena(
    huge_pages.packed_bytes((cpu_matmul.packed_shape(w.shape), 'float32') for w in chosen.values())
  )
  packed = {path: arena.place(cpu_matmul.pack(w)) for path, w in chosen.items()}
  if not keep_unpacked:
    flat = {path: leaf for path, leaf in flat.items() if path not in chosen or path[-1] != 'kernel'}
  return PackedParams(
    params=traverse_util.unflatten_dict(flat), packed=traverse_util.unflatten_dict(packed)
  )


def plain_params(params: PyTree) -> PyTree:
  """The T5X parameter tree of `params` (a plain tree, or `PackedParams`' own)."""
  return params.params if isinstance(params, PackedParams) else params


def variables(params: PyTree, **collections: Any) -> Dict[str, Any]:
  """The variables for `module.apply`: {'params': ...}, with 'packed' for `PackedParams`."""
  if isinstance(params, PackedParams):
    return {'params': params.params, COLLECTION: params.packed, **collections}
  return {'params': params, **collections}
