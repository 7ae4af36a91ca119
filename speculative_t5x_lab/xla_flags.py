"""An XLA:CPU flag for memory-bound targets, set before JAX starts a backend.

XLA reads `XLA_FLAGS` once, when the first backend starts, so a program that
wants the flag calls `set_decode_flags()` first. Only
scripts/memory_bound_cpu.py does: the library, the mains and the demo run on
XLA's defaults (as do the tests), because the flag's effect depends on the
pair, not only on the target's size.

The one flag, `--xla_cpu_experimental_ynn_fusion_type=-individual_dot` (dot
products through Eigen instead of YNNPACK, XLA:CPU's default for single
dots), measured on a 2-core AMD EPYC (jaxlib 0.10.2), batch 1, greedy:

* helps a T5 1.1 small-size float32 target (168 MB per step) with a T5 1.1
  tiny draft, random weights, emulated alpha 0.75 (scripts/memory_bound_cpu.py,
  two alternating runs each): a one-token step unchanged (3.70-3.74 vs
  3.68-3.72 ms), blocks of 6 / 8 tokens 10% / 7% cheaper (5.54-5.61 vs
  6.15-6.32 ms, 5.78-5.85 vs 6.22-6.24 ms), speedup at gamma 5 / 7 from
  1.37-1.38x / 1.33-1.34x to 1.45-1.48x / 1.40-1.42x;
* hurts the main job's pair (speculative_t5x_lab.demo: a 47.9M target of width
  768 reading 163 MB per step, a 2.9M distilled draft, alpha 0.66, 16 test
  sentences): speedup at gamma 3 / 5 / 7 0.98x / 1.00x / 1.22x with the flag
  against 1.44x / 1.44x / 1.35x without, run back to back. Its parts timed
  alone barely change; the decode loop gains 2.5 ms per iteration of time no
  part explains (0.8 ms at gamma 7);
* hurts the earlier cache-resident demo pair (6.0M target, 1.3M draft):
  speculative decoding 2.4x slower (0.55 -> 1.30 ms/token at gamma 1).

Training steps are unchanged either way. Accelerator backends ignore the flag.
"""

import logging
import os
from typing import List

MEMORY_BOUND_FLAGS = ('--xla_cpu_experimental_ynn_fusion_type=-individual_dot',)
# A target decoder reading more than this many times the last-level cache per
# step streams its weights from DRAM: the flag's regime.
MEMORY_BOUND_FACTOR = 2


def _flag_name(flag: str) -> str:
  return flag.split('=', 1)[0]


def set_decode_flags(target_decoder_bytes: int) -> List[str]:
  """Sets the XLA flags for decoding with a target of this size; returns those added.

  Adds `MEMORY_BOUND_FLAGS` to `XLA_FLAGS` when the target decoder's weights
  exceed `MEMORY_BOUND_FACTOR` times the last-level cache, unless the user's
  own `XLA_FLAGS` names them. Call before anything creates a JAX array: once
  a backend has started the flags would have no effect, so nothing is changed
  and a warning says so.

  Args:
    target_decoder_bytes: what one target decoder step reads
      (`network.decoder_weight_bytes`).
  """
  if target_decoder_bytes <= MEMORY_BOUND_FACTOR * last_level_cache_bytes():
    return []
  current = os.environ.get('XLA_FLAGS', '')
  named = {_flag_name(flag) for flag in current.split()}
  added = [flag for flag in MEMORY_BOUND_FLAGS if _flag_name(flag) not in named]
  if not added:
    return []
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):  # A JAX without the probe: assume not started.
    started = False
  if started:
    logging.warning(
      'A JAX backend has already started; XLA flags %s are not applied. Call '
      'xla_flags.set_decode_flags() before the first JAX computation.',
      added,
    )
    return []
  os.environ['XLA_FLAGS'] = ' '.join([current] + added).strip()
  return added


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
  """The CPU's last-level cache size (Linux sysfs), or `default` where unknown."""
  for index in (3, 2):
    try:
      with open(f'/sys/devices/system/cpu/cpu0/cache/index{index}/size') as f:
        text = f.read().strip()
    except OSError:
      continue
    scale = {'K': 2**10, 'M': 2**20, 'G': 2**30}.get(text[-1], 1)
    return int(text.rstrip('KMG')) * scale
  return default
