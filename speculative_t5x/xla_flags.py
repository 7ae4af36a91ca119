"""The XLA flags this project's programs run with, set before JAX starts a backend.

XLA reads `XLA_FLAGS` once, when the first backend starts, so the mains
(`gin_utils.run`, the demo) and the scripts call `set_decode_flags()` first.
The library itself never changes the process's flags, and the tests run on
XLA's defaults.

The one flag, measured on the 2-core AMD EPYC development machine (jaxlib
0.10.2; scripts/memory_bound_cpu.py, T5 1.1 small-size float32 target and
tiny draft, batch 1, greedy, emulated alpha 0.75, two alternating runs each):

  --xla_cpu_experimental_ynn_fusion_type=-individual_dot
      Dot products through Eigen instead of YNNPACK (XLA:CPU's default for
      single dots). A one-token step is unchanged (3.70-3.74 vs 3.68-3.72 ms,
      its GEMV never took YNNPACK), a block of 6 / 8 tokens is 10% / 7%
      cheaper (5.54-5.61 vs 6.15-6.32 ms, 5.78-5.85 vs 6.22-6.24 ms), and the
      speedup at gamma 5 / 7 goes from 1.37-1.38x / 1.33-1.34x to
      1.45-1.48x / 1.40-1.42x. Training steps of the demo's pair are
      unchanged (134 vs 137 ms, 45 vs 45 ms). Accelerator backends ignore it.
"""

import logging
import os
from typing import List, Sequence

DECODE_FLAGS = ('--xla_cpu_experimental_ynn_fusion_type=-individual_dot',)


def _flag_name(flag: str) -> str:
  return flag.split('=', 1)[0]


def set_decode_flags(flags: Sequence[str] = DECODE_FLAGS) -> List[str]:
  """Adds `flags` to `XLA_FLAGS`, unless the user's own value names them; returns those added.

  Call before anything creates a JAX array. If a backend has already started
  the flags would have no effect: nothing is changed and a warning says so.
  """
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):  # A JAX without the probe: assume not started.
    started = False
  current = os.environ.get('XLA_FLAGS', '')
  named = {_flag_name(flag) for flag in current.split()}
  added = [flag for flag in flags if _flag_name(flag) not in named]
  if not added:
    return []
  if started:
    logging.warning('A JAX backend has already started; XLA flags %s are not applied. Call '
                    'xla_flags.set_decode_flags() before the first JAX computation.', added)
    return []
  os.environ['XLA_FLAGS'] = ' '.join([current] + added).strip()
  return added
