"""Token trees against chains on one pair: acceptance by depth and rank, costs, walltime.

    records = tree_benchmark.compare_trees_and_chains(target, draft, inputs, temperature=0.0)

Per temperature, in one run on the same inputs:
  1. acceptance by depth and sibling rank, measured with a probe tree (a spine
     of `probe_depth` nodes, each with `probe_width` children: every rank is
     judged at every depth the spine reaches; `probe_tree`);
  2. the best tree for each node budget from those rates (`tree_design.choose_tree`,
     Sequoia's dynamic program), with its predicted tokens per call, and any
     other shapes given (`shapes`: a check of the chooser's picks against
     trees it did not choose, on the same timed examples);
  3. the costs that decide whether a tree pays on this machine: v(nodes), a
     target call over a tree's N nodes (tree-masked) over a one-token step,
     and the draft's cost per depth (one tree-masked call over the level's
     nodes, timed warm: a lower bound, see `tree_costs`);
  4. tokens per target call (mean over examples +- standard error, the ratio
     estimator's delta method) and ms/token of the baseline, each chain and
     each tree, batches interleaved (`benchmark.time_decodings`): speedups of
     trees and chains measured moments apart.
The records are JSON-ready dicts (kind 'tree_rates', 'tree_costs',
'tree_walltime'); `markdown_table` prints them side by side, `write_report`
writes them with a figure. The gin main (configs/runs/tree_benchmark.gin has
the command) runs `benchmark_pair_trees` on a pair and a TSV split.
"""

import dataclasses
import functools
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import benchmark
from speculative_t5x import decoding
from speculative_t5x import layouts
from speculative_t5x_lab import emulation
from speculative_t5x_lab import measure
from speculative_t5x_lab import records as records_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import tree as tree_lib
from speculative_t5x_lab import tree_design

PROBE_DEPTH, PROBE_WIDTH = 12, 4
NODE_BUDGETS = (8, 16, 32)
CHAIN_GAMMAS = (3, 5, 7)


def probe_tree(depth: int = PROBE_DEPTH, width: int = PROBE_WIDTH) -> tree_lib.Tree:
  """A spine of `depth` rank-0 nodes, each node of it with `width` children.

  The walk follows the spine while rank 0 is accepted, judging ranks 0..width-1
  at every depth it reaches: acceptance by (depth, rank) with (width) x depth
  nodes instead of width^depth.
  """
  parents, spine = [-1], 0
  for _ in range(depth):
    first = len(parents)
    parents += [spine] * width
    spine = first
  return tree_lib.Tree(tuple(parents))


def tokens_per_call(stats: decoding.SpeculativeStats) -> Dict[str, float]:
  """Tokens per target call over rows (sum emitted / sum iterations) and its standard error.

  The delta method for a ratio of sums over n rows: se = sqrt(sum (e_i - r
  n_i)^2 / (n (n - 1))) / mean(n_i), e_i a row's emitted tokens, n_i its
  iterations.
  """
  emitted = np.asarray(stats.emitted, np.float64).ravel()
  iterations = np.asarray(stats.iterations, np.float64).ravel()
  ratio = emitted.sum() / iterations.sum()
  count = emitted.size
  residual = emitted - ratio * iterations
  stderr = np.sqrt(np.sum(residual**2) / (count * (count - 1))) / iterations.mean()
  return dict(mean=float(ratio), stderr=float(stderr))


def predicted_tokens_per_call(tree: tree_lib.Tree, rates) -> Optional[float]:
  """1 + `tree_design.expected_accepted` at rates [D, K] (or [K]); None for a tree deeper than D.

  A given shape may reach past the depths the probe measured, where no rate is
  known; it is timed, not predicted.
  """
  if np.ndim(rates) == 2 and tree.max_depth > np.shape(rates)[0]:
    return None
  return 1 + tree_design.expected_accepted(tree, rates)


def measure_rates(
  target: models.Model,
  draft: models.Model,
  inputs: np.ndarray,
  *,
  temperature: float,
  max_decode_len: int,
  probe: Optional[tree_lib.Tree] = None,
  seed: int = 0,
) -> Dict[str, Any]:
  """Acceptance rates by (parent depth, rank) of the pair, from one probe-tree decode of `inputs`."""
  probe = probe or probe_tree()
  out = models.generate(
    target,
    draft,
    inputs,
    temperature=temperature,
    max_decode_len=max_decode_len,
    tree=probe,
    rng=jax.random.PRNGKey(seed),
    judge=acceptance_counts.AcceptanceCounts(),
  )
  counts = acceptance_counts.counts(out.stats)
  reached, accepted = np.asarray(counts.rank_judged), np.asarray(counts.rank_accepted)
  rates, stderr = tree_design.acceptance_rates_from_counts(reached, accepted)
  return records_lib.TreeRates(
    temperature=temperature,
    probe=probe.describe(),
    num_examples=int(len(inputs)),
    rates=rates.tolist(),
    stderr=np.where(np.isnan(stderr), None, stderr).tolist(),
    reached=reached.tolist(),
    accepted=accepted.tolist(),
  )


def _tree_block_step(params, i, carry, *, config, tree, first_node, width, start):
  """One tree-masked call over `width` nodes from `first_node` (a loop step of `measure`)."""
  del i
  cache, checksum = carry
  batch_size = checksum.shape[0]
  tokens = jnp.full((batch_size, width), 2, jnp.int32) + (checksum[0] == jnp.inf)
  logits, cache = network.apply_decode_block(
    config,
    params,
    cache,
    tokens,
    jnp.full((batch_size,), start, jnp.int32),
    tree=tree,
    first_node=first_node,
  )
  return cache, checksum + jnp.sum(logits, axis=(1, 2)) * 1e-9


def tree_costs(
  target: models.Model,
  draft: models.Model,
  tree: tree_lib.Tree,
  *,
  input_length: int,
  max_decode_len: int,
  repetitions: int = 7,
) -> Dict[str, Any]:
  """v(nodes) and the draft's cost per depth of `tree` at batch 1, seconds.

  The target's one-token step and its tree-masked call over all N nodes at
  the middle of the output, in cached loops as `measure.network_step_seconds`
  times them; the draft's call over each level's nodes (depths 0..D-1, the
  ones a draft feeds), warm: in the decode loop the target evicts the draft's
  weights, so these are lower bounds (`measure.cold_step_seconds`, which
  subtracts a cache flush's time, is too noisy per level at these sizes).
  """
  cache_length = decoding.speculative_cache_length(max_decode_len, tree.max_depth, tree)
  inputs = measure.random_encoder_inputs(1, input_length, target.vocab_size)
  start = max_decode_len // 2
  checksum = jnp.zeros((1,), jnp.float32)

  def target_call(width, call_tree):
    cache = network.init_decoder_cache(target.config, target.decode_params, inputs, cache_length)
    step = functools.partial(
      _tree_block_step,
      config=target.config,
      tree=call_tree,
      first_node=0,
      width=width,
      start=start,
    )
    return measure.step_seconds(
      step, target.decode_params, (cache, checksum), repetitions=repetitions
    )

  target_step = target_call(1, None)
  target_tree = target_call(tree.num_nodes, tree)
  draft_cache = network.init_decoder_cache(draft.config, draft.decode_params, inputs, cache_length)
  draft_levels = []
  for depth in range(tree.max_depth):
    level_start, level_stop = tree.levels[depth]
    step = functools.partial(
      _tree_block_step,
      config=draft.config,
      tree=tree,
      first_node=level_start,
      width=level_stop - level_start,
      start=start,
    )
    draft_levels.append(
      measure.step_seconds(
        step, draft.decode_params, (draft_cache, checksum), repetitions=repetitions
      )
    )
  return records_lib.TreeCosts(
    tree=tree.describe(),
    parents=list(tree.parents),
    nodes=tree.num_nodes,
    target_step_ms=1e3 * target_step,
    target_tree_call_ms=1e3 * target_tree,
    v_nodes=target_tree / target_step,
    draft_level_ms=[1e3 * s for s in draft_levels],
    draft_level_widths=[stop - start for start, stop in tree.levels[:-1]],
    draft_total_over_target_step=sum(draft_levels) / target_step,
  )


def compare_trees_and_chains(
  target: models.Model,
  draft: models.Model,
  inputs: np.ndarray,
  *,
  temperature: float,
  rate_inputs: Optional[np.ndarray] = None,
  gammas: Sequence[int] = CHAIN_GAMMAS,
  node_budgets: Sequence[int] = NODE_BUDGETS,
  shapes: Sequence[Any] = (),
  max_decode_len: int = 48,
  repetitions: int = 3,
  emulate_rates: Optional[Sequence[float]] = None,
  progress=print,
) -> List[Dict[str, Any]]:
  """The module docstring's measurements at one temperature, batch 1; returns records.

  Args:
    target, draft: the pair (`models.Model`s of one architecture).
    inputs: int32 [N, Lin], the timed examples (one per decode call).
    temperature: 0 is greedy.
    rate_inputs: int32 [M, Lin] examples the acceptance rates are measured on
      (default `inputs`; other examples keep the trees chosen apart from the
      ones they are timed on).
    gammas: the chains compared.
    node_budgets: drafted-node budgets of the chosen trees.
    shapes: further trees timed beside the chosen ones, anything
      `tree.Tree.parse` reads (branching per depth such as (2, 2, 1, 1), a
      parent array); their predicted tokens per call is None where they are
      deeper than the rates were measured.
    max_decode_len: output length.
    repetitions: timed passes per decoder.
    emulate_rates: timing only, for random weights (e.g. XXL/small): K
      acceptance rates by sibling rank (`emulation.tree_rates`), used instead
      of measured ones to choose the trees, and drawn i.i.d. per node when
      they decode; chains are emulated at the rank-0 rate. Rows run to the
      full length (no EOS) and the records say `emulated`; no text is made.
    progress: called with a line per step.
  """
  inputs = layouts.trim_padding(np.asarray(inputs))
  rate_inputs = inputs if rate_inputs is None else layouts.trim_padding(np.asarray(rate_inputs))
  if emulate_rates is not None:
    rates = records_lib.TreeRates(temperature=temperature, emulated=True, rates=list(emulate_rates))
  else:
    progress(f'T={temperature:g}: acceptance by depth and rank ({probe_tree().describe()}) ...')
    rates = measure_rates(
      target, draft, rate_inputs, temperature=temperature, max_decode_len=max_decode_len
    )
  trees = _trees_to_time(rates, node_budgets, shapes)
  records = [rates]
  for name, tree, budget in trees:
    progress(f'T={temperature:g}: costs of {name}, {tree} ...')
    costs = tree_costs(
      target,
      draft,
      tree,
      input_length=inputs.shape[1],
      max_decode_len=max_decode_len,
      repetitions=max(5, repetitions),
    )
    predicted = predicted_tokens_per_call(tree, rates.rates)
    records.append(
      dataclasses.replace(
        costs, temperature=temperature, budget=budget, predicted_tokens_per_call=predicted
      )
    )
  records += _time_trees_and_chains(
    target,
    draft,
    inputs,
    gammas,
    trees,
    temperature=temperature,
    emulate_rates=emulate_rates,
    max_decode_len=max_decode_len,
    repetitions=repetitions,
    progress=progress,
  )
  return records


def _trees_to_time(
  rates: records_lib.TreeRates, node_budgets: Sequence[int], shapes: Sequence[Any]
) -> List[Tuple[str, tree_lib.Tree, Optional[int]]]:
  """(name, tree, node budget or None for a given shape) of every tree timed.

  The tree `tree_design.choose_tree` picks for each budget from the rates, then the
  given shapes.
  """
  trees = [
    (f'tree <= {budget} nodes', tree_design.choose_tree(np.asarray(rates.rates), budget), budget)
    for budget in node_budgets
  ]
  for shape in shapes:
    tree = tree_lib.Tree.parse(shape)
    trees.append((f'tree {tree.branching or tree.parents} (given)', tree, None))
  return trees


def _time_trees_and_chains(
  target: models.Model,
  draft: models.Model,
  inputs: np.ndarray,
  gammas: Sequence[int],
  trees: Sequence[Tuple[str, tree_lib.Tree, Optional[int]]],
  *,
  temperature: float,
  emulate_rates: Optional[Sequence[float]],
  max_decode_len: int,
  repetitions: int,
  progress,
) -> List[records_lib.TreeWalltime]:
  """Times the baseline, a chain per gamma and each tree, batches interleaved.

  inputs: int32 [N, Lin], one decode call each. trees: `_trees_to_time`'s.
  With `emulate_rates` the trees' draft is emulated at those rates, the
  chains' at the rank-0 rate, and rows run to the full length.
  """
  emulated = emulate_rates is not None
  # (decoder settings, the judge: counted; emulated, chains at the rank-0 rate).
  configs = {
    f'chain gamma={g}': (
      dict(gamma=g),
      acceptance_counts.AcceptanceCounts(emulation.judge_at(emulate_rates and emulate_rates[0])),
    )
    for g in gammas
  }
  configs.update(
    {
      name: (
        dict(tree=t),
        acceptance_counts.AcceptanceCounts(emulation.judge_at(emulate_rates)),
      )
      for name, t, _ in trees
    }
  )
  progress(f'T={temperature:g}: baseline, {len(configs)} speculative decoders, interleaved ...')
  # Emulated rows run to the full length: random weights' EOS would end them at random.
  sampling_args = dict(
    temperature=temperature,
    max_decode_len=max_decode_len,
    eos_id=-1 if emulated else layouts.EOS_ID,
  )
  decoders = [models.make_decoder(target, None, **sampling_args)] + [
    models.make_decoder(target, draft, **config, **sampling_args, judge=judge)
    for config, judge in configs.values()
  ]
  runs = benchmark.time_decodings(decoders, inputs, repetitions=repetitions)
  baseline = runs[0]
  records = []
  for (name, (config, _)), run in zip(configs.items(), runs[1:]):
    tree = tree_lib.Tree.parse(config['tree']) if 'tree' in config else None
    records.append(
      records_lib.TreeWalltime(
        temperature=temperature,
        emulated=emulated,
        name=name,
        tree=None if tree is None else tree.describe(),
        parents=None if tree is None else list(tree.parents),
        gamma=run.gamma,
        nodes_per_call=config['gamma'] + 1 if tree is None else tree.num_nodes,
        num_examples=int(len(inputs)),
        tokens_per_call=tokens_per_call(run.stats),
        ms_per_token_baseline=float(np.median(baseline.ms_per_token)),
        ms_per_token=float(np.median(run.ms_per_token)),
        speedup=benchmark.summary([b / s for b, s in zip(baseline.ms_per_token, run.ms_per_token)]),
        identical_to_baseline=float(np.mean(np.all(baseline.outputs == run.outputs, axis=1))),
        acceptance_by_rank=np.asarray(
          acceptance_counts.counts(run.stats).acceptance_by_rank
        ).tolist(),
      )
    )
    progress(markdown_row(records[-1]))
  return records


def markdown_row(record: records_lib.TreeWalltime) -> str:
  """One `records.TreeWalltime` as a table row."""
  tpc = record.tokens_per_call
  return (
    f'| {record.temperature:g} | {record.name} | {record.nodes_per_call} | '
    f'{tpc["mean"]:.2f} ± {tpc["stderr"]:.2f} | {record.ms_per_token_baseline:.2f} | '
    f'{record.ms_per_token:.2f} | {record.speedup["median"]:.2f}x |'
  )


def markdown_table(records: Sequence[records_lib.Record]) -> str:
  """The walltime records side by side, then the costs (v(nodes), the draft per depth).

  `records` may be typed or tree_benchmark.json's dicts.
  """
  records = records_lib.typed(records)
  lines = []
  emulated = [r for r in records if isinstance(r, records_lib.TreeRates) and r.emulated]
  if emulated:
    lines += [
      f'**EMULATION**: acceptance drawn i.i.d. per node at rates by sibling rank '
      f'{emulated[0].rates} (chains at the rank-0 rate), on random weights; timings only, '
      'no text.',
      '',
    ]
  lines += [
    '| T | decoder | nodes/call | tokens/call | base ms/tok | ms/tok | speedup |',
    '| ---: | --- | ---: | ---: | ---: | ---: | ---: |',
  ]
  lines += [markdown_row(r) for r in records if isinstance(r, records_lib.TreeWalltime)]
  lines += [
    '',
    '| T | budget | tree | predicted tokens/call | v(nodes) | draft ms per depth, warm (widths) |',
    '| ---: | ---: | --- | ---: | ---: | --- |',
  ]
  for r in records:
    if isinstance(r, records_lib.TreeCosts):
      levels = ', '.join(f'{ms:.2f} ({w})' for ms, w in zip(r.draft_level_ms, r.draft_level_widths))
      predicted = r.predicted_tokens_per_call
      lines.append(
        f'| {r.temperature:g} | {r.budget or "given"} | {r.tree} | '
        f'{"-" if predicted is None else f"{predicted:.2f}"} | {r.v_nodes:.2f} | {levels} |'
      )
  return '\n'.join(lines)


def plot_trees(records: Sequence[records_lib.Record], path: str) -> None:
  """Tokens per call and speedup against nodes per call, trees and chains, per temperature."""
  records = records_lib.typed(records)
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  walltime = [r for r in records if isinstance(r, records_lib.TreeWalltime)]
  figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  for temperature in sorted({r.temperature for r in walltime}):
    for kind, marker in (('chain', 'o'), ('tree', 's')):
      rows = sorted(
        (r for r in walltime if r.temperature == temperature and r.name.startswith(kind)),
        key=lambda r: r.nodes_per_call,
      )
      nodes = [r.nodes_per_call for r in rows]
      label = f'{kind}s, T={temperature:g}'
      left.errorbar(
        nodes,
        [r.tokens_per_call['mean'] for r in rows],
        yerr=[r.tokens_per_call['stderr'] for r in rows],
        marker=marker,
        label=label,
      )
      right.plot(nodes, [r.speedup['median'] for r in rows], marker=marker, label=label)
  left.set(xlabel='nodes per target call', ylabel='tokens per target call')
  right.set(xlabel='nodes per target call', ylabel='speedup over the baseline (median)')
  right.axhline(1.0, color='gray', linewidth=0.5)
  left.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_report(records: Sequence[records_lib.Record], output_dir: str) -> None:
  """tree_benchmark.json, tree_benchmark.md and tree_benchmark.png in `output_dir`."""
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'tree_benchmark.json'), 'w') as f:
    json.dump(records_lib.to_json(records_lib.typed(records)), f, indent=1)
  with open(os.path.join(output_dir, 'tree_benchmark.md'), 'w') as f:
    f.write(markdown_table(records) + '\n')
  plot_trees(records, os.path.join(output_dir, 'tree_benchmark.png'))


def benchmark_pair_trees(
  *,
  target: models.Model,
  draft: models.Model,
  output_dir: str,
  tsv_path: Optional[str] = None,
  vocabulary_path: Optional[str] = None,
  temperatures: Sequence[float] = (0.0, 1.0),
  num_examples: int = 32,
  rate_examples: int = 128,
  prefix: Optional[str] = None,
  emulate_rates: Optional[Sequence[float]] = None,
  random_input_length: int = 64,
  **comparison,
) -> List[Dict[str, Any]]:
  """`compare_trees_and_chains` on a TSV split (or random inputs) at each temperature, report written.

  The first `num_examples` lines are timed; the acceptance rates come from
  the `rate_examples` after them. With `emulate_rates` (random weights, e.g.
  configs/pairs/xxl_small.gin) no TSV is read: `num_examples` random inputs
  of `random_input_length` tokens are timed at those rates. `comparison`:
  the rest of `compare_trees_and_chains`'s keywords (gammas, node_budgets, ...).
  """
  if emulate_rates is not None:
    inputs = benchmark.random_inputs(num_examples, random_input_length, target.vocab_size)[0]
    rate_inputs = None
  elif tsv_path is None or vocabulary_path is None:
    raise ValueError(
      'The tree benchmark decodes TSV_PATH (source<TAB>target lines, tokenized with '
      'VOCABULARY), or random inputs when EMULATE_RATES gives acceptance rates by sibling '
      f'rank; got tsv_path={tsv_path!r}, vocabulary_path={vocabulary_path!r}.'
    )
  else:
    from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

    inputs, _ = benchmark.tsv_inputs(
      tsv_path,
      vocabulary_path,
      prefix=tasks_core.EN_DE_PREFIX if prefix is None else prefix,
      num_examples=num_examples + rate_examples,
    )
    if len(inputs) < num_examples + rate_examples:
      raise ValueError(
        f'{tsv_path} has {len(inputs)} examples; the tree benchmark times {num_examples} and '
        f'measures acceptance on {rate_examples} others. Lower NUM_EXAMPLES or RATE_EXAMPLES.'
      )
    inputs, rate_inputs = inputs[:num_examples], inputs[num_examples:]
  records: List[records_lib.Record] = [records_lib.Machine(**measure.machine())]
  for temperature in temperatures:
    records += compare_trees_and_chains(
      target,
      draft,
      inputs,
      rate_inputs=rate_inputs,
      temperature=temperature,
      emulate_rates=emulate_rates,
      **comparison,
    )
  write_report(records, output_dir)
  print(markdown_table(records))
  return records


def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `benchmark_pair_trees` (configs/runs/tree_benchmark.gin)."""
  if len(argv) > 1:
    from absl import app  # pylint: disable=g-import-not-at-top

    raise app.UsageError(f'Unexpected arguments: {argv[1:]}.')
  import gin  # pylint: disable=g-import-not-at-top

  from speculative_t5x_lab import tree_benchmark as module  # pylint: disable=g-import-not-at-top

  gin.get_configurable(module.benchmark_pair_trees)()


if __name__ == '__main__':
  from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top

  gin_utils.run(main)
