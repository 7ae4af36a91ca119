r"""Training T5X's networks on a seqio task: optax, orbax, resumable.

`train` trains a network of any size on any registered task; a speculative
pair's target and draft are trained by the same call with different configs.
The network is `network.module_for(config)`: the encoder-decoder
`network.Transformer` for a `network.T5Config` (T5X's `EncoderDecoderModel`)
or `network.DecoderOnly` for a `network.DecoderOnlyConfig` (T5X's
`DecoderOnlyModel`; see Data). The loss is T5X's (`t5x/losses.py`): cross
entropy against label-smoothed targets minus the smoothed targets' entropy,
plus `z_loss * log(Z)^2`, summed over the tokens of 'decoder_loss_weights'
and divided by an optional `loss_normalizing_factor`. The optimizer defaults
to Adafactor, whose optax defaults are T5X's (decay rate 0.8, factored second
moments, parameter-scaled updates clipped at RMS 1).

Data. The training stream is seqio's: the train split repeated, shuffled with
`seed`, packed (or padded) by the model's feature converter and batched
without remainder. The converter is T5X's choice: `seqio.EncDecFeatureConverter`
for an encoder-decoder; `seqio.DecoderFeatureConverter` for a decoder-only
network, which by the keys of `feature_lengths` makes LM features
({'targets': L}: a plain language model of the targets) or prefix-LM features
({'inputs': Lin, 'targets': L}: rows of Lin + L tokens, each example its
inputs then its targets, the loss on the targets only, and
'decoder_causal_attention' marking the inputs). As in T5X, a prefix LM attends
causally unless `inputs_bidirectional_attention` is set, which passes
'decoder_causal_attention' to the network: the inputs then attend to each
other bidirectionally. The stream depends only on the task, feature lengths,
batch size, packing, converter and seed, so a run resumed at step s skips the
stream's first s batches and then sees the batches an uninterrupted run sees.
Skipping re-reads, re-tokenizes and re-packs those examples (about 20 s per
1e5 examples on a 2-core CPU), which keeps the checkpoint to the model's state
alone.

Checkpoints. `model_dir` is an `orbax.checkpoint.CheckpointManager` directory
with items 'params' (the T5X parameter tree, float32) and 'opt_state' (the
optax state), each saved with `ocp.args.StandardSave`, one step directory per
checkpoint named by the step (orbax's default), written every
`checkpoint_every` steps and at the last step. orbax writes a step into a
temporary directory and renames it when complete, so an interruption leaves no
half-written step that could be restored; a run picks up the latest complete
step. Besides the steps, `metrics.jsonl` logs training and validation metrics
(one JSON object per line; a resumed run appends, so steps after the last
checkpoint of an interrupted run appear twice), and `SETTINGS_FILE` records
the run's network, task and settings (`inputs_bidirectional_attention`
included, which decoding a prefix LM must repeat: `models.Model`'s argument of
that name); a resumed run must use the recorded settings, all of them (a
difference is an error naming the setting and both values). One run writes a
`model_dir` at a time: the run holds its writer lock (`output_lock`; the
command line from before gin builds the arguments), and a second run there
stops at once naming the first (host, process id, since when); a run killed
outright leaves the lock file, which the next run takes over. The loop itself,
resume-or-start, metrics, progress bar, checkpoint and evaluation cadence, is
`resumable_loop`, which `distill` runs too.

Determinism. Parameters are drawn from `seed` on the host
(`network.random_params`), dropout keys are `fold_in(PRNGKey(seed), step)`,
and the data order is fixed as above, so on the CPU, whose XLA kernels are
deterministic, an interrupted and resumed run ends with the same parameters as
an uninterrupted one, bit for bit (tests/test_train.py checks it). On GPUs
that holds with XLA_FLAGS=--xla_gpu_deterministic_ops=true.

Command line, T5X style (flags as in `gin_utils`):

  python -m speculative_t5x.training.train \
    --gin_file=configs/models/gettext_target.gin \
    --gin_file=configs/tasks/gettext_ende.gin \
    --gin_file=configs/runs/train.gin \
    --gin.MODEL_DIR="'/tmp/gettext_target'" --gin.TRAIN_STEPS=600 \
    --gin.CORPUS_DIR="'/tmp/gettext_ende'" --gin.VOCABULARY="'/tmp/spm/ende_4000.model'"

The model file binds `network.T5Config` (or `network.DecoderOnlyConfig`, with
configs/runs/train_decoder_only.gin as the run file), the task file `TASK` (a
task name or a registering call), the run file `train`'s arguments. SIGTERM
ends the run after the saves it started are complete.
"""

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from absl import logging
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import seqio
import tensorflow as tf
import tqdm

from speculative_t5x import checkpoints
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x import run_settings
from speculative_t5x import checks
from speculative_t5x.data import tasks

PyTree = Any
Batch = Dict[str, np.ndarray]
LossNormalizingFactor = Union[None, float, str]

ITEM_NAMES = ('params', 'opt_state')
METRICS_FILE = run_settings.METRICS_FILE
SETTINGS_FILE = run_settings.TRAIN_SETTINGS_FILE  # models.load_trained reads it.
# T5X's special loss normalizing factors (`t5x.losses.SpecialLossNormalizingFactor`).
SPECIAL_LOSS_NORMALIZING_FACTORS = (
  'NUM_REAL_TARGET_TOKENS',
  'NUM_TOTAL_TARGET_TOKENS',
  'AVERAGE_PER_SEQUENCE',
)
# Summed over tokens by the steps; per-token means are these over 'weight'.
_METRIC_SUMS = ('loss', 'cross_entropy', 'z_loss', 'correct', 'weight')


# ------------------------------------------------------------------------------
# Loss.
# ------------------------------------------------------------------------------
def cross_entropy_with_logits(
  logits: jax.Array, targets: jax.Array, *, label_smoothing: float = 0.0, z_loss: float = 0.0
) -> Dict[str, jax.Array]:
  """T5X's per-token loss, without materializing one-hot targets.

  With V = vocabulary size, the smoothed target puts 1 - label_smoothing on the
  target id and label_smoothing / (V - 1) on every other id. The loss is the
  cross entropy against it minus its entropy (so a perfect prediction of the
  smoothed target scores 0), plus z_loss * log(Z)^2 with Z the softmax
  normalizer. The gradient equals that of T5X's custom-VJP version.

  Args:
    logits: float [B, L, V].
    targets: int [B, L] target ids.
    label_smoothing: in [0, 1).
    z_loss: coefficient of the log(Z)^2 term.

  Returns:
    float32 [B, L] arrays: 'loss' (the objective above), 'cross_entropy'
    (-log p(target), unsmoothed), 'z_loss' (the z term alone) and 'correct'
    (1 where the argmax is the target).
  """
  logits = logits.astype(jnp.float32)
  vocab_size = logits.shape[-1]
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), -1)[..., 0]
  cross_entropy = log_z - target_logits
  loss = cross_entropy
  if label_smoothing > 0.0:
    confidence = 1.0 - label_smoothing
    off_value = label_smoothing / (vocab_size - 1)
    # -sum_v t_v log p_v with t the smoothed target; log p_v = logits_v - log Z.
    other_log_probs = jnp.sum(logits, axis=-1) - vocab_size * log_z + cross_entropy
    loss = confidence * cross_entropy - off_value * other_log_probs
    entropy = -(
      confidence * np.log(confidence) + (vocab_size - 1) * off_value * np.log(off_value + 1e-20)
    )
    loss = loss - entropy
  z_term = z_loss * jnp.square(log_z)
  return {
    'loss': loss + z_term,
    'cross_entropy': cross_entropy,
    'z_loss': z_term,
    'correct': (jnp.argmax(logits, -1) == targets).astype(jnp.float32),
  }


def loss_weights(
  batch: Mapping[str, jax.Array], loss_normalizing_factor: LossNormalizingFactor
) -> tuple:
  """Per-token weights of the objective and the number it is divided by.

  As T5X's `get_loss_normalizing_factor_and_weights`: the base weights are
  'decoder_loss_weights' (else non-padding targets); None divides by 1 (T5X's
  default: the loss is a sum over tokens, which Adafactor's scale invariance
  makes harmless); a number divides by it; 'NUM_REAL_TARGET_TOKENS' by the
  weight sum; 'NUM_TOTAL_TARGET_TOKENS' by B * L; 'AVERAGE_PER_SEQUENCE'
  weights each sequence (packed segment) by 1 / its token count and divides
  by the number of sequences.

  Args:
    batch: model features; 'decoder_target_tokens' int [B, L], optionally
      'decoder_loss_weights' [B, L] and 'decoder_segment_ids' int [B, L].
    loss_normalizing_factor: see above (checked by `train`).

  Returns:
    (weights float32 [B, L], normalizer float32 scalar).
  """
  targets = batch['decoder_target_tokens']
  weights = _token_weights(batch)
  if loss_normalizing_factor is None:
    return weights, jnp.float32(1.0)
  if not isinstance(loss_normalizing_factor, str):
    return weights, jnp.float32(loss_normalizing_factor)
  if loss_normalizing_factor == 'NUM_REAL_TARGET_TOKENS':
    return weights, jnp.sum(weights)
  if loss_normalizing_factor == 'NUM_TOTAL_TARGET_TOKENS':
    return weights, jnp.float32(np.prod(targets.shape))
  segments = batch.get('decoder_segment_ids', (targets > 0).astype(jnp.int32))
  same_segment = segments[:, :, None] == segments[:, None, :]  # [B, L, L]
  tokens_in_segment = jnp.einsum('blm,bm->bl', same_segment.astype(jnp.float32), weights)
  weights = jnp.where(weights > 0, weights / jnp.maximum(tokens_in_segment, 1e-9), 0.0)
  return weights, jnp.sum(weights)


def _token_weights(batch: Mapping[str, jax.Array]) -> jax.Array:
  """float32 [B, L]: 'decoder_loss_weights', else 1 at non-padding targets."""
  targets = batch['decoder_target_tokens']
  return batch.get('decoder_loss_weights', targets > 0).astype(jnp.float32)


def _check_loss_normalizing_factor(value: LossNormalizingFactor) -> LossNormalizingFactor:
  if isinstance(value, str):
    if value.upper() not in SPECIAL_LOSS_NORMALIZING_FACTORS:
      raise ValueError(
        f'Unknown loss_normalizing_factor {value!r}: use None, a positive '
        f'number or one of {SPECIAL_LOSS_NORMALIZING_FACTORS}.'
      )
    return value.upper()
  if value is not None and not value > 0:
    raise ValueError(f'loss_normalizing_factor must be positive, got {value}.')
  return value


# ------------------------------------------------------------------------------
# Steps.
# ------------------------------------------------------------------------------
@flax.struct.dataclass
class TrainState:
  """The training state: `step` int32 scalar, `params` (T5X tree), `opt_state`."""

  step: jax.Array
  params: PyTree
  opt_state: PyTree


def _check_bidirectional(config: network.NetworkConfig, inputs_bidirectional_attention: bool):
  if inputs_bidirectional_attention and not isinstance(config, network.DecoderOnlyConfig):
    raise ValueError(
      "inputs_bidirectional_attention=True is for decoder-only prefix LMs (T5X's "
      f'DecoderOnlyModel), but the network is a {type(config).__name__}, an encoder-decoder '
      'whose decoder attends causally. Pass inputs_bidirectional_attention=False, or train a '
      'network.DecoderOnlyConfig.'
    )


def make_logits_fn(config: network.NetworkConfig, inputs_bidirectional_attention: bool = False):
  """`(params, batch, dropout_key) -> float32 logits [B, L, V]`, T5X's forward pass.

  `batch` holds the features of `feature_converter_cls(config)` (int32
  [B, Lin] 'encoder_*' and [B, L] 'decoder_*' arrays); dropout is on when
  `dropout_key` is not None. As T5X's `DecoderOnlyModel`, a decoder-only
  network gets 'decoder_causal_attention' only with
  `inputs_bidirectional_attention` (a prefix LM whose inputs attend
  bidirectionally); otherwise it attends causally.
  """
  _check_bidirectional(config, inputs_bidirectional_attention)

  def logits_fn(params: PyTree, batch: Mapping[str, jax.Array], dropout_key: Optional[jax.Array]):
    if not inputs_bidirectional_attention:  # The network then attends causally.
      batch = {name: value for name, value in batch.items() if name != 'decoder_causal_attention'}
    return network.compute_logits(config, params, batch, dropout_key)

  return logits_fn


def _metric_sums(per_token: Mapping[str, jax.Array], weights: jax.Array) -> Dict[str, jax.Array]:
  sums = {name: jnp.sum(per_token[name] * weights) for name in _METRIC_SUMS[:-1]}
  sums['weight'] = jnp.sum(weights)
  return sums


def make_train_step(
  config: network.NetworkConfig,
  optimizer: optax.GradientTransformation,
  *,
  label_smoothing: float,
  z_loss: float,
  loss_normalizing_factor: LossNormalizingFactor,
  inputs_bidirectional_attention: bool = False,
) -> Callable:
  """The (unjitted) training step `(state, batch, key) -> (state, metric sums)`.

  `batch` holds `feature_converter_cls(config)`'s features as int32 [B, L]
  arrays; `key` is the run's PRNG key, folded with the step for dropout
  (used only when `config.dropout_rate > 0`). The metric sums (float32
  scalars) are the loss terms and correct predictions summed over the tokens
  of 'decoder_loss_weights' (a prefix LM's targets), and their count
  'weight'. `inputs_bidirectional_attention`: see `make_logits_fn`.
  """
  logits_fn = make_logits_fn(config, inputs_bidirectional_attention)
  use_dropout = config.dropout_rate > 0.0

  def step(state: TrainState, batch: Mapping[str, jax.Array], key: jax.Array):
    dropout_key = jax.random.fold_in(key, state.step) if use_dropout else None

    def objective(params):
      logits = logits_fn(params, batch, dropout_key)
      per_token = cross_entropy_with_logits(
        logits, batch['decoder_target_tokens'], label_smoothing=label_smoothing, z_loss=z_loss
      )
      weights, normalizer = loss_weights(batch, loss_normalizing_factor)
      total = jnp.sum(per_token['loss'] * weights) / normalizer
      return total, _metric_sums(per_token, _token_weights(batch))

    grads, sums = jax.grad(objective, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return step


def make_eval_step(
  config: network.NetworkConfig,
  *,
  label_smoothing: float,
  z_loss: float,
  inputs_bidirectional_attention: bool = False,
) -> Callable:
  """The (unjitted) evaluation step `(params, batch) -> metric sums`, no dropout."""
  logits_fn = make_logits_fn(config, inputs_bidirectional_attention)

  def step(params: PyTree, batch: Mapping[str, jax.Array]):
    logits = logits_fn(params, batch, None)
    per_token = cross_entropy_with_logits(
      logits, batch['decoder_target_tokens'], label_smoothing=label_smoothing, z_loss=z_loss
    )
    return _metric_sums(per_token, _token_weights(batch))

  return step


@functools.lru_cache(maxsize=8)
def _jitted_steps(
  config: network.NetworkConfig,
  optimizer: Callable[..., optax.GradientTransformation],
  learning_rate: optax.ScalarOrSchedule,
  label_smoothing: float,
  z_loss: float,
  loss_normalizing_factor: LossNormalizingFactor,
  inputs_bidirectional_attention: bool,
) -> tuple:
  """(optax transformation, jitted train step, jitted eval step).

  Cached, so that training the same configuration again in one process (a
  resumed or continued run in a notebook) reuses the compiled steps.
  """
  tx = optimizer(learning_rate)
  train_step = make_train_step(
    config,
    tx,
    label_smoothing=label_smoothing,
    z_loss=z_loss,
    loss_normalizing_factor=loss_normalizing_factor,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  eval_step = make_eval_step(
    config,
    label_smoothing=label_smoothing,
    z_loss=z_loss,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  return tx, jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)


def cached_unless_unhashable(cached_fn: Callable[..., Any], *args) -> Any:
  """`cached_fn(*args)` of a `functools.lru_cache`d builder, or uncached when an
  argument is unhashable (e.g. an array learning rate)."""
  try:
    return cached_fn(*args)
  except TypeError:
    return cached_fn.__wrapped__(*args)


def _per_token(sums: Mapping[str, float]) -> Dict[str, float]:
  weight = max(float(sums['weight']), 1.0)
  return {
    'loss': float(sums['loss']) / weight,
    'cross_entropy': float(sums['cross_entropy']) / weight,
    'z_loss': float(sums['z_loss']) / weight,
    'accuracy': float(sums['correct']) / weight,
  }


# ------------------------------------------------------------------------------
# Data.
# ------------------------------------------------------------------------------
def feature_converter_cls(config: network.NetworkConfig) -> Callable[..., seqio.FeatureConverter]:
  """The seqio feature converter of T5X's model for `config` (its FEATURE_CONVERTER_CLS).

  `seqio.EncDecFeatureConverter` for a `network.T5Config`,
  `seqio.DecoderFeatureConverter` (LM or prefix LM by the feature lengths'
  keys) for a `network.DecoderOnlyConfig`.
  """
  if isinstance(config, network.DecoderOnlyConfig):
    return seqio.DecoderFeatureConverter
  return seqio.EncDecFeatureConverter


def get_dataset(
  task: Union[str, seqio.Task],
  split: str,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  *,
  pack: bool = True,
  shuffle: bool = False,
  seed: Optional[int] = None,
  repeat: bool = False,
  skip_batches: int = 0,
  converter_cls: Callable[..., seqio.FeatureConverter] = seqio.EncDecFeatureConverter,
) -> tf.data.Dataset:
  """Batches of model features from a seqio task.

  seqio's pipeline (the split's examples tokenized, EOS-terminated and
  truncated to `feature_lengths`; repeated if `repeat`; shuffled with `seed`
  if `shuffle`), then `converter_cls(pack=pack)`, then batches of
  `batch_size` rows (the last, partial one dropped if `repeat`).

  Args:
    task: a registered task name or a `seqio.Task`.
    split: the split, e.g. 'train' or 'validation'.
    feature_lengths: the task feature lengths: {'inputs': Lin, 'targets': L},
      or {'targets': L} for a decoder-only LM.
    batch_size: rows per batch.
    pack: pack several examples per row (T5X's default for training).
    shuffle: shuffle examples (buffer of the task's shuffle_buffer_size).
    seed: the shuffle seed; with it the order is deterministic.
    repeat: repeat the split indefinitely.
    skip_batches: batches to drop from the start (resuming).
    converter_cls: the feature converter (`feature_converter_cls(config)`).

  Returns:
    A `tf.data.Dataset` of dicts of int32 arrays: encoder-decoder, [rows, Lin]
    'encoder_*' and [rows, L] 'decoder_*'; decoder-only, [rows, Lin + L] (or
    [rows, L]) 'decoder_*', with 'decoder_causal_attention' for a prefix LM;
    segment ids and positions when packed.
  """
  dataset = seqio.get_dataset(
    task,
    dict(feature_lengths),
    converter_cls(pack=pack),
    dataset_split=split,
    shuffle=shuffle,
    num_epochs=None if repeat else 1,
    seed=seed,
    verbose=False,
  )
  dataset = dataset.batch(batch_size, drop_remainder=repeat)
  if skip_batches:
    dataset = dataset.skip(skip_batches)
  return dataset.prefetch(tf.data.AUTOTUNE)


def _padded(batch: Batch, batch_size: int) -> Batch:
  """Pads a final partial batch with all-padding rows (weight 0)."""
  rows = next(iter(batch.values())).shape[0]
  return {
    name: np.pad(value, [(0, batch_size - rows)] + [(0, 0)] * (value.ndim - 1))
    for name, value in batch.items()
  }


def _real_tokens(batch: Batch) -> int:
  # A decoder-only row holds its inputs (if any) among its target tokens.
  return sum(
    int(np.count_nonzero(batch[name]))
    for name in ('encoder_input_tokens', 'decoder_target_tokens')
    if name in batch
  )


# ------------------------------------------------------------------------------
# Checkpoints.
# ------------------------------------------------------------------------------
def checkpoint_manager(
  model_dir: str, keep_checkpoints: Optional[int] = None
) -> ocp.CheckpointManager:
  """The orbax manager of `model_dir` (items 'params' and 'opt_state').

  Temporary directories of saves cut short are removed on creation.
  `keep_checkpoints` is `max_to_keep` (None keeps all).
  """
  return ocp.CheckpointManager(
    os.path.abspath(model_dir),
    item_names=ITEM_NAMES,
    options=ocp.CheckpointManagerOptions(
      max_to_keep=keep_checkpoints, cleanup_tmp_directories=True
    ),
  )


def _host_copy(tree: PyTree) -> PyTree:
  # The next step donates (overwrites) the state's buffers while orbax writes
  # in the background, and on CPU a host view of a device array aliases it.
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)


def save_state(manager: ocp.CheckpointManager, state: TrainState) -> None:
  manager.save(
    int(state.step),
    args=ocp.args.Composite(
      params=ocp.args.StandardSave(_host_copy(state.params)),
      opt_state=ocp.args.StandardSave(_host_copy(state.opt_state)),
    ),
  )


def restore_state(
  manager: ocp.CheckpointManager, step: int, params: PyTree, opt_state: PyTree
) -> TrainState:
  """Restores `step`, checking its parameters against those of `params`.

  Args:
    manager: the model directory's manager.
    step: a complete step in it.
    params: the parameter tree the run trains (`jax.ShapeDtypeStruct`s).
    opt_state: the optimizer state's structure (`jax.ShapeDtypeStruct`s).
  """
  restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  differences = checkpoints.compare_shapes(restored.params, params)
  if differences:
    raise ValueError(
      f'The checkpoint at step {step} in {manager.directory} holds the parameters of another '
      f'network: {differences.summary("the configured network")}. Resume with the config it '
      'was trained with, or train into a new model_dir.'
    )
  restored_opt_state = manager.restore(
    step, args=ocp.args.Composite(opt_state=ocp.args.StandardRestore(opt_state))
  ).opt_state
  return TrainState(
    step=jnp.int32(step),
    params=jax.device_put(restored.params),
    opt_state=jax.device_put(restored_opt_state),
  )


# ------------------------------------------------------------------------------
# Training.
# ------------------------------------------------------------------------------
def append_metrics(path: str, split: str, record: Mapping[str, Any]) -> None:
  """Appends one JSON line `{'split': split, **record}` to a metrics file."""
  with open(path, 'a') as f:
    f.write(json.dumps({'split': split, **record}) + '\n')


def read_metrics(model_dir: str, split: Optional[str] = None) -> List[Dict[str, Any]]:
  """The records of `model_dir`'s `METRICS_FILE` in the order written; [] if it has none.

  A resumed run appends: the steps after the last checkpoint of an
  interrupted run appear twice (the later record is the one the final
  parameters follow), and each segment's 'seconds' restarts from 0.

  Args:
    model_dir: a directory `train` (or `distill`) wrote.
    split: only that split's records ('train', 'validation'), without their
      'split' key; None for all of them, with it.
  """
  path = os.path.join(model_dir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  if split is None:
    return records
  return [
    {name: value for name, value in record.items() if name != 'split'}
    for record in records
    if record['split'] == split
  ]


@dataclasses.dataclass
class TrainResult:
  """What `train` returns.

  Attributes:
    params: the final parameters (T5X tree, float32 jax arrays).
    step: the final step.
    train_metrics: per logging interval, {'step', 'loss', 'cross_entropy',
      'z_loss', 'accuracy' (per real target token), 'learning_rate',
      'tokens' (the real input + target tokens of the interval's batches),
      'tokens_per_second' (of those, after the run's first step),
      'seconds' (since the run started)}.
    eval_metrics: per evaluation, {'step', 'loss', 'cross_entropy', 'z_loss',
      'accuracy', 'seconds'} on the validation split.
  """

  params: PyTree
  step: int
  train_metrics: List[Dict[str, float]]
  eval_metrics: List[Dict[str, float]]


def check_positive(**values) -> None:
  """`checks.check_positive_int` of each value given (None: not set, not checked)."""
  for name, value in values.items():
    if value is not None:
      checks.check_positive_int(name, value)


def check_task(
  task: Union[str, seqio.Task],
  config: network.NetworkConfig,
  feature_lengths: Mapping[str, int],
  *,
  inputs_bidirectional_attention: bool = False,
  evaluate: bool = False,
) -> seqio.Task:
  """The task, checked against the network and the feature lengths (see `train`).

  `evaluate`: the run evaluates (`eval_every` set), so the task needs a
  validation split.
  """
  task = seqio.get_mixture_or_task(task) if isinstance(task, str) else task
  if 'train' not in task.splits:
    raise ValueError(f'Task {task.name!r} has no train split (splits: {task.splits}).')
  if evaluate and 'validation' not in task.splits:
    raise ValueError(
      f'Task {task.name!r} has no validation split to evaluate on; pass eval_every=None.'
    )
  _check_bidirectional(config, inputs_bidirectional_attention)
  if isinstance(config, network.T5Config):
    if set(feature_lengths) != {'inputs', 'targets'}:
      raise ValueError(
        "feature_lengths must map exactly 'inputs' and 'targets' to lengths, got "
        f'{dict(feature_lengths)}.'
      )
  elif set(feature_lengths) not in ({'targets'}, {'inputs', 'targets'}):
    raise ValueError(
      "A decoder-only network's feature_lengths map 'targets' (a language model) or "
      f"'inputs' and 'targets' (a prefix LM) to lengths, got {dict(feature_lengths)}."
    )
  elif 'inputs' in feature_lengths and 'inputs' not in task.output_features:
    raise ValueError(
      f"feature_lengths has 'inputs' but task {task.name!r} has only the features "
      f"{sorted(task.output_features)}; pass feature_lengths={{'targets': L}} to train a "
      'language model of its targets.'
    )
  elif inputs_bidirectional_attention and 'inputs' not in feature_lengths:
    raise ValueError(
      'inputs_bidirectional_attention=True makes the inputs of a prefix LM attend '
      f"bidirectionally, but feature_lengths={dict(feature_lengths)} has no 'inputs' (a "
      "plain LM). Add an 'inputs' length (the task must have inputs), or pass "
      'inputs_bidirectional_attention=False.'
    )
  check_positive(**{f'feature_lengths[{k!r}]': v for k, v in feature_lengths.items()})
  for name, feature in task.output_features.items():
    if feature.vocabulary.vocab_size > config.vocab_size:
      raise ValueError(
        f'Task {task.name!r} feature {name!r} has a vocabulary of '
        f'{feature.vocabulary.vocab_size} ids but the network has vocab_size='
        f'{config.vocab_size}; set {type(config).__name__}.vocab_size >= '
        f'{feature.vocabulary.vocab_size}.'
      )
  return task


def _evaluate(eval_step: Callable, params: PyTree, batches: Sequence[Batch]) -> Dict[str, float]:
  totals = {name: 0.0 for name in _METRIC_SUMS}
  for sums in [eval_step(params, batch) for batch in batches]:
    for name, value in jax.device_get(sums).items():
      totals[name] += float(value)
  return _per_token(totals)


def _settings(config: network.NetworkConfig, task: seqio.Task, **settings: Any) -> Dict[str, Any]:
  config_fields = run_settings.jsonable_config(config)
  return {'network': type(config).__name__, 'config': config_fields, 'task': task.name, **settings}


def read_settings(model_dir: str) -> Optional[Dict[str, Any]]:
  """The settings `train` recorded in `model_dir` (`SETTINGS_FILE`), or None if none.

  {'network': 'T5Config' or 'DecoderOnlyConfig', 'config': its fields (dtype
  by name), 'task', 'feature_lengths', 'batch_size', 'pack', 'seed',
  'inputs_bidirectional_attention'}.
  """
  return run_settings.read(os.path.join(model_dir, SETTINGS_FILE))


# ------------------------------------------------------------------------------
# The resumable loop, of `train` and `distill.distill`.
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Schedule:
  """How far a run trains, and when it logs, saves and evaluates (`resumable_loop`).

  The trainers (`train`, `distill.distill`, `train_feature_head`, which has
  no step hook) take these as arguments of the same names. ValueError unless
  each number is a positive integer (None, where allowed, is not checked).

  Attributes:
    num_steps: the step to train to (a resumed run continues up to it).
    checkpoint_every: save every this many steps (and at `num_steps`).
    keep_checkpoints: orbax's `max_to_keep` (None keeps all).
    eval_every: evaluate every this many steps and at the end; None: never.
    log_every: steps per logged (and progress bar) metrics line.
    progress: show a tqdm progress bar.
    after_step: called with each step's number once the step, its records and
      any save it starts are issued (a step hook: the kill-and-resume tests
      stop a run at a chosen step with it); None: no hook.
  """

  num_steps: int
  checkpoint_every: int
  keep_checkpoints: Optional[int]
  eval_every: Optional[int]
  log_every: int
  progress: bool
  after_step: Optional[Callable[[int], None]] = None

  def __post_init__(self):
    check_positive(
      num_steps=self.num_steps,
      checkpoint_every=self.checkpoint_every,
      keep_checkpoints=self.keep_checkpoints,
      eval_every=self.eval_every,
      log_every=self.log_every,
    )


@dataclasses.dataclass
class LoopSteps:
  """A run's own part of `resumable_loop`: its step, its records, its evaluation.

  Attributes:
    step: `(state, step) -> (state, sums, tokens)`: one training step on
      step `step`'s data (1-based; it fetches its batch itself). `sums` maps
      names to metric sums (device scalars), summed over each logging
      interval; `tokens` counts the step's real tokens (an int or a device
      scalar) for the throughput.
    summary: `(totals, step) -> dict`: a training record's metrics from the
      interval's summed `sums` (host values).
    postfix: `record -> dict`: the progress bar's fields of a training record.
    evaluate: `params -> dict` of evaluation metrics; None: no evaluation.
    evaluate_at_start: also evaluate the starting parameters of a fresh run
      (a curve's step-0 point).
  """

  step: Callable[[TrainState, int], Tuple[TrainState, Mapping[str, jax.Array], Any]]
  summary: Callable[[Mapping[str, Any], int], Dict[str, Any]]
  postfix: Callable[[Mapping[str, Any]], Dict[str, str]]
  evaluate: Optional[Callable[[PyTree], Dict[str, Any]]] = None
  evaluate_at_start: bool = False


def data_step(step: int, data_passes: int, chunk_steps: int) -> int:
  """The data step (1-based) whose batch training step `step` (1-based) reads.

  Data steps come in chunks of `chunk_steps` (a trainer decodes a chunk's
  outputs together); each chunk serves `data_passes` times as many training
  steps, its batches in order on each pass. `distill` and
  `train_feature_head` train several steps on each decoded batch with it: on
  the CPU, decoding a batch costs more than a step on it.
  """
  chunk, offset = divmod(step - 1, chunk_steps * data_passes)
  return chunk * chunk_steps + offset % chunk_steps + 1


def _restore_or_start(
  manager: ocp.CheckpointManager,
  model_dir: str,
  *,
  config: network.NetworkConfig,
  optimizer: optax.GradientTransformation,
  initial_params: Callable[[], PyTree],
  settings_file: str,
  settings: Mapping[str, Any],
  abstract_params: Optional[Callable[[], PyTree]],
) -> Tuple[int, TrainState]:
  """(start step, state): the latest step's, its settings checked, or step 0's with
  `settings` written (see `resumable_loop`)."""
  start_step = manager.latest_step() or 0
  if start_step:
    run_settings.check_resumed(model_dir, settings_file, settings)
    params = network.abstract_params(config)[0] if abstract_params is None else abstract_params()
    state = restore_state(manager, start_step, params, jax.eval_shape(optimizer.init, params))
    logging.info('Resuming %s from step %d.', model_dir, start_step)
    return start_step, state
  run_settings.write(os.path.join(model_dir, settings_file), settings)
  params = initial_params()
  return 0, TrainState(step=jnp.int32(0), params=params, opt_state=jax.jit(optimizer.init)(params))


class _Interval:
  """A logging interval: its steps' metric sums and token counts, and the clock of its
  throughput. Counts added before `start_clock` (the run's first step, which compiles)
  are not timed."""

  def __init__(self, start: float):
    self._restart(start)

  def _restart(self, start: float) -> None:
    self._sums, self._counts, self._timed_from, self._start = [], [], 0, start

  def add(self, sums: Mapping[str, jax.Array], tokens: Any) -> None:
    self._sums.append(sums)
    self._counts.append(tokens)

  def start_clock(self) -> float:
    """Times the counts added from now on; returns now."""
    self._start, self._timed_from = time.perf_counter(), len(self._counts)
    return self._start

  def close(self, step: int, summary: Callable[[Mapping[str, Any], int], Dict[str, Any]]):
    """The training record of the interval that ends at `step`; the next one starts now.

    {'step', `summary` of the summed sums, 'tokens', 'tokens_per_second'}.
    """
    totals = jax.device_get(jax.tree_util.tree_map(lambda *x: sum(x), *self._sums))
    counts = [int(count) for count in jax.device_get(self._counts)]
    now = time.perf_counter()
    record = {
      'step': step,
      **summary(totals, step),
      'tokens': sum(counts),
      'tokens_per_second': sum(counts[self._timed_from :]) / (now - self._start),
    }
    self._restart(now)
    return record


def resumable_loop(
  model_dir: str,
  schedule: Schedule,
  *,
  config: network.NetworkConfig,
  optimizer: optax.GradientTransformation,
  initial_params: Callable[[], PyTree],
  settings_file: str,
  settings: Mapping[str, Any],
  start: Callable[[int], LoopSteps],
  abstract_params: Optional[Callable[[], PyTree]] = None,
  job: str = 'speculative_t5x.training',
) -> Tuple[PyTree, int, List[Dict[str, Any]], List[Dict[str, Any]]]:
  """Trains `model_dir`'s run up to `schedule.num_steps`, from its latest checkpoint or the start.

  One writer: the loop holds `model_dir`'s writer lock (`output_lock.hold`)
  from before it reads or cleans the directory until its saves are complete;
  a second run on the directory stops at once with `OutputLockedError`
  naming the running one. Resume or start: a directory with a complete step
  resumes from the latest one, after its `settings_file` is checked against `settings` (a difference
  is a ValueError naming each setting and both values); otherwise `settings`
  are written to `settings_file` and the run starts from `initial_params()`
  with a fresh optimizer state. `start(start_step)` then prepares the run's
  data (skipping what the run has seen) and returns its `LoopSteps`, which
  `_step_loop` runs, logging, saving and evaluating on `schedule`. The loop
  returns (or raises: an error, or SIGTERM, which `gin_utils.run` turns into
  SystemExit) only once every save it started is complete.

  Args:
    model_dir: the run's directory (orbax steps, `METRICS_FILE`, `settings_file`).
    schedule: the step to train to, and when to log, save and evaluate.
    config: the trained network's configuration (the restored tree's shapes).
    optimizer: the optax transformation (the restored optimizer state's structure).
    initial_params: the parameters of a fresh run's first step.
    settings_file: the settings' file name in `model_dir`.
    settings: what the run records and a resumed run must repeat (JSON values).
    start: see above.
    abstract_params: the trained parameters' shapes (`jax.ShapeDtypeStruct`s)
      for a restore, when they are not a network's (e.g. a draft head's);
      None: `network.abstract_params(config)`.
    job: what trains, for the writer lock's record (`output_lock`).

  Returns:
    (the final parameters, the final step, training records, evaluation records).
  """
  # One writer per model_dir, before the manager removes unfinished saves (`output_lock`).
  with output_lock.hold(model_dir, job):
    records = _RunRecords(os.path.join(model_dir, METRICS_FILE), start_time=time.perf_counter())
    manager = checkpoint_manager(model_dir, schedule.keep_checkpoints)
    try:
      start_step, state = _restore_or_start(
        manager,
        model_dir,
        config=config,
        optimizer=optimizer,
        initial_params=initial_params,
        settings_file=settings_file,
        settings=settings,
        abstract_params=abstract_params,
      )
      if start_step >= schedule.num_steps:
        logging.info(
          '%s is already at step %d >= num_steps=%d.', model_dir, start_step, schedule.num_steps
        )
        return state.params, start_step, [], []
      steps = start(start_step)
      if steps.evaluate is not None and steps.evaluate_at_start and start_step == 0:
        records.log('validation', {'step': 0, **steps.evaluate(state.params)})
      state = _step_loop(model_dir, manager, state, steps, records, schedule, start_step)
      return state.params, schedule.num_steps, records.train, records.eval
    finally:
      # Returns only once every started save is complete (renamed into place).
      manager.wait_until_finished()
      manager.close()


class _RunRecords:
  """A run's training and evaluation records: kept, logged and appended to its metrics file."""

  def __init__(self, metrics_path: str, start_time: float):
    self._metrics_path, self.start_time = metrics_path, start_time
    self.train: List[Dict[str, Any]] = []
    self.eval: List[Dict[str, Any]] = []

  def log(self, split: str, record: Dict[str, Any]) -> None:
    """Adds `record` of `split` ('train' or 'validation'), with the run's 'seconds' so far."""
    record['seconds'] = time.perf_counter() - self.start_time
    (self.train if split == 'train' else self.eval).append(record)
    logging.info('%s step %d: %s', split, record['step'], record)
    append_metrics(self._metrics_path, split, record)


def _step_loop(
  model_dir: str,
  manager,
  state: TrainState,
  steps: LoopSteps,
  records: _RunRecords,
  schedule: Schedule,
  start_step: int,
) -> TrainState:
  """`resumable_loop`'s steps from `start_step` + 1 to `num_steps`; returns the final state.

  One step is in flight: the host prepares the next batch while the device
  computes. Every `log_every` steps and at the last, a training record
  ({'step', the summary's metrics, 'tokens', 'tokens_per_second' (from the
  end of the first step, which compiles), 'seconds'}) goes to the metrics
  file and the progress bar; every `checkpoint_every` steps and at the last,
  the state is saved; every `eval_every` steps and at the last, an
  evaluation record ({'step', its metrics, 'seconds'}) is written (all of
  `schedule`).
  """
  num_steps, eval_every = schedule.num_steps, schedule.eval_every
  bar = tqdm.tqdm(
    total=num_steps,
    initial=start_step,
    disable=not schedule.progress,
    desc=os.path.basename(os.path.normpath(model_dir)),
    dynamic_ncols=True,
  )
  interval = _Interval(time.perf_counter())
  in_flight = None  # The previous step's sums, set after the first step.
  for step in range(start_step + 1, num_steps + 1):
    state, sums, tokens = steps.step(state, step)
    interval.add(sums, tokens)
    if step == start_step + 1:
      # Throughput is measured from the end of the first step (compilation).
      jax.block_until_ready(sums)
      first_done = interval.start_clock()
      logging.info(
        'First step of %s (with compilation) done %.1f s after the start.',
        model_dir,
        first_done - records.start_time,
      )
    else:
      # One step in flight, and the progress bar within a step of the truth.
      jax.block_until_ready(in_flight)
    in_flight = sums
    bar.update()
    if step % schedule.log_every == 0 or step == num_steps:
      record = interval.close(step, steps.summary)
      bar.set_postfix(**steps.postfix(record))
      records.log('train', record)
    if step % schedule.checkpoint_every == 0 or step == num_steps:
      save_state(manager, state)
    if steps.evaluate is not None and (step % eval_every == 0 or step == num_steps):
      records.log('validation', {'step': step, **steps.evaluate(state.params)})
    if schedule.after_step is not None:
      schedule.after_step(step)
  bar.close()
  return state


def _validation_evaluator(
  eval_step: Callable,
  task: seqio.Task,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  pack: bool,
  converter_cls: type,
  eval_batches: Optional[int],
) -> Optional[Callable[[PyTree], Dict[str, float]]]:
  """`params -> per-token metrics` on the validation split (its first `eval_batches`
  batches, each padded to `batch_size`), or None when the split yields no batch."""
  validation = get_dataset(
    task, 'validation', feature_lengths, batch_size, pack=pack, converter_cls=converter_cls
  )
  if eval_batches is not None:
    validation = validation.take(eval_batches)
  eval_sets = [_padded(batch, batch_size) for batch in validation.as_numpy_iterator()]
  return functools.partial(_evaluate, eval_step, batches=eval_sets) if eval_sets else None


def _train_loop_steps(
  train_step: Callable,
  batches: Iterator[Batch],
  key: jax.Array,
  num_steps: int,
  learning_rate: optax.ScalarOrSchedule,
  evaluate: Optional[Callable[[PyTree], Dict[str, float]]],
) -> LoopSteps:
  """`train`'s `LoopSteps`: each step takes the next of `batches`, the one after is read
  while the device computes."""
  batch = next(batches)

  def step(state: TrainState, step: int):
    nonlocal batch
    state, sums = train_step(state, batch, key)
    tokens = _real_tokens(batch)
    if step < num_steps:
      batch = next(batches)  # While the device computes this step.
    return state, sums, tokens

  def summary(totals: Mapping[str, Any], step: int) -> Dict[str, Any]:
    rate = learning_rate(step - 1) if callable(learning_rate) else learning_rate
    return {**_per_token(totals), 'learning_rate': float(rate)}

  postfix = lambda record: dict(
    loss=f'{record["loss"]:.3f}', tok_s=f'{record["tokens_per_second"]:.0f}'
  )
  return LoopSteps(step, summary, postfix, evaluate)


def _check_loss_settings(
  label_smoothing: float, z_loss: float, loss_normalizing_factor: LossNormalizingFactor
) -> LossNormalizingFactor:
  """ValueError unless T5X's loss settings are valid; the normalizing factor as checked."""
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f'label_smoothing must be in [0, 1), got {label_smoothing}.')
  if z_loss < 0:
    raise ValueError(f'z_loss must be >= 0, got {z_loss}.')
  return _check_loss_normalizing_factor(loss_normalizing_factor)


def _start_training_data(
  train_step: Callable,
  eval_step: Optional[Callable],
  start_step: int,
  *,
  config: network.NetworkConfig,
  task: seqio.Task,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  pack: bool,
  seed: int,
  num_steps: int,
  learning_rate: optax.ScalarOrSchedule,
  eval_batches: Optional[int],
) -> LoopSteps:
  """`train`'s `resumable_loop` start: the train split from `start_step`'s batch, shuffled
  with `seed`, and (with `eval_step`; None: no evaluation) the validation evaluator."""
  converter_cls = feature_converter_cls(config)
  evaluate = None
  if eval_step is not None:
    evaluate = _validation_evaluator(
      eval_step, task, feature_lengths, batch_size, pack, converter_cls, eval_batches
    )
  batches = get_dataset(
    task,
    'train',
    feature_lengths,
    batch_size,
    pack=pack,
    shuffle=True,
    seed=seed,
    repeat=True,
    skip_batches=start_step,
    converter_cls=converter_cls,
  ).as_numpy_iterator()
  return _train_loop_steps(
    train_step, batches, jax.random.PRNGKey(seed), num_steps, learning_rate, evaluate
  )


def train(
  model_dir: str,
  config: network.NetworkConfig,
  task: Union[str, seqio.Task],
  *,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  num_steps: int,
  inputs_bidirectional_attention: bool = False,
  learning_rate: optax.ScalarOrSchedule = 0.01,
  optimizer: Callable[..., optax.GradientTransformation] = optax.adafactor,
  pack: bool = True,
  label_smoothing: float = 0.0,
  z_loss: float = 1e-4,
  loss_normalizing_factor: LossNormalizingFactor = None,
  seed: int = 0,
  checkpoint_every: int = 1000,
  keep_checkpoints: Optional[int] = 3,
  eval_every: Optional[int] = 1000,
  eval_batches: Optional[int] = None,
  log_every: int = 50,
  progress: bool = True,
  after_step: Optional[Callable[[int], None]] = None,
) -> TrainResult:
  """Trains (or resumes training of) a network on a task; see the module docstring.

  Args:
    model_dir: the checkpoint directory; the latest checkpoint in it is resumed.
    config: the network, a `network.T5Config` (encoder-decoder) or a
      `network.DecoderOnlyConfig` (`dtype` is the compute dtype; parameters
      are float32; dropout is on when `config.dropout_rate > 0`).
    task: a registered seqio task name or a `seqio.Task` with 'inputs' and
      'targets' features (a decoder-only LM: 'targets' at least) and 'train'
      (and, to evaluate, 'validation') splits.
    feature_lengths: {'inputs': Lin, 'targets': L}; for a decoder-only
      network, {'targets': L} trains a language model of the targets alone
      (rows of L tokens; a task's 'inputs' are then unused) and
      {'inputs': Lin, 'targets': L} a prefix LM (rows of Lin + L tokens, the
      loss on the targets). Longer examples are truncated (seqio's trimming),
      packed rows hold several examples.
    batch_size: rows per step.
    num_steps: the step to train to (a resumed run continues up to it).
    inputs_bidirectional_attention: T5X's `DecoderOnlyModel` argument: a
      prefix LM's inputs attend to each other bidirectionally (the network
      gets 'decoder_causal_attention'); False attends causally. Decoder-only
      prefix LMs only; recorded in `SETTINGS_FILE`, and decoding must repeat
      it (`models.Model(..., inputs_bidirectional_attention=...)`).
    learning_rate: a float or an optax schedule of the step (e.g.
      `optax.warmup_cosine_decay_schedule(...)`).
    optimizer: called as `optimizer(learning_rate)`; default Adafactor.
    pack: pack examples into rows (else one example per row, padded).
    label_smoothing: T5X's label smoothing, in [0, 1).
    z_loss: T5X's z-loss coefficient (T5X's default 1e-4).
    loss_normalizing_factor: T5X's: None (a sum over tokens), a number, or
      one of `SPECIAL_LOSS_NORMALIZING_FACTORS`.
    seed: seeds the parameters, the data order and dropout.
    checkpoint_every: save every this many steps (and at `num_steps`).
    keep_checkpoints: orbax's `max_to_keep` (None keeps all).
    eval_every: evaluate on the validation split every this many steps and
      at the end; None never.
    eval_batches: evaluate on at most this many batches; None the whole split.
    log_every: steps per logged (and progress bar) metrics line.
    progress: show a tqdm progress bar.
    after_step: called with each step's number (`Schedule`).

  Returns:
    A `TrainResult`.
  """
  check_positive(batch_size=batch_size, eval_batches=eval_batches)
  schedule = Schedule(
    num_steps, checkpoint_every, keep_checkpoints, eval_every, log_every, progress, after_step
  )
  loss_normalizing_factor = _check_loss_settings(label_smoothing, z_loss, loss_normalizing_factor)
  task = check_task(
    task,
    config,
    feature_lengths,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
    evaluate=eval_every is not None,
  )
  tasks.hide_gpus_from_tensorflow()
  step_args = (
    config,
    optimizer,
    learning_rate,
    label_smoothing,
    z_loss,
    loss_normalizing_factor,
    bool(inputs_bidirectional_attention),
  )
  tx, train_step, eval_step = cached_unless_unhashable(_jitted_steps, *step_args)
  settings = _settings(
    config,
    task,
    feature_lengths=dict(feature_lengths),
    batch_size=batch_size,
    pack=pack,
    seed=seed,
    inputs_bidirectional_attention=bool(inputs_bidirectional_attention),
  )
  start = functools.partial(
    _start_training_data,
    train_step,
    eval_step if eval_every is not None else None,
    config=config,
    task=task,
    feature_lengths=feature_lengths,
    batch_size=batch_size,
    pack=pack,
    seed=seed,
    num_steps=num_steps,
    learning_rate=learning_rate,
    eval_batches=eval_batches,
  )
  params, step, train_metrics, eval_metrics = resumable_loop(
    model_dir,
    schedule,
    config=config,
    optimizer=tx,
    initial_params=lambda: jax.device_put(network.random_params(config, seed)[0]),
    settings_file=SETTINGS_FILE,
    settings=settings,
    start=start,
    job='speculative_t5x.training.train',
  )
  return TrainResult(params, step, train_metrics, eval_metrics)


# ------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------
def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `train` (`gin_utils.run` has parsed the gin flags)."""
  from speculative_t5x.training import train as train_lib  # pylint: disable=g-import-not-at-top

  gin_utils.run_configured(argv, train_lib.train, writes='model_dir')


if __name__ == '__main__':
  gin_utils.run(main)
