r"""The main job: train a small EnDe pair on this machine and measure speculative decoding.

  make demo                      # or: python -m speculative_t5x.demo

Every step is cached in --workdir (default runs/demo), so a second run skips
to the measurements:

  1. an English->German corpus from the machine's gettext catalogs
     (`tasks_core.build_gettext_corpus`; 36k/2k/2k pairs on Debian);
  2. a SentencePiece vocabulary on its train split;
  3. a target (6.0M parameters, configs/models/gettext_target.gin) and a
     draft (1.3M, configs/models/gettext_draft.gin), trained by `train.train`;
  4. `benchmark.run_benchmark` on the held-out test split at batch 1, greedy
     and temperature 1: alpha (Table 3, also for unigram/bigram drafts), c and
     the verify cost, ms/token of both decoders over a gamma sweep, the
     Theorem 3.8 prediction, BLEU, speedup vs batch size, memory;
  5. the peer comparison: the same pair exported to Hugging Face and run by
     transformers' greedy and assisted generation at batch 1, beside ours,
     outputs compared token for token (`peers.compare_with_huggingface`);
  6. a Table-2-style report printed and written to <workdir>/report/
     (benchmark.json, benchmark.md, peers.json, peers.md, figures).

The compiled programs are cached in <workdir>/jax_cache, which is what makes
the second run fast. On a 2-core CPU, expect no speedup from this pair: its
6.0M target and 1.3M draft fit the last-level cache together, so a target
step is not memory-bound, a block of gamma+1 tokens costs it 1.4-1.8 single
steps, and the draft a third of one; the report shows where each iteration's
time goes. scripts/memory_bound_cpu.py times the regime where the paper's
premise holds on a CPU (a target streaming its weights from DRAM); full-size
walltime belongs to an accelerator: see scripts/gpu and scripts/tpu.
"""

import dataclasses
import json
import os
import time

from absl import app
from absl import flags
from absl import logging
import jax

from speculative_t5x import benchmark
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import reports
from speculative_t5x import tasks_core

MAX_DECODE_LEN = 48  # Output length of the timed decodes: the training targets' length.


def _define_flags() -> None:
  """The demo's command line; defined only when the demo runs, not when it is imported."""
  flags.DEFINE_string('workdir', 'runs/demo', 'Where every step caches its result.')
  flags.DEFINE_integer('target_steps', 400, 'Training steps of the target.')
  flags.DEFINE_integer('draft_steps', 400, 'Training steps of the draft.')
  flags.DEFINE_integer('vocab_size', 4000, 'SentencePiece pieces.')
  flags.DEFINE_integer('num_examples', 16, 'Test examples timed at batch 1.')
  flags.DEFINE_list('gammas', ['1', '2', '3'], 'The gamma sweep.')
  flags.DEFINE_list('batch_sizes', ['1', '8'], 'The batch-size sweep.')
  flags.DEFINE_integer('repetitions', 3, 'Timed passes per configuration.')
  flags.DEFINE_integer('alpha_tokens', 10_000, 'Target tokens per alpha.')
  flags.DEFINE_integer(
    'peer_examples', 8, 'Test examples of the Hugging Face comparison (0: skip it).'
  )


def _step(message: str) -> None:
  print(f'\n== {message}', flush=True)


def prepare_data(workdir: str, vocab_size: int):
  """Builds (or finds) the corpus and the vocabulary: (corpus_dir, vocabulary path)."""
  corpus_dir = os.path.join(workdir, 'corpus')
  vocabulary = os.path.join(workdir, 'vocabulary', f'spm_{vocab_size}')
  if not os.path.exists(os.path.join(corpus_dir, 'test.tsv')):
    _step('Building the gettext English->German corpus')
    print(tasks_core.build_gettext_corpus(corpus_dir))
  if not os.path.exists(vocabulary + '.model'):
    _step(f'Training a {vocab_size}-piece SentencePiece vocabulary')
    train_pairs = tasks_core.read_tsv(os.path.join(corpus_dir, 'train.tsv'))
    tasks_core.train_sentencepiece_model(
      (text for pair in train_pairs for text in pair), vocabulary, vocab_size
    )
  return corpus_dir, vocabulary + '.model'


def trained_model(
  workdir: str, name: str, steps: int, corpus_dir: str, vocabulary: str, vocab_size: int
) -> models.Model:
  """Trains configs/models/<name>.gin on the corpus (or resumes/finds it).

  The training run is `python -m speculative_t5x.train` with the model file,
  configs/tasks/gettext_ende.gin and configs/runs/train.gin, keeping only the
  last checkpoint and without evaluation.
  """
  config = gin_utils.model_config(name, vocab_size)
  model_dir = os.path.join(workdir, name)
  from speculative_t5x import checkpoints

  finished = os.path.isdir(model_dir) and os.path.isdir(os.path.join(model_dir, str(steps)))
  if not finished:
    from speculative_t5x import train  # TensorFlow and seqio only when training.

    num_params = sum(x.size for x in jax.tree_util.tree_leaves(network.abstract_params(config)[0]))
    _step(f'Training {name} ({num_params / 1e6:.1f}M parameters, {steps} steps)')
    gin_utils.call_configured(
      train.train,
      [f'configs/models/{name}.gin', 'configs/tasks/gettext_ende.gin', 'configs/runs/train.gin'],
      [
        f'MODEL_DIR = {model_dir!r}',
        f'TRAIN_STEPS = {steps}',
        f'CORPUS_DIR = {corpus_dir!r}',
        f'VOCABULARY = {vocabulary!r}',
        f'VOCAB_SIZE = {vocab_size}',
        'EVAL_PERIOD = None',
        'train.train.keep_checkpoints = 1',
      ],
    )
  return models.Model(config, checkpoints.restore_params(model_dir, step=steps))


def compare_with_huggingface(target, draft, inputs, gamma, workdir, report_dir) -> str:
  """`peers.compare_with_huggingface`, written to report_dir/peers.{json,md}."""
  from speculative_t5x import peers  # PyTorch and transformers only here.

  result = peers.compare_with_huggingface(
    target,
    draft,
    inputs,
    max_decode_len=MAX_DECODE_LEN,
    gamma=gamma,
    workdir=os.path.join(workdir, 'hf'),
  )
  markdown = peers.format_markdown(result)
  os.makedirs(report_dir, exist_ok=True)
  with open(os.path.join(report_dir, 'peers.json'), 'w') as f:
    json.dump(dataclasses.asdict(result), f, indent=1, default=lambda value: value.item())
  with open(os.path.join(report_dir, 'peers.md'), 'w') as f:
    f.write(markdown)
  return markdown


def print_table(records) -> None:
  """The Table-2-style summary: one row per temperature and gamma, at batch 1."""
  header = (
    'T',
    'gamma',
    'alpha',
    'c',
    'v',
    'tok/call',
    'base ms/tok',
    'spec ms/tok',
    'speedup',
    'predicted',
    'BLEU base',
    'BLEU spec',
  )
  print(' '.join(f'{h:>11s}' for h in header))
  for r in records:
    if r['kind'] != 'walltime' or r['batch_size'] != 1:
      continue
    row = (
      r['temperature'],
      r['gamma'],
      r['alpha'],
      r['c'],
      r['verify_cost'],
      r['tokens_per_call'],
      r['ms_per_token_baseline']['median'],
      r['ms_per_token_speculative']['median'],
      r['speedup']['median'],
      r.get('predicted_speedup'),
      r.get('bleu_baseline'),
      r.get('bleu_speculative'),
    )
    print(' '.join(f'{v:>11.3f}' if isinstance(v, float) else f'{str(v):>11s}' for v in row))


def main(argv) -> None:
  del argv
  start = time.perf_counter()
  args = flags.FLAGS
  if not args['verbosity'].present:  # Progress bars and the report, not library INFO logs.
    logging.set_verbosity(logging.WARNING)
  workdir = args.workdir
  os.makedirs(workdir, exist_ok=True)
  # Compiled programs persist across runs: the second run skips compilation.
  jax.config.update('jax_compilation_cache_dir', os.path.join(workdir, 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)

  corpus_dir, vocabulary = prepare_data(workdir, args.vocab_size)
  target = trained_model(
    workdir, 'gettext_target', args.target_steps, corpus_dir, vocabulary, args.vocab_size
  )
  draft = trained_model(
    workdir, 'gettext_draft', args.draft_steps, corpus_dir, vocabulary, args.vocab_size
  )

  _step('Benchmarking on the test split')
  progress = lambda line: print(f'[{time.perf_counter() - start:4.0f} s] {line}', flush=True)
  inputs, references = benchmark.tsv_inputs(
    os.path.join(corpus_dir, 'test.tsv'), vocabulary, prefix=tasks_core.EN_DE_PREFIX
  )
  ngram_corpus = benchmark.tsv_target_tokens(
    os.path.join(corpus_dir, 'train.tsv'), vocabulary, 20_000
  )
  records = benchmark.run_benchmark(
    target,
    draft,
    inputs,
    references=references,
    vocabulary_path=vocabulary,
    pair_name='gettext target (6.0M) / draft (1.3M)',
    task_name='gettext EnDe test',
    temperatures=(0.0, 1.0),
    gammas=[int(g) for g in args.gammas],
    batch_sizes=[int(b) for b in args.batch_sizes],
    num_walltime_examples=args.num_examples,
    repetitions=args.repetitions,
    max_decode_len=MAX_DECODE_LEN,
    alpha_tokens=args.alpha_tokens,
    ngram_corpus=ngram_corpus,
    output_dir=os.path.join(workdir, 'report'),
    progress=progress,
  )
  report_dir = os.path.join(workdir, 'report')
  peers_markdown = None
  if args.peer_examples:
    greedy_gamma = reports.best_gamma(records, temperature=0.0)
    _step(f'Hugging Face assisted generation beside ours (greedy, batch 1, gamma {greedy_gamma})')
    peers_markdown = compare_with_huggingface(
      target,
      draft,
      benchmark.trim_padding(inputs[: args.peer_examples]),
      greedy_gamma,
      workdir,
      report_dir,
    )
  _step(f'Report ({report_dir}/benchmark.md, .json, peers.md, figures)')
  print_table(records)
  if peers_markdown:
    print('\n' + peers_markdown)
  print(f'\nTotal wall time: {time.perf_counter() - start:.0f} s')


if __name__ == '__main__':
  _define_flags()
  app.run(main)
