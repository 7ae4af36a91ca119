"""Trains the paper's GPT-like target and draft on the offline English LM task.

Leviathan et al. 2023 (Table 3) pair a 97M-parameter GPT-like target (12
layers, width 768, feed-forward 3072, 12 heads) with a 6M draft (2 layers,
256, 1024, 4 heads), decoder-only, trained on LM1B with an 8k vocabulary.
Here (configs/models/gpt_like_{target,draft}.gin):

  1. the corpus: English sentences from this machine's Python standard library
     and gettext catalogs (`corpora.build_english_corpus`; LM1B cannot be
     downloaded offline), in <workdir>/corpus;
  2. an 8,000-piece SentencePiece vocabulary trained on its train split, in
     <workdir>/vocabulary/spm_8000.model (the networks' 8192 rows leave 192
     unused);
  3. both models trained as prefix LMs on `speculative_t5x:english_lm`
     (configs/tasks/english_lm.gin: the prompt is a sentence's first 4 words,
     the loss is on the rest; attention causal, T5X's default
     inputs_bidirectional_attention=False, so the models are also plain
     language models of whole sentences), with configs/runs/train_decoder_only.gin,
     into <workdir>/<model> (orbax checkpoints, metrics.jsonl,
     train_settings.json). Adafactor's relative step warms up linearly to
     --peak_learning_rate (train.gin's constant 0.03) over --warmup_steps,
     then decays to 0 along a cosine by the last step: with the constant
     rate, the 4-layer target ended at a training loss of 4.29 (the draft
     3.77) and a validation cross entropy of 4.57, worse than its draft's
     4.47 (optimization-limited, not data-limited); with the schedule, 3.56
     and 4.32, against the draft's 3.36 and 4.40.

The target keeps the paper's width and heads, so that its decoder step stays
memory-bound (its weights are several times the 32 MiB last-level cache), but
a 12-layer model cannot be trained meaningfully on a 2-core CPU (one step of
16 rows of 64 tokens took 4.6 s, ~200 steps or 0.17M tokens in 15 minutes,
under half an epoch; the 4-layer target's step takes 0.9 s):
`--target_layers` (default 4) sets its depth, and its directory and summary
name it ("gpt_like_target_4l", "GPT-like target, 4 of 12 layers"). The script
first times one training step of the full 12-layer target (recorded as
'full_target_step'), then trains the draft and the target, one at a time.

Resumable: the corpus, vocabulary and step timing are reused when present;
`train.train` resumes an interrupted model from its latest checkpoint and
returns at once for a finished one. <workdir>/summary.json gets, per model,
its config, size, steps, tokens seen, losses and wall time (from
metrics.jsonl, so a resumed run counts all of its segments).

  python scripts/gpt_like_models.py --workdir runs/gpt_like

Load a trained model with `models.load_trained(<workdir>/<model>)`.
"""

import argparse
import json
import logging as std_logging
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative_t5x_lab import corpora
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x.data import tasks
from speculative_t5x.training import train

VOCABULARY_PIECES = 8000
# The English LM task's pieces: inputs (4 words) 5.0 on average, 10 at the
# 99th percentile; targets (the rest, EOS included) 13.0 and 42. Prefix-LM
# rows are 16 + 48 = 64 tokens, packed.
FEATURE_LENGTHS = {'inputs': 16, 'targets': 48}
RUN_FILES = ['configs/tasks/english_lm.gin', 'configs/runs/train_decoder_only.gin']
SUMMARY_FILE = 'summary.json'


def _step(message: str) -> None:
  print(f'\n== {message}', flush=True)


def prepare_data(workdir: str) -> tuple:
  """Builds (or finds) the corpus and the vocabulary: (corpus_dir, vocabulary path)."""
  corpus_dir = os.path.join(workdir, 'corpus')
  vocabulary = os.path.join(workdir, 'vocabulary', f'spm_{VOCABULARY_PIECES}')
  # The info file is written last: its presence means the corpus is complete.
  if not os.path.exists(os.path.join(corpus_dir, corpora.ENGLISH_CORPUS_INFO_FILE)):
    _step('Building the English corpus (Python standard library, gettext catalogs)')
    print(corpora.build_english_corpus(corpus_dir), flush=True)
  if not os.path.exists(vocabulary + '.model'):
    _step(f'Training a {VOCABULARY_PIECES}-piece SentencePiece vocabulary')
    lines = corpora.read_lines(os.path.join(corpus_dir, 'train.txt'))
    tasks.train_sentencepiece(lines, vocabulary, VOCABULARY_PIECES)
  return corpus_dir, vocabulary + '.model'


def model_config(model_file: str, overrides=()) -> network.DecoderOnlyConfig:
  """The network of a configs/models file with gin overrides, without dropout."""
  return gin_utils.call_configured(
    network.DecoderOnlyConfig, [model_file], ['DROPOUT_RATE = 0.0', *overrides]
  )


def num_params(config: network.NetworkConfig) -> int:
  return network.parameter_count(network.abstract_params(config)[0])


def time_training_step(config, task: str, batch_size: int, repetitions: int = 3) -> dict:
  """Seconds of one training step of `config` on a real batch (median), after compiling."""
  batch = next(
    train.get_dataset(
      task,
      'train',
      FEATURE_LENGTHS,
      batch_size,
      converter_cls=train.feature_converter_cls(config),
    ).as_numpy_iterator()
  )
  # train.train's own compiled step (train.gin's optimizer, losses, causal attention).
  tx, step, _ = train._jitted_steps(  # pylint: disable=protected-access
    config, optax.adafactor, 0.03, 0.0, 1e-4, None, False
  )
  params = jax.device_put(network.random_params(config, 0)[0])
  state = train.TrainState(step=jnp.int32(0), params=params, opt_state=jax.jit(tx.init)(params))
  key = jax.random.PRNGKey(0)
  start = time.perf_counter()
  state, sums = step(state, batch, key)
  jax.block_until_ready(sums)
  compile_seconds = time.perf_counter() - start
  seconds = []
  for _ in range(repetitions):
    start = time.perf_counter()
    state, sums = step(state, batch, key)
    jax.block_until_ready(sums)
    seconds.append(time.perf_counter() - start)
  return {
    'params': num_params(config),
    'batch': f'{batch_size} rows of {sum(FEATURE_LENGTHS.values())} tokens',
    'real_tokens': int(np.count_nonzero(batch['decoder_target_tokens'])),
    'first_step_seconds': compile_seconds,
    'step_seconds': float(np.median(seconds)),
    # The machine is shared: its 1-minute load average when timed (2 cores).
    'load_average': os.getloadavg()[0],
  }


def training_figures(model_dir: str) -> dict:
  """Losses, tokens seen and wall time of a model directory's metrics.jsonl.

  A resumed run appends; a step logged twice counts once (its later record,
  the one the final parameters follow), and the wall time adds up the
  segments (each restarts 'seconds' from 0).
  """
  records = train.read_metrics(model_dir)
  by_step = {r['step']: r for r in records if r['split'] == 'train'}
  evals = [r for r in records if r['split'] == 'validation']
  wall, last = 0.0, 0.0
  for record in records:
    if record['seconds'] < last:  # A new segment.
      wall += last
    last = record['seconds']
  steps = sorted(by_step)
  first, final = by_step[steps[0]], by_step[steps[-1]]
  return {
    'steps': steps[-1],
    'tokens_seen': sum(r['tokens'] for r in by_step.values()),
    'wall_seconds': wall + last,
    'train_loss_first_interval': {'steps': f'1-{steps[0]}', 'loss': first['loss']},
    'train_loss_last_interval': {'step': steps[-1], 'loss': final['loss']},
    'tokens_per_second_last_interval': final['tokens_per_second'],
    'validation': [
      {'step': r['step'], 'cross_entropy': r['cross_entropy'], 'accuracy': r['accuracy']}
      for r in evals
    ],
  }


def train_model(
  workdir: str,
  name: str,
  title: str,
  model_file: str,
  overrides: list,
  steps: int,
  corpus_dir: str,
  vocabulary: str,
  batch_size: int,
  peak_learning_rate: float,
  warmup_steps: int,
) -> dict:
  """Trains (or resumes, or finds) one model; returns its summary."""
  config = model_config(model_file, overrides)
  model_dir = os.path.join(workdir, name)
  size = num_params(config)
  _step(
    f'{title}: {size / 1e6:.1f}M parameters, {steps} steps of {batch_size} rows, in {model_dir}'
  )
  schedule = 'optax.warmup_cosine_decay_schedule'
  gin_utils.call_configured(
    train.train,
    [model_file, *RUN_FILES],
    [
      # Bindings are parsed on their own: they import what they reference.
      'from __gin__ import dynamic_registration',
      'import optax',
      'from speculative_t5x import network',
      'from speculative_t5x.training import train',
      *overrides,
      f'MODEL_DIR = {model_dir!r}',
      f'TRAIN_STEPS = {steps}',
      f'CORPUS_DIR = {corpus_dir!r}',
      f'VOCABULARY = {vocabulary!r}',
      f'TASK_FEATURE_LENGTHS = {FEATURE_LENGTHS!r}',
      f'BATCH_SIZE = {batch_size}',
      f'LEARNING_RATE = @{schedule}()',
      f'{schedule}.init_value = 0.0',
      f'{schedule}.peak_value = {peak_learning_rate}',
      f'{schedule}.warmup_steps = {warmup_steps}',
      f'{schedule}.decay_steps = {steps}',
      f'{schedule}.end_value = 0.0',
      'CHECKPOINT_PERIOD = 100',
      'EVAL_PERIOD = 100',
      'train.train.progress = False',
    ],
  )
  return {
    'title': title,
    'checkpoint_dir': os.path.abspath(model_dir),
    'gin': {'files': [model_file, *RUN_FILES], 'overrides': overrides},
    'learning_rate': {
      'schedule': schedule,
      'peak': peak_learning_rate,
      'warmup_steps': warmup_steps,
      'decay_steps': steps,
    },
    'params': size,
    'decoder_step_weight_mb': network.decoder_weight_bytes(config) / 2**20,
    'config': train.read_settings(model_dir)['config'],
    **training_figures(model_dir),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='runs/gpt_like')
  parser.add_argument('--target_layers', type=int, default=4, help="Of the paper's 12.")
  parser.add_argument('--target_steps', type=int, default=700)
  parser.add_argument('--draft_steps', type=int, default=1000)
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--peak_learning_rate', type=float, default=0.03)
  parser.add_argument('--warmup_steps', type=int, default=50)
  args = parser.parse_args()
  # train's per-interval metrics lines, without the INFO chatter of orbax and seqio.
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger('absl').addFilter(
    lambda record: record.levelno >= std_logging.WARNING or 'speculative_t5x' in record.pathname
  )
  tasks.hide_gpus_from_tensorflow()
  os.makedirs(args.workdir, exist_ok=True)
  summary_path = os.path.join(args.workdir, SUMMARY_FILE)
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)

  def save():
    with open(summary_path, 'w') as f:
      json.dump(summary, f, indent=1)

  corpus_dir, vocabulary = prepare_data(args.workdir)
  with open(os.path.join(corpus_dir, corpora.ENGLISH_CORPUS_INFO_FILE)) as f:
    summary['corpus'] = json.load(f)
  summary['vocabulary'] = os.path.abspath(vocabulary)
  task = tasks.register_english_lm_task(corpus_dir, vocabulary)

  if 'full_target_step' not in summary:
    _step('Timing one training step of the full 12-layer target')
    summary['full_target_step'] = time_training_step(
      model_config('configs/models/gpt_like_target.gin'), task.name, args.batch_size
    )
    save()
  print(json.dumps(summary['full_target_step'], indent=1), flush=True)

  layers = args.target_layers
  models_to_train = [
    ('gpt_like_draft', 'GPT-like draft', 'configs/models/gpt_like_draft.gin', [], args.draft_steps),
    (
      f'gpt_like_target_{layers}l',
      f'GPT-like target, {layers} of 12 layers',
      'configs/models/gpt_like_target.gin',
      [f'network.DecoderOnlyConfig.num_layers = {layers}'],
      args.target_steps,
    ),
  ]
  for name, title, model_file, overrides, steps in models_to_train:
    summary[name] = train_model(
      args.workdir,
      name,
      title,
      model_file,
      overrides,
      steps,
      corpus_dir,
      vocabulary,
      args.batch_size,
      args.peak_learning_rate,
      args.warmup_steps,
    )
    save()
    figures = summary[name]
    print(
      f'{title}: loss {figures["train_loss_first_interval"]["loss"]:.3f} (steps '
      f'{figures["train_loss_first_interval"]["steps"]}) -> '
      f'{figures["train_loss_last_interval"]["loss"]:.3f} (step {figures["steps"]}), '
      f'{figures["tokens_seen"]} tokens, {figures["wall_seconds"] / 60:.1f} min; '
      f'validation cross entropy {[round(r["cross_entropy"], 3) for r in figures["validation"]]}',
      flush=True,
    )
  print(f'\nSummary: {os.path.abspath(summary_path)}')


if __name__ == '__main__':
  main()
