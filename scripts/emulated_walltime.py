"""Walltime of a full-size pair at an emulated alpha, without checkpoints or TensorFlow.

Random bfloat16 parameters drawn on the accelerator (fast, unlike the host
draws of `models.random_model`, which take minutes for XXL), then
`benchmark.run_benchmark(..., emulate_alpha=...)`: acceptances are i.i.d.
with probability alpha, every row decodes to full length, the report says it
is an emulation. Needs jax, flax and numpy only.

  python scripts/emulated_walltime.py --target xxl --draft small --alpha 0.75 \
    --gammas 3 5 7 --output_dir /tmp/emulated_xxl_small
"""

import argparse
import json

import jax
import jax.numpy as jnp

from speculative_t5x.bench import benchmark
from speculative_t5x import models
from speculative_t5x import network


def device_random_model(size: str, seed: int) -> models.Model:
  """T5 1.1 `size` in bfloat16 with N(0, 1/fan_in) weights drawn on the default device."""
  config = network.t5_1_1_config(size)
  shapes, _ = network.abstract_params(config)
  leaves, treedef = jax.tree_util.tree_flatten(shapes)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  draw = jax.jit(
    lambda key, shape: jax.random.normal(key, shape, jnp.bfloat16) * jnp.bfloat16(shape[0] ** -0.5),
    static_argnums=1,
  )
  params = [draw(key, leaf.shape) for key, leaf in zip(keys, leaves)]
  return models.Model(config, jax.tree_util.tree_unflatten(treedef, params))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', default='xxl')
  parser.add_argument('--draft', default='small')
  parser.add_argument('--alpha', type=float, default=0.75)
  parser.add_argument('--gammas', type=int, nargs='+', default=[3, 5, 7])
  parser.add_argument('--batch_sizes', type=int, nargs='+', default=[1])
  parser.add_argument('--num_examples', type=int, default=4)
  parser.add_argument('--input_length', type=int, default=64)
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repetitions', type=int, default=2)
  parser.add_argument('--output_dir', required=True)
  args = parser.parse_args()

  print('devices:', jax.devices(), flush=True)
  target = device_random_model(args.target, seed=0)
  draft = device_random_model(args.draft, seed=1)
  inputs, _ = benchmark.random_inputs(args.num_examples, args.input_length, target.vocab_size)
  records = benchmark.run_benchmark(
    target,
    draft,
    inputs,
    pair_name=f'T5 1.1 {args.target} / {args.draft} (random weights)',
    task_name=f'random inputs, emulated alpha {args.alpha}',
    temperatures=(0.0,),
    gammas=args.gammas,
    batch_sizes=args.batch_sizes,
    num_walltime_examples=args.num_examples,
    repetitions=args.repetitions,
    max_decode_len=args.max_decode_len,
    emulate_alpha=args.alpha,
    output_dir=args.output_dir,
    progress=lambda line: print(line, flush=True),
  )
  print(json.dumps([r for r in records if r['kind'] == 'costs'], default=float))


if __name__ == '__main__':
  main()
