"""Times one cached decoder step of k = 1 and k = gamma + 1 tokens.

The cost ratio v = time(k = gamma + 1) / time(k = 1) is what speculative
decoding's speedup prediction needs besides c (draft / target step time): on
memory-bound accelerators v is close to 1, on a CPU it is not.

For each size: random parameters, an encoder input of `--input_length` tokens,
a cache of `--max_decode_length + gamma + 1` positions, and the block written at
the middle of the cache. Two timings per block size, each the median of
`--runs` runs after warm-up:
  call: one jitted `decode_block` call (cache donated), including dispatch.
  loop: per step of `--loop_steps` steps inside one jitted `lax.fori_loop`,
        as in the decode loops (no host round trip per step).

Example:
  python scripts/time_network_steps.py --sizes tiny small --dtype float32
"""

import argparse
import functools
import statistics
import time

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import network


def _median_seconds(fn, runs):
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_size(size, *, batch, input_length, max_decode_length, gamma, dtype, runs, loop_steps):
  """Returns {k: (call seconds, loop seconds per step)} for k in (1, gamma + 1)."""
  config = network.t5_1_1_config(size, dtype=dtype)
  params = jax.device_put(network.random_params(config)[0])
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(2, config.vocab_size, (batch, input_length)), jnp.int32)
  cache_length = max_decode_length + gamma + 1
  cache = jax.jit(network.init_decoder_cache, static_argnums=(0, 3))(
    config, params, inputs, cache_length
  )
  decode_block = functools.partial(network.apply_decode_block, config)
  step = jax.jit(decode_block, donate_argnums=1)

  @functools.partial(jax.jit, donate_argnums=1)
  def loop(params, cache, tokens, starts):
    body = lambda _, carry: decode_block(params, carry[1], tokens, starts)
    logits = jnp.zeros(tokens.shape + (config.vocab_size,), jnp.float32)
    return lax.fori_loop(0, loop_steps, body, (logits, cache))

  results = {}
  for k in (1, gamma + 1):
    tokens = jnp.asarray(rng.integers(2, config.vocab_size, (batch, k)), jnp.int32)
    starts = jnp.full((batch,), max_decode_length // 2, jnp.int32)
    state = {'cache': cache}

    def call(fn):
      logits, state['cache'] = fn(params, state['cache'], tokens, starts)
      return logits

    for _ in range(3):  # Compile and warm up.
      call(step)
      call(loop)
    results[k] = (
      _median_seconds(lambda: call(step), runs),
      _median_seconds(lambda: call(loop), runs) / loop_steps,
    )
    cache = state['cache']
  return config, params, results


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--sizes', nargs='+', default=['tiny', 'small'], choices=sorted(network.T5_1_1_SIZES)
  )
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--input_length', type=int, default=64)
  parser.add_argument('--max_decode_length', type=int, default=64)
  parser.add_argument('--gamma', type=int, default=7)
  parser.add_argument('--dtype', default='float32')
  parser.add_argument('--runs', type=int, default=30)
  parser.add_argument('--loop_steps', type=int, default=10)
  args = parser.parse_args()
  print(
    f'jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}, '
    f'input length {args.input_length}, cache length '
    f'{args.max_decode_length + args.gamma + 1}, {args.dtype}, median of {args.runs}'
  )
  print(
    f'{"size":>6} {"params":>8} {"k":>3} {"call ms":>8} {"loop ms":>8} {"call v":>7} {"loop v":>7}'
  )
  for size in args.sizes:
    _, params, results = time_size(
      size,
      batch=args.batch,
      input_length=args.input_length,
      max_decode_length=args.max_decode_length,
      gamma=args.gamma,
      dtype=args.dtype,
      runs=args.runs,
      loop_steps=args.loop_steps,
    )
    count = network.parameter_count(params)
    single_call, single_loop = results[1]
    for k, (call_s, loop_s) in results.items():
      print(
        f'{size:>6} {count / 1e6:>7.1f}M {k:>3} {call_s * 1e3:>8.3f} {loop_s * 1e3:>8.3f} '
        f'{call_s / single_call:>7.2f} {loop_s / single_loop:>7.2f}'
      )


if __name__ == '__main__':
  main()
