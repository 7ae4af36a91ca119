r"""The main job: train a small EnDe pair on this machine and measure speculative decoding.

  make demo                      # or: python -m speculative_t5x_lab.demo

It first prints the machine (`measure.machine`: CPU, family, cores, memory
bandwidth) and a target training step's time, which say what the run's
figures are of: the pool's CPUs differ about 2x. Every step is cached in
--workdir (default runs/demo), so a second run skips to the measurements:

  1. an English->German corpus from the machine's gettext catalogs
     (`corpora.build_gettext_corpus`; 36k/2k/2k pairs on Debian);
  2. a SentencePiece vocabulary on its train split;
  3. a target (47.9M parameters, configs/models/gettext_target.gin; 300
     steps of 8 rows under configs/runs/cosine_schedule.gin) and a draft
     (configs/models/gettext_draft.gin; 400 steps of 16), trained on the
     data by `train.train`;
  4. the draft distilled from the target once per decoding mode
     (`distill.distill`): greedy on the target's greedy outputs (decoded
     ahead in large batches, each serving 2 steps; their loss needs no
     target call), T = 1 on the draft's own samples (on-policy); 150 and
     200 steps; held-out alpha at its own temperature kept;
  5. `benchmark.run_benchmark` on the held-out test split at batch 1, greedy
     and temperature 1: alpha, c and the verify cost, ms/token of both
     decoders for gamma 3 and 5 (--full_sweep: 3, 5 and 7, and batch 8),
     tokens per target call, the Theorem 3.8 prediction, where each
     iteration's time goes, BLEU (greedy: identical outputs; T = 1: mean +-
     standard error over 8 keys, samples of one distribution), memory;
  6. the peer comparison: the same pair exported to Hugging Face and run by
     transformers' greedy and assisted generation at batch 1, beside ours,
     outputs compared token for token (`peers.compare_with_huggingface`);
  7. a Table-2-style report printed and written to <workdir>/report/
     (benchmark.json, benchmark.md, peers.json, peers.md, figures).

--extras adds what does not fit the first run's budget: a feature head
(EAGLE-style, `drafts.FeatureDraft`; `train_feature_head.train_on_task` with
configs/runs/train_feature_head.gin, --head_steps) timed in the same
interleaved passes as the distilled draft and the baseline, and alpha of the
draft before distillation, of the draft distilled for the other temperature
and of unigram and bigram drafts (Table 3).

At the start the demo estimates its run on this machine, stage by stage
(`stage_estimates`: each stage's measured cost in training steps, times the
step it has just timed), against the budget (`_start_schedule`: a first run
within 20 minutes with set-up, a second within 3, on the pool's slowest kind,
proportionally less on a faster one), and says so if the run will exceed it;
each stage's header then gives the time left.

The compiled programs are cached in <workdir>/jax_cache, and what the
checkpoints, inputs and machine determine (alpha, the sampled quality) in
<workdir>/result_cache (`result_cache`; --remeasure recomputes it): that is
what makes the second run fast. Its timings are measured again. A model is
reused only if it was trained from this demo's recipe (its gin files'
bindings and the demo's settings, `RECIPE_FILE` beside its checkpoints):
another, from an earlier version of the demo or other flags, is refused with
the binding named and the way out.

One writer per stage (`speculative_t5x.output_lock`): a stage that writes
(the corpus, the vocabulary, each model's training, the result cache's new
entries, report/ from the benchmark on) holds its directory's writer lock,
so a second demo on the same workdir stops with the running one named
instead of writing beside it. A finished stage is only read, without a lock.

The target is decoder-heavy (1 encoder, 4 decoder layers
of width 768): a decoder step reads 163 MB of float32 weights, five times the
32 MiB last-level cache of the AMD machines this runs on (the Intel kind
reports 480 MiB, and still runs the step at 0.95-1.01x its DRAM floor), so,
as on the paper's accelerators, a step is bound by memory bandwidth; on this
package's CPU kernel a (gamma+1)-token block costs 1.1-1.4 one-token steps
(XLA's dot: 1.4-2.0), and the draft's step 0.05 of one.
scripts/alpha_table.py adds alpha for every
distillation loss; full-size walltime belongs to an accelerator: see
scripts/gpu and scripts/tpu.
"""

import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import jax

from speculative_t5x_lab import benchmark
from speculative_t5x_lab import corpora
from speculative_t5x import gin_utils
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x import run_settings
from speculative_t5x_lab import records as records_lib
from speculative_t5x_lab import reports
from speculative_t5x_lab import result_cache as result_cache_lib
from speculative_t5x.data import tasks_core

# What holds a workdir stage's writer lock, for its record (`output_lock`).
JOB = 'speculative_t5x_lab.demo'

# The demo's clock, read by `_elapsed`: it starts as the module loads (`python -m` runs it).
_started = time.perf_counter()
# This run's stages still to go and their estimated seconds (`_start_schedule`), for `_step`.
_schedule: Dict[str, float] = {}

MAX_DECODE_LEN = 48  # Output length of the timed decodes: the training targets' length.
# The target's training, the first run's largest cost: 300 steps of 8 rows (train.gin's
# BATCH_SIZE is 16, the draft's) under configs/runs/cosine_schedule.gin's warm-up and
# decay. Runs on a CPU see less than an epoch, where updates count more than rows
# (train.gin), hence half the rows. Validation cross entropy under the schedule: 4.38,
# 4.21 and 4.03 after 200, 250 and 300 steps, against 4.31 after 400 at train.gin's
# constant rate. A 250-step target (with a 250-step draft) gave the benchmark's timed
# examples other greedy outputs, on which tokens per call fell from 2.93 to 2.01 (T = 0,
# gamma 3), though alpha over 5,000 tokens rose from 0.729 to 0.776.
TARGET_STEPS = 300
TARGET_BATCH_SIZE = 8
TARGET_SCHEDULE_FILE = 'configs/runs/cosine_schedule.gin'
DRAFT_STEPS = 400
# The training step timed at the start, against the machine kinds' (docs/results.md, "Machines":
# 0.8 s on the Zen 5 kind, 1.65 s on the Zen 4 kind): the target on 16 packed rows of 48 tokens.
REFERENCE_STEP_ROWS = 16
# The budgets (issue 55): a first run within 20 minutes with `make`'s set-up, a second run
# (only measurements) within 3, on the pool's slowest kind, whose training step above takes
# 2.3 s; a machine with a faster step is held to proportionally less.
FIRST_RUN_BUDGET_S, SECOND_RUN_BUDGET_S, BUDGET_STEP_S = 20 * 60, 3 * 60, 2.3
SETUP_S = 180  # `make`'s set-up of .venv on a fresh clone of the slowest kind, before the demo.
# What each stage costs in this machine's training steps (the one timed at the start):
# (fixed, per training step of the stage); for the benchmark, (fixed, per timed pass: one
# gamma or batch size at one temperature), and 'alpha and quality' its share that a second
# run reads from the result cache. Fitted to a first and a second run of the Zen 4 kind
# (docs/results.md, "Run time by machine kind"; the head's to an earlier first run).
STAGE_STEPS = {
  'data': (6.5, 0.0),
  'gettext_target': (10.0, 0.555),
  'gettext_draft': (3.2, 0.108),
  'distillation': (20.0, 0.46),
  'feature head': (10.0, 0.43),
  'benchmark': (13.0, 4.5),
  'alpha and quality': (93.0, 0.0),
  'peers': (36.0, 0.0),
}
# The default sweep: batch 1, gamma 3 and 5 (--full_sweep: gamma 3, 5 and 7 at batch 1 and 8).
GAMMAS, FULL_GAMMAS = ('3', '5'), ('3', '5', '7')
BATCH_SIZES, FULL_BATCH_SIZES = ('1',), ('1', '8')
TEMPERATURES = (0.0, 1.0)  # The decoding modes measured, each with its own distilled draft.
# Distillation steps per temperature, the first run's largest costs after the target's
# training (a greedy step decodes the target's outputs, 0.8 s on the Zen 5 kind; a T = 1
# step runs the target on the draft's samples, 0.45 s). Held-out alpha of the demo's pair,
# greedy: 0.15, 0.77, 0.79 at 0, 100, 150 steps; T = 1: 0.42, 0.69, 0.71, 0.74, 0.75 at 0
# to 400 steps. At T = 1, 200 steps keep alpha above 0.7 (test split: 0.72 against 0.76
# after 400) in half the time.
DISTILL_STEPS = (150, 200)
# The distillation data per decoding mode, the better of draft or target samples for the
# held-out greedy alpha of the demo's pair (forward KL from the data-trained draft, whose
# alpha is 0.40): greedy, the target's greedy outputs, the prefixes greedy decoding
# judges (alpha 0.64 after 100 steps, against 0.40 from the draft's greedy outputs);
# temperature 1, the draft's own samples (DistillSpec's on-policy data; alpha 0.52 ->
# 0.66 in 300 steps).
DISTILLATION_DATA = {0.0: {'target': 1.0}, 1.0: {'draft': 1.0}}
# Training steps per decoded batch of the target's greedy outputs (distill's data_passes;
# the draft's own samples are never reused). On a Zen 4, 150 greedy steps: 1 pass, 188 s,
# held-out greedy alpha 0.794 +- 0.019; 2 passes, 133 s, 0.775 +- 0.022; 4 passes, 95 s,
# 0.602 +- 0.025 (the draft learns the few rows by heart).
DISTILLATION_PASSES = {0.0: 2, 1.0: 1}
# The feature head's training steps with --extras (16 rows each; the head's shape and loss
# are configs/runs/train_feature_head.gin's defaults). Tokens per target call of the
# demo's head at gamma 3, batch 8, 64 test sentences (T = 0 / T = 1): 1.94 / 1.91 after
# 60 steps, 2.19 / 2.18 after 200, 2.22 / 2.35 after 600, 2.27 / 2.35 after 1,000 (the
# distilled drafts: 2.70 / 2.50; docs/results.md). Since each decoded batch serves
# 4 steps and the target's pass over it is made once (DATA_PASSES), 180 steps cost
# what 60 did (about 140 s on the slower machine kind); even 1,000 steps do not
# pass the drafts (--head_steps for more).
HEAD_STEPS = 180
# Target tokens per alpha (the paper's 10,000 is `benchmark.Measurement`'s default): the
# target's sampling is most of what alpha costs (126 s of the Zen 4 kind's first run at
# 10,000), and the report's standard errors were 0.010 (T = 0) and 0.002 (T = 1) there,
# about 0.014 and 0.003 at half the tokens, below the spread of the timed tokens per call.
ALPHA_TOKENS = 5_000
HEAD_DIR = 'feature_head'  # The head's model directory in the workdir.
HEAD_NAME = 'feature head'  # How the report names the head beside the drafts.
# The table's note on outputs cut at MAX_DECODE_LEN without EOS (the target repeating a
# phrase): printed for a temperature where they hold this share of the alpha tokens or more.
CUT_NOTE_SHARE = 0.25


def _define_flags() -> None:
  """The demo's command line; defined only when the demo runs, not when it is imported."""
  flags.DEFINE_string('workdir', 'runs/demo', 'Where every step caches its result.')
  flags.DEFINE_integer('target_steps', TARGET_STEPS, 'Training steps of the target.')
  flags.DEFINE_integer('draft_steps', DRAFT_STEPS, 'Training steps of the draft on the data.')
  flags.DEFINE_list(
    'distill_steps',
    [str(steps) for steps in DISTILL_STEPS],
    f'Distillation steps of the draft from the target for each of the temperatures '
    f'{TEMPERATURES} (0: no distillation, the data-trained draft).',
  )
  flags.DEFINE_enum(
    'distill_divergence', 'forward_kl', ['forward_kl', 'reverse_kl', 'jsd', 'tvd'], 'The loss.'
  )
  flags.DEFINE_bool(
    'extras',
    False,
    'Beyond the core rows: a feature head trained for the target and timed beside the '
    'distilled draft, and alpha of the draft before distillation, of the one distilled for '
    'the other temperature and of unigram and bigram drafts (Table 3). README: what it adds '
    'and how long it takes.',
  )
  flags.DEFINE_integer(
    'head_steps',
    HEAD_STEPS,
    'Training steps of the feature head (with --extras).',
    lower_bound=1,
  )
  flags.DEFINE_integer('vocab_size', 4000, 'SentencePiece pieces.')
  flags.DEFINE_integer('num_examples', 16, 'Test examples timed at batch 1.')
  flags.DEFINE_list('gammas', None, f'The gamma sweep (default {",".join(GAMMAS)}).')
  flags.DEFINE_list('batch_sizes', None, f'The batch-size sweep (default {",".join(BATCH_SIZES)}).')
  flags.DEFINE_bool(
    'full_sweep',
    False,
    f'Sweep gamma {",".join(FULL_GAMMAS)} and batch sizes {",".join(FULL_BATCH_SIZES)} '
    '(--gammas and --batch_sizes still take precedence).',
  )
  flags.DEFINE_integer('repetitions', 3, 'Timed passes per configuration.')
  flags.DEFINE_bool(
    'remeasure',
    False,
    'Recompute alpha and the sampled quality even where <workdir>/result_cache holds them '
    '(a second run reads them back; timings are always measured).',
  )
  flags.DEFINE_integer('alpha_tokens', ALPHA_TOKENS, 'Target tokens per alpha.')
  flags.DEFINE_bool(
    'peers',
    True,
    "The Hugging Face comparison, on the benchmark's timed examples (--nopeers: skip it).",
  )


def _millions(model) -> str:
  """A model's or a feature head's parameters, in millions (the head's own only)."""
  return f'{network.parameter_count(model.params) / 1e6:.1f}M'


def _elapsed() -> str:
  """The seconds since the demo began, as step headers and progress lines show them."""
  return f'[{time.perf_counter() - _started:4.0f} s]'


def _step(message: str, stage: Optional[str] = None) -> None:
  """A step's header: the seconds since the demo began, and from a `stage` of the run's
  schedule on (`_start_schedule`), the estimate of the time left."""
  left = ''
  if stage is not None and stage in _schedule:
    seconds = sum(list(_schedule.values())[list(_schedule).index(stage) :])
    left = f' (about {seconds / 60:.1f} min left)'
  print(f'\n== {_elapsed()} {message}{left}', flush=True)


def stage_estimates(args, workdir: str, step_s: float) -> Dict[str, float]:
  """The stages this run still has to go through: {stage: estimated seconds}, in order.

  A stage whose result `workdir` holds is skipped, as the run will skip it.
  Each estimate is `STAGE_STEPS` in units of `step_s`, this machine's target
  training step (`training_step_seconds` of REFERENCE_STEP_ROWS rows): the
  machine kinds differ in that step about as they differ in every stage.
  """
  corpus_dir, vocabulary = _data_paths(workdir, args.vocab_size)
  data_ready = os.path.exists(os.path.join(corpus_dir, 'test.tsv')) and os.path.exists(
    vocabulary + '.model'
  )
  # {stage: (its training steps, whether the workdir holds its result)}.
  stages = {'data': (0, data_ready)}
  for name, steps in (('gettext_target', args.target_steps), ('gettext_draft', args.draft_steps)):
    stages[name] = (steps, _finished(os.path.join(workdir, name), steps))
  for temperature, steps in zip(TEMPERATURES, _distill_steps(args)):
    if steps:
      model_dir = _distilled_dir(workdir, args.distill_divergence, temperature)
      stages[f'distillation for T={temperature:g}'] = (steps, _finished(model_dir, steps))
  if args.extras:
    head_dir = os.path.join(workdir, HEAD_DIR)
    stages['feature head'] = (args.head_steps, _finished(head_dir, args.head_steps))
  estimates = {}
  for stage, (count, cached) in stages.items():
    if not cached:
      fixed, per_step = STAGE_STEPS[stage.split(' for ')[0]]
      estimates[stage] = (fixed + per_step * count) * step_s
  # The timed passes: both temperatures, every gamma and batch size, and the head's beside.
  gammas = len(args.gammas or (FULL_GAMMAS if args.full_sweep else GAMMAS))
  batch_sizes = len(args.batch_sizes or (FULL_BATCH_SIZES if args.full_sweep else BATCH_SIZES))
  passes = len(TEMPERATURES) * (gammas + batch_sizes - 1) * (2 if args.extras else 1)
  passes *= args.repetitions / 3 * args.num_examples / 16
  fixed, per_pass = STAGE_STEPS['benchmark']
  first_run = bool(estimates) or args.remeasure  # alpha and the sampled quality not cached.
  measured = STAGE_STEPS['alpha and quality'][0] * (2 if args.extras else 1) if first_run else 0
  estimates['benchmark'] = (fixed + measured + per_pass * passes) * step_s
  if args.peers:
    estimates['peers'] = STAGE_STEPS['peers'][0] * step_s
  return estimates


def _start_schedule(args, workdir: str, step_s: float) -> None:
  """Estimates this run (`stage_estimates`), prints it against its budget and keeps it for
  `_step`'s time left.

  A run that trains is a first run, held with `make`'s set-up (SETUP_S) to
  FIRST_RUN_BUDGET_S, one that only measures to SECOND_RUN_BUDGET_S; both
  are set for a machine whose training step is BUDGET_STEP_S (the pool's
  slowest) and shrink in proportion on a faster one.
  """
  _schedule.clear()
  _schedule.update(stage_estimates(args, workdir, step_s))
  total = sum(_schedule.values())
  first_run = set(_schedule) - {'benchmark', 'peers'}
  scale = step_s / BUDGET_STEP_S
  if first_run:
    budget, with_setup = FIRST_RUN_BUDGET_S * scale, total + SETUP_S * scale
    kind = f'a first run, with set-up about {with_setup / 60:.1f} min'
  else:
    budget, with_setup = SECOND_RUN_BUDGET_S * scale, total
    kind = 'a second run (the models are in the workdir)'
  parts = ', '.join(f'{stage} {seconds / 60:.1f}' for stage, seconds in _schedule.items())
  print(
    f'Estimate on this machine: {total / 60:.1f} min ({kind}; stages: {parts}); the budget '
    f'here is {budget / 60:.1f} min ({(FIRST_RUN_BUDGET_S if first_run else SECOND_RUN_BUDGET_S) / 60:.0f} min at a '
    f"{BUDGET_STEP_S} s step, in proportion to this machine's {step_s:.2f} s).",
    flush=True,
  )
  if with_setup > budget:
    print(
      f'This run will take longer than the budget by about {(with_setup - budget) / 60:.1f} '
      'min on this machine.',
      flush=True,
    )


def training_step_seconds(
  config: network.T5Config, batch_size: int, length: int = MAX_DECODE_LEN, repetitions: int = 3
) -> float:
  """Median seconds of one training step of `config` on `batch_size` full rows of `length`.

  Cross entropy through the network (`network.compute_logits`, the forward pass of
  `train`'s step) and an Adafactor update (train.gin's optimizer) on random tokens, warmed
  up: the machine's training speed, the same on either run, without importing `train`
  (TensorFlow and seqio, which a second run does not otherwise need).
  """
  import numpy as np
  import optax

  from speculative_t5x_lab import measure

  tx = optax.adafactor(0.03)

  @jax.jit
  def step(params, opt_state, batch):
    def loss(params):
      logits = network.compute_logits(config, params, batch)
      return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch['decoder_target_tokens']
      ).mean()

    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params = network.random_params(config)[0]
  opt_state = tx.init(params)
  tokens = np.random.default_rng(0).integers(2, config.vocab_size, (batch_size, length))
  batch = {
    'encoder_input_tokens': tokens,
    'decoder_input_tokens': layouts.shift_right(tokens),
    'decoder_target_tokens': tokens,
  }
  batch = {name: jax.numpy.asarray(value, jax.numpy.int32) for name, value in batch.items()}
  return measure.median_seconds(lambda: step(params, opt_state, batch), repetitions)


def print_machine(vocab_size: int) -> Dict[str, Any]:
  """Prints and returns what this run measures on: `measure.machine()` and a training step."""
  from speculative_t5x_lab import measure

  machine = measure.machine()
  config = gin_utils.model_config('gettext_target', vocab_size)
  machine['training_step_s'] = training_step_seconds(config, REFERENCE_STEP_ROWS)
  machine['training_step_rows'] = REFERENCE_STEP_ROWS
  print(
    f'Machine: {machine["cpu"]} (family {machine["cpu_family"]}), {machine["cores"]} cores, '
    f'{machine["bandwidth_gb_per_s"]:.1f} GB/s (a reduction over 512 MiB); a target '
    f'training step ({REFERENCE_STEP_ROWS} x {MAX_DECODE_LEN} tokens) takes '
    f'{machine["training_step_s"]:.2f} s (docs/results.md: 0.8 s on the Zen 5 kind, '
    f'1.65 s on the Zen 4 kind).',
    flush=True,
  )
  return machine


def _data_paths(workdir: str, vocab_size: int) -> Tuple[str, str]:
  """(corpus_dir, the vocabulary's path without '.model') of a workdir."""
  return os.path.join(workdir, 'corpus'), os.path.join(workdir, 'vocabulary', f'spm_{vocab_size}')


def _distilled_dir(workdir: str, divergence: str, temperature: float) -> str:
  """The model directory of the draft distilled for `temperature`."""
  return os.path.join(workdir, f'gettext_draft_{divergence}_T{temperature:g}')


def _finished(model_dir: str, steps: int) -> bool:
  """Whether a workdir's run has its checkpoint of `steps` (the stage is then only read)."""
  return os.path.isdir(os.path.join(model_dir, str(steps)))


def prepare_data(workdir: str, vocab_size: int):
  """Builds (or finds) the corpus and the vocabulary: (corpus_dir, vocabulary path).

  Each is built holding its directory's writer lock (`output_lock`); one
  that is there is read without it.
  """
  corpus_dir, vocabulary = _data_paths(workdir, vocab_size)
  if not os.path.exists(os.path.join(corpus_dir, 'test.tsv')):
    with output_lock.hold(corpus_dir, JOB):
      _step('Building the gettext English->German corpus', stage='data')
      print(corpora.build_gettext_corpus(corpus_dir))
  if not os.path.exists(vocabulary + '.model'):
    with output_lock.hold(os.path.dirname(vocabulary), JOB):
      _step(f'Training a {vocab_size}-piece SentencePiece vocabulary')
      train_pairs = tasks_core.read_tsv(os.path.join(corpus_dir, 'train.tsv'))
      tasks_core.train_sentencepiece_model(
        (text for pair in train_pairs for text in pair), vocabulary, vocab_size
      )
  return corpus_dir, vocabulary + '.model'


def trained_model(
  workdir: str,
  name: str,
  steps: int,
  corpus_dir: str,
  vocabulary: str,
  vocab_size: int,
  batch_size: Optional[int] = None,
  schedule_file: Optional[str] = None,
) -> models.Model:
  """Trains configs/models/<name>.gin on the corpus (or resumes it, or checks the finished one's
  recipe: `_train_or_check`).

  The training run is `python -m speculative_t5x.training.train` with the model file,
  configs/tasks/gettext_ende.gin and configs/runs/train.gin (then
  `schedule_file`, a gin file of the learning-rate schedule, if given), keeping
  only the last checkpoint and without evaluation; `batch_size` replaces
  train.gin's BATCH_SIZE (None: keep it).
  """
  config = gin_utils.model_config(name, vocab_size)
  model_dir = os.path.join(workdir, name)

  gin_files = [
    f'configs/models/{name}.gin',
    'configs/tasks/gettext_ende.gin',
    'configs/runs/train.gin',
    *([schedule_file] if schedule_file else []),
  ]
  settings = {'VOCAB_SIZE': vocab_size, 'EVAL_PERIOD': None, 'train.train.keep_checkpoints': 1}
  if batch_size is not None:
    settings['BATCH_SIZE'] = batch_size
  locations = {
    'MODEL_DIR': model_dir,
    'TRAIN_STEPS': steps,
    'CORPUS_DIR': corpus_dir,
    'VOCABULARY': vocabulary,
  }

  def run(bindings: List[str]) -> None:
    from speculative_t5x.training import train  # TensorFlow and seqio only when training.

    num_params = network.parameter_count(network.abstract_params(config)[0])
    _step(f'Training {name} ({num_params / 1e6:.1f}M parameters, {steps} steps)', stage=name)
    gin_utils.call_configured(train.train, gin_files, bindings)

  _train_or_check(model_dir, steps, gin_files, settings, locations, run)
  return models.Model(config, _restore_cached(model_dir, steps, config))


def _restore_cached(model_dir: str, steps: int, config: network.T5Config):
  """The parameters a workdir caches, with a way out when they are another network's."""
  from speculative_t5x import checkpoints

  try:
    return checkpoints.restore_params(model_dir, step=steps, config=config)
  except ValueError as error:
    raise ValueError(
      f'{model_dir} holds a model trained with another configuration (an earlier version of '
      f'the demo, or other flags): {error} Run the demo with a new --workdir, or delete '
      f'{model_dir} to train it again.'
    ) from error


def _stale_run(error: ValueError, model_dir: str, settings_file: str) -> None:
  """Re-raises a refused resume of a workdir's unfinished run with the demo's way out.

  A run that recorded its settings in `model_dir` and was refused is from an
  earlier version of the demo or other flags; any other error is raised as it is.
  """
  if not os.path.exists(os.path.join(model_dir, settings_file)):
    raise error
  raise ValueError(
    f'{error} That run is from an earlier version of the demo or other flags: run the '
    f'demo with a new --workdir, or delete {model_dir} to train it again.'
  ) from error


# A workdir run's recipe (`_train_or_check`), beside its checkpoints.
RECIPE_FILE = 'demo_recipe.json'


def _train_or_check(
  model_dir: str,
  steps: int,
  gin_files: Sequence[str],
  settings: Mapping[str, Any],
  locations: Mapping[str, Any],
  run: Callable[[List[str]], None],
) -> None:
  """Trains a workdir's run to `steps`, or checks that the one there is this demo's.

  `run(bindings)` trains (or resumes: the trainers check their own recorded
  settings) with the gin files and `NAME = VALUE` bindings of `settings` (what
  shapes the model) and `locations` (its paths and step count: a moved workdir
  or a longer run is the same recipe). The recipe, the files' bindings
  (`gin_utils.file_bindings`) and `settings`, is written to RECIPE_FILE. A
  finished run is not retrained, so its recipe is compared with this demo's:
  a difference (an earlier version of the demo, or other flags) is refused,
  naming it, rather than measured as this demo's. Library defaults that no
  gin file binds are not part of a recipe.

  Training and writing the recipe hold `model_dir`'s writer lock
  (`output_lock`; the trainer's own hold nests in it): while another job
  writes it, this raises `OutputLockedError` naming that job. Checking a
  finished run only reads, without the lock.
  """
  recipe = {
    'gin_files': list(gin_files),
    'bindings': gin_utils.file_bindings(gin_files),
    'settings': {name: repr(value) for name, value in settings.items()},
  }
  path = os.path.join(model_dir, RECIPE_FILE)
  if not _finished(model_dir, steps):
    with output_lock.hold(model_dir, JOB):
      run([f'{name} = {value!r}' for name, value in {**settings, **locations}.items()])
      with open(path, 'w') as f:
        json.dump(recipe, f, indent=1)
  elif not os.path.exists(path):
    print(
      f'   {model_dir} was trained before the demo recorded recipes ({RECIPE_FILE}): reused '
      f'unchecked; delete it to train it with this version.',
      flush=True,
    )
  else:
    with open(path) as f:
      recorded = json.load(f)
    if recorded != recipe:
      raise ValueError(
        f"{model_dir} was trained from another recipe than this demo's (an earlier version of "
        f'the demo, or other flags): {_recipe_changes(recorded, recipe)}. Run the demo with a '
        f'new --workdir, or delete {model_dir} to train it again.'
      )


def _recipe_changes(recorded: Mapping[str, Any], recipe: Mapping[str, Any]) -> str:
  """What differs between two recipes, e.g. "bindings: 'X = 1' then, 'X = 2' now"."""
  changes = []
  for part in ('gin_files', 'bindings'):
    then = [line for line in recorded.get(part, []) if line not in recipe[part]]
    now = [line for line in recipe[part] if line not in recorded.get(part, [])]
    if then or now:
      changes.append(f'{part}: {then} then, {now} now')
  then, now = recorded.get('settings', {}), recipe['settings']
  for name in sorted(set(then) | set(now)):
    if then.get(name) != now.get(name):
      changes.append(f'{name} {then.get(name, "unset")} then, {now.get(name, "unset")} now')
  return '; '.join(changes) or 'the order of its bindings'


def distilled_model(
  workdir: str,
  steps: int,
  divergence: str,
  temperature: float,
  corpus_dir: str,
  vocabulary: str,
  vocab_size: int,
) -> tuple:
  """Distills the data-trained draft from the target (or resumes or checks it, as
  `_train_or_check` does): (model, record).

  The run is `python -m speculative_t5x.training.distill` with the pair file
  configs/pairs/gettext_tiny.gin (target and draft read from their training
  directories in `workdir`), configs/tasks/gettext_ende.gin and
  configs/runs/distill.gin. The record holds the run's settings and its
  held-out alpha curve (read from the model directory, so a cached run
  reports them too) for `benchmark.Report.distillation`.
  """
  config = gin_utils.model_config('gettext_draft', vocab_size)
  model_dir = _distilled_dir(workdir, divergence, temperature)
  settings = {
    'DIVERGENCE': divergence,
    'TEMPERATURE': temperature,
    'DATA_MIX': DISTILLATION_DATA[temperature],
    'DATA_PASSES': DISTILLATION_PASSES[temperature],
    'VOCAB_SIZE': vocab_size,
    # Held-out alpha at the draft's own temperature only: the other temperature's held-out
    # set (the target's samples and probabilities on the validation inputs) took 12 s of the
    # greedy distillation and 3 s of the T = 1 one on the Zen 4 kind, and --extras measures
    # alpha at the other temperature on the test split.
    'distill.distill.eval_temperatures': (temperature,),
  }
  locations = {
    'MODEL_DIR': model_dir,
    'DISTILL_STEPS': steps,
    'CHECKPOINT_PATH': os.path.join(workdir, 'gettext_target'),
    'DRAFT_CHECKPOINT_PATH': os.path.join(workdir, 'gettext_draft'),
    'CORPUS_DIR': corpus_dir,
    'VOCABULARY': vocabulary,
  }
  gin_files = [
    'configs/pairs/gettext_tiny.gin',
    'configs/tasks/gettext_ende.gin',
    'configs/runs/distill.gin',
  ]

  def run(bindings: List[str]) -> None:
    from speculative_t5x.training import distill  # TensorFlow and seqio only when distilling.

    _step(
      f'Distilling the draft from the target for T={temperature:g} ({divergence}, {steps} '
      f'steps, data {DISTILLATION_DATA[temperature]}, {DISTILLATION_PASSES[temperature]} '
      'pass(es) per batch)',
      stage=f'distillation for T={temperature:g}',
    )
    try:
      gin_utils.call_configured(distill.distill, gin_files, bindings)
    except ValueError as error:
      _stale_run(error, model_dir, distill.SETTINGS_FILE)

  _train_or_check(model_dir, steps, gin_files, settings, locations, run)
  with open(os.path.join(model_dir, run_settings.DISTILL_SETTINGS_FILE)) as f:
    record = json.load(f)
  with open(os.path.join(model_dir, run_settings.METRICS_FILE)) as f:
    curve = [json.loads(line) for line in f]
  record.update(
    steps=steps,
    curve=[r for r in curve if r.pop('split') == 'validation' and r['step'] <= steps],
  )
  return models.Model(config, _restore_cached(model_dir, steps, config)), record


def feature_head_draft(
  workdir: str, target: models.Model, steps: int, corpus_dir: str, vocabulary: str, vocab_size: int
):
  """Trains a feature head for the target (or resumes or checks it, as `_train_or_check`
  does): (draft, training record).

  The run is `python -m speculative_t5x.training.train_feature_head` with
  configs/pairs/gettext_tiny.gin (the target read from its training directory
  in `workdir`), configs/tasks/gettext_ende.gin and
  configs/runs/train_feature_head.gin. The record holds the head's held-out
  alpha curve and its training time (read from the model directory, so a
  cached run reports them too).
  """
  model_dir = os.path.join(workdir, HEAD_DIR)
  gin_files = [
    'configs/pairs/gettext_tiny.gin',
    'configs/tasks/gettext_ende.gin',
    'configs/runs/train_feature_head.gin',
  ]
  locations = {
    'MODEL_DIR': model_dir,
    'HEAD_STEPS': steps,
    'CHECKPOINT_PATH': os.path.join(workdir, 'gettext_target'),
    'CORPUS_DIR': corpus_dir,
    'VOCABULARY': vocabulary,
  }

  def run(bindings: List[str]) -> None:
    from speculative_t5x.training import train_feature_head  # TensorFlow and seqio only here.

    _step(f'Training a feature head for the target ({steps} steps)', stage='feature head')
    try:
      gin_utils.call_configured(train_feature_head.train_on_task, gin_files, bindings)
    except ValueError as error:
      _stale_run(error, model_dir, train_feature_head.SETTINGS_FILE)

  _train_or_check(model_dir, steps, gin_files, {'VOCAB_SIZE': vocab_size}, locations, run)
  with open(os.path.join(model_dir, run_settings.METRICS_FILE)) as f:
    metrics = [json.loads(line) for line in f]
  last = [r['seconds'] for r in metrics if r['split'] == 'train' and r['step'] == steps]
  record = dict(
    steps=steps,
    training_seconds=last[-1] if last else None,
    curve=[
      {name: r[name] for name in ('step', 'alpha', 'loss')}
      for r in metrics
      if r['split'] == 'validation' and r['step'] <= steps
    ],
  )
  return models.FeatureHeadCheckpoint(model_dir, steps).for_target(target), record


def compare_with_huggingface(target, draft, inputs, gamma, workdir, report_dir) -> str:
  """`peers.compare_with_huggingface`, written to report_dir/peers.{json,md}."""
  from speculative_t5x_lab import peers  # PyTorch and transformers only here.

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


def _draft_label(record: records_lib.PairRecord) -> str:
  """The table's draft column: 'head' for the feature head, else 'distilled' or 'draft'."""
  if HEAD_NAME in record.pair:
    return 'head'
  return 'distilled' if 'distilled' in record.pair else 'draft'


def print_table(records) -> None:
  """The Table-2-style summary at batch 1: one row per temperature, gamma and draft.

  The feature head's rows sit beside the distilled draft's; 'same' is the share of
  outputs identical to the baseline's (greedy: all of them, else a bug).
  """
  header = (
    'T',
    'gamma',
    'draft',
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
    'same',
  )
  print(' '.join(f'{h:>11s}' for h in header))
  sampled = []
  walltime = [
    r
    for r in records_lib.typed(records)
    if isinstance(r, records_lib.Walltime) and r.batch_size == 1
  ]
  for r in sorted(walltime, key=lambda r: (r.temperature, r.gamma)):
    row = (
      r.temperature,
      r.gamma,
      _draft_label(r),
      r.alpha,
      r.c,
      r.verify_cost,
      r.tokens_per_call,
      r.ms_per_token_baseline['median'],
      r.ms_per_token_speculative['median'],
      r.speedup['median'],
      r.predicted_speedup,
      *_bleu_cells(r),
      r.identical_outputs if r.temperature == 0 else '-',
    )
    print(' '.join(f'{v:>11.3f}' if isinstance(v, float) else f'{str(v):>11s}' for v in row))
    if r.sampled_quality:
      sampled.append(r)
  for line in _cut_output_lines(records):
    print(line)
  if sampled:
    print(f'\n{reports.SAMPLED_QUALITY_NOTE}')
    for r in sampled:
      print(reports.sampled_quality_line(r))


def _cut_output_lines(records) -> List[str]:
  """Per temperature where `CUT_NOTE_SHARE` of the alpha tokens or more are in outputs cut at
  the decode length: that share, and the table's drafts' alpha on those and on the rest."""
  alpha = [
    r
    for r in records_lib.typed(records)
    if isinstance(r, records_lib.Alpha) and r.cut_share is not None
  ]
  lines = []
  for temperature in sorted({r.temperature for r in alpha}):
    shown = [
      r
      for r in alpha
      if r.temperature == temperature and (r.draft == benchmark.PAIR_DRAFT or HEAD_NAME in r.draft)
    ]
    if not shown or shown[0].cut_share < CUT_NOTE_SHARE:
      continue
    number = lambda value: '-' if value is None else f'{value:.3f}'
    parts = ', '.join(
      f'{"head" if HEAD_NAME in r.draft else _draft_label(r)} {number(r.alpha_cut)} / '
      f'{number(r.alpha_ended)}'
      for r in shown
    )
    lines.append(
      f'T={temperature:g}: {shown[0].cut_share:.0%} of the alpha tokens are in target outputs '
      f'cut at the decode length without EOS (the target repeating itself); alpha on those / '
      f'on the outputs that end: {parts}.'
    )
  return lines


def _bleu_cells(record: Dict[str, Any]) -> tuple:
  """The table's BLEU cells: greedy, one value each; sampled, mean+-stderr over keys."""
  quality = record.get('sampled_quality')
  if not quality or quality['baseline']['bleu'] is None:
    return record.get('bleu_baseline'), record.get('bleu_speculative')
  return tuple(
    f'{quality[name]["bleu"]["mean"]:.1f}+-{quality[name]["bleu"]["stderr"]:.1f}'
    for name in ('baseline', 'speculative')
  )


def _use_workdir(args) -> str:
  """Creates `--workdir`, keeps compiled programs there, quiets library logs; returns it."""
  if not args['verbosity'].present:  # Progress bars and the report, not library INFO logs.
    logging.set_verbosity(logging.WARNING)
  workdir = args.workdir
  os.makedirs(workdir, exist_ok=True)
  # Compiled programs persist across runs, every one however fast it compiled: the second
  # run skips compilation.
  jax.config.update('jax_compilation_cache_dir', os.path.join(workdir, 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return workdir


def _distill_steps(args) -> List[int]:
  """`--distill_steps` as one count per temperature of TEMPERATURES; UsageError otherwise."""
  steps = [int(count) for count in args.distill_steps]
  if len(steps) != len(TEMPERATURES) or min(steps) < 0:
    raise app.UsageError(
      f'--distill_steps takes {len(TEMPERATURES)} counts >= 0, one for each of the '
      f'temperatures {TEMPERATURES}; got {args.distill_steps}.'
    )
  return steps


def _distilled_drafts(args, workdir: str, corpus_dir: str, vocabulary: str) -> Dict[float, Any]:
  """One draft per decoding mode, as DistillSpec distills: {temperature: (draft, record)}.

  Only the temperatures whose `--distill_steps` count is > 0.
  """
  return {
    temperature: distilled_model(
      workdir, steps, args.distill_divergence, temperature, corpus_dir, vocabulary, args.vocab_size
    )
    for temperature, steps in zip(TEMPERATURES, _distill_steps(args))
    if steps
  }


def _benchmark_options(args, workdir: str, corpus_dir: str, vocabulary: str) -> Dict[str, Any]:
  """`run_benchmark`'s options from the flags.

  The flags' sweep (gammas and batch sizes), with --extras the train split's
  target tokens for the n-gram drafts, the workdir's result cache, and
  progress lines stamped with the seconds since the demo began; each mode
  replaces its temperature, other drafts, pair name and distillation.
  """
  gammas = args.gammas or list(FULL_GAMMAS if args.full_sweep else GAMMAS)
  batch_sizes = args.batch_sizes or list(FULL_BATCH_SIZES if args.full_sweep else BATCH_SIZES)
  ngram_corpus = None
  if args.extras:
    ngram_corpus = benchmark.tsv_target_tokens(
      os.path.join(corpus_dir, 'train.tsv'), vocabulary, 20_000
    )
  return dict(
    sweep=benchmark.Sweep(
      gammas=[int(g) for g in gammas], batch_sizes=[int(b) for b in batch_sizes]
    ),
    measurement=benchmark.Measurement(
      num_walltime_examples=args.num_examples,
      repetitions=args.repetitions,
      max_decode_len=MAX_DECODE_LEN,
      alpha_tokens=args.alpha_tokens,
    ),
    other_drafts=benchmark.OtherDrafts(ngram_corpus=ngram_corpus),
    report=benchmark.Report(
      task_name='gettext EnDe test',
      vocabulary_path=vocabulary,
      # alpha and the sampled quality are functions of the checkpoints, the inputs and
      # this machine: a second run reads them back (timings are measured in every run).
      # It takes its directory's writer lock if it computes an entry; `main` closes it.
      result_cache=result_cache_lib.ResultCache(
        os.path.join(workdir, 'result_cache'), remeasure=args.remeasure, job=JOB
      ),
      progress=lambda line: print(f'{_elapsed()} {line}', flush=True),
    ),
  )


def _benchmark_every_mode(
  target, data_draft, distilled, head, inputs, references, options, extras: bool
) -> Tuple[List[Any], Dict[float, Any]]:
  """`benchmark.run_benchmark` once per temperature: `(records, {temperature: draft used})`.

  Each temperature's pair is the draft distilled for it (else the data-trained
  draft). With `extras` (--extras), alpha of the other drafts is measured on
  the same target samples (before distillation, and the draft distilled for
  the other temperature), and the head is timed in the same passes. inputs:
  int32 [N, Lin] the test split's, `references` their N targets; `options`:
  `_benchmark_options`.
  """
  records, drafts_used = [], {}
  target_name = f'gettext target ({_millions(target)})'
  for temperature in TEMPERATURES:
    draft, distillation = distilled.get(temperature, (data_draft, None))
    drafts_used[temperature] = draft
    name = f'draft distilled for T={temperature:g}' if distillation else 'draft'
    alpha_drafts, compared = {}, {}
    if extras:
      if distillation:
        alpha_drafts['data-trained draft'] = data_draft
      for other, (other_draft, _) in distilled.items():
        if other != temperature:
          alpha_drafts[f'draft distilled for T={other:g}'] = other_draft
      compared[f'{target_name} / {HEAD_NAME} ({_millions(head)})'] = head
    records += benchmark.run_benchmark(
      target,
      draft,
      inputs,
      references=references,
      sweep=dataclasses.replace(options['sweep'], temperatures=(temperature,)),
      measurement=options['measurement'],
      other_drafts=dataclasses.replace(
        options['other_drafts'], alpha_drafts=alpha_drafts, compared_drafts=compared
      ),
      report=dataclasses.replace(
        options['report'],
        pair_name=f'{target_name} / {name} ({_millions(draft)})',
        distillation=distillation,
      ),
    )
  return records, drafts_used


def _head_training_record(target, head_training: Dict[str, Any]) -> records_lib.HeadTraining:
  """The feature head's training, as a record of the report."""
  return records_lib.make(
    records_lib.HeadTraining,
    pair=f'gettext target ({_millions(target)}) / {HEAD_NAME}',
    task='gettext EnDe train',
    emulated=False,
    architecture=models.architecture(target),
    **head_training,
  )


def _peers_beside_ours(
  records, target, greedy_draft, inputs, workdir: str, report_dir: str
) -> Optional[str]:
  """`compare_with_huggingface` at the gamma fastest in the benchmark (greedy, batch 1).

  inputs: int32 [N, Lin], the benchmark's timed examples. The feature head's
  records are left out of the choice of gamma: its draft is not compared.
  """
  distilled_records = [r for r in records if HEAD_NAME not in r.get('pair', '')]
  greedy_gamma = benchmark.best_gamma(distilled_records, temperature=0.0)
  _step(
    f'Hugging Face assisted generation beside ours (greedy, batch 1, gamma {greedy_gamma})',
    stage='peers',
  )
  return compare_with_huggingface(target, greedy_draft, inputs, greedy_gamma, workdir, report_dir)


def main(argv) -> None:
  del argv
  args = flags.FLAGS
  workdir = _use_workdir(args)

  _step('The machine')
  machine = print_machine(args.vocab_size)
  _start_schedule(args, workdir, machine['training_step_s'])

  corpus_dir, vocabulary = prepare_data(workdir, args.vocab_size)
  target = trained_model(
    workdir,
    'gettext_target',
    args.target_steps,
    corpus_dir,
    vocabulary,
    args.vocab_size,
    batch_size=TARGET_BATCH_SIZE,
    schedule_file=TARGET_SCHEDULE_FILE,
  )
  data_draft = trained_model(
    workdir, 'gettext_draft', args.draft_steps, corpus_dir, vocabulary, args.vocab_size
  )
  distilled = _distilled_drafts(args, workdir, corpus_dir, vocabulary)
  head, head_training = None, None
  if args.extras:
    head, head_training = feature_head_draft(
      workdir, target, args.head_steps, corpus_dir, vocabulary, args.vocab_size
    )

  _step('Benchmarking on the test split', stage='benchmark')
  report_dir = os.path.join(workdir, 'report')
  # report/ has one writer, from before the measurements (a second demo on this workdir
  # stops here, not after timing beside this one); the peers' exports in hf/ are
  # written inside it too.
  with output_lock.hold(report_dir, JOB):
    inputs, references = benchmark.tsv_inputs(
      os.path.join(corpus_dir, 'test.tsv'), vocabulary, prefix=tasks_core.EN_DE_PREFIX
    )
    options = _benchmark_options(args, workdir, corpus_dir, vocabulary)
    with options['report'].result_cache:
      records, drafts_used = _benchmark_every_mode(
        target, data_draft, distilled, head, inputs, references, options, args.extras
      )
    if head_training is not None:
      records.append(_head_training_record(target, head_training))
    records.append(records_lib.Machine(emulated=False, **machine))
    reports.write_report(records, report_dir)
    peers_markdown = None
    if args.peers:
      # The examples the benchmark times (`Measurement.num_walltime_examples`), so that the
      # two tables' speedups are of the same inputs.
      timed_inputs = layouts.trim_padding(inputs[: args.num_examples])
      peers_markdown = _peers_beside_ours(
        records, target, drafts_used[0.0], timed_inputs, workdir, report_dir
      )
  _step(f'Report ({report_dir}/benchmark.md, .json, peers.md, figures)')
  print_table(records)
  if peers_markdown:
    print('\n' + peers_markdown)
  print(f'\nTotal wall time: {time.perf_counter() - _started:.0f} s')


if __name__ == '__main__':
  _define_flags()
  app.run(main)
