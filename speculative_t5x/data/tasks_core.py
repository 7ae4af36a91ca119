"""The TensorFlow-free core of the data layer: names, prefixes, metrics, TSV files,
SentencePiece training.

`tasks` registers seqio tasks (and imports TensorFlow); everything the tasks
share with the TensorFlow-free paths (benchmark, demo, peers, the input
readers of accelerator machines) lives here, once:

* task names, the TFDS datasets and T5's prefixes (`EN_DE_PREFIX`, ...);
* the metrics, with the `t5` package's settings (`bleu`, `rouge`), in seqio's
  signature `(targets, predictions) -> {name: value}`;
* a registered task by name, checked (`get_task`);
* TSV files of `source<TAB>target` lines (`read_tsv`);
* `train_sentencepiece_model`, T5's special ids (pad=0, eos=1, unk=2, no bos).

The offline corpora the gettext and English tasks read are built by
`corpora`.
"""

import collections
import os
from typing import Callable, Iterable, Mapping, Optional, Sequence

from etils import epath
from rouge_score import rouge_scorer
import sacrebleu
import sentencepiece as spm

# ---------------------------------------------------------------------------
# Names and defaults.
# ---------------------------------------------------------------------------

TASK_NAMESPACE = 'speculative_t5x'
WMT_ENDE_TASK = f'{TASK_NAMESPACE}:wmt_t2t_ende_v003'
CNN_DAILYMAIL_TASK = f'{TASK_NAMESPACE}:cnn_dailymail_v002'
GETTEXT_ENDE_TASK = f'{TASK_NAMESPACE}:gettext_ende'
ENGLISH_LM_TASK = f'{TASK_NAMESPACE}:english_lm'
# The prompt of an English LM example: its sentence's first words (see
# `tasks.register_english_lm_task`).
ENGLISH_LM_PROMPT_WORDS = 4

DEFAULT_VOCAB_PATH = 'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
DEFAULT_EXTRA_IDS = 100

WMT_ENDE_TFDS_NAME = 'wmt_t2t_translate/de-en:1.0.0'
CNN_DAILYMAIL_TFDS_NAME = 'cnn_dailymail:3.4.0'
EN_DE_PREFIX = 'translate English to German: '
SUMMARIZE_PREFIX = 'summarize: '

SPLITS = ('train', 'validation', 'test')
MetricFn = Callable[[Sequence[str], Sequence[str]], Mapping[str, float]]

# ---------------------------------------------------------------------------
# Metrics (signature `(targets, predictions) -> {name: value}`, as seqio calls
# them).
# ---------------------------------------------------------------------------


def _check_metric_inputs(targets: Sequence[str], predictions: Sequence[str]):
  if len(targets) != len(predictions):
    raise ValueError(
      f'Got {len(targets)} targets but {len(predictions)} predictions; '
      'pass one prediction per target.'
    )
  if not targets:
    raise ValueError('Got no targets and no predictions; pass at least one.')


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Corpus BLEU on a 0-100 scale, with `t5.evaluation.metrics.bleu`'s settings.

  sacrebleu's corpus BLEU over all examples (one reference each) with
  exponential smoothing, the international tokenizer (`intl`), case-sensitive,
  no effective order.

  Args:
    targets: one reference string per example.
    predictions: one hypothesis string per example.

  Returns:
    {"bleu": score in [0, 100]}.
  """
  _check_metric_inputs(targets, predictions)
  score = sacrebleu.corpus_bleu(
    list(predictions),
    [list(targets)],
    smooth_method='exp',
    smooth_value=0.0,
    force=False,
    lowercase=False,
    tokenize='intl',
    use_effective_order=False,
  )
  return {'bleu': score.score}


def _split_sentences_for_rouge_lsum(summary: str) -> str:
  # ROUGE-Lsum scores each newline-separated sentence; T5 marks a sentence end
  # as " . " in its (single-line) targets and predictions.
  return summary.replace(' . ', ' .\n')


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """ROUGE-1, ROUGE-2 and ROUGE-Lsum F1 (x100), averaged over examples.

  Scored like `t5.evaluation.metrics.rouge`: rouge-score's `RougeScorer` with
  its defaults (no stemming), each text split into sentences at " . " for
  ROUGE-Lsum. One difference, for reproducibility: t5 reports the median of
  1000 unseeded bootstrap resamples of the mean F1 (a noisy estimate of the
  mean, different on every call); this returns the mean itself, which is what
  t5's `rouge_mean` computes.

  Args:
    targets: one reference summary per example.
    predictions: one predicted summary per example.

  Returns:
    {"rouge1": ..., "rouge2": ..., "rougeLsum": ...}, each in [0, 100].
  """
  _check_metric_inputs(targets, predictions)
  keys = ('rouge1', 'rouge2', 'rougeLsum')
  scorer = rouge_scorer.RougeScorer(list(keys))
  totals = collections.Counter()
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(
      target=_split_sentences_for_rouge_lsum(target),
      prediction=_split_sentences_for_rouge_lsum(prediction),
    )
    for key in keys:
      totals[key] += scores[key].fmeasure
  return {key: 100 * totals[key] / len(targets) for key in keys}


# ---------------------------------------------------------------------------
# Tasks by name.
# ---------------------------------------------------------------------------


def get_task(task):
  """The text-to-text `seqio.Task` of a registered name, or `task` itself, checked.

  Imports seqio only when called, so the TensorFlow-free paths can import this
  module. Raises ValueError for a mixture (decoding reads one task at a time)
  and for a task without 'inputs' and 'targets' features.
  """
  import seqio  # pylint: disable=g-import-not-at-top

  task = seqio.get_mixture_or_task(task) if isinstance(task, str) else task
  if not isinstance(task, seqio.Task):
    raise ValueError(f'{task.name!r} is a mixture; decoding reads one task at a time.')
  missing = {'inputs', 'targets'} - set(task.output_features)
  if missing:
    raise ValueError(
      f'Task {task.name!r} has no {sorted(missing)} features; decoding needs '
      "text-to-text tasks with 'inputs' and 'targets' (a decoder-only pair's prompts are "
      "the 'inputs': for configs/tasks/english_lm.gin keep PROMPT_WORDS > 0)."
    )
  return task


# ---------------------------------------------------------------------------
# TSV files.
# ---------------------------------------------------------------------------


def read_tsv(path: epath.PathLike, num_examples: Optional[int] = None) -> list[tuple[str, str]]:
  """The (source, target) pairs of a file of `source<TAB>target` lines.

  The format `tasks.register_tsv_task` reads: UTF-8, no header, no quoting,
  exactly two tab-separated fields a line.

  Args:
    path: the file (local, or a URL such as gs:// that etils.epath opens).
    num_examples: read at most this many lines (None: all).

  Returns:
    The pairs, in file order.
  """
  pairs = []
  with epath.Path(path).open('rb') as f:
    for line_number, line in enumerate(f, 1):
      if num_examples is not None and len(pairs) == num_examples:
        break
      fields = line.decode('utf-8').rstrip('\n').split('\t')
      if len(fields) != 2:
        raise ValueError(
          f'Line {line_number} of {path} has {len(fields)} tab-separated '
          'fields; a TSV task file holds exactly two, source<TAB>target, '
          'a line.'
        )
      pairs.append((fields[0], fields[1]))
  return pairs


# ---------------------------------------------------------------------------
# SentencePiece vocabularies.
# ---------------------------------------------------------------------------


def train_sentencepiece_model(
  texts: Iterable[str],
  model_prefix: str,
  vocab_size: int,
  *,
  model_type: str = 'unigram',
  character_coverage: float = 0.9995,
  num_threads: int = 1,
) -> str:
  """Trains a SentencePiece model with T5's special ids; returns the model's path.

  Ids: pad=0, eos=1, unk=2, no bos, as in T5's cc_all.32000, so seqio treats
  0 as PAD and 1 as EOS. Training reads every text in order (no sampling),
  so the model is a function of texts and the arguments (with the default
  num_threads=1; more threads are faster and may reorder floating-point
  sums).

  Args:
    texts: the training sentences (e.g. `tsv_texts(corpus/"train.tsv")`).
    model_prefix: writes `{model_prefix}.model` and `{model_prefix}.vocab`.
    vocab_size: the number of pieces, special ids included.
    model_type: "unigram" (T5's) or "bpe", "char", "word".
    character_coverage: the fraction of characters covered by single-character
      pieces; rarer characters map to unk.
    num_threads: training threads.

  Returns:
    f"{model_prefix}.model".
  """
  if vocab_size <= 3:
    raise ValueError(f'vocab_size must exceed the 3 special ids, got {vocab_size}.')
  directory = os.path.dirname(model_prefix)
  if directory:
    os.makedirs(directory, exist_ok=True)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts),
      model_prefix=model_prefix,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      pad_id=0,
      eos_id=1,
      unk_id=2,
      bos_id=-1,
      input_sentence_size=0,
      shuffle_input_sentence=False,
      num_threads=num_threads,
      minloglevel=2,
    )
  except RuntimeError as e:
    if 'Vocabulary size too high' not in str(e):
      raise
    raise ValueError(f'The texts are too few for vocab_size={vocab_size}: {e}') from e
  return f'{model_prefix}.model'
