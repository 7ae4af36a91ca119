"""A parallel draft (PARD) against the distilled chain draft at T = 0 and T = 1, batch 1 (issue 56).

Per temperature, one `benchmark.run_benchmark` of the target with the chain
draft distilled for that temperature, the parallel draft adapted for it timed
in the same interleaved passes (`OtherDrafts.compared_drafts`), over the
gamma sweep: ms/token, speedup, tokens per call, acceptance by position, c,
the drafting cost per iteration (a parallel draft's one call) against a chain
draft step, v(gamma), greedy outputs against the baseline's, each draft's
best gamma (`reports.parallel_draft_lines`). Writes benchmark.json,
benchmark.md and figures to --output_dir, and prints the parallel-draft
section and the issue's acceptance checks.

    python scripts/parallel_draft_benchmark.py --workdir=runs/demo \\
      --parallel_t0=/tmp/pard_T0 --parallel_t1=/tmp/pard_T1 --output_dir=/tmp/pard_benchmark

--untimed decodes without timing (any machine, any load): tokens per call
and acceptance by position of every draft and gamma, e.g. a held-out
evaluation of an adaptation run (--split=validation --gammas=5), written to
rates.json; --rates_json reads such a file instead of decoding. With
--project_c, either mode adds a projection (labelled as one): the speedup
that this run's acceptance by position gives at a draft step cost of
--project_c target steps and a verify cost --project_v (e.g. a full-size
pair's measured c and v), with a parallel draft's call costing
--project_parallel_cost target steps (default: one draft step).

Run from the repository root; the workdir is `make demo`'s (gettext_target,
gettext_draft_forward_kl_T0/T1, corpus/, vocabulary/). The timed mode times
on this machine: run it alone.
"""

import argparse
import json
import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x.data import tasks_core
from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import measure
from speculative_t5x_lab import records as records_lib
from speculative_t5x_lab import reports
from speculative_t5x_lab import theory

TEMPERATURES = (0.0, 1.0)
CHAIN, PARALLEL = 'chain draft', 'parallel draft'
# The acceptance: at this gamma, a parallel call's drafting cost in chain draft steps
# and its tokens per call over the chain's.
CHECK_GAMMA, MAX_CHAIN_STEPS, MIN_TOKENS_RATIO = 5, 1.5, 0.85

Rates = Dict[Tuple[float, str, int], Dict[str, Any]]  # (T, draft, gamma) -> tokens/call, rates.


def load_drafts(workdir: str, parallel_dirs: Sequence[str], vocab_size: int):
  """The target and {temperature: {CHAIN: its distilled draft, PARALLEL: the parallel draft}}."""
  from speculative_t5x import checkpoints  # pylint: disable=g-import-not-at-top
  from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top

  def load(name: str, directory: str) -> models.Model:
    config = gin_utils.model_config(name, vocab_size)
    return models.Model(config, checkpoints.restore_params(directory, config=config))

  target = load('gettext_target', os.path.join(workdir, 'gettext_target'))
  pairs = {
    temperature: {
      CHAIN: load(
        'gettext_draft', os.path.join(workdir, f'gettext_draft_forward_kl_T{temperature:g}')
      ),
      PARALLEL: models.load_parallel_draft(parallel_dir),
    }
    for temperature, parallel_dir in zip(TEMPERATURES, parallel_dirs)
  }
  return target, pairs


def timed_run(target, pairs, inputs, references, vocabulary, args) -> List[records_lib.Record]:
  """`run_benchmark` per temperature, the parallel draft in the chain's passes; all records."""
  records: List[records_lib.Record] = [records_lib.Machine(**measure.machine())]
  for temperature, drafts in pairs.items():
    records += benchmark.run_benchmark(
      target,
      drafts[CHAIN],
      inputs,
      references=references,
      sweep=benchmark.Sweep(temperatures=(temperature,), gammas=args.gammas),
      measurement=benchmark.Measurement(
        num_walltime_examples=args.num_examples,
        repetitions=args.repetitions,
        max_decode_len=args.max_decode_len,
        alpha_tokens=args.alpha_tokens,
      ),
      other_drafts=benchmark.OtherDrafts(compared_drafts={PARALLEL: drafts[PARALLEL]}),
      report=benchmark.Report(
        pair_name=CHAIN, task_name=f'gettext EnDe {args.split}', vocabulary_path=vocabulary
      ),
    )
  return records


def rates_of_records(records: Sequence[records_lib.Record]) -> Rates:
  """The timed run's tokens per call and acceptance by position, by (T, draft, gamma)."""
  return {
    (r.temperature, r.pair, r.gamma): dict(
      tokens_per_call=r.tokens_per_call, acceptance_by_position=r.acceptance_by_position
    )
    for r in records_lib.typed(records)
    if isinstance(r, records_lib.Walltime) and r.batch_size == 1
  }


def untimed_rates(target, pairs, inputs, args, batch_size: int = 16) -> Rates:
  """Tokens per call and acceptance by position of every draft and gamma, decoded untimed."""
  rates = {}
  rows = len(inputs) // batch_size * batch_size or len(inputs)
  for temperature, drafts in pairs.items():
    for name, draft in drafts.items():
      for gamma in args.gammas:
        decode = models.make_decoder(
          target,
          draft,
          gamma=gamma,
          temperature=temperature,
          max_decode_len=args.max_decode_len,
          judge=benchmark.timing_judge(),
        )
        run = benchmark.time_decodings(
          [decode], inputs[:rows], batch_size=min(batch_size, rows), repetitions=1
        )[0]
        counts = acceptance_counts.counts(run.stats)
        rates[temperature, name, gamma] = dict(
          tokens_per_call=float(run.stats.tokens_per_target_call),
          acceptance_by_position=np.asarray(counts.acceptance_by_position).tolist(),
        )
        print(
          f'T={temperature:g} {name} gamma={gamma}: '
          f'{rates[temperature, name, gamma]["tokens_per_call"]:.3f} tokens/call',
          flush=True,
        )
  return rates


def write_rates(path: str, rates: Rates) -> None:
  """Writes `rates` as a JSON list of {temperature, draft, gamma, tokens_per_call, ...}."""
  with open(path, 'w') as f:
    json.dump([dict(temperature=t, draft=n, gamma=g, **r) for (t, n, g), r in rates.items()], f)


def read_rates(path: str) -> Rates:
  """`write_rates`' file read back."""
  with open(path) as f:
    return {(r.pop('temperature'), r.pop('draft'), r.pop('gamma')): r for r in json.load(f)}


def rate_lines(rates: Rates) -> List[str]:
  """Markdown: tokens per call and acceptance by position (the untimed mode's table)."""
  lines = ['| T | gamma | draft | tokens/call | acceptance by position |', '|---|---|---|---|---|']
  for (temperature, name, gamma), r in sorted(rates.items()):
    lines.append(
      f'| {temperature:g} | {gamma} | {name} | {r["tokens_per_call"]:.2f} '
      f'| {" ".join(f"{a:.2f}" for a in r["acceptance_by_position"])} |'
    )
  return lines


def projection(rates: Rates, c: float, verify_cost: float, parallel_cost: float) -> List[str]:
  """Markdown: the speedups this run's acceptance by position gives at other costs (a projection).

  Per (T, gamma): `theory.walltime_improvement_by_position` of the chain draft
  (gamma steps of c target steps each) and of the parallel draft (one call of
  `parallel_cost` target steps), both with v(gamma) = `verify_cost`.
  """
  lines = [
    f'PROJECTION, not a measurement: draft step c = {c}, parallel call {parallel_cost}, '
    f'v = {verify_cost} target steps; acceptance by position from this run.',
    '',
    '| T | gamma | chain: E[tokens/call] | chain: speedup | parallel: E[tokens/call] '
    '| parallel: speedup |',
    '|---|---|---|---|---|---|',
  ]
  for temperature, name, gamma in sorted(rates):
    if name != CHAIN or (temperature, PARALLEL, gamma) not in rates:
      continue
    cells = []
    for drafting_cost, key in ((gamma * c, CHAIN), (parallel_cost, PARALLEL)):
      by_position = rates[temperature, key, gamma]['acceptance_by_position']
      cells += [
        f'{float(theory.expected_tokens_by_position(by_position)):.2f}',
        f'{float(theory.walltime_improvement_by_position(by_position, drafting_cost, verify_cost)):.2f}x',
      ]
    lines.append(f'| {temperature:g} | {gamma} | ' + ' | '.join(cells) + ' |')
  return lines


def acceptance_checks(records: Sequence[records_lib.Record]) -> List[str]:
  """The issue's acceptance, each check with its figures and 'met' or 'NOT met'."""
  walltime = {
    (r.temperature, r.pair, r.gamma): r
    for r in records_lib.typed(records)
    if isinstance(r, records_lib.Walltime) and r.batch_size == 1
  }
  verdict = lambda ok: 'met' if ok else 'NOT met'
  lines = []
  for temperature in sorted({t for t, _, _ in walltime}):
    chain, parallel = (
      walltime.get((temperature, CHAIN, CHECK_GAMMA)),
      walltime.get((temperature, PARALLEL, CHECK_GAMMA)),
    )
    if chain is not None and parallel is not None:
      steps = CHECK_GAMMA * parallel.c / chain.c
      ratio = parallel.tokens_per_call / chain.tokens_per_call
      lines += [
        f'- T = {temperature:g}, gamma {CHECK_GAMMA}: drafting cost {steps:.2f} chain draft '
        f'steps (chain: {CHECK_GAMMA}) <= {MAX_CHAIN_STEPS}: {verdict(steps <= MAX_CHAIN_STEPS)}',
        f"- T = {temperature:g}, gamma {CHECK_GAMMA}: tokens per call {ratio:.2f}x the chain's "
        f'>= {MIN_TOKENS_RATIO}: {verdict(ratio >= MIN_TOKENS_RATIO)}',
      ]
    best = {
      name: max(
        (r for (t, n, _), r in walltime.items() if t == temperature and n == name),
        key=lambda r: r.speedup['median'],
      )
      for name in (CHAIN, PARALLEL)
    }
    lines.append(
      f'- T = {temperature:g}: best speedup, parallel {best[PARALLEL].speedup["median"]:.2f}x '
      f'(gamma {best[PARALLEL].gamma}) >= chain {best[CHAIN].speedup["median"]:.2f}x (gamma '
      f'{best[CHAIN].gamma}): '
      f'{verdict(best[PARALLEL].speedup["median"] >= best[CHAIN].speedup["median"])}'
    )
  return lines


def decoded_rates_and_lines(args) -> Tuple[Rates, List[str]]:
  """Loads the pair and the drafts and decodes (--untimed) or runs the timed comparison."""
  import sentencepiece  # pylint: disable=g-import-not-at-top

  vocabulary = os.path.join(args.workdir, 'vocabulary', 'spm_4000.model')
  vocab_size = sentencepiece.SentencePieceProcessor(model_file=vocabulary).get_piece_size()
  target, pairs = load_drafts(args.workdir, (args.parallel_t0, args.parallel_t1), vocab_size)
  inputs, references = benchmark.tsv_inputs(
    os.path.join(args.workdir, 'corpus', f'{args.split}.tsv'),
    vocabulary,
    prefix=tasks_core.EN_DE_PREFIX,
    num_examples=args.num_examples,
  )
  inputs = layouts.trim_padding(inputs)
  if args.untimed:
    rates = untimed_rates(target, pairs, inputs, args)
    write_rates(os.path.join(args.output_dir, 'rates.json'), rates)
    return rates, rate_lines(rates)
  records = timed_run(target, pairs, inputs, references, vocabulary, args)
  reports.write_report(records, args.output_dir)
  return rates_of_records(records), reports.parallel_draft_lines(records) + [
    '',
    *acceptance_checks(records),
  ]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', help="make demo's workdir (the pair)")
  parser.add_argument('--parallel_t0', help='the parallel draft for T = 0')
  parser.add_argument('--parallel_t1', help='the parallel draft for T = 1')
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--split', default='test', help='corpus/<split>.tsv is decoded')
  parser.add_argument('--num_examples', type=int, default=16)
  parser.add_argument('--max_decode_len', type=int, default=48)
  parser.add_argument('--gammas', type=int, nargs='+', default=[1, 2, 3, 5, 8, 12])
  parser.add_argument('--repetitions', type=int, default=3)
  parser.add_argument('--alpha_tokens', type=int, default=5000)
  parser.add_argument('--untimed', action='store_true', help='tokens per call and rates only')
  parser.add_argument(
    '--rates_json', default=None, help="an --untimed run's rates.json: no decoding, e.g. to project"
  )
  parser.add_argument('--project_c', type=float, default=None)
  parser.add_argument('--project_v', type=float, default=1.0)
  parser.add_argument('--project_parallel_cost', type=float, default=None)
  args = parser.parse_args(argv)
  os.makedirs(args.output_dir, exist_ok=True)
  if args.rates_json:
    rates = read_rates(args.rates_json)
    lines = rate_lines(rates)
  else:
    if not (args.workdir and args.parallel_t0 and args.parallel_t1):
      parser.error('--workdir, --parallel_t0 and --parallel_t1 are needed unless --rates_json.')
    rates, lines = decoded_rates_and_lines(args)
  if args.project_c is not None:
    parallel_cost = (
      args.project_c if args.project_parallel_cost is None else args.project_parallel_cost
    )
    lines += [''] + projection(rates, args.project_c, args.project_v, parallel_cost)
  text = '\n'.join(lines) + '\n'
  with open(os.path.join(args.output_dir, 'parallel_draft.md'), 'w') as f:
    f.write(text)
  print(text)


if __name__ == '__main__':
  main()
