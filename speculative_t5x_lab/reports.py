"""Benchmark reports: Markdown tables, benchmark.json and figures from the records.

The records are `benchmark.run_benchmark`'s (`records`: one class per kind,
each naming the target's architecture), or benchmark.json's dicts, read back
with `records.from_json` at the entry points (`markdown_report`,
`plot_report`, `write_report`). This module reads them only; matplotlib is
imported when a figure is asked for.
"""

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from speculative_t5x_lab import profile_sweep
from speculative_t5x_lab import records as records_lib


def _fmt(value, digits=2):
  return '-' if value is None else f'{value:.{digits}f}'


def markdown_report(records: Sequence[records_lib.Record]) -> str:
  """Markdown tables: walltime and prediction (Tables 2 and 4), alpha (Table 3),
  distillation, batch size, memory, acceptance by position."""
  records = records_lib.typed(records)
  lines = _pair_lines(records) + _machine_lines(records)
  walltime = [r for r in records if isinstance(r, records_lib.Walltime)]
  if any(getattr(r, 'emulated', False) for r in records):
    lines += [
      '**EMULATION**: acceptances drawn i.i.d. at the given alpha on random weights; '
      'timings only, no text.',
      '',
    ]
  lines += _walltime_lines(walltime)
  lines += _sampled_quality_lines(walltime)
  lines += _breakdown_lines(records)
  lines += _gamma_choice_lines(records)
  lines += _alpha_lines(records)
  lines += _distillation_lines(records)
  lines += _head_training_lines(records)
  lines += _profile_lines(records)
  if not any(isinstance(r, records_lib.Profile) for r in records):
    lines += _batch_size_lines(walltime)
  lines += _memory_lines(walltime)
  lines += _drafting_lines(walltime)
  lines += parallel_draft_lines(records)
  return '\n'.join(lines) + '\n'


def _walltime_lines(walltime: Sequence[records_lib.Walltime]) -> List[str]:
  """Markdown: Tables 2 and 4, the batch-1 walltime records with their predictions."""
  lines = [
    '## Walltime at batch 1 (Tables 2 and 4)',
    '',
    '| pair | task | T | gamma | alpha | alpha (loop) | c | v(gamma) | tokens/call '
    '| ms/token base | ms/token spec | speedup (range) | predicted | predicted, v=1 '
    '| BLEU base / spec |',
    '|' + '---|' * 15,
  ]
  for r in walltime:
    if r.batch_size != 1:
      continue
    bleu = _bleu_cell(r)
    lines.append(
      f'| {r.pair} | {r.task} | {r.temperature} | {r.gamma} | {_fmt(r.alpha)} '
      f'| {_fmt(r.alpha_loop)} | {_fmt(r.c, 3)} | {_fmt(r.verify_cost)} '
      f'| {_fmt(r.tokens_per_call)} | {_fmt(r.ms_per_token_baseline["median"])} '
      f'| {_fmt(r.ms_per_token_speculative["median"])} '
      f'| {_fmt(r.speedup["median"])}x ({_fmt(r.speedup["min"])}-'
      f'{_fmt(r.speedup["max"])}) | {_fmt(r.predicted_speedup)}x '
      f'| {_fmt(r.predicted_speedup_free_verify)}x | {bleu} |'
    )
  return lines


def _alpha_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: Table 3, the `records.Alpha` records (none: no lines)."""
  alpha = [r for r in records if isinstance(r, records_lib.Alpha)]
  if not alpha:
    return []
  lines = [
    '',
    '## alpha (Table 3)',
    '',
    'On target samples (after the prompts); a prompt-lookup draft is judged by its '
    'first guess at each position. "Cut": the samples that reach the decode length '
    'without EOS (a weak target repeating a phrase, mostly greedy), their share of the '
    'tokens and alpha on them; "ended": alpha on the samples that end with EOS.',
    '',
    '| draft | T | alpha | stderr | tokens | cut share | alpha cut | alpha ended |',
    '|---|---|---|---|---|---|---|---|',
  ]
  lines += [
    f'| {r.draft} | {r.temperature} | {_fmt(r.alpha, 3)} '
    f'| {_fmt(r.alpha_stderr, 3)} | {r.num_tokens} | {_fmt(r.cut_share, 2)} '
    f'| {_fmt(r.alpha_cut, 3)} | {_fmt(r.alpha_ended, 3)} |'
    for r in alpha
  ]
  return lines + _cached_lines(r.cached_from for r in alpha)


def _batch_size_lines(walltime: Sequence[records_lib.Walltime]) -> List[str]:
  """Markdown: speedup vs batch size at the batch sweep's gamma (no batch sweep: no lines)."""
  batched = [r for r in walltime if r.batch_size != 1]
  if not batched:
    return []
  lines = [
    '',
    '## Speedup vs batch size',
    '',
    '| T | gamma | batch | ms/token base | ms/token spec | speedup |',
    '|---|---|---|---|---|---|',
  ]
  for r in sorted(walltime, key=lambda r: (r.temperature, r.batch_size)):
    if r.gamma == batched[0].gamma:
      lines.append(
        f'| {r.temperature} | {r.gamma} | {r.batch_size} '
        f'| {_fmt(r.ms_per_token_baseline["median"])} '
        f'| {_fmt(r.ms_per_token_speculative["median"])} '
        f'| {_fmt(r.speedup["median"])}x |'
      )
  return lines


def _memory_lines(walltime: Sequence[records_lib.Walltime]) -> List[str]:
  """Markdown: XLA's memory and acceptance by draft position of the batch-1 records."""
  lines = [
    '',
    '## Memory and acceptance by position (batch 1)',
    '',
    '| pair | T | gamma | XLA temp MiB | XLA args MiB | acceptance by draft position |',
    '|---|---|---|---|---|---|',
  ]
  for r in walltime:
    if r.batch_size == 1:
      mem = r.memory
      lines.append(
        f'| {r.pair} | {r.temperature} | {r.gamma} '
        f'| {_fmt(mem.get("temp_bytes", 0) / 2**20, 1)} '
        f'| {_fmt(mem.get("argument_bytes", 0) / 2**20, 1)} '
        f'| {" ".join(f"{a:.2f}" for a in r.acceptance_by_position)} |'
      )
  return lines


def _machine_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: the machine the run measured (a record of kind 'machine', if any)."""
  machine = next((r for r in records if isinstance(r, records_lib.Machine)), None)
  if machine is None:
    return []
  step = (
    f'; a target training step ({machine.training_step_rows} rows) {machine.training_step_s:.2f} s'
    if machine.training_step_s is not None
    else ''
  )
  return [
    f'Machine: {machine.cpu} (CPU family {machine.cpu_family}), '
    f'{machine.cores} cores, {machine.bandwidth_gb_per_s:.1f} GB/s '
    f'(a reduction over 512 MiB){step}.',
    '',
  ]


def _bleu_cell(record: records_lib.Walltime) -> str:
  """The walltime table's BLEU: greedy, one value each; sampled, mean +- stderr over keys."""
  quality = record.sampled_quality
  if quality and quality['baseline']['bleu'] is not None:
    return ' / '.join(
      f'{quality[name]["bleu"]["mean"]:.1f} ± {quality[name]["bleu"]["stderr"]:.1f}'
      for name in ('baseline', 'speculative')
    )
  if record.bleu_baseline is None:
    return '-'
  return f'{_fmt(record.bleu_baseline, 1)} / {_fmt(record.bleu_speculative, 1)}'


# What a sampled-quality row means, in the report and in the demo's table.
SAMPLED_QUALITY_NOTE = (
  'At T > 0 each decode is a sample: speculative decoding samples from the same '
  "distribution as the baseline (the target's), so their BLEU and output length differ "
  'only by sampling noise. Each is the mean ± standard error over keys (each key: one '
  'corpus BLEU and one mean length over the same inputs); diff = (speculative - '
  'baseline) / the standard error of that difference.'
)


def sampled_quality_line(record: records_lib.Walltime) -> str:
  """One walltime record's sampled quality as a line of text."""
  q = record.sampled_quality
  ms = lambda name, field, digits: (
    f'{q[name][field]["mean"]:.{digits}f} ± {q[name][field]["stderr"]:.{digits}f}'
  )
  bleu = (
    f'BLEU {ms("baseline", "bleu", 1)} / {ms("speculative", "bleu", 1)} '
    f'(diff {q["bleu_difference_in_stderr"]:+.1f} SE), '
    if q['baseline']['bleu'] is not None
    else ''
  )
  return (
    f'  T={record.temperature} gamma={record.gamma}, {q["num_keys"]} keys x '
    f'{q["num_examples"]} inputs: {bleu}mean length {ms("baseline", "length", 1)} / '
    f'{ms("speculative", "length", 1)} tokens (baseline / speculative)'
  )


def _sampled_quality_lines(walltime: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: BLEU and output length at T > 0, mean +- standard error over keys."""
  rows = [r for r in walltime if r.sampled_quality and r.batch_size == 1]
  if not rows:
    return []
  lines = [
    '',
    '## Sampled quality (T > 0): samples of one distribution',
    '',
    SAMPLED_QUALITY_NOTE + ' Greedy rows check instead that the outputs are identical.',
    '',
    '| T | gamma | keys x inputs | BLEU base | BLEU spec | diff (SE) | length base | length spec |',
    '|' + '---|' * 8,
  ]
  for r in rows:
    q = r.sampled_quality
    cell = lambda name, field, digits=1: (
      '-'
      if q[name][field] is None
      else f'{q[name][field]["mean"]:.{digits}f} ± {q[name][field]["stderr"]:.{digits}f}'
    )
    diff = q.get('bleu_difference_in_stderr')
    lines.append(
      f'| {r.temperature} | {r.gamma} | {q["num_keys"]} x {q["num_examples"]} '
      f'| {cell("baseline", "bleu")} | {cell("speculative", "bleu")} '
      f'| {"-" if diff is None else f"{diff:+.1f}"} '
      f'| {cell("baseline", "length")} | {cell("speculative", "length")} |'
    )
  return lines + _cached_lines(
    r.sampled_quality[name].get('cached_from') for r in rows for name in ('baseline', 'speculative')
  )


def _cached_lines(cached_from: Iterable[Optional[Dict[str, str]]]) -> List[str]:
  """Markdown: which runs computed the figures above that were read from the result cache."""
  dates = sorted({c['computed'] for c in cached_from if c})
  if not dates:
    return []
  return [
    '',
    f'Read from the result cache (computed in the run of {", ".join(dates)}: same '
    'checkpoints, inputs, code and machine kind; `--remeasure` recomputes them).',
  ]


def _pair_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: the pair, its architecture and the prompts (from the costs records).

  A run's first costs record is its pair's; the others', drafts compared in the
  same passes (`benchmark.OtherDrafts.compared_drafts`) or other runs' pairs.
  """
  all_costs = [r for r in records if isinstance(r, records_lib.Costs)]
  if not all_costs:
    return []
  costs = all_costs[0]
  others = list({r.pair: r for r in all_costs[1:] if r.pair != costs.pair}.values())
  prompts = costs.prompts
  described = (
    'none (decoding starts at BOS)'
    if prompts is None
    else f'{prompts["mean_tokens"]:.1f} tokens on average (at most {prompts["max_tokens"]}, '
    f'width {prompts["width"]})'
  )
  # Records written before decoder-only pairs existed are all encoder-decoder.
  return [
    f'Pair **{costs.pair}** ({costs.architecture or "encoder-decoder"}), task '
    f'**{costs.task}**; {draft_description(costs.draft)}prompts of the timed examples: '
    f'{described}.',
    '',
  ] + [f'Also **{r.pair}**: {draft_description(r.draft)[:-2] or "a draft"}.\n' for r in others]


def draft_description(draft: Optional[Dict[str, Any]]) -> str:
  """'draft: ...; ' from a costs record's `draft` (empty for records without one)."""
  if not draft:
    return ''
  if draft['kind'] == 'feature head':
    return (
      f'draft: a feature head of width {draft["width"]}, {draft["layers"]} layer(s), output '
      f'{draft["output"]!r}, reading target layer(s) {tuple(draft["feature_layers"])} '
      f'({draft["parameters"] / 1e6:.2f}M parameters); '
    )
  if 'parameters' in draft:
    return f'draft: a {draft["kind"]} ({draft["parameters"] / 1e6:.2f}M parameters); '
  return f'draft: {draft["kind"]}; '


def _drafting_lines(walltime: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: what was drafted and accepted per iteration (batch 1)."""
  rows = [r for r in walltime if r.batch_size == 1 and r.drafted_per_iteration is not None]
  if not rows:
    return []
  lines = [
    '',
    '## Drafted and accepted per iteration (batch 1)',
    '',
    'Mean acceptance length = 1 + accepted / iterations (vLLM); tokens/call also '
    'counts the cuts at EOS. With a draft threshold, gamma is the most drafted.',
    '',
    '| T | gamma | verification | draft threshold | drafted / iteration | draft steps / call '
    '| mean acceptance length | tokens/call | speedup | accepted histogram |',
    '|' + '---|' * 10,
  ]
  for r in rows:
    lines.append(
      f'| {r.temperature} | {r.gamma} | {r.verification or "token"} '
      f'| {r.draft_threshold or 0.0} | {_fmt(r.drafted_per_iteration)} '
      f'| {_fmt(r.draft_steps_per_call)} | {_fmt(r.mean_acceptance_length)} '
      f'| {_fmt(r.tokens_per_call)} | {_fmt(r.speedup["median"])}x '
      f'| {" ".join(str(n) for n in r.accepted_histogram)} |'
    )
  return lines


def parallel_draft_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: each parallel draft beside the chain drafts timed in its passes (batch 1).

  Per temperature, every gamma's tokens per call, acceptance by position,
  drafting cost per iteration (gamma c: a chain's gamma steps, a parallel
  draft's one call), that cost in one-step costs of the first chain draft
  (its c at the same T and gamma), v(gamma), ms/token, speedup and greedy
  outputs identical to the baseline's; then each draft's best gamma and, at
  each gamma, the parallel draft's tokens per call over the chain's. No
  lines without a parallel draft (`records.PARALLEL_DRAFT_KIND` in a costs
  record).
  """
  records = records_lib.typed(records)
  kinds = {r.pair: (r.draft or {}).get('kind') for r in records if isinstance(r, records_lib.Costs)}
  rows = [r for r in records if isinstance(r, records_lib.Walltime) and r.batch_size == 1]
  parallel = {r.pair for r in rows if kinds.get(r.pair) == records_lib.PARALLEL_DRAFT_KIND}
  if not parallel:
    return []
  lines = [
    '',
    '## Parallel draft beside the chain draft (batch 1)',
    '',
    'Drafting / iteration: what one iteration spends drafting, in target steps (gamma c: a '
    "chain draft's gamma steps, a parallel draft's one call over 2 gamma tokens); in chain "
    'steps: that over one step of the chain draft at the same T and gamma (its c). A parallel '
    "draft's alpha is its first position's; acceptance by position is each draft position's "
    "rate when judged (the loop's).",
    '',
    '| T | gamma | draft | tokens/call | acceptance by position | drafting / iteration '
    '| in chain steps | v(gamma) | ms/token | speedup | identical |',
    '|' + '---|' * 11,
  ]
  summary = []
  for temperature in sorted({r.temperature for r in rows if r.pair in parallel}):
    at_t = [r for r in rows if r.temperature == temperature]
    pairs = list(dict.fromkeys(r.pair for r in at_t))  # In the records' order.
    chains = [p for p in pairs if p not in parallel]
    chain = {r.gamma: r for r in at_t if chains and r.pair == chains[0]}
    for r in sorted(at_t, key=lambda r: (r.gamma, r.pair in parallel)):
      in_chain_steps = r.gamma * r.c / chain[r.gamma].c if r.gamma in chain else None
      lines.append(
        f'| {r.temperature} | {r.gamma} | {r.pair} | {_fmt(r.tokens_per_call)} '
        f'| {" ".join(f"{a:.2f}" for a in r.acceptance_by_position)} '
        f'| {_fmt(r.gamma * r.c, 3)} | {_fmt(in_chain_steps)} | {_fmt(r.verify_cost)} '
        f'| {_fmt(r.ms_per_token_speculative["median"])} | {_fmt(r.speedup["median"])}x '
        f'| {_fmt(r.identical_outputs)} |'
      )
    for pair in pairs:
      best = max((r for r in at_t if r.pair == pair), key=lambda r: r.speedup['median'])
      summary.append(
        f'- T = {temperature}, {pair}: best gamma {best.gamma}, {best.speedup["median"]:.2f}x '
        f'({best.tokens_per_call:.2f} tokens/call).'
      )
    for pair in (p for p in pairs if p in parallel and chain):
      ratios = [
        f'{r.gamma}: {r.tokens_per_call / chain[r.gamma].tokens_per_call:.2f}'
        for r in at_t
        if r.pair == pair and r.gamma in chain
      ]
      summary.append(
        f"- T = {temperature}, {pair}: tokens per call over the chain's, by gamma: "
        f'{", ".join(ratios)}.'
      )
  return lines + [''] + summary


_BREAKDOWN_PARTS = (
  'draft_catch_up',
  'draft_rollout',
  'draft_observe',
  'target_block',
  'judge',
  'emit',
  'encode',
  'unexplained',
)


def _gamma_choice_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: gamma chosen from the measured parts vs the measured best."""
  choices = [r for r in records if isinstance(r, records_lib.GammaChoice)]
  if not choices:
    return []
  lines = [
    '',
    '## gamma chosen from the measured parts (batch 1)',
    '',
    '| T | chosen gamma | predicted | measured | best measured gamma | its speedup '
    '| chosen / best |',
    '|---|---|---|---|---|---|---|',
  ]
  for r in choices:
    lines.append(
      f'| {r.temperature} | {r.chosen_gamma} | {_fmt(r.chosen_predicted_speedup)}x '
      f'| {_fmt(r.chosen_measured_speedup)}x | {r.best_gamma} '
      f'| {_fmt(r.best_measured_speedup)}x | {_fmt(r.chosen_over_best)} |'
    )
  return lines


def _breakdown_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: where an iteration's time goes, and each step against its memory floor."""
  rows = [r for r in records if isinstance(r, records_lib.Walltime) and r.breakdown is not None]
  lines = [
    '',
    "## Where an iteration's time goes (batch 1, ms)",
    '',
    "Each part timed alone in a compiled loop at the decode call's shapes (head "
    "observe: a feature head's rewrite of its cache over the block, every iteration); the "
    'catch-up counted at the rate the run needed it, the encoders at their share per '
    'iteration; unexplained = measured - parts. When target and draft exceed the '
    'last-level cache together, the draft is timed with flushed caches, as it runs '
    'after the target in the loop.',
    '',
    '| T | gamma | catch-up | draft rollout | head observe | target block | verify '
    '| bookkeeping | encode | parts | measured | unexplained | baseline ms/token: parts / '
    'measured | predicted from parts | measured speedup |',
    '|' + '---|' * 15,
  ]
  for r in rows:
    b = r.breakdown
    lines.append(
      f'| {r.temperature} | {r.gamma} | {_fmt(b["draft_catch_up"], 3)} '
      f'| {_fmt(b["draft_rollout"], 3)} | {_fmt(b.get("draft_observe"), 3)} '
      f'| {_fmt(b["target_block"], 3)} | {_fmt(b["judge"], 3)} '
      f'| {_fmt(b["emit"], 3)} | {_fmt(b["encode"], 3)} | {_fmt(b["parts_sum"], 3)} '
      f'| {_fmt(b["measured"], 3)} '
      f'| {_fmt(b["unexplained"], 3)} ({100 * b["unexplained"] / max(b["measured"], 1e-9):.0f}%) '
      f'| {_fmt(b["baseline_parts"], 3)} / {_fmt(b["baseline_measured"], 3)} '
      f'| {_fmt(r.predicted_speedup_parts)}x '
      f'| {_fmt(r.speedup["median"])}x |'
    )
  lines += _breakdown_misses(rows)
  costs = next((r for r in records if isinstance(r, records_lib.Costs)), None)
  if costs and costs.floors:
    lines += [
      '',
      '## One-token steps against the memory floor',
      '',
      f'Bandwidth measured in this run: {costs.bandwidth_gb_per_s:.1f} GB/s '
      '(a reduction over 512 MiB); floor = bytes / bandwidth. Below 1x the floor, a '
      "model's weights were served from cache, not DRAM.",
      '',
      '| model | MB read per step | floor ms | measured ms | GB/s achieved | x floor |',
      '|---|---|---|---|---|---|',
    ]
    for name in ('target', 'draft'):
      floor = costs.floors.get(name)
      if floor:
        lines.append(
          f'| {name} | {floor["bytes"] / 1e6:.1f} | {_fmt(floor["floor_ms"], 3)} '
          f'| {_fmt(floor["measured_ms"], 3)} | {_fmt(floor["achieved_gb_per_s"], 1)} '
          f'| {_fmt(floor["over_floor"])} |'
        )
    if 'draft_bytes_over_target_bytes' in costs.floors:
      lines.append('')
      lines.append(
        f'Draft / target bytes per step: {costs.floors["draft_bytes_over_target_bytes"]:.3f}.'
      )
  return lines


# How far the parts may miss the measured iteration and still explain it.
BREAKDOWN_TOLERANCE = 0.10


def _breakdown_misses(rows: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: whether the parts explain each measured iteration, and if not which part
  is mis-timed, told apart by the baseline's own step (parts: the target step alone)."""
  if not rows:
    return []
  share = lambda b, part, whole: b[part] / max(b[whole], 1e-9)
  missed = [
    r for r in rows if abs(share(r.breakdown, 'unexplained', 'measured')) > BREAKDOWN_TOLERANCE
  ]
  lines = [
    '',
    f'The parts explain the measured iteration within ±{BREAKDOWN_TOLERANCE:.0%} in '
    f'{len(rows) - len(missed)} of {len(rows)} rows.',
  ]
  for r in missed:
    b = r.breakdown
    miss = share(b, 'unexplained', 'measured')
    baseline_miss = share(b, 'baseline_unexplained', 'baseline_measured')
    if abs(baseline_miss) > BREAKDOWN_TOLERANCE / 2 and baseline_miss * miss > 0:
      why = (
        f"the baseline's one-token step misses by {baseline_miss:+.0%} as well, so the "
        'target (its step and its block, each timed alone) ran '
        f'{"slower" if miss > 0 else "faster"} in the decode loop than alone: other work on '
        'the CPU while one of them was timed, or the loop evicting what the target finds '
        'cached when timed alone.'
      )
    else:
      why = (
        f"the baseline's step is timed within {baseline_miss:+.0%}, so the parts only "
        "speculative decoding runs are mis-timed: the draft's rollout and catch-up (timed "
        'alone, their weights in cache unless the report says they were flushed) or the '
        'verification.'
      )
    lines.append(
      f'- T = {r.temperature}, gamma = {r.gamma}: the measured iteration exceeds the '
      f'parts by {miss:+.0%}; {why}'
      if miss > 0
      else f'- T = {r.temperature}, gamma = {r.gamma}: the parts exceed the measured '
      f'iteration by {-miss:.0%}; {why}'
    )
  return lines


def _profile_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: per temperature, batch size and gamma the measured and predicted speedups and
  finished-row shares; then per batch size the profile's choice and gamma='auto' against
  every fixed gamma, timed side by side."""
  lines = []
  for profile in (r for r in records if isinstance(r, records_lib.Profile)):
    auto = {
      r.batch_size: r
      for r in records
      if isinstance(r, records_lib.Auto) and r.temperature == profile.temperature
    }
    lines += _profile_speedup_lines(profile) + _profile_auto_lines(profile, auto)
  return lines


def _profile_speedup_lines(profile: records_lib.Profile) -> List[str]:
  """Markdown: one profile's measured and predicted speedups per batch size and gamma."""
  temperature = profile.temperature
  sizes = sorted(profile.batch_sizes, key=int)
  lines = [
    '',
    f'## Speculation profile, T = {temperature} ({profile.path})',
    '',
    'Measured: the median speedup over the baseline. Theorem 3.8: with alpha and c, v '
    'measured at that batch size. Batched: the same for loops that run until their '
    "batch's slowest row ends (`theory.batch_walltime_improvement`, the baseline's output "
    'lengths), with one alpha for every row, and per row from its batch-1 decode (greedy: its '
    'iterations replayed, exact but for the cost of one; sampled: its alpha fitted, '
    '`theory.fit_row_alphas`). The speedup splits into baseline steps per target call '
    'and one step / one iteration (`profile_sweep.speedup_terms`): measured against predicted, '
    "they name the term a prediction misses. Finished: the share of the target calls' "
    "rows whose row had ended, measured (one alpha; per row); the baseline's beside it.",
    '',
    '| batch | gamma | measured | Theorem 3.8 | batched, one alpha | batched, per row '
    '| per row / measured | steps per call: measured, one alpha, per row '
    '| step / iteration: measured, predicted | finished: measured (one alpha; per row) '
    "| baseline's finished |",
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for size in sizes:
    by_gamma = sorted(profile.batch_sizes[size]['gammas'].items(), key=lambda x: int(x[0]))
    for gamma, cell in by_gamma:
      rows = cell.get('predicted_speedup_rows')
      lines.append(
        f'| {size} | {gamma} | {_fmt(cell["measured_speedup"])}x '
        f'| {_fmt(cell["predicted_speedup"])}x | {_fmt(cell.get("predicted_speedup_batched"))}x '
        f'| {_fmt(rows)}x | {_fmt(rows and rows / cell["measured_speedup"])} '
        f'| {_fmt(cell.get("steps_per_call_measured"))}, '
        f'{_fmt(cell.get("steps_per_call_predicted"))}, '
        f'{_fmt(cell.get("steps_per_call_predicted_rows"))} '
        f'| {_fmt(cell.get("step_over_iteration_measured"))}, '
        f'{_fmt(cell.get("step_over_iteration_predicted"))} '
        f'| {_fmt(cell["finished_row_share"])} '
        f'({_fmt(cell.get("predicted_finished_row_share"))}; '
        f'{_fmt(cell.get("predicted_finished_row_share_rows"))}) '
        f'| {_fmt(cell.get("baseline_finished_row_share"))} |'
      )
  return lines


def _profile_auto_lines(
  profile: records_lib.Profile, auto: Dict[int, records_lib.Auto]
) -> List[str]:
  """Markdown: per batch size the profile's chosen gamma, and gamma='auto' (`auto`: its
  `records.Auto` per batch size) against the best fixed gamma."""
  sizes = sorted(profile.batch_sizes, key=int)
  # Integer keys in memory, strings when read back from benchmark.json.
  chosen = {int(b): g for b, g in profile.gamma_by_batch_size.items()}
  by_prediction = {int(b): g for b, g in (profile.predicted_gamma_by_batch_size or {}).items()}
  lines = [
    '',
    "Chosen: the profile's gamma (0: the baseline), on the sweep's measurements. Then, "
    "timed again side by side in one interleaved run: gamma='auto' with this profile, "
    'every fixed gamma, and the baseline. auto / best fixed compares two timings (auto '
    "runs a fixed gamma's program); the last column compares the chosen gamma's fixed "
    'decoder with the best one, timed in the same passes.',
    '',
    '| batch | chosen (on the prediction alone) | auto (ran) | best fixed gamma (speedup) '
    '| auto / best fixed | chosen gamma, fixed / best fixed |',
    '|---|---|---|---|---|---|',
  ]
  for size in sizes:
    record = auto.get(int(size))
    choice = f'{chosen[int(size)]} ({by_prediction.get(int(size), "-")})'
    if record is None:
      lines.append(f'| {size} | {choice} | - | - | - | - |')
      continue
    best = record.best_fixed_gamma
    best_speedup = record.fixed_speedups[str(best)]['median'] if best else 1.0
    lines.append(
      f'| {size} | {choice} | {_fmt(record.speedup["median"])}x '
      f'({record.gamma_ran}) | {best} ({_fmt(best_speedup)}x) '
      f'| {_fmt(record.auto_over_best_fixed)} '
      f'| {_fmt(record.chosen_over_best_fixed)} |'
    )
  return lines


def plot_profile(
  records: Sequence[records_lib.Record], profile: records_lib.Profile, path: str
) -> None:
  """Speedup vs batch size: each gamma measured (solid) and predicted for loops that wait for
  their batch's slowest row (dashed, `profile_sweep.best_prediction`), and auto."""
  from matplotlib import pyplot as plt

  temperature = profile.temperature
  sizes = sorted(profile.batch_sizes, key=int)
  gammas = sorted({g for b in sizes for g in profile.batch_sizes[b]['gammas']}, key=int)
  fig, ax = plt.subplots(figsize=(6, 4))
  for index, gamma in enumerate(gammas):
    color = f'C{index}'
    points = [
      (int(b), profile.batch_sizes[b]['gammas'][gamma])
      for b in sizes
      if gamma in profile.batch_sizes[b]['gammas']
    ]
    ax.plot(
      [b for b, _ in points],
      [p['measured_speedup'] for _, p in points],
      marker='o',
      color=color,
      label=f'gamma {gamma}, measured',
    )
    # The prediction the profile chose on (`profile_sweep.best_prediction`).
    predictions = [(b, profile_sweep.best_prediction(p, temperature)) for b, p in points]
    predicted = [(b, s) for b, s in predictions if s is not None]
    if predicted:
      ax.plot(
        *zip(*predicted), '--', color=color, alpha=0.7, label=f'gamma {gamma}, predicted (batched)'
      )
  auto = sorted(
    (r.batch_size, r.speedup['median'])
    for r in records
    if isinstance(r, records_lib.Auto) and r.temperature == temperature
  )
  if auto:
    ax.plot(*zip(*auto), marker='s', color='black', linewidth=2, label="gamma='auto'")
  ax.set_xscale('log', base=2)
  ax.set_title(f'T = {temperature}', fontsize=9)
  _save_speedup_figure(fig, ax, 'batch size', path)


def _alpha_keys(evaluation: Dict[str, Any]) -> List[str]:
  """The held-out alpha names of a distillation evaluation record ('alpha_T0', ...)."""
  return sorted(k for k in evaluation if k.startswith('alpha_T') and not k.endswith('_stderr'))


def _head_training_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: a feature head's training, its held-out alpha at the curve's ends."""
  lines = []
  for r in records:
    if isinstance(r, records_lib.HeadTraining) and r.curve:
      took = '' if r.training_seconds is None else f', {r.training_seconds:.0f} s'
      first, last = r.curve[0], r.curve[-1]
      lines += [
        '',
        f'## Feature head training ({r.steps} steps{took})',
        '',
        f'Held-out alpha of its first draft token at T = 1: {first["alpha"]:.3f} at step '
        f'{first["step"]}, {last["alpha"]:.3f} at step {last["step"]}.',
      ]
  return lines


def _distillation_lines(records: Sequence[records_lib.Record]) -> List[str]:
  """Markdown: held-out alpha of the draft before and after distillation (its curve's ends)."""
  lines = []
  for r in records:
    if not isinstance(r, records_lib.Distillation):
      continue
    first, last = r.curve[0], r.curve[-1]
    lines += [
      '',
      f'## Distillation ({r.divergence}, {r.steps} steps, for T = {r.temperature}, '
      f'data {r.data_mix})',
      '',
      f'Held-out alpha on {r.eval_examples} validation inputs (figure: '
      f'{distillation_figure_name(r)}).',
      '',
      '| T | alpha before | alpha after | stderr after |',
      '|---|---|---|---|',
    ]
    for key in _alpha_keys(last):
      lines.append(
        f'| {key[len("alpha_T") :]} | {_fmt(first.get(key), 3)} | {_fmt(last[key], 3)} '
        f'| {_fmt(last[key + "_stderr"], 3)} |'
      )
  return lines


def distillation_figure_name(record: records_lib.Distillation) -> str:
  """The file name of a distillation record's curve, one per decoding temperature."""
  return f'distillation_T{record.temperature:g}.png'


def plot_distillation(record: records_lib.Distillation, path: str) -> None:
  """Held-out alpha per temperature against the distillation step, with standard errors."""
  from matplotlib import pyplot as plt

  curve = record.curve
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for key in _alpha_keys(curve[-1]):
    points = [c for c in curve if key in c]
    ax.errorbar(
      [c['step'] for c in points],
      [c[key] for c in points],
      yerr=[c[key + '_stderr'] for c in points],
      marker='o',
      capsize=3,
      label=f'T={key[len("alpha_T") :]}',
    )
  ax.set_xlabel(f'distillation step ({record.divergence})')
  ax.set_ylabel('held-out alpha')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_breakdown(records: Sequence[records_lib.Record], path: str) -> None:
  """A stacked bar per (temperature, gamma): the parts of an iteration and the rest."""
  from matplotlib import pyplot as plt

  rows = [r for r in records if isinstance(r, records_lib.Walltime) and r.breakdown is not None]
  fig, ax = plt.subplots(figsize=(max(4, 0.8 * len(rows) + 2), 3.5))
  labels = [f'T={r.temperature}\ng={r.gamma}' for r in rows]
  bottom = np.zeros(len(rows))
  for part in _BREAKDOWN_PARTS:
    heights = np.array([max(r.breakdown.get(part, 0.0), 0.0) for r in rows])
    ax.bar(labels, heights, bottom=bottom, label=part.replace('_', ' '))
    bottom += heights
  if rows:
    ax.plot(
      labels,
      [r.breakdown['baseline_measured'] for r in rows],
      'k_',
      markersize=20,
      label='baseline ms/token',
    )
  ax.set_ylabel('ms per iteration')
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_report(records: Sequence[records_lib.Record], output_dir: str) -> List[str]:
  """Saves speedup-vs-gamma (measured and predicted) and speedup-vs-batch figures."""
  records = records_lib.typed(records)
  import matplotlib  # Figures only when asked for.

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt

  walltime = [r for r in records if isinstance(r, records_lib.Walltime)]
  paths = []
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for temperature in sorted({r.temperature for r in walltime}):
    rows = sorted(
      (r for r in walltime if r.temperature == temperature and r.batch_size == 1),
      key=lambda r: r.gamma,
    )
    gammas = [r.gamma for r in rows]
    ax.errorbar(
      gammas,
      [r.speedup['median'] for r in rows],
      yerr=[
        [r.speedup['median'] - r.speedup['min'] for r in rows],
        [r.speedup['max'] - r.speedup['median'] for r in rows],
      ],
      marker='o',
      capsize=3,
      label=f'measured, T={temperature}',
    )
    if rows and rows[0].get('predicted_speedup') is not None:
      ax.plot(
        gammas,
        [r.predicted_speedup for r in rows],
        '--',
        marker='x',
        label=f'predicted, T={temperature}',
      )
  paths.append(os.path.join(output_dir, 'speedup_vs_gamma.png'))
  _save_speedup_figure(fig, ax, 'gamma', paths[-1])
  if any(r.breakdown is not None for r in walltime):
    paths.append(os.path.join(output_dir, 'iteration_breakdown.png'))
    plot_breakdown(records, paths[-1])
  for r in records:
    if isinstance(r, records_lib.Distillation):
      paths.append(os.path.join(output_dir, distillation_figure_name(r)))
      plot_distillation(r, paths[-1])
  for profile in (r for r in records if isinstance(r, records_lib.Profile)):
    paths.append(os.path.join(output_dir, f'profile_t{profile.temperature:g}.png'))
    plot_profile(records, profile, paths[-1])
  batched = [r for r in walltime if r.batch_size != 1]
  if batched and not any(isinstance(r, records_lib.Profile) for r in records):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for temperature in sorted({r.temperature for r in walltime}):
      rows = sorted(
        (r for r in walltime if r.temperature == temperature and r.gamma == batched[0].gamma),
        key=lambda r: r.batch_size,
      )
      ax.plot(
        [r.batch_size for r in rows],
        [r.speedup['median'] for r in rows],
        marker='o',
        label=f'T={temperature}, gamma={batched[0]["gamma"]}',
      )
    ax.set_xscale('log', base=2)
    paths.append(os.path.join(output_dir, 'speedup_vs_batch.png'))
    _save_speedup_figure(fig, ax, 'batch size', paths[-1])
  return paths


def _save_speedup_figure(fig, ax, xlabel: str, path: str) -> None:
  """Labels a speedup figure (a line at 1x, the axes, the legend), saves and closes it."""
  from matplotlib import pyplot as plt

  ax.axhline(1.0, color='gray', linewidth=0.8)
  ax.set_xlabel(xlabel)
  ax.set_ylabel('speedup over baseline')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(records: Sequence[records_lib.Record], output_dir: str) -> None:
  """benchmark.json (one record per configuration), benchmark.md, figures."""
  records = records_lib.typed(records)
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(records_lib.to_json(records), f, indent=1, default=float)
  with open(os.path.join(output_dir, 'benchmark.md'), 'w') as f:
    f.write(markdown_report(records))
  plot_report(records, output_dir)


def walltime_line(record: records_lib.Walltime) -> str:
  """One walltime record as a progress line: ms/token, speedup, prediction, tokens/call."""
  predicted = record.predicted_speedup
  return (
    f'  T={record.temperature} gamma={record.gamma} batch={record.batch_size}: '
    f'{record.ms_per_token_baseline["median"]:.2f} -> '
    f'{record.ms_per_token_speculative["median"]:.2f} ms/token, speedup '
    f'{record.speedup["median"]:.2f}x'
    + (f' (predicted {predicted:.2f}x' if predicted is not None else '')
    + (
      f', from the parts {record.predicted_speedup_parts:.2f}x'
      if record.predicted_speedup_parts is not None
      else ''
    )
    + (
      f', batched {record.predicted_speedup_batched:.2f}x'
      if record.batch_size > 1 and record.predicted_speedup_batched is not None
      else ''
    )
    + (')' if predicted is not None else '')
    + f', {record.tokens_per_call:.2f} tokens/call'
  )
