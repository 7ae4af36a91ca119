"""Speculative decoding where the paper's premise holds on a CPU: a memory-bound target.

A T5 1.1 small-size target (77M parameters, float32: each decoder step reads
~168 MB, far more than the last-level cache) and a T5 1.1 tiny draft, both
with random weights and T5's 32,128-token vocabulary; batch 1, greedy, with
acceptances emulated i.i.d. at `--alpha` (no trained pair is needed to time
the loop). Prints, from one run: the walltime table (measured speedup next to
Theorem 3.8's prediction and the prediction from the measured parts), where
each iteration's time goes, and both models' one-token steps against the
memory floor (bytes read / bandwidth measured in the same run).

  python scripts/memory_bound_cpu.py --alpha 0.75 --gammas 1 2 3 4 5 7 \
    --output_dir /tmp/memory_bound_cpu

Runs with the XLA flags the mains choose for this target's size
(`xla_flags.set_decode_flags`); set XLA_FLAGS yourself to compare others. With 16 examples a pass decodes ~200
iterations: emulated acceptance still varies, so tokens per call (and the
prediction that assumes Eq. 1's) can differ by a few percent.

Needs jax, flax and numpy only (matplotlib for the figures).
"""

import argparse

from speculative_t5x_lab import benchmark
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x_lab import reports
from speculative_t5x_lab import xla_flags


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', default='small', help='T5 1.1 size of the target.')
  parser.add_argument('--draft', default='tiny', help='T5 1.1 size of the draft.')
  parser.add_argument('--alpha', type=float, default=0.75)
  parser.add_argument('--gammas', type=int, nargs='+', default=[1, 2, 3, 4, 5, 7])
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0])
  parser.add_argument('--num_examples', type=int, default=16)
  parser.add_argument('--input_length', type=int, default=32)
  parser.add_argument('--max_decode_len', type=int, default=32)
  parser.add_argument('--repetitions', type=int, default=5)
  parser.add_argument('--output_dir', default=None)
  args = parser.parse_args()

  vocab_size = 32128
  target_config = network.t5_1_1_config(args.target, dtype='float32', vocab_size=vocab_size)
  added = xla_flags.set_decode_flags(network.decoder_weight_bytes(target_config))
  print(f'XLA flags added for this target: {" ".join(added) or "none"}', flush=True)
  target = models.random_model(target_config, seed=0)
  draft = models.random_model(
    network.t5_1_1_config(args.draft, dtype='float32', vocab_size=vocab_size), seed=1
  )
  inputs, _ = benchmark.random_inputs(args.num_examples, args.input_length, vocab_size)
  records = benchmark.run_benchmark(
    target,
    draft,
    inputs,
    sweep=benchmark.Sweep(temperatures=tuple(args.temperatures), gammas=args.gammas),
    measurement=benchmark.Measurement(
      num_walltime_examples=args.num_examples,
      repetitions=args.repetitions,
      max_decode_len=args.max_decode_len,
      emulate_alpha=args.alpha,
    ),
    report=benchmark.Report(
      pair_name=f'T5 1.1 {args.target} / {args.draft} (random, float32)',
      task_name=f'random inputs, emulated alpha {args.alpha}',
      output_dir=args.output_dir,
      progress=lambda line: print(line, flush=True),
    ),
  )
  print(reports.markdown_report(records))


if __name__ == '__main__':
  main()
