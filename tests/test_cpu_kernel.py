"""The small-M CPU matmul kernel (speculative_t5x.kernels): values, jit, fallback, switches."""

import logging
import os

import gin
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import kernels
from speculative_t5x.kernels import cpu_matmul
from testing_utils import needs_cpu_kernel


def _within_float32(y, x, w):
  """|y - x @ w| <= K * eps32 * (|x| @ |w|) elementwise, x @ w in float64.

  The bound of any float32 summation of K products (Higham's gamma_K): a
  wrong column, row or block breaks it by orders of magnitude.
  """
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  bound = x.shape[-1] * np.finfo(np.float32).eps * (np.abs(x64) @ np.abs(w64)) + 1e-30
  error = np.abs(np.asarray(y, np.float64) - x64 @ w64)
  assert error.shape == bound.shape
  assert np.all(error <= bound), float(np.max(error / bound))


def _random(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
  """The library rebuilt (or not) under an empty cache, and the process's one restored after."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  cpu_matmul._library.cache_clear()
  yield tmp_path
  monkeypatch.undo()
  cpu_matmul._library.cache_clear()


# K, N: odd K, N below, at and past a block (16 on AVX2, 32 on AVX-512),
# the main job's shapes, and 17 x 300 x 520, past the size split over threads.
SHAPES = [(1, 1), (5, 3), (33, 100), (64, 16), (300, 520), (768, 2048), (2048, 768), (768, 4000)]


@pytest.mark.parametrize('rows', [1, 3, 7, 17, 32])
@pytest.mark.parametrize('k,n', SHAPES)
def test_matches_dot_within_float32(rows, k, n):
  needs_cpu_kernel()
  x, w = _random((rows, k), 0), _random((k, n), 1)
  packed = kernels.pack(w)
  assert packed.ndim == 3 and packed.shape[1] == k and packed.shape[0] * packed.shape[2] >= n
  y = jax.jit(kernels.matmul, static_argnums=2)(x, packed, n)
  assert y.shape == (rows, n) and y.dtype == jnp.float32
  _within_float32(y, x, w)
  _within_float32(jnp.dot(x, w), x, w)  # the reference meets the same bound
  np.testing.assert_array_equal(kernels.unpack(packed, n), w)


def test_rows_bitwise_the_same_whatever_m_and_thread_split():
  """A row's output does not depend on the other rows or the split (greedy equality needs it)."""
  needs_cpu_kernel()
  k, n = 300, 520
  x, packed = _random((32, k), 2), kernels.pack(_random((k, n), 3))
  whole = np.asarray(kernels.matmul(x, packed, n))
  for rows in (1, 2, 5, 8, 13):
    part = kernels.matmul(x[:rows], packed, n)
    np.testing.assert_array_equal(part, whole[:rows])
  np.testing.assert_array_equal(kernels.matmul(x[20:21], packed, n), whole[20:21])


def test_leading_axes_are_rows():
  needs_cpu_kernel()
  x, w = _random((2, 3, 40), 4), _random((40, 24), 5)
  y = kernels.matmul(x, kernels.pack(w), 24)
  assert y.shape == (2, 3, 24)
  np.testing.assert_array_equal(
    y.reshape(6, 24), kernels.matmul(x.reshape(6, 40), kernels.pack(w), 24)
  )


def test_inside_while_loop_traced_once():
  needs_cpu_kernel()
  k, n = 72, 96
  w = _random((k, n), 6)
  packed = kernels.pack(w)
  traces = []

  @jax.jit
  def run(x, packed):
    traces.append(None)

    def body(carry):
      i, x = carry
      return i + 1, jnp.tanh(kernels.matmul(x, packed, n)[:, :k])

    return lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

  for seed in (7, 8):
    x = _random((4, k), seed)
    expected = x
    for _ in range(3):
      expected = np.tanh(np.asarray(expected, np.float64) @ w.astype(np.float64))[:, :k]
    np.testing.assert_allclose(run(x, packed), expected, rtol=1e-4, atol=1e-5)
  assert len(traces) == 1


def test_mismatched_shapes_name_the_fix():
  needs_cpu_kernel()
  packed = kernels.pack(_random((8, 40), 9))
  with pytest.raises(ValueError, match=r'x \[\.\.\., 8\]'):
    kernels.matmul(_random((2, 9), 10), packed, 40)
  with pytest.raises(ValueError, match='N = 70'):
    kernels.matmul(_random((2, 8), 10), packed, 70)


def test_built_once_and_cached(fresh_library):
  if not kernels.available():
    pytest.skip('no C++ compiler here')
  (library,) = os.listdir(os.path.join(fresh_library, 'speculative_t5x', 'kernels'))
  path = os.path.join(fresh_library, 'speculative_t5x', 'kernels', library)
  built = os.stat(path).st_mtime_ns
  cpu_matmul._library.cache_clear()
  assert kernels.available() and os.stat(path).st_mtime_ns == built


@pytest.mark.parametrize('compiler', ['/nonexistent/g++', 'false'])
def test_fallback_without_a_compiler(compiler, fresh_library, monkeypatch, caplog):
  """No compiler (or one that fails): XLA's dot, one one-line warning, the same values."""
  monkeypatch.setenv('CXX', compiler)
  x, w = _random((3, 33), 11), _random((33, 50), 12)
  with caplog.at_level(logging.WARNING):
    assert not kernels.available()
    packed = kernels.pack(w)
    y = jax.jit(kernels.matmul, static_argnums=2)(x, packed, 50)
    kernels.available()
  notices = [r.getMessage() for r in caplog.records if 'kernel is unavailable' in r.getMessage()]
  assert len(notices) == 1 and '\n' not in notices[0], notices
  assert packed.ndim == 2
  np.testing.assert_array_equal(packed, w)
  np.testing.assert_array_equal(y, jnp.dot(x, w))


@pytest.mark.parametrize('value', ['0', 'false', 'off'])
def test_environment_opt_out(value, monkeypatch):
  monkeypatch.setenv(cpu_matmul.ENV_SWITCH, value)
  assert not kernels.available()
  w = _random((10, 20), 13)
  assert kernels.pack(w).ndim == 2
  x = _random((2, 10), 14)
  np.testing.assert_array_equal(kernels.matmul(x, kernels.pack(w), 20), jnp.dot(x, w))


def test_gin_opt_out():
  with gin.unlock_config():
    gin.bind_parameter('cpu_kernel_enabled.enabled', False)
  try:
    assert not kernels.available()
    assert kernels.pack(_random((10, 20), 15)).ndim == 2
  finally:
    gin.clear_config()


def test_bad_switch_value_is_an_error(monkeypatch):
  monkeypatch.setenv(cpu_matmul.ENV_SWITCH, 'maybe')
  with pytest.raises(ValueError, match="SPECULATIVE_T5X_CPU_KERNEL='maybe'"):
    kernels.available()
