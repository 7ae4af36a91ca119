"""Speculative / baseline time per token for a perfect and a useless draft.

The two ends of what this implementation can reach, at batch 1, greedy, on
random weights (no training needed): the draft equal to the target (alpha =
1, every iteration emits gamma + 1 tokens: the upper bound) and an
independent random draft (alpha ~ 0, one token per iteration: the lower
bound), for a gamma sweep, each next to Theorem 3.8's prediction from the
measured c and verify cost (`benchmark.run_benchmark` measures and predicts).

  python scripts/speedup_bounds.py --target gettext_target --draft gettext_draft
"""

import argparse
import dataclasses
import os
import tempfile

from speculative_t5x_lab import benchmark
from speculative_t5x import gin_utils
from speculative_t5x import models


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', default='gettext_target', help='configs/models/<name>.gin')
  parser.add_argument('--draft', default='gettext_draft', help='configs/models/<name>.gin')
  parser.add_argument('--vocab_size', type=int, default=4000)
  parser.add_argument('--gammas', type=int, nargs='+', default=[1, 3, 5, 7])
  parser.add_argument('--num_examples', type=int, default=8)
  parser.add_argument('--max_decode_len', type=int, default=48)
  parser.add_argument('--repetitions', type=int, default=3)
  parser.add_argument('--output_dir', default=None, help='Reports (default: a temporary dir).')
  args = parser.parse_args()

  # Untied logits: with random weights and logits through the shared
  # embedding, every network's argmax repeats the previous token, so any two
  # would agree everywhere; a separate random logits layer makes them disagree.
  untied = lambda name: dataclasses.replace(
    gin_utils.model_config(name, args.vocab_size), logits_via_embedding=False
  )
  target = models.random_model(untied(args.target), seed=0)
  draft = models.random_model(untied(args.draft), seed=1)
  inputs, _ = benchmark.random_inputs(args.num_examples, 24, args.vocab_size)
  output_dir = args.output_dir or tempfile.mkdtemp(prefix='speedup_bounds_')
  print(
    'draft | gamma | alpha | c | v(gamma) | tokens/call | speculative/baseline time '
    'per token | Theorem 3.8 predicts'
  )
  for name, candidate in (('= target', target), ('random', draft)):
    records = benchmark.run_benchmark(
      target,
      candidate,
      inputs,
      sweep=benchmark.Sweep(temperatures=(0.0,), gammas=args.gammas),
      measurement=benchmark.Measurement(
        num_walltime_examples=args.num_examples,
        repetitions=args.repetitions,
        max_decode_len=args.max_decode_len,
        alpha_tokens=2000,
      ),
      report=benchmark.Report(
        output_dir=os.path.join(output_dir, name.replace('= ', '')), progress=lambda _: None
      ),
    )
    for r in records:
      if r['kind'] == 'walltime':
        print(
          f'{name} | {r["gamma"]} | {r["alpha"]:.3f} | {r["c"]:.3f} | '
          f'{r["verify_cost"]:.2f} | {r["tokens_per_call"]:.2f} | '
          f'{1 / r["speedup"]["median"]:.3f} | {1 / r["predicted_speedup"]:.3f}'
        )
  print(f'Reports: {output_dir}')


if __name__ == '__main__':
  main()
