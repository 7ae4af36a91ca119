"""The packed weights' host region on 2 MB pages (`kernels.huge_pages`)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import kernels
from speculative_t5x.kernels import cpu_matmul
from speculative_t5x.kernels import huge_pages
from testing_utils import needs_cpu_kernel
from testing_utils import tiny_model


def _needs_linux():
  if not sys.platform.startswith('linux'):
    pytest.skip(
      "optional OS facility absent: Linux's madvise(MADV_HUGEPAGE) (the fallback test runs here)"
    )


def _arrays():
  rng = np.random.default_rng(0)
  return [
    jnp.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in [(3, 5), (7, 64), (1,)]
  ]


def test_placed_arrays_alias_one_region_in_order_and_keep_their_values():
  _needs_linux()
  arrays = _arrays()
  arena = huge_pages.HugePageArena(huge_pages.packed_bytes((a.shape, a.dtype) for a in arrays))
  placed = [arena.place(a) for a in arrays]
  pointers = [p.unsafe_buffer_pointer() for p in placed]
  assert pointers[0] % huge_pages.HUGE_PAGE == 0  # the first array starts a huge page
  for a, p, start, next_start in zip(arrays, placed, pointers, pointers[1:] + [None]):
    np.testing.assert_array_equal(p, a)
    assert p.shape == a.shape and p.dtype == a.dtype and p.sharding == a.sharding
    assert start % huge_pages.ALIGNMENT == 0
    if next_start is not None:
      assert next_start - start == -(-a.nbytes // huge_pages.ALIGNMENT) * huge_pages.ALIGNMENT


def test_what_does_not_fit_or_is_traced_is_returned_as_it_is():
  _needs_linux()
  small, large = jnp.ones((4,), jnp.float32), jnp.ones((1000,), jnp.float32)
  arena = huge_pages.HugePageArena(64)
  assert arena.place(large) is large
  placed = arena.place(small)
  assert placed is not small and placed.unsafe_buffer_pointer() % huge_pages.HUGE_PAGE == 0
  assert arena.place(small) is small  # the region is full
  traced, roomy = [], huge_pages.HugePageArena(64)
  jax.jit(lambda x: traced.append(roomy.place(x) is x) or x)(jnp.ones((1,), jnp.float32))
  assert traced == [True]
  assert huge_pages.HugePageArena(0).place(small) is small


def test_without_linux_madvise_arrays_stay_as_they_are(monkeypatch):
  monkeypatch.setattr(sys, 'platform', 'darwin')
  small = jnp.ones((4,), jnp.float32)
  assert huge_pages.HugePageArena(64).place(small) is small


def test_pack_params_puts_every_packed_weight_in_one_region():
  _needs_linux()
  needs_cpu_kernel()
  model = tiny_model(0, vocab_size=40, emb_dim=48)
  packed = kernels.pack_params(model.config, model.params)
  leaves = jax.tree_util.tree_leaves_with_path(packed.packed)
  assert leaves
  total = huge_pages.packed_bytes((leaf.shape, leaf.dtype) for _, leaf in leaves)
  first = min(leaf.unsafe_buffer_pointer() for _, leaf in leaves)
  assert first % huge_pages.HUGE_PAGE == 0
  for path, leaf in leaves:
    assert first <= leaf.unsafe_buffer_pointer() <= first + total - leaf.nbytes
    plain = model.params
    for key in path:
      plain = plain[key.key]
    np.testing.assert_array_equal(leaf, cpu_matmul.pack(plain))
