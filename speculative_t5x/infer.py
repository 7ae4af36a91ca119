r"""Inference over a seqio task split: baseline or speculative, resumable, sharded.

The role of T5X's `infer.py`, with T5X's command line:

  python -m speculative_t5x.infer \
    --gin_file=configs/pairs/gettext_tiny.gin \
    --gin_file=configs/tasks/gettext_ende.gin \
    --gin_file=configs/runs/infer.gin \
    --gin.CHECKPOINT_PATH="'/tmp/gettext_target'" \
    --gin.DRAFT_CHECKPOINT_PATH="'/tmp/gettext_draft'" \
    --gin.CORPUS_DIR="'/tmp/gettext_ende'" --gin.VOCABULARY="'/tmp/spm/ende_4000.model'" \
    --gin.TASK_FEATURE_LENGTHS="{'inputs': 48, 'targets': 48}" \
    --gin.INFER_OUTPUT_DIR="'/tmp/infer_gettext'"

The pair file binds the target and draft (`--gin.DRAFT=None` decodes with the
target alone, the baseline), the task file the task, the run file `infer`'s
arguments (configs/runs/infer.gin lists the common overrides).

Both architectures. An encoder-decoder pair encodes the task's inputs
(`seqio.EncDecFeatureConverter`, as T5X's `EncoderDecoderModel`); a
decoder-only pair is a prefix LM, as T5X's `DecoderOnlyModel` with
`seqio.DecoderFeatureConverter`: the task's inputs as it writes them (with
their EOS if its 'inputs' feature adds one; the English LM task's have none)
are the prompt (`decoder_input_tokens * decoder_causal_attention`),
prefilled in one block call (bidirectionally if the model's
`inputs_bidirectional_attention`), and the targets are generated after it:
at most feature_lengths['targets'] tokens, as T5X's `max_decode_steps`.
Target and draft networks must share one architecture (n-gram and
prompt-lookup drafts fit both).

`infer` reads the split in its stored order (no shuffling), one example a row
(the converter with pack=False), decodes it in batches with
`models.make_decoder`, and writes, for a task T and split S:

  <output_dir>/T-S.jsonl         one JSON object a line, per example in order:
      index, inputs, targets, prediction (texts, the prediction being what
      follows a decoder-only pair's prompt; with the task's postprocessed
      values too when it has a postprocessor), score (log probability under the
      distribution sampled from, 0 when greedy), iterations (target calls
      while the row was active), accepted (draft tokens accepted), emitted
      (tokens written, EOS included), truncated (the decode reached
      feature_lengths['targets'] before EOS), and, speculative only,
      batch_beta_sum / batch_beta_count: the beta = sum_x min(p, q) statistics
      of the example's batch (`decoding.SpeculativeStats` aggregates them per
      batch; the padding rows of a last, partial batch, copies of its last
      example, are included).
  <output_dir>/T-S.summary.json  examples, tokens, tokens/s, alpha (the mean
      beta over the run, weighted by beta_count), tokens per target call, the
      number of truncated predictions, and the task's metrics (its
      `predict_metric_fns` on the postprocessed targets and predictions).
  <output_dir>/T-S.settings.json what determines the outputs (task, lengths,
      batch size, seed, decoding arguments, the networks' configs and a
      fingerprint of their parameters); a resumed run must match it.

Nothing is cut silently. An input longer than feature_lengths['inputs']
(measured before seqio's trimming) is an error that names the example and the
length needed, unless `truncate_inputs=True` lets seqio cut it; the last,
partial batch is padded and only its real rows are written.

Resuming. Records are appended batch by batch and flushed. A rerun with the
same settings keeps the complete records, drops a partial last line (a write
cut short by a kill), and continues at the first missing example. A damaged
file (two writers' records interleaved, from before the writer lock below; a
line a disk error garbled) keeps its longest consistent prefix, example 0, 1,
2, ... in order: the run says what it keeps and what it drops, moves the
dropped lines aside and decodes those examples again (`_recover_records`). Each batch
covers the same examples as in an uninterrupted run (batch k is examples
[k * batch_size, (k + 1) * batch_size)): a batch cut short is decoded again
whole and only its missing rows are written, so resumed outputs equal
uninterrupted ones.

Determinism. Batch k decodes with the key fold_in(PRNGKey(seed), k *
batch_size). An example's output is a function of the settings alone, so
resumed and uninterrupted runs agree, sampling included, and so do runs on
other meshes (the target is greedy-exact; JAX's random bits do not depend on
sharding). Greedy outputs also do not depend on the batch size, up to the
float rounding of batched matrix products (identical in our tests); sampled
ones do, because a batch draws its random numbers together.

One writer. `infer` holds the output directory's writer lock (`output_lock`)
from its start to its end, and the command line from before gin loads the
checkpoints: a second run on the same output_dir stops at once, naming the
running one (host, process id, since when), instead of interleaving its
records with it. A run killed outright leaves its lock file behind; the next
run takes it over and resumes.

Sharding. Parameters are placed on a ('data', 'model') mesh of all devices by
their logical axes (T5X's rules, `partitioning`): `num_partitions` devices
split each model (heads, MLP, vocabulary), the other axis splits the batch.
The decode call stays one compiled program; XLA partitions it from the
shardings of its arguments, caches included.
"""

import dataclasses
import hashlib
import json
import os
import time
from typing import (
  Any,
  Callable,
  Dict,
  Iterator,
  List,
  Mapping,
  NamedTuple,
  Optional,
  Sequence,
  Tuple,
  Union,
)

from absl import app
from absl import logging
import gin
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np
import seqio
import tensorflow as tf
import tqdm

from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import gin_utils
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x import parallel_draft
from speculative_t5x import partitioning
from speculative_t5x import run_settings
from speculative_t5x import checks
from speculative_t5x import settings as settings_lib
from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core

Record = Dict[str, Any]


# ------------------------------------------------------------------------------
# Checks.
# ------------------------------------------------------------------------------
def check_pair(target: models.Model, draft: Optional[models.Draft]) -> None:
  """Raises ValueError unless the draft fits the target: one vocabulary, one architecture.

  Warns when a prefix-LM target has a causal decoder-only draft or the other
  way round: exact all the same, but the draft reads the prompt differently,
  which costs acceptance.
  """
  if draft is None:
    return
  draft = draft.as_draft() if isinstance(draft, models.Model) else draft
  drafts.check_shared_vocabulary(draft.vocab_size, target.vocab_size)
  models.check_same_architecture(target, draft)
  if (
    isinstance(draft, (drafts.ModelDraft, parallel_draft.ParallelDraft))
    and draft.inputs_bidirectional_attention != target.inputs_bidirectional_attention
  ):
    logging.warning(
      'The target has inputs_bidirectional_attention=%s but the draft %s: outputs stay '
      'exact, but the draft reads the prompt unlike the target (lower alpha). Bind the '
      "pair's INPUTS_BIDIRECTIONAL_ATTENTION for both.",
      target.inputs_bidirectional_attention,
      draft.inputs_bidirectional_attention,
    )


def check_vocabularies(task: seqio.Task, target: models.Model) -> None:
  """Raises ValueError unless the task's ids fit the target's vocabulary.

  (`check_pair` checks the draft's against the target's.)
  """
  for name in ('inputs', 'targets'):
    size = task.output_features[name].vocabulary.vocab_size
    if size > target.vocab_size:
      raise ValueError(
        f'Task {task.name!r} feature {name!r} has a vocabulary of {size} ids but the target '
        f'has vocab_size={target.vocab_size}: the checkpoint belongs to another vocabulary '
        "(check the task file's VOCABULARY and the model file's VOCAB_SIZE)."
      )


def _check_arguments(
  feature_lengths: Mapping[str, int], batch_size: int, num_partitions: int
) -> Mesh:
  """Validates the arguments that shape the run; returns its mesh."""
  if set(feature_lengths) != {'inputs', 'targets'}:
    raise ValueError(
      "feature_lengths must map exactly 'inputs' and 'targets' to lengths "
      f'(TASK_FEATURE_LENGTHS), got {dict(feature_lengths)}.'
    )
  for name, value in dict(
    feature_lengths, batch_size=batch_size, num_partitions=num_partitions
  ).items():
    checks.check_positive_int(name, value)
  if jax.device_count() % num_partitions:
    raise ValueError(
      f'num_partitions={num_partitions} does not divide the {jax.device_count()} devices.'
    )
  data_parallel = jax.device_count() // num_partitions
  if batch_size % data_parallel:
    raise ValueError(
      f'batch_size={batch_size} must be a multiple of the {data_parallel} '
      f'data-parallel replicas ({jax.device_count()} devices / '
      f'num_partitions={num_partitions}).'
    )
  return partitioning.make_mesh(data_parallel, num_partitions)


def _count_and_check_inputs(
  raw: tf.data.Dataset, max_length: int, truncate: bool, description: str
) -> int:
  """Number of examples in `raw`; raises for inputs longer than `max_length`.

  `raw` is the task's dataset before any trimming, so the lengths are the true
  ones (EOS included).
  """
  lengths = np.fromiter(raw.map(lambda ex: tf.size(ex['inputs'])).as_numpy_iterator(), np.int64)
  if not lengths.size:
    raise ValueError(f'{description} has no examples.')
  too_long = np.flatnonzero(lengths > max_length)
  if too_long.size and not truncate:
    first, longest = too_long[0], too_long[np.argmax(lengths[too_long])]
    raise ValueError(
      f'{too_long.size} of the {lengths.size} examples of {description} have more input '
      f"tokens than TASK_FEATURE_LENGTHS['inputs'] = {max_length}: example {first} has "
      f'{lengths[first]} (EOS included), the longest, example {longest}, has '
      f"{lengths[longest]}. Raise TASK_FEATURE_LENGTHS['inputs'] to {lengths[longest]}, or "
      'let seqio truncate them with --gin.infer.infer.truncate_inputs=True.'
    )
  if too_long.size:
    logging.warning(
      '%d inputs of %s are truncated to %d tokens.', too_long.size, description, max_length
    )
  return int(lengths.size)


# ------------------------------------------------------------------------------
# Settings and records on disk.
# ------------------------------------------------------------------------------
def _fingerprint(tree: Any) -> str:
  """A digest of a tree's paths, shapes, dtypes and the first values of each array."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    head = np.asarray(leaf.reshape(-1)[:16], np.float64)
    digest.update(f'{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}'.encode())
    digest.update(head.tobytes())
  return digest.hexdigest()[:16]


def _describe(model_or_draft: Any) -> Optional[Dict[str, Any]]:
  """The draft or target as JSON: its kind, static configuration and a fingerprint."""
  if model_or_draft is None:
    return None
  if isinstance(model_or_draft, models.Model):
    model_or_draft = model_or_draft.as_draft()
  static = {
    field.name: getattr(model_or_draft, field.name)
    for field in dataclasses.fields(model_or_draft)
    if not field.metadata.get('pytree_node', True)
  }
  static = {
    name: run_settings.jsonable_config(value)
    if isinstance(
      value, (network.T5Config, network.DecoderOnlyConfig, feature_head.FeatureHeadConfig)
    )
    else value
    for name, value in static.items()
  }
  return {
    'kind': type(model_or_draft).__name__,
    **static,
    'fingerprint': _fingerprint(model_or_draft),
  }


class _OutputPaths(NamedTuple):
  """A run's files in its output directory (see the module docstring)."""

  records: str
  summary: str
  settings: str


def _output_paths(output_dir: str, task_name: str, split: str) -> _OutputPaths:
  stem = os.path.join(output_dir, f'{task_name}-{split}')
  return _OutputPaths(f'{stem}.jsonl', f'{stem}.summary.json', f'{stem}.settings.json')


def _check_settings(path: str, settings: Dict[str, Any], records_path: str) -> None:
  """Raises ValueError if records exist that were written with other settings."""
  if not os.path.exists(records_path) or not os.path.getsize(records_path):
    return  # Nothing to continue.
  if not os.path.exists(path):
    raise ValueError(
      f'{records_path} exists without {path}: it was not written by '
      'speculative_t5x.infer. Use another output_dir.'
    )
  differing = run_settings.differences(run_settings.read(path), settings)
  if differing:
    raise ValueError(
      f'{records_path} holds outputs of a run with other settings (differing: '
      f'{list(differing)}: {run_settings.describe(differing)}; see {path}); they cannot be '
      'continued with these. Use another output_dir, or delete its files to start over.'
    )


class _Prefix(NamedTuple):
  """The longest consistent prefix of an output file (`_consistent_prefix`)."""

  records: List[Record]
  end: int  # Its length in bytes.
  complete_end: int  # The length of the file's complete lines (a partial last one after).
  lines: int  # The file's complete lines.
  problem: Optional[str]  # Why the line after the prefix is not part of it; None: none is.


def _consistent_prefix(data: bytes) -> _Prefix:
  """The records of `data`'s complete lines up to the first one that is not the next example.

  Line n (from 0) must be a JSON object with 'index' n: a line that is not,
  and everything after it, is left out (two writers interleaved their
  batches, or a disk error garbled a line).
  """
  complete_end = data.rfind(b'\n') + 1
  lines = data[:complete_end].split(b'\n')[:-1]
  records, end, problem = [], 0, None
  for number, line in enumerate(lines):
    try:
      record = json.loads(line)
    except ValueError as e:
      problem = f'line {number + 1} is not JSON ({e})'
      break
    index = record.get('index') if isinstance(record, dict) else None
    if index != number:
      problem = f'line {number + 1} holds example {index}, expected {number}'
      break
    records.append(record)
    end += len(line) + 1
  return _Prefix(records, end, complete_end, len(lines), problem)


def read_records(path: str) -> List[Record]:
  """The records of an output file, in order: its longest consistent prefix.

  Reads without changing the file. A partial last line (a write cut short by a
  kill) is not read; nor is anything from the first line that is not the next
  example (a damaged file: see `_recover_records`), with a warning.
  """
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    prefix = _consistent_prefix(f.read())
  if prefix.problem:
    logging.warning(
      'Reading the first %d records of %s: %s, so its last %d lines are not read (a damaged '
      'file; a run of infer on it keeps these records and decodes the rest again).',
      len(prefix.records),
      path,
      prefix.problem,
      prefix.lines - len(prefix.records),
    )
  return prefix.records


def _recover_records(path: str) -> List[Record]:
  """A writer's `read_records`: the file is cut to its longest consistent prefix.

  A partial last line (a write cut short by a kill) is dropped with a warning.
  A damaged file (records interleaved by two writers started before there was
  a writer lock, a line garbled by a disk error) keeps its consistent prefix:
  the lines after it are moved to `<path>.dropped-<UTC time>` and the file is
  truncated, with a warning that says what is kept and what is dropped; the
  run then decodes the dropped examples again. The caller holds the writer
  lock.
  """
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    data = f.read()
  prefix = _consistent_prefix(data)
  if prefix.problem is None and prefix.complete_end < len(data):
    logging.warning(
      'Dropping a partial last line (%d bytes) of %s.', len(data) - prefix.complete_end, path
    )
  elif prefix.problem is not None:
    aside = f'{path}.dropped-{time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())}'
    with open(aside, 'wb') as f:  # Written (and synced) before the file is cut.
      f.write(data[prefix.end :])
      f.flush()
      os.fsync(f.fileno())
    kept = len(prefix.records)
    logging.warning(
      '%s is damaged: %s. Keeping its first %d records (examples 0-%d, lines 1-%d) and dropping '
      'lines %d-%d (%d lines, %d bytes; moved to %s); their examples are decoded again.',
      path,
      prefix.problem,
      kept,
      kept - 1,
      kept,
      kept + 1,
      prefix.lines + (prefix.complete_end < len(data)),
      prefix.lines - kept + (prefix.complete_end < len(data)),
      len(data) - prefix.end,
      aside,
    )
  if prefix.end < len(data):
    with open(path, 'r+b') as f:
      f.truncate(prefix.end)
      f.flush()
      os.fsync(f.fileno())
  return prefix.records


# ------------------------------------------------------------------------------
# Data.
# ------------------------------------------------------------------------------
def _datasets(
  task: seqio.Task,
  split: str,
  feature_lengths: Mapping[str, int],
  num_examples: Optional[int],
  decoder_only: bool,
) -> Tuple[tf.data.Dataset, tf.data.Dataset]:
  """(untrimmed examples, model features of T5X's converter for the architecture), in order."""
  raw = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1)
  converter = seqio.DecoderFeatureConverter if decoder_only else seqio.EncDecFeatureConverter
  features = seqio.get_dataset(
    task,
    dict(feature_lengths),
    converter(pack=False),
    dataset_split=split,
    shuffle=False,
    num_epochs=1,
    verbose=False,
  )
  if num_examples is not None:
    raw, features = raw.take(num_examples), features.take(num_examples)
  return raw, features


@dataclasses.dataclass
class _Batch:
  """Rows [start, start + len(examples)) of the split, padded to the batch size.

  Attributes:
    start: the index of the first row.
    inputs: int32 [batch_size, Lin] encoder inputs, or a decoder-only pair's
      prompts (tokens, 0-padding); rows past the examples repeat the last
      one (so the batch ends with them).
    examples: the untrimmed seqio examples of the real rows (numpy values).
  """

  start: int
  inputs: np.ndarray
  examples: List[Dict[str, Any]]


def input_row(feature: Mapping[str, np.ndarray], input_length: int) -> np.ndarray:
  """The decode call's input row of one converted example: int [input_length].

  `seqio.EncDecFeatureConverter`'s encoder inputs, or, from
  `seqio.DecoderFeatureConverter`'s features, the prompt as T5X's
  `DecoderOnlyModel` takes it: `decoder_input_tokens * decoder_causal_attention`
  (BOS, then the inputs as the task writes them) without the BOS slot.
  """
  if 'encoder_input_tokens' in feature:
    return feature['encoder_input_tokens']
  prompt = feature['decoder_input_tokens'] * feature['decoder_causal_attention']
  return prompt[1 : input_length + 1]


def _batches(
  raw: tf.data.Dataset,
  features: tf.data.Dataset,
  start: int,
  batch_size: int,
  input_length: int,
) -> Iterator[_Batch]:
  pairs = tf.data.Dataset.zip((raw, features)).skip(start).prefetch(tf.data.AUTOTUNE)
  examples, rows = [], []
  for example, feature in pairs.as_numpy_iterator():
    examples.append(example)
    rows.append(input_row(feature, input_length))
    if len(rows) == batch_size:
      yield _Batch(start, np.stack(rows).astype(np.int32), examples)
      start, examples, rows = start + batch_size, [], []
  if rows:
    rows += [rows[-1]] * (batch_size - len(rows))
    yield _Batch(start, np.stack(rows).astype(np.int32), examples)


def _text(example: Mapping[str, Any], key: str, vocabulary: seqio.Vocabulary) -> str:
  """The example's text of `key`: seqio's `<key>_pretokenized`, else its ids decoded."""
  text = example.get(f'{key}_pretokenized')
  if text is None:
    return vocabulary.decode(example[key].tolist())
  return text.decode('utf-8') if isinstance(text, bytes) else str(text)


# ------------------------------------------------------------------------------
# Placement on the mesh.
# ------------------------------------------------------------------------------
def place_on_mesh(
  model_or_draft: Any, mesh: Mesh, rules: Optional[partitioning.LogicalRules] = None
) -> Any:
  """A `models.Model` or draft with its arrays on `mesh`.

  Networks (`Model`, `drafts.ModelDraft`, a `parallel_draft.ParallelDraft`'s
  network) are sharded by their parameters' logical axes; other drafts'
  arrays (n-gram tables, a feature head's own parameters, a parallel draft's
  mask vector) are replicated, a feature head's copy of the target's
  parameters placed as the target's.
  """
  if isinstance(model_or_draft, parallel_draft.ParallelDraft):
    placed = place_on_mesh(models.Model(model_or_draft.config, model_or_draft.params), mesh, rules)
    mask = jax.device_put(model_or_draft.mask_embedding, NamedSharding(mesh, PartitionSpec()))
    return model_or_draft.replace(params=placed.params, mask_embedding=mask)
  if isinstance(model_or_draft, drafts.FeatureDraft):
    target = place_on_mesh(
      models.Model(model_or_draft.target_config, model_or_draft.target_params), mesh, rules
    )
    head = jax.device_put(model_or_draft.params, NamedSharding(mesh, PartitionSpec()))
    return model_or_draft.replace(params=head, target_params=target.params)
  if isinstance(model_or_draft, (models.Model, drafts.ModelDraft)):
    _, params_axes = network.abstract_params(model_or_draft.config)
    shardings = partitioning.params_shardings(model_or_draft.params, params_axes, mesh, rules)
    return dataclasses.replace(
      model_or_draft, params=jax.device_put(model_or_draft.params, shardings)
    )
  return jax.device_put(model_or_draft, NamedSharding(mesh, PartitionSpec()))


# ------------------------------------------------------------------------------
# Records and the summary.
# ------------------------------------------------------------------------------
def _batch_records(
  batch: _Batch, output: models.GenerateOutput, task: seqio.Task, eos_id: int
) -> List[Record]:
  """One record per real row of a decoded batch (`output` on the host)."""
  vocabulary = task.output_features['targets'].vocabulary
  stats = output.stats
  lengths = layouts.output_lengths(output.tokens, eos_id)
  records = []
  for row, example in enumerate(batch.examples):
    tokens, length = output.tokens[row], int(lengths[row])
    prediction = vocabulary.decode(tokens[:length].tolist())
    targets = _text(example, 'targets', vocabulary)
    record = {
      'index': batch.start + row,
      'inputs': _text(example, 'inputs', task.output_features['inputs'].vocabulary),
      'targets': targets,
      'prediction': prediction,
      'score': float(output.scores[row]),
      # The baseline makes one target call per token and accepts no draft tokens.
      'iterations': length if stats is None else int(stats.iterations[row]),
      'accepted': 0 if stats is None else int(stats.accepted[row]),
      'emitted': length if stats is None else int(stats.emitted[row]),
      'drafted': 0 if stats is None else int(stats.drafted[row]),
      'truncated': bool(tokens[length - 1] != eos_id),
    }
    if stats is not None:
      record.update(batch_beta_sum=float(stats.beta_sum), batch_beta_count=int(stats.beta_count))
    if task.postprocessor is not None:
      record.update(
        postprocessed_targets=task.postprocess_fn(targets, example=example, is_target=True),
        postprocessed_prediction=task.postprocess_fn(prediction, example=example, is_target=False),
      )
    records.append(record)
  return records


def summarize(records: Sequence[Record], task: seqio.Task, batch_size: int) -> Dict[str, Any]:
  """Totals, alpha and the task's metrics over all records of a run.

  Args:
    records: every record of the run, in order (`read_records`).
    task: the task, for its metric functions.
    batch_size: the run's batch size (records of one batch share its beta
      statistics).

  Returns:
    {'examples', 'tokens', 'alpha' (None for the baseline),
    'tokens_per_target_call', 'mean_acceptance_length' (1 + accepted per
    iteration, before cuts at EOS), 'drafted_per_iteration',
    'truncated_predictions', 'metrics'}.
  """
  batch_betas = {
    record['index'] // batch_size: (record['batch_beta_sum'], record['batch_beta_count'])
    for record in records
    if 'batch_beta_sum' in record
  }
  beta_sum, beta_count = np.sum(list(batch_betas.values()) or [(0.0, 0)], axis=0)
  tokens = sum(record['emitted'] for record in records)
  iterations = max(sum(r['iterations'] for r in records), 1)
  targets = [record.get('postprocessed_targets', record['targets']) for record in records]
  predictions = [record.get('postprocessed_prediction', record['prediction']) for record in records]
  if task.score_metric_fns or task.predict_with_aux_metric_fns:
    logging.warning(
      'Task %s: only its predict_metric_fns are computed (the others need target '
      'scores or auxiliary values).',
      task.name,
    )
  metrics = {}
  for metric_fn in task.predict_metric_fns:
    metrics.update({name: float(value) for name, value in metric_fn(targets, predictions).items()})
  return {
    'examples': len(records),
    'tokens': tokens,
    'alpha': float(beta_sum / beta_count) if batch_betas else None,
    'tokens_per_target_call': tokens / iterations,
    'mean_acceptance_length': 1 + sum(r['accepted'] for r in records) / iterations,
    'drafted_per_iteration': sum(r['drafted'] for r in records) / iterations,
    'truncated_predictions': sum(record['truncated'] for record in records),
    'metrics': metrics,
  }


# ------------------------------------------------------------------------------
# Decoding the split.
# ------------------------------------------------------------------------------
def _speculative_settings(
  draft: Optional[models.Draft],
  gamma: Optional[Union[int, str]],
  tree: Optional[Any],
  lenience: float,
  verification: str,
  draft_threshold: float,
  speculation_profile: Optional[str],
) -> Optional[settings_lib.SpeculativeSettings]:
  """The checked speculative settings of `infer`'s arguments; None for the baseline (no draft)."""
  if draft is None:
    return None
  if gamma is None and tree is None:
    raise ValueError('gamma (or a tree) is required with a draft (the pair file sets GAMMA).')
  return settings_lib.SpeculativeSettings(
    gamma=gamma,
    lenience=lenience,
    verification=verification,
    draft_threshold=draft_threshold,
    profile=speculation_profile,
    tree=tree,
  )


def _decoding_args(
  speculation: Optional[settings_lib.SpeculativeSettings],
  *,
  temperature: float,
  topk: int,
  topp: float,
) -> Dict[str, Any]:
  """The settings file's 'decoding' entry: sampling and every speculative field (None: baseline)."""
  return dict(
    temperature=temperature,
    topk=topk,
    topp=topp,
    **(
      speculation.as_dict()
      if speculation
      else dict.fromkeys(settings_lib.SpeculativeSettings.field_names())
    ),
  )


class _BatchDecoder:
  """Decodes `_Batch`es on the mesh: one compilation (every batch has the same shapes).

  Batch k's key is fold_in(PRNGKey(seed), its first row). `compile_seconds`
  is the compilation's time and `decode_start` when the first decode began
  (None before), for the run's tokens per second.
  """

  def __init__(self, decoder: models.Decoder, mesh: Mesh, seed: int):
    self._decoder, self._mesh = decoder, mesh
    self._replicated = NamedSharding(mesh, PartitionSpec())
    self._base_key = jax.random.PRNGKey(seed)
    self._compiled = None
    self.compile_seconds = 0.0
    self.decode_start: Optional[float] = None

  def __call__(self, batch: _Batch) -> models.GenerateOutput:
    inputs = jax.device_put(
      batch.inputs, partitioning.batch_sharding(batch.inputs.shape, self._mesh)
    )
    key = jax.device_put(jax.random.fold_in(self._base_key, batch.start), self._replicated)
    if self._compiled is None:
      start = time.perf_counter()
      self._compiled = self._decoder.compile(inputs, key)
      self.decode_start = time.perf_counter()
      self.compile_seconds = self.decode_start - start
    return self._compiled(inputs, key)


@dataclasses.dataclass
class _Written:
  """What one run appended: examples, tokens (EOS included), and the gammas its batches ran."""

  examples: int = 0
  tokens: int = 0
  gammas: set = dataclasses.field(default_factory=set)


def _decode_and_append(
  batches: Iterator[_Batch],
  decode: Callable[[_Batch], models.GenerateOutput],
  records_path: str,
  done: int,
  task: seqio.Task,
  eos_id: int,
  *,
  bar: tqdm.tqdm,
  after_batch: Optional[Callable[[int], None]],
) -> _Written:
  """Decodes `batches` and appends the records of examples >= `done`, flushed batch by batch.

  One batch is in flight: the host writes batch k while the devices decode
  k + 1. `after_batch` gets the number of examples written so far.
  """
  written = _Written()
  with open(records_path, 'ab') as f:

    def write(batch: _Batch, output: models.GenerateOutput) -> None:
      records = [
        r for r in _batch_records(batch, jax.device_get(output), task, eos_id) if r['index'] >= done
      ]
      f.write(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records).encode())
      f.flush()
      written.examples += len(records)
      written.tokens += sum(r['emitted'] for r in records)
      written.gammas.add(output.gamma)
      bar.update(len(records))
      if after_batch is not None:
        after_batch(written.examples)

    pending = None
    for batch in batches:
      output = decode(batch)
      if pending is not None:
        write(*pending)
      pending = (batch, output)
    if pending is not None:
      write(*pending)
  return written


def _throughput(written: _Written, decode: _BatchDecoder) -> Dict[str, Any]:
  """The summary's decoded_examples, decoded_tokens, compile_seconds, decode_seconds (until
  now) and tokens_per_second."""
  decode_seconds = time.perf_counter() - decode.decode_start if written.examples else 0.0
  return dict(
    decoded_examples=written.examples,
    decoded_tokens=written.tokens,
    compile_seconds=decode.compile_seconds,
    decode_seconds=decode_seconds,
    tokens_per_second=written.tokens / decode_seconds if written.examples else None,
  )


# ------------------------------------------------------------------------------
# Inference.
# ------------------------------------------------------------------------------
def infer(
  *,
  target: models.Model,
  draft: Optional[models.Draft],
  task: Union[str, seqio.Task],
  feature_lengths: Mapping[str, int],
  output_dir: str,
  split: str = 'test',
  batch_size: int = 32,
  gamma: Optional[Union[int, str]] = None,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  lenience: float = settings_lib.DEFAULTS.lenience,
  verification: str = settings_lib.DEFAULTS.verification,
  draft_threshold: float = settings_lib.DEFAULTS.draft_threshold,
  speculation_profile: Optional[str] = None,
  tree: Optional[Any] = None,
  seed: int = 0,
  num_partitions: int = 1,
  logical_axis_rules: Optional[partitioning.LogicalRules] = None,
  truncate_inputs: bool = False,
  num_examples: Optional[int] = None,
  progress: bool = True,
  after_batch: Optional[Callable[[int], None]] = None,
) -> Dict[str, Any]:
  """Decodes a task split into `output_dir`, resuming a run there; see the module docstring.

  Args:
    target: the target model (parameters on the host or on devices).
    draft: a `models.Model` or a draft from `drafts` for speculative decoding;
      None for the baseline.
    task: a registered task name or a `seqio.Task` with 'inputs' and
      'targets' text features.
    feature_lengths: {'inputs': Lin, 'targets': L}; L is the decode length.
    output_dir: where the records, summary and settings go (created).
    split: the split to decode.
    batch_size: rows per decode call; a multiple of the data-parallel size.
    gamma, lenience, verification, draft_threshold, tree: the speculative
      settings, as `settings.SpeculativeSettings`'s fields (lenience 1 is
      exact); with a draft, gamma or a tree is required. gamma='auto' takes
      the gamma that `speculation_profile` (a profile's JSON path) gives for
      `batch_size` (0: the baseline program; see `profiles`).
    temperature, topk, topp: sampling (0 temperature: greedy; 0 k or p: off).
    seed: batch k decodes with fold_in(PRNGKey(seed), k * batch_size).
    num_partitions: devices per model replica (model parallelism); all
      devices are used, the rest split the batch.
    logical_axis_rules: logical-to-mesh axis rules; default T5X's standard.
    truncate_inputs: let seqio truncate inputs longer than Lin (else an error).
    num_examples: decode only the first this many examples. A later run with
      a larger number continues the outputs; the records of the shorter run's
      last, padded batch keep that batch's beta statistics.
    progress: show a tqdm progress bar.
    after_batch: called with the number of examples this run has written, after
      each batch's records are flushed (a hook: the kill-and-resume test stops
      a run after its first batch with it).

  Returns:
    The summary written to `<task>-<split>.summary.json` (`_write_summary`).
  """
  # One writer per output directory, from before any computation (`output_lock`).
  with output_lock.hold(output_dir, job='speculative_t5x.infer'):
    mesh = _check_arguments(feature_lengths, batch_size, num_partitions)
    draft = models.draft_for(target, draft)  # A feature head's checkpoint, read for the target.
    speculation = _speculative_settings(
      draft, gamma, tree, lenience, verification, draft_threshold, speculation_profile
    )
    check_pair(target, draft)
    task = tasks_core.get_task(task)
    check_vocabularies(task, target)
    decoding_args = _decoding_args(speculation, temperature=temperature, topk=topk, topp=topp)
    settings = _run_settings(
      task, split, feature_lengths, truncate_inputs, batch_size, seed, decoding_args, target, draft
    )
    paths, done = _open_outputs(output_dir, task.name, split, settings)
    raw, features, total = _read_split(
      task, split, feature_lengths, num_examples, truncate_inputs, target
    )
    eos_id = task.output_features['targets'].vocabulary.eos_id
    decoder = models.make_decoder(
      place_on_mesh(target, mesh, logical_axis_rules),
      place_on_mesh(draft, mesh, logical_axis_rules),
      speculation,
      temperature=temperature,
      topk=topk,
      topp=topp,
      max_decode_len=feature_lengths['targets'],
      eos_id=eos_id,
    )
    decode = _BatchDecoder(decoder, mesh, seed)
    run_settings.write(paths.settings, settings)
    batches = _batches(
      raw, features, done - done % batch_size, batch_size, feature_lengths['inputs']
    )
    with _progress_bar(total, done, progress, f'{task.name}:{split}') as bar:
      written = _decode_and_append(
        batches, decode, paths.records, done, task, eos_id, bar=bar, after_batch=after_batch
      )
    return _write_summary(paths, total, settings, task, target, mesh, written, decode)


def _write_summary(
  paths: _OutputPaths,
  total: int,
  settings: Mapping[str, Any],
  task: seqio.Task,
  target: models.Model,
  mesh: Mesh,
  written: _Written,
  decode: _BatchDecoder,
) -> Dict[str, Any]:
  """Writes and returns `infer`'s summary of a run with `settings` (`_run_settings`).

  `summarize`'s fields over the split's `total` records, plus task, split,
  architecture (`models.architecture`), speculative, gamma, mesh ({'data':
  ..., 'model': ...}) and this process's gammas_ran (the gammas its batches
  decoded with, 0 the baseline), decoded_examples, decoded_tokens,
  compile_seconds, decode_seconds and tokens_per_second.
  """
  summary = dict(
    task=task.name,
    split=settings['split'],
    architecture=models.architecture(target),
    speculative=settings['draft'] is not None,
    gamma=settings['decoding']['gamma'],
    gammas_ran=sorted(written.gammas),  # gamma='auto' chose these by batch size (0: baseline).
    mesh=dict(mesh.shape),
    **summarize(read_records(paths.records)[:total], task, settings['batch_size']),
    **_throughput(written, decode),
  )
  with open(paths.summary, 'w') as f:
    json.dump(summary, f, indent=1)
  logging.info('Summary of %s: %s', paths.records, summary)
  return summary


def _run_settings(
  task, split, feature_lengths, truncate_inputs, batch_size, seed, decoding_args, target, draft
) -> Dict[str, Any]:
  """What determines `infer`'s outputs, as its settings file holds them (arguments as its)."""
  return dict(
    task=task.name,
    split=split,
    feature_lengths=dict(feature_lengths),
    truncate_inputs=truncate_inputs,
    batch_size=batch_size,
    seed=seed,
    decoding=decoding_args,
    target=_describe(target),
    draft=_describe(draft),
  )


def _open_outputs(
  output_dir: str, task_name: str, split: str, settings: Dict[str, Any]
) -> Tuple[_OutputPaths, int]:
  """(the run's paths, the examples already decoded there) in `output_dir` (created).

  ValueError if records there were written with other settings.
  """
  os.makedirs(output_dir, exist_ok=True)
  paths = _output_paths(output_dir, task_name, split)
  _check_settings(paths.settings, settings, paths.records)
  return paths, len(_recover_records(paths.records))


def _read_split(
  task: seqio.Task,
  split: str,
  feature_lengths: Mapping[str, int],
  num_examples: Optional[int],
  truncate_inputs: bool,
  target: models.Model,
) -> Tuple[tf.data.Dataset, tf.data.Dataset, int]:
  """(untrimmed examples, the converter's features, their count) of the split to decode.

  ValueError for inputs longer than feature_lengths['inputs'] unless
  `truncate_inputs` (`_count_and_check_inputs`).
  """
  tasks.hide_gpus_from_tensorflow()
  decoder_only = network.is_decoder_only(target.config)
  raw, features = _datasets(task, split, feature_lengths, num_examples, decoder_only)
  total = _count_and_check_inputs(
    raw, feature_lengths['inputs'], truncate_inputs, f'{task.name}:{split}'
  )
  return raw, features, total


def _progress_bar(total: int, done: int, progress: bool, description: str) -> tqdm.tqdm:
  """The run's tqdm bar over the split's `total` examples, `done` of them already decoded."""
  return tqdm.tqdm(
    total=total,
    initial=min(done, total),
    disable=not progress,
    unit='ex',
    desc=description,
    dynamic_ncols=True,
  )


def _format_summary(summary: Mapping[str, Any]) -> str:
  alpha = 'n/a (baseline)' if summary['alpha'] is None else f'{summary["alpha"]:.3f}'
  speed = (
    'n/a (nothing left to decode)'
    if summary['tokens_per_second'] is None
    else f'{summary["tokens_per_second"]:.1f}'
  )
  metrics = ', '.join(f'{name} {value:.2f}' for name, value in summary['metrics'].items())
  return (
    f'{summary["task"]}:{summary["split"]}: {summary["examples"]} examples, '
    f'{summary["tokens"]} tokens, {speed} tokens/s, alpha {alpha}, '
    f'{summary["tokens_per_target_call"]:.2f} tokens per target call, '
    f'{summary["truncated_predictions"]} truncated predictions; {metrics}'
  )


def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `infer` and prints its summary.

  A damaged checkpoint file is reported as the target's or the draft's (the
  pair file loads both while gin builds `infer`'s arguments).
  """
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}.')
  logging.info('Gin config:\n%s', gin.config_str())
  # The gin files configure `speculative_t5x.infer.infer`, which is not this
  # module's function when it runs as `python -m speculative_t5x.infer`.
  from speculative_t5x import infer as infer_lib  # pylint: disable=g-import-not-at-top

  # The writer lock before gin builds the arguments: a refused run loads no checkpoint.
  with gin_utils.holding_bound_output(infer_lib.infer, 'output_dir', 'speculative_t5x.infer'):
    with gin_utils.naming_checkpoint_owners():
      summary = gin.get_configurable(infer_lib.infer)()
  print(_format_summary(summary))


if __name__ == '__main__':
  gin_utils.run(main)
