"""Walltime of a full-size pair at an emulated alpha, without checkpoints or TensorFlow.

Random bfloat16 parameters drawn on the accelerator (fast, unlike the host
draws of `models.random_model`, which take minutes for XXL), then
`benchmark.run_benchmark` with `Measurement(emulate_alpha=...)`: acceptances are i.i.d.
with probability alpha, every row decodes to full length, the report says it
is an emulation. Needs jax, flax and numpy only.

  python scripts/emulated_walltime.py --target xxl --draft small --alpha 0.75 \
    --gammas 3 5 7 --output_dir /tmp/emulated_xxl_small

`--head_widths 1024` adds feature heads (`drafts.FeatureDraft`, random
weights, one decoder layer of that width reading the target's last layer)
to the same interleaved run, timed at the same emulated alpha against the
same baseline: what a head costs (c, its cache rewrite included) beside the
draft model, where random weights cannot show what it would accept.
`--costs_only` times the parts of one iteration (c, v(gamma)) for each draft
and skips the walltime sweep, whose many compiled programs take most of an
XXL run's time:

  python scripts/emulated_walltime.py --target xxl --draft small --gammas 3 7 \
    --head_widths 1024 --costs_only --output_dir /tmp/costs_xxl
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp

from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import settings as settings_lib
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import measure
from speculative_t5x_lab import records as records_lib


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


def random_feature_head(target: models.Model, width: int, output: str) -> drafts.FeatureDraft:
  """A one-layer head of `width` (heads of 64, a T5 1.1 MLP of 2.75 x width) on `target`'s
  last decoder layer, computing in the target's dtype; random float32 parameters."""
  config = feature_head.config_for(
    target.config,
    emb_dim=width,
    num_layers=1,
    num_heads=width // 64,
    head_dim=64,
    mlp_dim=width * 11 // 4,
    output=output,
    dtype=target.config.dtype,
  )
  return drafts.FeatureDraft.for_target(target, feature_head.init_params(config, seed=2), config)


def print_costs(target, candidates, args) -> None:
  """c and v(gamma) of each draft in `candidates` (label -> draft) at batch 1, greedy: the
  target's parts timed once, each draft's beside them. A table row on stdout as each draft is
  done, and all rows so far in output_dir/costs.json (a run stopped early keeps what it had)."""
  settings = settings_lib.SpeculativeSettings(gamma=max(args.gammas))
  os.makedirs(args.output_dir, exist_ok=True)
  step_bytes = measure.decoder_step_bytes(
    target.config,
    target.params,
    batch_size=1,
    block_size=1,
    input_length=args.input_length,
    cache_length=args.input_length + args.max_decode_len,
  )
  bandwidth = measure.memory_bandwidth(num_bytes=args.bandwidth_bytes)
  print(
    f'target step reads {step_bytes / 1e9:.2f} GB; memory streams {bandwidth / 1e9:.0f} GB/s: '
    f'floor {1e3 * step_bytes / bandwidth:.2f} ms',
    flush=True,
  )
  print('| draft | gamma | target step ms | v(gamma) | c | draft ms/token | observe ms |')
  print('|---|---|---|---|---|---|---|', flush=True)
  rows, target_parts = [], None
  for label, draft in candidates.items():
    draft = models.as_draft(draft)
    parts = benchmark.measure_parts(
      target,
      draft,
      (0.0,),
      args.gammas,
      settings,
      input_length=args.input_length,
      max_decode_len=args.max_decode_len,
      emulate_alpha=args.alpha,
      target_parts=target_parts,
    )
    target_parts = target_parts or parts
    for (_, gamma), part in sorted(parts.items()):
      row = dict(
        draft=label,
        gamma=gamma,
        target_step_ms=1e3 * part.target_step,
        v=part.verify_cost,
        c=part.c,
        draft_ms_per_token=1e3 * part.draft_rollout / gamma,
        observe_ms=1e3 * part.draft_observe,
        draft_description=benchmark.describe_draft(draft),
      )
      rows.append(row)
      print(
        f'| {label} | {gamma} | {row["target_step_ms"]:.2f} | {row["v"]:.2f} | {row["c"]:.3f} '
        f'| {row["draft_ms_per_token"]:.2f} | {row["observe_ms"]:.2f} |',
        flush=True,
      )
    with open(os.path.join(args.output_dir, 'costs.json'), 'w') as f:
      json.dump(rows, f, indent=1, default=str)


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
  parser.add_argument('--head_widths', type=int, nargs='*', default=[])
  parser.add_argument('--head_output', choices=feature_head.OUTPUTS, default='own')
  parser.add_argument('--costs_only', action='store_true')
  parser.add_argument(
    '--bandwidth_bytes', type=int, default=2**31, help='array read to measure the floor'
  )
  parser.add_argument('--output_dir', required=True)
  args = parser.parse_args()
  bad_widths = [width for width in args.head_widths if width <= 0 or width % 64]
  if bad_widths:
    parser.error(
      f'--head_widths are positive multiples of 64 (the heads are 64 wide); got {bad_widths}. '
      'Use e.g. --head_widths 256 1024.'
    )

  print('devices:', jax.devices(), flush=True)
  target = device_random_model(args.target, seed=0)
  draft = device_random_model(args.draft, seed=1)
  inputs, _ = benchmark.random_inputs(args.num_examples, args.input_length, target.vocab_size)
  heads = {
    f'feature head, width {width} ({args.head_output} output)': random_feature_head(
      target, width, args.head_output
    )
    for width in args.head_widths
  }
  if args.costs_only:
    print_costs(target, {f'{args.draft} (draft model)': draft, **heads}, args)
    return
  records = benchmark.run_benchmark(
    target,
    draft,
    inputs,
    sweep=benchmark.Sweep(temperatures=(0.0,), gammas=args.gammas, batch_sizes=args.batch_sizes),
    measurement=benchmark.Measurement(
      num_walltime_examples=args.num_examples,
      repetitions=args.repetitions,
      max_decode_len=args.max_decode_len,
      emulate_alpha=args.alpha,
    ),
    other_drafts=benchmark.OtherDrafts(compared_drafts=heads),
    report=benchmark.Report(
      pair_name=f'T5 1.1 {args.target} / {args.draft} (random weights)',
      task_name=f'random inputs, emulated alpha {args.alpha}',
      output_dir=args.output_dir,
      progress=lambda line: print(line, flush=True),
    ),
  )
  costs = [r for r in records if isinstance(r, records_lib.Costs)]
  print(json.dumps(records_lib.to_json(costs), default=float))


if __name__ == '__main__':
  main()
