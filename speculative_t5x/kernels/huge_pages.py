"""Host memory on 2 MB pages for the kernel's packed weights (Linux).

Why: `small_m_matmul.cc` streams every packed weight once per call. On 4 KB
pages a 144 MB model spans 36k pages; on 2 MB pages, 72. Measured on the
Intel machine (docs/results.md), the `make demo` target's 37 products took
0.85-0.96 of the time for 1-16 rows with the weights on 2 MB pages.

XLA:CPU allocates its buffers on ordinary pages and THP is commonly set to
`madvise` (only memory that asks gets huge pages). `HugePageArena` maps one
private anonymous region, advises it onto huge pages before the first touch,
copies each packed weight into it and hands the copy to JAX without a
further copy (`jax.device_put` of an aligned NumPy array on the CPU aliases
it). Where that cannot be done -- not Linux, no `madvise`, a traced or
multi-device array, or a JAX that copies -- `place` returns the array as it
is; the kernel reads it the same way, only slower.
"""

import logging
import mmap
import sys
from typing import Optional

import jax
import numpy as np

Array = jax.Array

HUGE_PAGE = 1 << 21  # bytes; x86-64's transparent huge page
ALIGNMENT = 64  # bytes; what the CPU client needs to alias a host array


def _aligned(nbytes: int) -> int:
  return -(-nbytes // ALIGNMENT) * ALIGNMENT


class HugePageArena:
  """One host region on 2 MB pages that packed weights are copied into, each once.

  arena = HugePageArena(total_bytes)
  w = arena.place(w)   # same values; on huge pages where possible

  The region lives as long as any array placed in it.
  """

  def __init__(self, nbytes: int):
    """Maps room for `nbytes` of arrays (each rounded up to 64 bytes) after a 2 MB boundary."""
    self._region: Optional[mmap.mmap] = None
    self._offset = 0
    self._end = 0
    if nbytes <= 0 or not sys.platform.startswith('linux') or not hasattr(mmap, 'MADV_HUGEPAGE'):
      return
    try:
      region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
      region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError) as error:
      logging.info('speculative_t5x: packed weights stay on ordinary pages (%s).', error)
      return
    base = np.frombuffer(region, np.uint8, count=1).ctypes.data
    self._region = region
    self._offset = (-base) % HUGE_PAGE
    self._end = self._offset + nbytes

  def place(self, w: Array) -> Array:
    """`w`'s values in the region, as a JAX array on `w`'s device; `w` itself where that fails."""
    if (
      self._region is None
      or isinstance(w, jax.core.Tracer)
      or len(w.sharding.device_set) != 1
      or self._offset + w.nbytes > self._end
    ):
      return w
    view = np.frombuffer(self._region, w.dtype, count=w.size, offset=self._offset).reshape(w.shape)
    view[...] = np.asarray(w)
    placed = jax.device_put(view, w.sharding)
    if placed.unsafe_buffer_pointer() != view.ctypes.data:
      # JAX copied: keep its copy, and place nothing more here.
      logging.info(
        'speculative_t5x: JAX copies host arrays here; packed weights stay on its pages.'
      )
      self._region = None
      return placed
    self._offset += _aligned(w.nbytes)
    return placed


def packed_bytes(shapes_and_dtypes) -> int:
  """The arena size for arrays of these (shape, dtype) pairs, each rounded up to 64 bytes."""
  return sum(
    _aligned(int(np.prod(shape)) * np.dtype(dtype).itemsize) for shape, dtype in shapes_and_dtypes
  )
