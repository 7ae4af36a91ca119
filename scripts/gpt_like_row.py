"""The paper's GPT-like row (Table 3) from a trained pair, with its walltime at batch 1.

For a workdir holding a decoder-only target and draft trained by
`speculative_t5x.training.train` on the English LM task (scripts/gpt_like_models.py
writes runs/gpt_like), measured with `benchmark.run_benchmark`, one code path
with every other pair:

  * alpha at T = 0 and T = 1 (>= --alpha_tokens target tokens each, standard
    errors from per-sequence means): the target samples continuations of the
    test split's prompts (each sentence's first --prompt_words words), the
    draft is teacher-forced along them; the paper's Table 3 alpha of its
    GPT-like pair (97M / 6M, LM1B) beside it, and, for scale, the bigram and
    unigram of the training sentences and prompt lookup;
  * c, v(gamma) and the walltime speedup at batch 1 on this machine for each
    gamma, baseline and speculative passes interleaved, next to Theorem 3.8's
    prediction from the measured alpha, c and v(gamma);
  * what else ran meanwhile: the load average and the other processes busy
    on the CPU, sampled every 30 s (`measure.LoadMonitor`; timings on a
    shared CPU are only as good as its quiet).

Writes <output_dir>/gpt_like_row.{md,json} (default <workdir>/report) and the
full benchmark report in <output_dir>/gpt_like_benchmark/.

  .venv/bin/python scripts/gpt_like_row.py --workdir runs/gpt_like

The workdir is read, not written (except the report): the model directories
are those holding `train.SETTINGS_FILE` of a decoder-only network (the larger
is the target), the corpus the directory of `corpora.build_english_corpus`,
the vocabulary its one SentencePiece model; flags name them where a workdir
holds more than one.
"""

import argparse
import glob
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from speculative_t5x_lab import benchmark
from speculative_t5x_lab import corpora
from speculative_t5x import drafts
from speculative_t5x_lab import measure
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.data import tasks_core
from speculative_t5x_lab import theory
from speculative_t5x.training import train

# Leviathan et al. 2023, Table 3: the GPT-like pair (97M target, 6M draft, LM1B).
PAPER_ALPHA = {0.0: 0.88, 1.0: 0.89}
TEMPERATURES = (0.0, 1.0)


# ------------------------------------------------------------------------------
# The workdir.
# ------------------------------------------------------------------------------
def decoder_only_model_dirs(workdir: str) -> List[str]:
  """The directories under `workdir` where `train` recorded a decoder-only network."""
  found = []
  for path in sorted(glob.glob(os.path.join(workdir, '**', train.SETTINGS_FILE), recursive=True)):
    with open(path) as f:
      if json.load(f).get('network') == 'DecoderOnlyConfig':
        found.append(os.path.dirname(path))
  return found


def load_trained(model_dir: str) -> models.Model:
  """The decoder-only model `train` wrote to `model_dir` (`models.load_trained`)."""
  settings = train.read_settings(model_dir)
  if settings is None or settings.get('network') != 'DecoderOnlyConfig':
    raise ValueError(
      f'{model_dir} holds no decoder-only network trained by speculative_t5x.training.train (its '
      f'{train.SETTINGS_FILE} is missing or names another network); pass the directories '
      'of the GPT-like target and draft (--target_dir, --draft_dir).'
    )
  return models.load_trained(model_dir)


def num_parameters(model: models.Model) -> int:
  return network.parameter_count(model.params)


def _only(paths: Sequence[str], what: str, flag: str, workdir: str) -> str:
  if len(paths) != 1:
    raise ValueError(
      f'Found {len(paths)} {what} under {workdir} ({list(paths)[:4]}); name the one to use '
      f'with {flag}.'
    )
  return paths[0]


def find_corpus_dir(workdir: str) -> str:
  """The directory `corpora.build_english_corpus` wrote (it holds its info file)."""
  paths = glob.glob(os.path.join(workdir, '**', corpora.ENGLISH_CORPUS_INFO_FILE), recursive=True)
  return os.path.dirname(_only(paths, 'English corpora', '--corpus_dir', workdir))


def find_vocabulary(workdir: str) -> str:
  """The workdir's one SentencePiece model."""
  return _only(
    glob.glob(os.path.join(workdir, '**', '*.model'), recursive=True),
    'SentencePiece models',
    '--vocabulary',
    workdir,
  )


def sentence_tokens(path: str, vocabulary_path: str) -> List[np.ndarray]:
  """Each line of a corpus file tokenized, EOS-terminated: the n-gram drafts' corpus."""
  import sentencepiece  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary_path)
  with open(path, encoding='utf-8') as f:
    return [np.asarray(processor.encode(line.strip()) + [models.EOS_ID]) for line in f]


# ------------------------------------------------------------------------------
# The row.
# ------------------------------------------------------------------------------
def gpt_like_row(
  target: models.Model,
  draft: models.Model,
  prompts: np.ndarray,
  *,
  references: Optional[Sequence[str]] = None,
  vocabulary_path: Optional[str] = None,
  ngram_corpus: Optional[Sequence[np.ndarray]] = None,
  gammas: Sequence[int] = (3, 5, 7),
  temperatures: Sequence[float] = TEMPERATURES,
  alpha_tokens: int = 10_000,
  num_walltime_examples: int = 32,
  max_decode_len: int = 48,
  repetitions: int = 3,
  benchmark_dir: Optional[str] = None,
  progress=print,
) -> Dict[str, Any]:
  """Measures the row; returns it as a JSON-ready dict (see `format_row`).

  Args:
    target, draft: the decoder-only pair.
    prompts: int32 [N, Lp] the test split's prompts (tokens, 0-padding):
      alpha is measured over all of them (cycled), the first
      `num_walltime_examples` are timed.
    references: their N reference continuations (BLEU in the benchmark report).
    vocabulary_path: the SentencePiece model (BLEU).
    ngram_corpus: token rows fitting the unigram and bigram drafts (None: none).
    gammas: the walltime sweep.
    temperatures: of alpha and the walltime.
    alpha_tokens: target tokens of each alpha measurement.
    num_walltime_examples: examples timed at batch 1.
    max_decode_len: tokens generated after each prompt at most (the training
      targets' length of scripts/gpt_like_models.py).
    repetitions: timed passes per configuration (median and range).
    benchmark_dir: where the full benchmark report goes (None: not written).
    progress: called with a line per step.
  """
  millions = lambda model: f'{num_parameters(model) / 1e6:.3g}M'
  start = time.time()
  log = []

  def logged(line):
    log.append(dict(seconds=time.time() - start, line=line))
    progress(line)

  with measure.LoadMonitor() as monitor:
    records = benchmark.run_benchmark(
      target,
      draft,
      prompts,
      references=references,
      sweep=benchmark.Sweep(temperatures=temperatures, gammas=gammas),
      measurement=benchmark.Measurement(
        num_walltime_examples=num_walltime_examples,
        repetitions=repetitions,
        max_decode_len=max_decode_len,
        alpha_tokens=alpha_tokens,
      ),
      other_drafts=benchmark.OtherDrafts(
        ngram_corpus=ngram_corpus,
        alpha_drafts={'prompt lookup': drafts.PromptLookupDraft(vocab_size=target.vocab_size)},
      ),
      report=benchmark.Report(
        pair_name=f'GPT-like {millions(target)} / {millions(draft)}',
        task_name='English LM, test split prompts',
        vocabulary_path=vocabulary_path,
        output_dir=benchmark_dir,
        progress=logged,
      ),
    )
  alpha = [
    dict(
      draft='GPT-like draft' if r['draft'] == benchmark.PAIR_DRAFT else r['draft'],
      temperature=r['temperature'],
      alpha=r['alpha'],
      stderr=r['alpha_stderr'],
      num_tokens=r['num_tokens'],
      paper_alpha=PAPER_ALPHA.get(r['temperature']) if r['draft'] == benchmark.PAIR_DRAFT else None,
    )
    for r in records
    if r['kind'] == 'alpha'
  ]
  walltime = [
    dict(
      temperature=r['temperature'],
      gamma=r['gamma'],
      alpha=r['alpha'],
      alpha_loop=r['alpha_loop'],
      c=r['c'],
      verify_cost=r['verify_cost'],
      tokens_per_call=r['tokens_per_call'],
      predicted_tokens_per_call=r.get('predicted_tokens_per_call'),
      ms_per_token_baseline=r['ms_per_token_baseline']['median'],
      ms_per_token_speculative=r['ms_per_token_speculative']['median'],
      speedup=r['speedup'],
      predicted_speedup=r.get('predicted_speedup'),
      # Theorem 3.8 with the tokens per call measured (EOS cuts rows short).
      predicted_speedup_measured_tokens=float(
        r['tokens_per_call'] / theory.iteration_walltime(r['gamma'], r['c'], r['verify_cost'])
      ),
      predicted_speedup_parts=r.get('predicted_speedup_parts'),
      identical_outputs=r.get('identical_outputs'),
    )
    for r in records
    if r['kind'] == 'walltime' and r['batch_size'] == 1
  ]
  (costs,) = [r for r in records if r['kind'] == 'costs']
  return dict(
    pair=costs['pair'],
    architecture=costs['architecture'],
    target_parameters=num_parameters(target),
    draft_parameters=num_parameters(draft),
    prompts=costs['prompts'],
    max_decode_len=max_decode_len,
    num_walltime_examples=num_walltime_examples,
    repetitions=repetitions,
    target_step_ms=costs['target_step_ms'],
    target_floor_ms=costs['floors']['target']['floor_ms'],
    bandwidth_gb_per_s=costs['bandwidth_gb_per_s'],
    alpha=alpha,
    walltime=walltime,
    seconds=time.time() - start,
    log=log,
    machine=dict(
      whole_run=monitor.summary(),
      # From the first timed decode on: what shared the CPU with the walltime passes.
      walltime=monitor.summary(
        since=start
        + next(e['seconds'] for e in log if e['line'].startswith('baseline and speculative'))
      ),
    ),
  )


def _fmt(value, digits=2):
  return '-' if value is None else f'{value:.{digits}f}'


def format_row(row: Dict[str, Any]) -> str:
  """The row as Markdown: alpha against the paper's, then the walltime sweep."""
  lines = [
    f'# The GPT-like row: {row["pair"]} ({row["architecture"]})',
    '',
    f'Target {row["target_parameters"] / 1e6:.3g}M, draft {row["draft_parameters"] / 1e6:.3g}M '
    f'parameters; prompts of {row["prompts"]["mean_tokens"]:.1f} tokens on average (timed '
    f'examples), up to {row["max_decode_len"]} tokens generated after each.',
    '',
    '## alpha (Table 3)',
    '',
    '| draft | T | alpha | ± stderr | target tokens | paper (97M / 6M, LM1B) |',
    '|---|---|---|---|---|---|',
  ]
  for r in row['alpha']:
    lines.append(
      f'| {r["draft"]} | {r["temperature"]:g} | {r["alpha"]:.3f} | {r["stderr"]:.3f} '
      f'| {r["num_tokens"]} | {_fmt(r["paper_alpha"])} |'
    )
  lines += [
    '',
    f'## Walltime at batch 1 ({row["num_walltime_examples"]} test prompts, median of '
    f'{row["repetitions"]} interleaved passes)',
    '',
    f'One-token target step {row["target_step_ms"]:.2f} ms against a memory floor of '
    f'{row["target_floor_ms"]:.2f} ms ({row["bandwidth_gb_per_s"]:.1f} GB/s measured). '
    'predicted: Theorem 3.8 with the measured alpha, c and v(gamma) (Eq. 1 tokens per '
    'call), then with the tokens per call measured (rows end at EOS, cutting their last '
    'block); from parts: each part of an iteration timed alone, the per-call prefill '
    "included. identical: greedy outputs equal to the baseline's.",
    '',
    '| T | gamma | alpha | c | v(gamma) | tokens/call (Eq. 1) | baseline ms/token '
    '| speculative ms/token | speedup (range) | predicted | predicted, measured tokens/call '
    '| from parts | identical |',
    '|' + '---|' * 13,
  ]
  for r in row['walltime']:
    identical = _fmt(r['identical_outputs']) if r['temperature'] == 0 else '-'
    lines.append(
      f'| {r["temperature"]:g} | {r["gamma"]} | {_fmt(r["alpha"], 3)} | {_fmt(r["c"], 3)} '
      f'| {_fmt(r["verify_cost"])} | {_fmt(r["tokens_per_call"])} '
      f'({_fmt(r["predicted_tokens_per_call"])}) | {_fmt(r["ms_per_token_baseline"])} '
      f'| {_fmt(r["ms_per_token_speculative"])} | {_fmt(r["speedup"]["median"])}x '
      f'({_fmt(r["speedup"]["min"])}-{_fmt(r["speedup"]["max"])}) '
      f'| {_fmt(r["predicted_speedup"])}x | {_fmt(r["predicted_speedup_measured_tokens"])}x '
      f'| {_fmt(r["predicted_speedup_parts"])}x | {identical} |'
    )
  lines += [
    '',
    '## The machine while it ran',
    '',
    f'Measuring took {row["seconds"] / 60:.1f} minutes. Other processes using >= 5% of a core '
    '(over 1 s, sampled every 30 s); the load average includes this run.',
  ]
  for phase, title in (('whole_run', 'the whole run'), ('walltime', 'the walltime passes')):
    machine = row['machine'][phase]
    load = machine['load_average_1min']
    load = '-' if load is None else f'{load["min"]:.2f}-{load["max"]:.2f}'
    lines += [
      '',
      f'During {title}: {machine["samples"]} samples, 1-minute load average {load}.',
      '',
    ]
    lines += [
      f'- {p["command"][:100]}: up to {p["peak_cpu_percent"]:.0f}% in {p["samples"]} of '
      f'{machine["samples"]} samples'
      for p in machine['busy']
    ] or ['- none']
  return '\n'.join(lines) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='runs/gpt_like')
  parser.add_argument('--target_dir', default=None, help='default: the larger model found')
  parser.add_argument('--draft_dir', default=None, help='default: the smaller model found')
  parser.add_argument('--corpus_dir', default=None)
  parser.add_argument('--vocabulary', default=None, help='a SentencePiece model')
  parser.add_argument('--prompt_words', type=int, default=tasks_core.ENGLISH_LM_PROMPT_WORDS)
  parser.add_argument('--gammas', type=int, nargs='+', default=[3, 5, 7])
  parser.add_argument('--temperatures', type=float, nargs='+', default=list(TEMPERATURES))
  parser.add_argument('--alpha_tokens', type=int, default=10_000)
  parser.add_argument('--num_walltime_examples', type=int, default=32)
  parser.add_argument('--max_decode_len', type=int, default=48)
  parser.add_argument('--repetitions', type=int, default=3)
  parser.add_argument('--output_dir', default=None, help='default: <workdir>/report')
  args = parser.parse_args(argv)

  from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top

  if (args.target_dir is None) != (args.draft_dir is None):
    parser.error('give both --target_dir and --draft_dir, or neither')
  if args.target_dir is None:
    found = [load_trained(d) for d in decoder_only_model_dirs(args.workdir)]
    if len(found) != 2:
      raise ValueError(
        f'Found {len(found)} decoder-only models trained under {args.workdir}, not a '
        'target and a draft; name them with --target_dir and --draft_dir.'
      )
    draft, target = sorted(found, key=num_parameters)
  else:
    target, draft = load_trained(args.target_dir), load_trained(args.draft_dir)
  corpus_dir = args.corpus_dir or find_corpus_dir(args.workdir)
  vocabulary = args.vocabulary or find_vocabulary(args.workdir)
  task = tasks.register_english_lm_task(corpus_dir, vocabulary, prompt_words=args.prompt_words)
  prompts, references = tasks.task_inputs(task, 'test')
  output_dir = args.output_dir or os.path.join(args.workdir, 'report')
  row = gpt_like_row(
    target,
    draft,
    prompts,
    references=references,
    vocabulary_path=vocabulary,
    ngram_corpus=sentence_tokens(os.path.join(corpus_dir, 'train.txt'), vocabulary),
    gammas=args.gammas,
    temperatures=args.temperatures,
    alpha_tokens=args.alpha_tokens,
    num_walltime_examples=args.num_walltime_examples,
    max_decode_len=args.max_decode_len,
    repetitions=args.repetitions,
    benchmark_dir=os.path.join(output_dir, 'gpt_like_benchmark'),
  )
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'gpt_like_row.json'), 'w') as f:
    json.dump(row, f, indent=1, default=float)
  markdown = format_row(row)
  with open(os.path.join(output_dir, 'gpt_like_row.md'), 'w') as f:
    f.write(markdown)
  print(markdown)
  return row


if __name__ == '__main__':
  main()
