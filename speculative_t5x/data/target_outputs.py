"""The target's own outputs as a seqio task: the data of draft training in T5X.

A draft trained for speculative decoding learns the target's distributions
where the target goes: on its own outputs (DistillSpec, Zhou et al. 2024). In
T5X that is two steps, each a stock T5X command:

1. `python -m t5x.infer` with the target (T5X's own model and gin files) over
   the task's training inputs, writing token ids as well as text: add
   configs/t5x/target_outputs.gin, which binds T5X's
   `write_inferences_to_file.output_ids = True`, and pick the split with
   `--gin.utils.DatasetConfig.split="'train'"`. T5X writes one JSON record per
   example to `INFER_OUTPUT_DIR/<task>-predict.jsonl-<shard>-of-<shards>`:
     {"inputs": {"inputs_pretokenized": "...", "targets_pretokenized": "..."},
      "prediction": "<the output's text>",
      "prediction_tokens": [<its ids, up to and including EOS>]}
   Greedy outputs (`decoding.temperature_sample.topk = 1`) train a draft for
   greedy decoding; samples at a temperature (topk = 0, temperature T) one
   for that temperature.
2. `python -m t5x.train` with configs/t5x/distill*.gin over a task registered
   by `register_target_outputs_task` on those files: inputs are the records'
   `inputs_pretokenized` text, tokenized again (SentencePiece is
   deterministic: the ids the target saw), targets are `prediction_tokens` as
   the target wrote them (not re-tokenized text, which need not give back the
   same ids; an output cut at the length limit keeps its missing EOS).

On-policy data (the draft samples, the target scores: DistillSpec's best mix)
does not fit T5X's train step: it takes a batch from the input pipeline and
computes a loss, with no decoding inside; sampling the draft in the step
would put a whole autoregressive decode in every training step's program.
`training.distill` offers it on one device.
"""

import json
import os
from typing import Mapping, Sequence, Union

import numpy as np
import seqio
import tensorflow as tf

from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core

# T5X's infer.write_inferences_to_file writes the ids under this key with output_ids=True.
TOKENS_KEY = 'prediction_tokens'


def _files(patterns: Union[str, Sequence[str]]) -> list:
  patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
  return sorted({path for pattern in patterns for path in tf.io.gfile.glob(os.fspath(pattern))})


def _record(line: str, path: str, line_number: int, with_inputs: bool) -> dict:
  """One example {'inputs': text (with_inputs), 'targets': int32 ids, 'targets_pretokenized': text}."""
  record = json.loads(line)
  if TOKENS_KEY not in record:
    raise ValueError(
      f'{path}, line {line_number}: no {TOKENS_KEY!r} in the record (keys {sorted(record)}). '
      "T5X's infer.py writes the output's token ids only with output_ids=True: run it with "
      '--gin_file=configs/t5x/target_outputs.gin (or bind '
      'infer_script.write_inferences_to_file.output_ids = True).'
    )
  example = {
    'targets': np.asarray(record[TOKENS_KEY], np.int32),
    'targets_pretokenized': record.get('prediction', ''),
  }
  if with_inputs:
    inputs = record.get('inputs', {}).get('inputs_pretokenized')
    if inputs is None:
      raise ValueError(
        f'{path}, line {line_number}: no inputs.inputs_pretokenized in the record (its inputs: '
        f'{sorted(record.get("inputs", {}))}); for a task of targets alone pass inputs=False.'
      )
    example['inputs'] = inputs
  return example


def _dataset_fn(split_to_filepattern: Mapping[str, Union[str, Sequence[str]]], with_inputs: bool):
  """seqio's `dataset_fn(split, shuffle_files, seed)` over T5X's inference files."""

  def dataset_fn(split: str, shuffle_files: bool, seed=None) -> tf.data.Dataset:
    del shuffle_files, seed  # One pass in file order; seqio shuffles the examples.
    paths = _files(split_to_filepattern[split])
    if not paths:
      raise ValueError(
        f'No file matches {split_to_filepattern[split]!r} (split {split!r}): give the '
        '<task>-predict.jsonl-* files that t5x.infer wrote into its INFER_OUTPUT_DIR.'
      )
    # The first record, read here, fails early (before training) if the files lack the ids.
    with tf.io.gfile.GFile(paths[0]) as f:
      _record(f.readline(), paths[0], 1, with_inputs)
    signature = {
      'targets': tf.TensorSpec([None], tf.int32),
      'targets_pretokenized': tf.TensorSpec([], tf.string),
    }
    if with_inputs:
      signature['inputs'] = tf.TensorSpec([], tf.string)

    def records():
      for path in paths:
        with tf.io.gfile.GFile(path) as f:
          for line_number, line in enumerate(f, 1):
            if line.strip():
              yield _record(line, path, line_number, with_inputs)

    return tf.data.Dataset.from_generator(records, output_signature=signature)

  return dataset_fn


def _tokenize_inputs(dataset: tf.data.Dataset, output_features) -> tf.data.Dataset:
  """Tokenizes 'inputs' (keeping the text as 'inputs_pretokenized'); 'targets' are ids already."""
  if 'inputs' not in output_features:
    return dataset
  vocabulary = output_features['inputs'].vocabulary

  def tokenize(example):
    return {
      **example,
      'inputs_pretokenized': example['inputs'],
      'inputs': vocabulary.encode_tf(example['inputs']),
    }

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


def register_target_outputs_task(
  name: str,
  split_to_filepattern: Mapping[str, Union[str, Sequence[str]]],
  vocabulary: tasks.VocabularyOrPath = tasks_core.DEFAULT_VOCAB_PATH,
  *,
  extra_ids: int = tasks_core.DEFAULT_EXTRA_IDS,
  inputs: bool = True,
  inputs_eos: bool = True,
) -> seqio.Task:
  """(Re)registers a task over T5X inference outputs (see the module docstring).

  Args:
    name: the task name.
    split_to_filepattern: split name -> file pattern(s) of T5X's JSONL
      inference files (gs:// or local), e.g. {'train':
      '/out/my_task-predict.jsonl-*'}.
    vocabulary: the target's vocabulary (a `seqio.Vocabulary` or the path of
      a SentencePiece model): the one the outputs' ids are in.
    extra_ids: extra ids for a vocabulary given by path.
    inputs: the task has inputs (an encoder-decoder's, or a prefix LM's
      prompt); False for a decoder-only task of targets alone.
    inputs_eos: end the re-tokenized inputs with EOS, as the task the target
      decoded did (T5's text-to-text tasks do; a prompt that a decoder-only
      target continues does not).

  Returns:
    The registered task: 'inputs' (if any) and 'targets' features, no metrics.
  """
  if not split_to_filepattern:
    raise ValueError(
      "split_to_filepattern is empty; map at least 'train' to the files t5x.infer wrote."
    )
  vocabulary = tasks.get_vocabulary(vocabulary, extra_ids)
  features = {'targets': seqio.Feature(vocabulary, add_eos=False)}
  if inputs:
    features = {'inputs': seqio.Feature(vocabulary, add_eos=inputs_eos), **features}
  return tasks._register(  # pylint: disable=protected-access
    name,
    source=seqio.FunctionDataSource(
      _dataset_fn(dict(split_to_filepattern), inputs), splits=list(split_to_filepattern)
    ),
    preprocessors=[_tokenize_inputs, seqio.preprocessors.append_eos_after_trim],
    output_features=features,
    metric_fns=[],
  )
