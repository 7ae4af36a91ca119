"""A small-M float32 matmul for CPU decoding, y[M, N] = x[M, K] @ W[K, N], through the XLA FFI.

Why: XLA:CPU's dot for 2-8 rows streams weights at 14-21 GB/s where a GEMV
reaches ~25 GB/s (docs/results.md), so a target block of gamma + 1 tokens costs
1.5-1.75 one-token steps. `small_m_matmul.cc` reads weights repacked once
into column blocks [ceil(N / NB), K, NB] (`pack`), each weight element once
per call, with all rows' accumulators in registers.

Built on first use: g++ (or $CXX) compiles the source with -O3 -march=native
against `jax.ffi.include_dir()`; the library is cached under
$XDG_CACHE_HOME/speculative_t5x/kernels (default ~/.cache), keyed by a hash of
the source, the compiler's version, the CPU's flags and jaxlib's version, so
a new machine or upgrade rebuilds it. Where it cannot be built (no compiler,
a CPU without AVX2 + FMA, a compile error) or jax's backend is not the CPU,
`pack` returns the weights unpacked and `matmul` is XLA's `jnp.dot`; the
first failure logs one warning that says why. Opt out with the environment
variable SPECULATIVE_T5X_CPU_KERNEL=0 or gin (`cpu_kernel_enabled.enabled =
False`).

Numerics: every output element is one fused multiply-add chain over k in
order, whatever M, the row tiling or the thread split, so a row's result is
bitwise the same in a one-token step as in a block; it differs from
`jnp.dot` by float32 rounding only.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from typing import Optional, Tuple

import gin
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

Array = jax.Array

ENV_SWITCH = 'SPECULATIVE_T5X_CPU_KERNEL'
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'small_m_matmul.cc')
FFI_TARGET = 'speculative_t5x_small_m_matmul'
CXX_FLAGS = ('-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-w', '-pthread')


@gin.configurable
def cpu_kernel_enabled(enabled: bool = True) -> bool:
  """Whether decoding may use the kernel: the gin switch and $SPECULATIVE_T5X_CPU_KERNEL.

  Args:
    enabled: gin's switch (`cpu_kernel_enabled.enabled = False` turns it off).

  Returns:
    False when either switch is off ('0', 'false' or 'off' in the
    environment variable); whether the kernel can be built is `available()`.
  """
  value = os.environ.get(ENV_SWITCH, '1').strip().lower()
  if value not in ('0', '1', 'false', 'true', 'off', 'on', ''):
    raise ValueError(
      f'{ENV_SWITCH}={value!r} is not a switch: set it to 1 (use the CPU kernel) or 0 (XLA dot).'
    )
  return enabled and value not in ('0', 'false', 'off')


def cache_dir() -> str:
  """Where built libraries are kept: $XDG_CACHE_HOME (or ~/.cache)/speculative_t5x/kernels."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(root, 'speculative_t5x', 'kernels')


def _cpu_flags() -> str:
  """The CPU's feature flags (what -march=native compiles for), from /proc/cpuinfo."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith(('flags', 'Features')):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return os.uname().machine


def _compiler() -> str:
  return os.environ.get('CXX') or 'g++'


def _library_path(compiler: str) -> str:
  """The cached library for this source, compiler version, CPU and jaxlib."""
  version = subprocess.run(
    [compiler, '--version'], capture_output=True, text=True, check=True, timeout=60
  ).stdout
  with open(SOURCE, 'rb') as f:
    key = hashlib.sha256(f.read())
  for part in (version, _cpu_flags(), jaxlib.__version__, CXX_FLAGS):
    key.update(repr(part).encode())
  return os.path.join(cache_dir(), f'small_m_matmul-{key.hexdigest()[:20]}.so')


def _build(compiler: str, path: str) -> None:
  """Compiles the source to `path`, atomically (parallel test workers may race)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, partial = tempfile.mkstemp(suffix='.so', dir=os.path.dirname(path))
  os.close(fd)
  try:
    command = [compiler, *CXX_FLAGS, '-I', jax.ffi.include_dir(), SOURCE, '-o', partial]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
      errors = [line for line in result.stderr.splitlines() if 'error' in line]
      raise RuntimeError(f'{compiler} failed: {(errors or [result.stderr.strip()])[0]}')
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


# The FFI target can be registered once per process (XLA refuses a second
# handler address under the same name): a library rebuilt elsewhere later, e.g.
# under another cache directory, is checked to build but the first one serves.
_registered: Optional[ctypes.CDLL] = None


@functools.cache
def _library() -> Optional[ctypes.CDLL]:
  """The built and registered library, or None (with one warning saying why)."""
  global _registered
  backend = jax.default_backend()
  if backend != 'cpu':
    logging.info('The small-M CPU kernel is not used on %s: XLA dot.', backend)
    return None
  compiler = _compiler()
  try:
    if shutil.which(compiler) is None:
      raise RuntimeError(f'no C++ compiler {compiler!r} on PATH (set $CXX to one)')
    path = _library_path(compiler)
    if not os.path.exists(path):
      _build(compiler, path)
    if _registered is None:
      library = ctypes.cdll.LoadLibrary(path)
      library.SpeculativeT5xSmallMBlockWidth.restype = ctypes.c_int64
      jax.ffi.register_ffi_target(
        FFI_TARGET, jax.ffi.pycapsule(library.SpeculativeT5xSmallMMatmul), platform='cpu'
      )
      _registered = library
  except (OSError, RuntimeError, subprocess.SubprocessError) as error:
    logging.warning(
      'speculative_t5x: the small-M CPU matmul kernel is unavailable (%s); using XLA dot.', error
    )
    return None
  return _registered


def available() -> bool:
  """Whether `pack` and `matmul` use the kernel: switched on, on the CPU, and built."""
  return cpu_kernel_enabled() and _library() is not None


def block_width() -> int:
  """NB, the column block width of this build (16 for AVX2, 32 for AVX-512)."""
  library = _library()
  if library is None:
    raise RuntimeError('block_width() needs the kernel; check available() first.')
  return int(library.SpeculativeT5xSmallMBlockWidth())


def pack(w: Array) -> Array:
  """W [K, N] -> column blocks float32 [ceil(N / NB), K, NB], N padded with zeros.

  Block b holds columns b*NB..b*NB+NB-1 row after row, so the kernel reads
  it as one contiguous run. Costs one copy of W (plus the padding); the
  caller may drop W where nothing else reads it. Without the kernel
  (`available()` false) W itself is returned, as float32, and `matmul` is
  XLA's dot on it.
  """
  w = jnp.asarray(w, jnp.float32)
  if w.ndim != 2:
    raise ValueError(f'pack takes a 2-D weight matrix [K, N], got shape {w.shape}.')
  if not available():
    return w
  blocks, k, nb = packed_shape(w.shape)
  w = jnp.pad(w, ((0, 0), (0, blocks * nb - w.shape[1])))
  return w.reshape(k, blocks, nb).transpose(1, 0, 2)


def packed_shape(shape: Tuple[int, int]) -> Tuple[int, int, int]:
  """`pack`'s output shape for a [K, N] matrix: (ceil(N / NB), K, NB); needs the kernel."""
  k, n = shape
  nb = block_width()
  return -(-n // nb), k, nb


def is_packed(w: Array) -> bool:
  """Whether `w` is `pack`'s blocked layout (3-D) rather than a plain [K, N] matrix."""
  return w.ndim == 3


def unpack(packed: Array, n: int) -> Array:
  """`pack`'s inverse: [ceil(N / NB), K, NB] -> W [K, N] (a plain matrix is returned as is)."""
  if not is_packed(packed):
    return packed
  blocks, k, nb = packed.shape
  return packed.transpose(1, 0, 2).reshape(k, blocks * nb)[:, :n]


def matmul(x: Array, packed: Array, n: int) -> Array:
  """x [..., K] @ W [K, N] -> float32 [..., N], W given as `pack(W)`.

  Jittable; the leading axes of x are flattened into the kernel's M rows
  (any M: past ~32 rows the kernel is compute-bound, still one pass over W).
  Given a plain [K, N] matrix (`pack` without the kernel) this is `jnp.dot`.

  Args:
    x: [..., K] activations (cast to float32).
    packed: `pack(W)`.
    n: N, W's columns (static; the packed layout pads them).
  """
  x = jnp.asarray(x, jnp.float32)
  if not is_packed(packed):
    return jnp.dot(x, packed)
  blocks, k, nb = packed.shape
  if x.shape[-1] != k or not (blocks - 1) * nb < n <= blocks * nb:
    raise ValueError(
      f'matmul: x {x.shape} and packed weights {packed.shape} (N = {n}) do not fit: '
      f'expected x [..., {k}] and {blocks - 1} * {nb} < N <= {blocks} * {nb}.'
    )
  lead = x.shape[:-1]
  rows = int(np.prod(lead, dtype=np.int64))
  call = jax.ffi.ffi_call(FFI_TARGET, jax.ShapeDtypeStruct((rows, n), jnp.float32))
  y = call(x.reshape(rows, k), packed)
  return y.reshape(lead + (n,))
