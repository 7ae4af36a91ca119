"""GB/s of XLA's dot against the small-M kernel, beside the memory floor, in one run.

  python -m speculative_t5x_lab.kernel_benchmark [--rows 1,2,4,8,16,32] [--shapes 768x2048,...]

For each weight shape [K, N] (default: the main job's target, configs/models/
gettext_target.gin: the MLP's wi 768 x 2048 and wo 2048 x 768, the logits
768 x 4000, and a T5-vocabulary logits 768 x 32128) and each M rows, times
y = x @ W over 8 distinct weight matrices (for 768 x 2048, 50 MB: more than
the 32 MiB last-level cache of the AMD machines, so they stream from DRAM;
the Intel kind reports 480 MiB and serves part of them from cache, where the
one-row GB/s exceed the reduction's) inside one compiled loop, summing every
output into the carry so XLA cannot drop work (`measure._run_steps`), the
methods timed in turn and the fastest of several rounds kept (the machine is
shared). Prints the weight bytes per second of XLA's dot and of the kernel
(for each thread pool asked for), and v = time(M rows) / time(1 row) for
each, beside the bandwidth of an XLA reduction (`measure.memory_bandwidth`)
measured in the same run.
"""

import functools
import json
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x_lab import measure
from speculative_t5x.kernels import cpu_matmul

DEFAULT_SHAPES = ((768, 2048), (2048, 768), (768, 4000), (768, 32128))
DEFAULT_ROWS = (1, 2, 4, 8, 16, 32)
NUM_MATRICES = 8


def _step(operands, i, checksum, *, product):
  """y = x @ W_j for every matrix j, each summed into the carry."""
  x, weights = operands
  for w in weights:
    checksum = checksum + jnp.sum(product(measure._vary(x, checksum), w))
  return checksum


def interleaved_seconds(calls: Dict[str, Callable[[], Any]], rounds: int = 7) -> Dict[str, float]:
  """The fastest of `rounds` timings of each call, the calls taken in turn each round.

  On a shared machine the load changes within seconds: timing the methods in
  turn exposes them to the same load, and the minimum is the least disturbed.
  """
  for call in calls.values():
    jax.block_until_ready(call())  # compiles and warms up
  best = {name: float('inf') for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def matmul_calls(
  products: Dict[str, Tuple[Callable[[jax.Array, jax.Array], jax.Array], Sequence[jax.Array]]],
  x: jax.Array,
  steps: int,
) -> Dict[str, Callable[[], Any]]:
  """For each method, a call of `steps` loop steps of product(x, W_j) over its matrices."""
  calls = {}
  for name, (product, weights) in products.items():
    step = functools.partial(_step, product=product)
    operands = (x, tuple(weights))
    calls[name] = functools.partial(
      measure._run_steps, operands, jnp.float32(0), step=step, steps=steps
    )
  return calls


def compare(
  shapes: Sequence[Tuple[int, int]] = DEFAULT_SHAPES,
  rows: Sequence[int] = DEFAULT_ROWS,
  seed: int = 0,
  steps: int = 4,
  rounds: int = 7,
) -> Dict[str, Any]:
  """One run's records: {'machine': ..., 'records': [{K, N, M, method, ms, gb_per_s, v}]}.

  `method` is 'xla' or 'kernel'; v is the time of M rows over the
  time of rows[0] (1 by default) by the same method. Each time is the
  fastest of `rounds` loops of `steps` steps over the 8 matrices, the
  methods timed in turn (`interleaved_seconds`). Needs the kernel
  (`available()`).
  """
  if not cpu_matmul.available():
    raise RuntimeError(
      'The kernel is unavailable here (see the warning above, or '
      f'{cpu_matmul.ENV_SWITCH}=0): nothing to compare with XLA dot.'
    )
  machine = measure.machine()
  rng = np.random.default_rng(seed)
  records: List[Dict[str, Any]] = []
  for k, n in shapes:
    weights = [
      jnp.asarray(rng.standard_normal((k, n), np.float32) / np.sqrt(k)) for _ in range(NUM_MATRICES)
    ]
    packed = [cpu_matmul.pack(w) for w in weights]
    methods = {'xla': (jnp.dot, weights)}
    methods['kernel'] = (functools.partial(_kernel_product, n=n), packed)
    one_row = {}
    for m in rows:
      x = jnp.asarray(rng.standard_normal((m, k), np.float32))
      timed = interleaved_seconds(matmul_calls(methods, x, steps), rounds)
      for method, seconds in timed.items():
        seconds /= steps * NUM_MATRICES
        one_row.setdefault(method, seconds)
        records.append(
          dict(
            K=k,
            N=n,
            M=m,
            method=method,
            ms=1000 * seconds,
            gb_per_s=4 * k * n / seconds / 1e9,
            v=seconds / one_row[method],
          )
        )
  return dict(machine=machine, records=records)


def _kernel_product(x, packed, *, n):
  return cpu_matmul.matmul(x, packed, n)


# A 16-node tree (the root, 3 children, 4 grandchildren each): the issue's
# "16-node tree" figure.
DEFAULT_TREE_BRANCHING = (3, 4)


def decoder_costs(
  config: Any,
  params: Any,
  *,
  block_sizes: Sequence[int] = (1, 4, 8),
  tree_branching: Sequence[int] = DEFAULT_TREE_BRANCHING,
  input_length: int = 64,
  max_decode_len: int = 48,
  rounds: int = 3,
) -> Dict[str, Any]:
  """v(block) and v(tree nodes) of one network at batch 1, with XLA's dot and with the kernel.

  Each cost is the fastest of `rounds` timings (`measure.network_step_seconds`
  for chain blocks, `tree_benchmark`'s tree-masked call for the tree), the
  two parameter sets timed in turn in every round; v divides by the
  one-token call of the same parameters. The kernel's parameters are
  `params.pack_params(config, params)`.

  Returns:
    {'machine', 'ms': {method: {'block_<k>' | 'tree_<N>': ms}}, 'v': {...}}.
  """
  # Imported here: the tree benchmark imports models, which imports network.
  from speculative_t5x import decoding  # pylint: disable=g-import-not-at-top
  from speculative_t5x import network  # pylint: disable=g-import-not-at-top
  from speculative_t5x import tree as tree_lib  # pylint: disable=g-import-not-at-top
  from speculative_t5x_lab import tree_benchmark  # pylint: disable=g-import-not-at-top
  from speculative_t5x.kernels import params as params_lib  # pylint: disable=g-import-not-at-top

  packed = params_lib.pack_params(config, params)
  if not isinstance(packed, params_lib.PackedParams):
    raise RuntimeError(
      'The kernel is unavailable here (see the warning above): nothing to compare.'
    )
  variants = {'xla': params, 'kernel': packed}
  tree = tree_lib.Tree.from_branching(tuple(tree_branching))
  cache_length = decoding.speculative_cache_length(max_decode_len, tree.max_depth, tree)
  inputs = measure.random_encoder_inputs(1, input_length, config.vocab_size)
  start = max_decode_len // 2

  def tree_seconds(variant):
    cache = network.init_decoder_cache(config, variant, inputs, cache_length)
    step = functools.partial(
      tree_benchmark._tree_block_step,
      config=config,
      tree=tree,
      first_node=0,
      width=tree.num_nodes,
      start=start,
    )
    checksum = jnp.zeros((1,), jnp.float32)
    return measure.step_seconds(step, variant, (cache, checksum), repetitions=5)

  def block_seconds(variant, block_size):
    return measure.network_step_seconds(
      config,
      variant,
      batch_size=1,
      input_length=input_length,
      block_size=block_size,
      cache_length=cache_length,
      prompt_length=start,
      repetitions=5,
    )

  machine = measure.machine()
  best: Dict[str, Dict[str, float]] = {name: {} for name in variants}
  for _ in range(rounds):
    for name, variant in variants.items():
      figures = {f'block_{k}': block_seconds(variant, k) for k in block_sizes}
      figures[f'tree_{tree.num_nodes}'] = tree_seconds(variant)
      for key, seconds in figures.items():
        best[name][key] = min(best[name].get(key, float('inf')), seconds)
  one = f'block_{block_sizes[0]}'
  return dict(
    machine=machine,
    tree=tree.describe(),
    ms={name: {k: 1000 * s for k, s in figures.items()} for name, figures in best.items()},
    v={name: {k: s / figures[one] for k, s in figures.items()} for name, figures in best.items()},
  )


def markdown_table(result: Dict[str, Any]) -> str:
  """GB/s and v per shape and M, one column pair per method, with the floor in the title."""
  records = result['records']
  methods = list(dict.fromkeys(r['method'] for r in records))
  lines = [
    f'Memory floor (XLA reduction over 512 MiB, same run): '
    f'{result["machine"]["bandwidth_gb_per_s"]:.1f} GB/s; {result["machine"]["cpu"]}',
    '',
    '| K x N | M | ' + ' | '.join(f'{m} GB/s | {m} v' for m in methods) + ' |',
    '| --- | ---: |' + ' ---: | ---: |' * len(methods),
  ]
  by_key = {(r['K'], r['N'], r['M'], r['method']): r for r in records}
  for k, n, m in dict.fromkeys((r['K'], r['N'], r['M']) for r in records):
    cells = []
    for method in methods:
      r = by_key[(k, n, m, method)]
      cells.append(f'{r["gb_per_s"]:.1f} | {r["v"]:.2f}')
    lines.append(f'| {k} x {n} | {m} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _ints(text: str) -> Tuple[int, ...]:
  return tuple(int(t) for t in text.split(',') if t)


def main(argv: Sequence[str] = ()) -> None:
  import argparse  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rows', default=','.join(map(str, DEFAULT_ROWS)))
  parser.add_argument(
    '--shapes', default=','.join(f'{k}x{n}' for k, n in DEFAULT_SHAPES), help='KxN,...'
  )
  parser.add_argument('--json', default='', help='also write the records to this file')
  parser.add_argument(
    '--decoder',
    default='',
    help="also v(block) and v(tree) of configs/models/<NAME>.gin's network with random "
    'weights (e.g. gettext_target), with and without the kernel',
  )
  parser.add_argument('--vocab_size', type=int, default=4000)
  parser.add_argument('--no_matmul', action='store_true', help='skip the matmul table')
  args = parser.parse_args(argv)
  if args.decoder:
    from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top
    from speculative_t5x import network  # pylint: disable=g-import-not-at-top

    config = gin_utils.model_config(args.decoder, args.vocab_size)
    params, _ = network.random_params(config)
    print(json.dumps(decoder_costs(config, jax.tree.map(jnp.asarray, params)), indent=1))
  if args.no_matmul:
    return
  shapes = [tuple(int(d) for d in s.split('x')) for s in args.shapes.split(',')]
  result = compare(shapes, _ints(args.rows))
  print(markdown_table(result))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
