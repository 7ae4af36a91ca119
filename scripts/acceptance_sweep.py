"""Tokens per target call and walltime: block vs token verification, adaptive draft length, auto γ.

One run on one pair and one set of inputs (issue 13's acceptance figures):

  * tokens per target call, block vs token verification, at each temperature
    and γ, with the gain (block - token) and its standard error over
    sequences (each input decoded by both rules, so the gain is paired);
  * walltime speedup over the baseline of every configuration, all batches
    interleaved (`benchmark.time_decodings`), and the block / token walltime
    ratio at the best γ;
  * the adaptive draft length (`--draft_threshold`, drafting at most the
    largest γ) against the best fixed γ: speedup and tokens per call;
  * the γ that `theory.choose_gamma` (γ='auto') picks from the measured α, c
    and v(γ), against the measured best.

    python scripts/acceptance_sweep.py \\
      --target_dir=runs/demo/gettext_target --target_config=gettext_target \\
      --draft_dir=runs/demo/gettext_draft --draft_config=gettext_draft \\
      --vocabulary=runs/demo/vocabulary/spm_4000.model \\
      --tsv=runs/demo/corpus/test.tsv --output=/tmp/acceptance_sweep.json

Run from the repository root (the model names are configs/models/*.gin).
Batch 1 (the regime of the paper's Table 2); it times on this machine, so run
it alone.
"""

import argparse
import json
from typing import Any, Callable, Dict, Sequence

import numpy as np

from speculative_t5x import acceptance
from speculative_t5x_lab import benchmark
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import settings as settings_lib
from speculative_t5x import speculative_sampling
from speculative_t5x_lab import theory


def per_sequence_tokens_per_call(run: benchmark.DecodeRun) -> np.ndarray:
  """float [N]: each sequence's tokens emitted per target call (batch 1: its iterations)."""
  stats = run.stats
  return np.asarray(stats.emitted) / np.maximum(np.asarray(stats.iterations), 1)


def mean_and_stderr(values: np.ndarray) -> Dict[str, float]:
  values = np.asarray(values, np.float64)
  return dict(mean=float(values.mean()), stderr=acceptance.standard_error(values))


def sweep(
  target: models.Model,
  draft: models.Model,
  inputs: np.ndarray,
  *,
  temperatures: Sequence[float] = (0.0, 1.0),
  gammas: Sequence[int] = tuple(range(1, 8)),
  draft_threshold: float = 0.4,
  max_decode_len: int = 64,
  repetitions: int = 3,
  alpha_tokens: int = 10_000,
  progress: Callable[[str], None] = print,
) -> Dict[str, Any]:
  """Measures every figure of the module docstring; returns them as a JSON-ready dict.

  Args:
    target, draft: the pair.
    inputs: int32 [N, Lin] encoder inputs (all are timed at batch 1).
    temperatures: sampling temperatures (0 is greedy).
    gammas: the fixed γs; the adaptive run drafts at most max(gammas).
    draft_threshold: the adaptive draft length's threshold (> 0).
    max_decode_len: output length.
    repetitions: timed passes per configuration.
    alpha_tokens: target tokens of each α measurement.
    progress: called with a line per step.
  """
  inputs = layouts.trim_padding(inputs)
  gammas = sorted(gammas)
  progress('Measuring c and v(gamma) ...')
  parts = benchmark.measure_parts(
    target,
    draft.as_draft(),
    temperatures,
    gammas,
    settings_lib.SpeculativeSettings(),  # c and v; the theory's γ choice uses no judge time.
    input_length=inputs.shape[1],
    max_decode_len=max_decode_len,
    repetitions=max(5, repetitions),
  )
  result = {'num_examples': int(len(inputs)), 'draft_threshold': draft_threshold, 'by_t': {}}
  for temperature in temperatures:
    progress(f'T={temperature}: alpha ...')
    alpha = acceptance.measure_alpha(
      target,
      {'draft': draft},
      inputs,
      temperature=temperature,
      max_decode_len=max_decode_len,
      min_tokens=alpha_tokens,
    )['draft'].alpha
    settings = dict(temperature=temperature, max_decode_len=max_decode_len)
    configs = [('baseline', None, None, 0.0)]
    configs += [(v, v, g, 0.0) for g in gammas for v in speculative_sampling.VERIFICATIONS]
    configs += [
      (f'{v}, adaptive', v, gammas[-1], draft_threshold) for v in speculative_sampling.VERIFICATIONS
    ]
    decoders = [
      models.make_decoder(target, None, **settings)
      if gamma is None
      else models.make_decoder(
        target,
        draft,
        gamma=gamma,
        verification=verification,
        draft_threshold=threshold,
        **settings,
      )
      for _, verification, gamma, threshold in configs
    ]
    progress(f'T={temperature}: timing {len(decoders)} decoders, batches interleaved ...')
    runs = benchmark.time_decodings(decoders, inputs, batch_size=1, repetitions=repetitions)
    baseline = runs[0]
    rows = []
    for (name, verification, gamma, threshold), run in zip(configs[1:], runs[1:]):
      speedups = [b / s for b, s in zip(baseline.ms_per_token, run.ms_per_token)]
      rows.append(
        dict(
          name=name,
          verification=verification,
          gamma=gamma,
          draft_threshold=threshold,
          speedup=float(np.median(speedups)),
          tokens_per_call=float(run.stats.tokens_per_target_call),
          mean_acceptance_length=float(run.stats.mean_acceptance_length),
          drafted_per_iteration=float(run.stats.drafted_per_iteration),
          per_sequence=per_sequence_tokens_per_call(run),
        )
      )
    result['by_t'][temperature] = summarize(rows, alpha, parts, temperature, gammas)
  return result


def summarize(rows, alpha, parts, temperature, gammas) -> Dict[str, Any]:
  """The figures of one temperature from its timed rows (see `sweep`)."""
  fixed = {(r['verification'], r['gamma']): r for r in rows if not r['draft_threshold']}
  comparison = []
  for gamma in gammas:
    token, block = fixed['token', gamma], fixed['block', gamma]
    comparison.append(
      dict(
        gamma=gamma,
        token=token['tokens_per_call'],
        block=block['tokens_per_call'],
        gain=mean_and_stderr(block['per_sequence'] - token['per_sequence']),
        speedup_token=token['speedup'],
        speedup_block=block['speedup'],
      )
    )
  best_token = max(gammas, key=lambda g: fixed['token', g]['speedup'])
  best = max(fixed.values(), key=lambda r: r['speedup'])
  adaptive = [r for r in rows if r['draft_threshold']]
  chosen = theory.choose_gamma(
    theory.predicted_speedups(
      alpha,
      {g: parts[temperature, g].c for g in gammas},
      {g: parts[temperature, g].verify_cost for g in gammas},
    )
  )
  strip = lambda r: {k: v for k, v in r.items() if k != 'per_sequence'}
  return dict(
    alpha=alpha,
    tokens_per_call=comparison,
    best_token_gamma=best_token,
    block_over_token_walltime_at_best_gamma=(
      fixed['block', best_token]['speedup'] / fixed['token', best_token]['speedup']
    ),
    best_fixed=strip(best),
    adaptive=[dict(strip(r), over_best_fixed=r['speedup'] / best['speedup']) for r in adaptive],
    auto_gamma=dict(
      chosen=chosen,
      chosen_speedup=fixed['token', chosen]['speedup'],
      best=best_token,
      best_speedup=fixed['token', best_token]['speedup'],
      chosen_over_best=fixed['token', chosen]['speedup'] / fixed['token', best_token]['speedup'],
    ),
  )


def format_report(result: Dict[str, Any]) -> str:
  """Markdown tables of `sweep`'s result."""
  lines = [f'{result["num_examples"]} inputs, batch 1.']
  for temperature, r in result['by_t'].items():
    lines += [
      '',
      f'## T = {temperature} (alpha {r["alpha"]:.3f})',
      '',
      '| gamma | tokens/call token | block | gain (stderr) | speedup token | block |',
      '|---|---|---|---|---|---|',
    ]
    for c in r['tokens_per_call']:
      lines.append(
        f'| {c["gamma"]} | {c["token"]:.3f} | {c["block"]:.3f} '
        f'| {c["gain"]["mean"]:+.3f} ({c["gain"]["stderr"]:.3f}) '
        f'| {c["speedup_token"]:.2f}x | {c["speedup_block"]:.2f}x |'
      )
    best, auto = r['best_fixed'], r['auto_gamma']
    lines += [
      '',
      f'Block / token walltime at the best token gamma ({r["best_token_gamma"]}): '
      f'{r["block_over_token_walltime_at_best_gamma"]:.3f}.',
      f'Best fixed: {best["verification"]}, gamma {best["gamma"]}: {best["speedup"]:.2f}x, '
      f'{best["tokens_per_call"]:.2f} tokens/call.',
    ]
    for a in r['adaptive']:
      lines.append(
        f'Adaptive ({a["verification"]}, threshold {a["draft_threshold"]}, gamma <= '
        f'{a["gamma"]}): {a["speedup"]:.2f}x ({a["over_best_fixed"]:.3f} of the best fixed), '
        f'{a["tokens_per_call"]:.2f} tokens/call, {a["drafted_per_iteration"]:.2f} drafted.'
      )
    lines.append(
      f"gamma='auto' picks {auto['chosen']} ({auto['chosen_speedup']:.2f}x); measured best "
      f'token gamma {auto["best"]} ({auto["best_speedup"]:.2f}x): '
      f'{auto["chosen_over_best"]:.3f} of the best.'
    )
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--target_dir', required=True, help="the target's checkpoint directory")
  parser.add_argument('--draft_dir', required=True, help="the draft's checkpoint directory")
  parser.add_argument('--target_config', required=True, help='configs/models/<name>.gin')
  parser.add_argument('--draft_config', required=True, help='configs/models/<name>.gin')
  parser.add_argument('--vocabulary', required=True, help='the SentencePiece model')
  parser.add_argument('--tsv', required=True, help='source<TAB>target lines to decode')
  parser.add_argument('--prefix', default=None, help="task prefix (default: T5's EnDe one)")
  parser.add_argument('--num_examples', type=int, default=64)
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--temperatures', default='0,1')
  parser.add_argument('--gammas', default='1,2,3,4,5,6,7')
  parser.add_argument('--draft_threshold', type=float, default=0.4)
  parser.add_argument('--repetitions', type=int, default=3)
  parser.add_argument('--alpha_tokens', type=int, default=10_000)
  parser.add_argument('--output', default=None, help='also write the result as JSON here')
  args = parser.parse_args(argv)

  import sentencepiece  # pylint: disable=g-import-not-at-top

  from speculative_t5x import checkpoints  # pylint: disable=g-import-not-at-top
  from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

  vocab_size = sentencepiece.SentencePieceProcessor(model_file=args.vocabulary).get_piece_size()
  pair = []
  for name, directory in (
    (args.target_config, args.target_dir),
    (args.draft_config, args.draft_dir),
  ):
    config = gin_utils.model_config(name, vocab_size)
    pair.append(models.Model(config, checkpoints.restore_params(directory, config=config)))
  inputs, _ = benchmark.tsv_inputs(
    args.tsv,
    args.vocabulary,
    prefix=tasks_core.EN_DE_PREFIX if args.prefix is None else args.prefix,
    num_examples=args.num_examples,
  )
  result = sweep(
    *pair,
    inputs,
    temperatures=[float(t) for t in args.temperatures.split(',')],
    gammas=[int(g) for g in args.gammas.split(',')],
    draft_threshold=args.draft_threshold,
    max_decode_len=args.max_decode_len,
    repetitions=args.repetitions,
    alpha_tokens=args.alpha_tokens,
  )
  print(format_report(result))
  if args.output:
    with open(args.output, 'w') as f:
      json.dump(result, f, indent=1, default=float)


if __name__ == '__main__':
  main()
