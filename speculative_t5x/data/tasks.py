"""seqio tasks and vocabularies: the TensorFlow side of the data layer.

Four kinds of task, text-to-text with T5's output features (`inputs` and
`targets`, each tokenized with one vocabulary and ended with EOS; the English
LM task's inputs are prompts, without EOS):

* TFDS tasks equivalent to the `t5` package's `wmt_t2t_ende_v003` and
  `cnn_dailymail_v002`: same TFDS datasets, prefixes, preprocessing chain
  (text map, `seqio.preprocessors.tokenize`, cache placeholder,
  `append_eos_after_trim`) and metrics. They are registered under the
  `speculative_t5x:` namespace so that they can live next to the `t5`
  package's own registrations (seqio raises on duplicate names; the colon is
  one of seqio's allowed task-name characters and becomes a sub-directory in
  seqio's cache).
* Tasks over local TSV files (`source<TAB>target` per line), for users who
  bring their own data.
* `speculative_t5x:gettext_ende`, over an English->German corpus built offline
  from the machine's gettext catalogs (`corpora.build_gettext_corpus`).
* `speculative_t5x:english_lm`, a language-model task (prefix-LM pairs: a
  sentence's first words, then the rest) over English sentences built offline
  (`corpora.build_english_corpus`).

The names, prefixes, metrics, TSV reader and corpus builders are
`tasks_core`'s, which imports no TensorFlow; this module adds seqio.

Importing this module registers the TFDS tasks with T5's vocabulary
(`gs://t5-data/vocabs/cc_all.32000/sentencepiece.model`, 100 extra ids). The
vocabulary is loaded lazily, on first use, so the import needs no network.
`register_tasks(vocabulary=..., tfds_data_dir=...)` re-registers them with
another vocabulary (a path, gs:// or local, or a `seqio.Vocabulary`) or TFDS
directory; every register function replaces an earlier registration of the
same name.

`train_sentencepiece` trains a vocabulary with T5's conventions (pad=0, eos=1,
unk=2, no bos) for local tasks.
"""

import functools
import os
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import seqio
import tensorflow as tf

from speculative_t5x.data import tasks_core

VocabularyOrPath = Union[str, seqio.Vocabulary]

# ---------------------------------------------------------------------------
# Vocabularies and output features.
# ---------------------------------------------------------------------------


def hide_gpus_from_tensorflow() -> None:
  """Keeps TensorFlow, which only feeds data here, off the GPUs that JAX uses.

  Left alone, TensorFlow reserves most of every GPU's memory when it starts.
  """
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # TensorFlow's devices are already initialized.
    pass


def get_vocabulary(
  vocabulary: VocabularyOrPath = tasks_core.DEFAULT_VOCAB_PATH,
  extra_ids: int = tasks_core.DEFAULT_EXTRA_IDS,
) -> seqio.Vocabulary:
  """A `seqio.Vocabulary` from a SentencePiece model path, or `vocabulary`.

  Args:
    vocabulary: a `seqio.Vocabulary` (returned as is), or the path (gs:// or
      local) of a SentencePiece model. The model is read on first use, not
      here.
    extra_ids: sentinel ids appended by seqio to a model given by path (T5's
      cc_all.32000 is used with 100).

  Returns:
    The vocabulary.
  """
  if isinstance(vocabulary, seqio.Vocabulary):
    return vocabulary
  if not isinstance(vocabulary, (str, os.PathLike)):
    raise ValueError(
      f'vocabulary must be a seqio.Vocabulary or the path of a SentencePiece '
      f'model, got {vocabulary!r}.'
    )
  return seqio.SentencePieceVocabulary(os.fspath(vocabulary), extra_ids)


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  """T5's text-to-text output features: EOS-terminated inputs and targets."""
  return {
    'inputs': seqio.Feature(vocabulary, add_eos=True, required=False),
    'targets': seqio.Feature(vocabulary, add_eos=True),
  }


# ---------------------------------------------------------------------------
# Registration.
# ---------------------------------------------------------------------------


@seqio.map_over_dataset
def _to_text2text(example, prefix: str, source_key: str, target_key: str):
  # Same strings as t5's `translate` ("translate English" + " to German: " +
  # text) and `summarize` ("summarize:" joined with the article by " ").
  return {'inputs': tf.strings.join([prefix, example[source_key]]), 'targets': example[target_key]}


@seqio.map_over_dataset
def _parse_tsv_line(line):
  source, target = tf.io.decode_csv(
    line, record_defaults=['', ''], field_delim='\t', use_quote_delim=False
  )
  return {'source': source, 'target': target}


def _text2text_preprocessors(prefix: str, source_key: str, target_key: str):
  return [
    functools.partial(_to_text2text, prefix=prefix, source_key=source_key, target_key=target_key),
    seqio.preprocessors.tokenize,
    seqio.CacheDatasetPlaceholder(),
    seqio.preprocessors.append_eos_after_trim,
  ]


def _register(name: str, **task_kwargs) -> seqio.Task:
  seqio.TaskRegistry.remove(name)  # A no-op for a new name.
  return seqio.TaskRegistry.add(name, **task_kwargs)


def register_tasks(
  vocabulary: VocabularyOrPath = tasks_core.DEFAULT_VOCAB_PATH,
  *,
  extra_ids: int = tasks_core.DEFAULT_EXTRA_IDS,
  tfds_data_dir: Optional[str] = None,
) -> tuple[str, str]:
  """(Re)registers the TFDS tasks equivalent to T5's WMT EnDe and CNN/DM.

  `speculative_t5x:wmt_t2t_ende_v003`: TFDS `wmt_t2t_translate/de-en:1.0.0`,
  inputs "translate English to German: " + English, targets German, BLEU.
  `speculative_t5x:cnn_dailymail_v002`: TFDS `cnn_dailymail:3.4.0`, inputs
  "summarize: " + article, targets the highlights, ROUGE-1/2/Lsum.

  Args:
    vocabulary: a `seqio.Vocabulary`, or the path (gs:// or local) of a
      SentencePiece model (read lazily).
    extra_ids: extra ids for a vocabulary given by path.
    tfds_data_dir: the TFDS data directory holding the prepared datasets; None
      for TFDS's default.

  Returns:
    The two task names.
  """
  features = output_features(get_vocabulary(vocabulary, extra_ids))
  _register(
    tasks_core.WMT_ENDE_TASK,
    source=seqio.TfdsDataSource(tasks_core.WMT_ENDE_TFDS_NAME, tfds_data_dir=tfds_data_dir),
    preprocessors=_text2text_preprocessors(tasks_core.EN_DE_PREFIX, 'en', 'de'),
    output_features=features,
    metric_fns=[tasks_core.bleu],
  )
  _register(
    tasks_core.CNN_DAILYMAIL_TASK,
    source=seqio.TfdsDataSource(tasks_core.CNN_DAILYMAIL_TFDS_NAME, tfds_data_dir=tfds_data_dir),
    preprocessors=_text2text_preprocessors(tasks_core.SUMMARIZE_PREFIX, 'article', 'highlights'),
    output_features=features,
    metric_fns=[tasks_core.rouge],
  )
  return tasks_core.WMT_ENDE_TASK, tasks_core.CNN_DAILYMAIL_TASK


def register_tsv_task(
  name: str,
  split_to_filepattern: Mapping[str, Union[str, Sequence[str]]],
  vocabulary: VocabularyOrPath = tasks_core.DEFAULT_VOCAB_PATH,
  *,
  extra_ids: int = tasks_core.DEFAULT_EXTRA_IDS,
  prefix: str = tasks_core.EN_DE_PREFIX,
  metric_fns: Sequence[tasks_core.MetricFn] = (tasks_core.bleu,),
) -> seqio.Task:
  """(Re)registers a task over TSV files of `source<TAB>target` lines.

  Each line holds exactly two tab-separated fields, UTF-8, no header and no
  quoting (a field may not contain a tab or a newline). inputs = prefix +
  source, targets = target, then T5's tokenize / append-EOS chain.

  Args:
    name: the task name (letters, digits, `_`, `.`, `:` and `#`, as seqio
      allows).
    split_to_filepattern: split name -> file pattern(s), gs:// or local.
    vocabulary: a `seqio.Vocabulary` or the path of a SentencePiece model.
    extra_ids: extra ids for a vocabulary given by path.
    prefix: prepended to every source string.
    metric_fns: seqio metric functions `(targets, predictions) -> dict`.

  Returns:
    The registered task.
  """
  if not split_to_filepattern:
    raise ValueError(
      "split_to_filepattern is empty; map at least one split (e.g. 'train') to a TSV file pattern."
    )
  return _register(
    name,
    source=seqio.TextLineDataSource(dict(split_to_filepattern)),
    preprocessors=[_parse_tsv_line, *_text2text_preprocessors(prefix, 'source', 'target')],
    output_features=output_features(get_vocabulary(vocabulary, extra_ids)),
    metric_fns=list(metric_fns),
  )


def register_gettext_task(
  corpus_dir: str,
  vocabulary: VocabularyOrPath = tasks_core.DEFAULT_VOCAB_PATH,
  *,
  extra_ids: int = tasks_core.DEFAULT_EXTRA_IDS,
  name: str = tasks_core.GETTEXT_ENDE_TASK,
) -> seqio.Task:
  """(Re)registers the EnDe task over a `corpora.build_gettext_corpus` directory.

  Args:
    corpus_dir: the directory holding train.tsv, validation.tsv and test.tsv.
    vocabulary: a `seqio.Vocabulary` or the path of a SentencePiece model.
    extra_ids: extra ids for a vocabulary given by path.
    name: the task name.

  Returns:
    The registered task (inputs "translate English to German: " + English,
    BLEU).
  """
  return register_tsv_task(
    name,
    {split: os.path.join(corpus_dir, f'{split}.tsv') for split in tasks_core.SPLITS},
    vocabulary,
    extra_ids=extra_ids,
    prefix=tasks_core.EN_DE_PREFIX,
    metric_fns=[tasks_core.bleu],
  )


def _prompt_and_continuation(dataset: tf.data.Dataset, prompt_words: int) -> tf.data.Dataset:
  """Lines (one sentence each) -> {'inputs': the first prompt_words words, 'targets': the rest}.

  Words are split at whitespace and joined by one space. Sentences of at most
  prompt_words words are dropped (no continuation). prompt_words=0 gives
  {'targets': line}.
  """
  if not prompt_words:
    return dataset.map(lambda line: {'targets': line}, num_parallel_calls=tf.data.AUTOTUNE)

  def split(line):
    words = tf.strings.split(line)
    return {
      'inputs': tf.strings.reduce_join(words[:prompt_words], separator=' '),
      'targets': tf.strings.reduce_join(words[prompt_words:], separator=' '),
    }

  longer = lambda line: tf.size(tf.strings.split(line)) > prompt_words
  return dataset.filter(longer).map(split, num_parallel_calls=tf.data.AUTOTUNE)


def register_english_lm_task(
  corpus_dir: str,
  vocabulary: VocabularyOrPath,
  *,
  extra_ids: int = 0,
  prompt_words: int = tasks_core.ENGLISH_LM_PROMPT_WORDS,
  name: str = tasks_core.ENGLISH_LM_TASK,
) -> seqio.Task:
  """(Re)registers the English LM task over a `corpora.build_english_corpus` directory.

  Each sentence of train.txt / validation.txt / test.txt becomes one example:
  'inputs' = its first `prompt_words` words (the prompt; no EOS, so that
  inputs then targets is the sentence itself), 'targets' = the rest of it,
  EOS-terminated. Decoder-only networks train on it as a prefix LM
  (`train.train` with feature lengths for 'inputs' and 'targets': the loss on
  the continuation) and decode continuations of the prompts; an
  encoder-decoder can train on it too. The split is at whitespace, and
  SentencePiece starts every word with its own piece, so the prompt's pieces
  followed by the continuation's are the sentence's pieces. With
  `prompt_words=0` an example is only 'targets' = the whole sentence (a plain
  language model, the paper's LM1B setting).

  Args:
    corpus_dir: the directory holding the three .txt files.
    vocabulary: a `seqio.Vocabulary` or the path of a SentencePiece model.
    extra_ids: extra ids for a vocabulary given by path.
    prompt_words: the prompt's length in words (4: the sentences average 13
      words, so ~9 remain to continue); sentences of at most this many words
      are skipped. 0: no prompt.
    name: the task name.

  Returns:
    The registered task (no metrics).
  """
  if not isinstance(prompt_words, int) or prompt_words < 0:
    raise ValueError(f'prompt_words must be an int >= 0 (0: targets only), got {prompt_words!r}.')
  vocabulary = get_vocabulary(vocabulary, extra_ids)
  features = {'targets': seqio.Feature(vocabulary, add_eos=True)}
  if prompt_words:
    features = {'inputs': seqio.Feature(vocabulary, add_eos=False), **features}
  return _register(
    name,
    source=seqio.TextLineDataSource(
      {split: os.path.join(corpus_dir, f'{split}.txt') for split in tasks_core.SPLITS}
    ),
    preprocessors=[
      functools.partial(_prompt_and_continuation, prompt_words=prompt_words),
      seqio.preprocessors.tokenize,
      seqio.CacheDatasetPlaceholder(),
      seqio.preprocessors.append_eos_after_trim,
    ],
    output_features=features,
    metric_fns=[],
  )


# ---------------------------------------------------------------------------
# SentencePiece vocabularies.
# ---------------------------------------------------------------------------


def tsv_texts(filepatterns: Union[str, Sequence[str]]) -> Iterator[str]:
  """Yields source and target of every line of the matching TSV files, in order.

  Args:
    filepatterns: glob pattern(s) of `tasks_core.read_tsv` files, gs:// or
      local.
  """
  patterns = [filepatterns] if isinstance(filepatterns, str) else filepatterns
  paths = [path for pattern in patterns for path in sorted(tf.io.gfile.glob(pattern))]
  if not paths:
    raise ValueError(f'No file matches {filepatterns!r}.')
  for path in paths:
    for pair in tasks_core.read_tsv(path):
      yield from pair


def train_sentencepiece(
  texts: Iterable[str],
  model_prefix: str,
  vocab_size: int,
  *,
  extra_ids: int = 0,
  **training_options,
) -> seqio.SentencePieceVocabulary:
  """`tasks_core.train_sentencepiece_model`, the model returned as a seqio vocabulary.

  Args:
    texts: the training sentences (e.g. `tsv_texts(corpus/"train.tsv")`).
    model_prefix: writes `{model_prefix}.model` and `{model_prefix}.vocab`.
    vocab_size: the number of pieces, special ids included (extra ids not).
    extra_ids: sentinel ids seqio appends after the pieces (T5 uses 100).
    **training_options: model_type, character_coverage, num_threads (see
      `tasks_core.train_sentencepiece_model`).

  Returns:
    `seqio.SentencePieceVocabulary(f"{model_prefix}.model", extra_ids)`.
  """
  if extra_ids < 0:
    raise ValueError(f'extra_ids must be >= 0, got {extra_ids}.')
  return seqio.SentencePieceVocabulary(
    tasks_core.train_sentencepiece_model(texts, model_prefix, vocab_size, **training_options),
    extra_ids,
  )


register_tasks()


def task_inputs(
  task, split: str, *, num_examples: Optional[int] = None, input_length: Optional[int] = None
):
  """Encoder inputs and reference texts of a seqio task's split, in order.

  Args:
    task: a registered task name or a `seqio.Task` (configs/tasks/*.gin).
    split: e.g. 'test'.
    num_examples: read at most this many examples.
    input_length: pad to this length (None: the longest input); longer
      inputs are an error, not cut.

  Returns:
    (inputs int32 [N, input_length] as the task tokenizes them, EOS
    included; list of N target strings).
  """
  # Here, not at the top: a task module that T5X imports after parsing gin (its
  # MIXTURE_OR_TASK_MODULE) must register no gin configurable, and layouts loads the network's.
  from speculative_t5x import layouts  # pylint: disable=g-import-not-at-top

  task = tasks_core.get_task(task)
  dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1)
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  vocabulary = task.output_features['targets'].vocabulary
  rows, references = [], []
  for example in dataset.as_numpy_iterator():
    rows.append(example['inputs'])
    text = example.get('targets_pretokenized')
    references.append(
      vocabulary.decode(example['targets'].tolist()) if text is None else text.decode('utf-8')
    )
  if not rows:
    raise ValueError(f'{task.name}:{split} has no examples.')
  return layouts.pad_rows(rows, input_length), references
