"""Training a feature head (`feature_head`) on its frozen target's own outputs.

Data. Each step takes a batch of inputs (rows of `inputs`, in a seeded
order that depends only on the step, so a resumed run sees what an
uninterrupted one does) and the target's own outputs for them
(`models.make_decoder`, the target alone), at a temperature taken in turn
from `data_temperatures` (greedy and sampled outputs, on-policy as `distill`
draws the target's). The outputs are decoded ahead, `DATA_CHUNK_STEPS`
steps at a time: the chunk's rows of each temperature in one call (a large
batch costs the memory-bound decoder little more than a small one), with
the PRNG key `fold_in(fold_in(PRNGKey(seed), first step of the chunk),
temperature's index)`; a resumed run decodes its chunk whole, as an
uninterrupted one. With `data_passes` P > 1 the steps train on each
chunk's batches P times over, in turn (training step s reads the batch of
data step `train.data_step(s, P, DATA_CHUNK_STEPS)`), so a step costs 1/P
of a decode: on the CPU the decode costs more than the step itself. For a decoder-only target the
rows are prompts and a sequence is the prompt followed by its continuation.

Loss. One teacher-forced target pass per batch (`with_target_outputs`,
however many steps train on it) gives, at every decoder input position
t, the target's features f_t and its standardized next-token distribution
p_{t+1} at the run's sampling mode (temperature 1 by default: the full
distribution, as EAGLE's heads are trained, so one head can serve every
temperature). The head is then unrolled K steps (training-time test,
EAGLE-3; `feature_head.FeatureHead.unrolled`):
  step 0: the head at position t reads (f_t, embed(x_{t+1})), the true feature;
  step k: it reads (its own step k - 1 prediction of f_t, embed(x_{t+1})) and
    attends to the true entries at positions <= t - k and to its own chain
    of predicted entries after them,
exactly what a rollout's step k + 1 computes, so that it learns from the
inputs and the cache it drafts from after its first token. Step 0 also
holds the head's start state (`feature_head.FeatureHead.start`), which
drafts x_1 against the target's p_0. The
loss of step k is the soft cross entropy -sum_x p_{t+2}(x) log q^k_t(x) of
the head's distribution (its log-softmax at the mode's temperature) against
the target's, averaged over real positions and weighted by decay^k
(normalized); `feature_weight` > 0 adds EAGLE-1's smooth-L1 regression of the
step-0 prediction onto f_{t+1}. Only the head's parameters train; the
target's are constants of the loss. A fresh head starts from
`feature_head.init_params` with its token paths in the target embedding's
principal subspace (`embedding_init`, `feature_head.embedding_aligned_params`).

Metrics: 'loss', and 'alpha', the mean over real positions of
beta = sum_x min(p, q) between the standardized target and step-0 head
distributions (the acceptance rate of a first draft token). Evaluation every
`eval_every` steps: the same on the target's samples of `eval_inputs` at
temperature 1 (decoded once per run).

Checkpoints: the head's 'params' and 'opt_state' in `train`'s layout
(`train.resumable_loop`), metrics.jsonl and `SETTINGS_FILE`; a resumed run is
refused if any recorded setting (the head's config, the loss, the data)
differs, naming it. `models.FeatureHeadCheckpoint` reads such a directory
back as a draft for its target.

Command line: `train_on_task`, configured by a pair file (TARGET), a task file (TASK;
its train split's inputs are the rows, its validation split the held-out
ones) and configs/runs/train_feature_head.gin:

  python -m speculative_t5x.training.train_feature_head \
    --gin_file=configs/pairs/gettext_tiny.gin \
    --gin_file=configs/tasks/gettext_ende.gin \
    --gin_file=configs/runs/train_feature_head.gin \
    --gin.MODEL_DIR="'/tmp/feature_head'" \
    --gin.CHECKPOINT_PATH="'runs/demo/gettext_target'" \
    --gin.CORPUS_DIR="'runs/demo/corpus'" \
    --gin.VOCABULARY="'runs/demo/vocabulary/spm_4000.model'"
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative_t5x.training import distill
from speculative_t5x import feature_head
from speculative_t5x import gin_utils
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import run_settings
from speculative_t5x import sampling
from speculative_t5x import speculative_sampling
from speculative_t5x.training import train

PyTree = Any
SETTINGS_FILE = run_settings.FEATURE_HEAD_SETTINGS_FILE
# Steps whose target outputs are decoded together (see the module docstring).
DATA_CHUNK_STEPS = 8
# `train`'s feature_layers for EAGLE-3's fusion of a low, a middle and the top layer.
FUSED = 'fused'


@dataclasses.dataclass(frozen=True)
class HeadLossConfig:
  """The static part of the loss: the head, its target, the unroll and the sampling mode."""

  head_config: feature_head.FeatureHeadConfig
  target_config: network.NetworkConfig
  unroll_steps: int = 3
  decay: float = 0.8
  feature_weight: float = 0.0
  temperature: float = 1.0
  topk: int = 0
  topp: float = 0.0

  def __post_init__(self):
    train.check_positive(unroll_steps=self.unroll_steps)
    if not 0.0 < self.decay <= 1.0:
      raise ValueError(f'decay must be in (0, 1] (a weight per unrolled step); got {self.decay}.')
    if self.feature_weight < 0:
      raise ValueError(f'feature_weight must be >= 0; got {self.feature_weight}.')
    sampling.validate_sampling_args(self.temperature, self.topk, self.topp)
    feature_head.check_target(self.head_config, self.target_config)


class AlignedOutputs(NamedTuple):
  """What the loss compares, paired position by position (see `aligned_outputs`).

  Head position t reads the target's feature f_t and the embedding of
  x_{t+1} ('decoder_target_tokens' [t]) and drafts x_{t+2}, which the target
  predicts at position t + 1; so over t = 0..L-2:
    p: float32 [B, L - 1, V], the target's standardized distribution at t + 1
      (the loss's mode);
    weights: float32 [B, L - 1], 1 where x_{t+2} is a real token (through EOS);
    depths: [(predicted feature [B, L - 1, Df], logits [B, L - 1, V])] for
      unroll depth k < unroll_steps (`feature_head.unrolled`): depth k at t is
      what the rollout's draft token k + 1 reads from when t - k is the last
      true position (t - k = -1: the rollout from the start state).
  The start state drafts x_1, which the target predicts at position 0:
    start_p: float32 [B, V], the target's standardized distribution at 0;
    start_weights: float32 [B], 1 where x_1 is a real token;
    start: (predicted feature [B, Df], logits [B, V]), the start state's.
  And features: float32 [B, L, Df], the target's true features at every position.
  """

  p: jax.Array
  weights: jax.Array
  depths: List[Tuple[jax.Array, jax.Array]]
  start_p: jax.Array
  start_weights: jax.Array
  start: Tuple[jax.Array, jax.Array]
  features: jax.Array


def with_target_outputs(
  config: HeadLossConfig, target_params: PyTree, batch: Mapping[str, jax.Array]
) -> Dict[str, jax.Array]:
  """`batch` and the frozen target's side of the loss, one teacher-forced pass over it.

  Computed once per batch, however many steps train on it (`data_passes`):
  on the CPU this pass costs about as much as the rest of a step. Adds
  'target_p' float32 [B, L, V], the target's standardized distribution at
  each position (the loss's mode), 'target_features' float32 [B, L, Df], its
  features there, and for an encoder-decoder target 'encoded' [B, Lin, D],
  its encoder output (which the head cross-attends to).
  """
  head, target_config = config.head_config, config.target_config
  mode = dict(temperature=config.temperature, topk=config.topk, topp=config.topp)
  target_logits, features = network.compute_logits(
    target_config, target_params, batch, feature_layers=head.feature_layers
  )
  outputs = {
    'target_p': sampling.standardize(target_logits, **mode),
    'target_features': features.astype(jnp.float32),
  }
  if head.cross_attention:
    outputs['encoded'] = network.encode(target_config, target_params, batch['encoder_input_tokens'])
  return {**batch, **outputs}


def aligned_outputs(
  config: HeadLossConfig, params: PyTree, target_params: PyTree, batch: Mapping[str, jax.Array]
) -> AlignedOutputs:
  """The target's and the head's outputs the loss compares (`AlignedOutputs`).

  The decode loop drafts from the same pairs (tests/test_feature_draft_training.py).
  `batch` as `head_loss`'s.
  """
  head, target_config = config.head_config, config.target_config
  p, features = batch['target_p'], batch['target_features']
  weights = batch['decoder_loss_weights'].astype(jnp.float32)
  next_embedded = network.embed_tokens(target_config, target_params, batch['decoder_target_tokens'])
  encoded = encoder_mask = None
  if head.cross_attention:
    encoded, encoder_mask = batch['encoded'], batch['encoder_input_tokens'] > 0
  start, unrolled = feature_head.unrolled(
    head, params, features, next_embedded, encoded, encoder_mask, config.unroll_steps
  )
  head_logits = lambda predicted, hidden: feature_head.logits(
    head, params, target_config, target_params, predicted, hidden
  )
  depths = [
    (predicted[:, :-1], head_logits(predicted, hidden)[:, :-1]) for predicted, hidden in unrolled
  ]
  return AlignedOutputs(
    p=p[:, 1:],
    weights=weights[:, 1:],
    depths=depths,
    start_p=p[:, 0],
    start_weights=weights[:, 0],
    start=(start[0], head_logits(*start)),
    features=features,
  )


def head_loss(
  config: HeadLossConfig, params: PyTree, target_params: PyTree, batch: Mapping[str, jax.Array]
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """(mean loss, metric sums {'loss', 'beta', 'weight'}) of one batch (see the module docstring).

  `batch`: int32 [B, L] 'decoder_input_tokens' and 'decoder_target_tokens',
  float32 [B, L] 'decoder_loss_weights', for an encoder-decoder target int32
  [B, Lin] 'encoder_input_tokens', and the target's outputs on them
  (`with_target_outputs`).
  """
  mode = dict(temperature=config.temperature, topk=config.topk, topp=config.topp)
  aligned = aligned_outputs(config, params, target_params, batch)
  scale = config.temperature if config.temperature > 0 else 1.0

  def cross_entropy(p, logits):
    log_q = jax.nn.log_softmax(logits / scale, axis=-1)
    return -jnp.sum(jnp.where(p > 0, p * log_q, 0.0), axis=-1)

  # Depth 0's positions: the start state's (drafting x_1), then t = 0..L-2.
  first_p = jnp.concatenate([aligned.start_p[:, None], aligned.p], axis=1)
  first_weights = jnp.concatenate([aligned.start_weights[:, None], aligned.weights], axis=1)
  total, norm, sums = 0.0, 0.0, {}
  for k, (predicted, logits) in enumerate(aligned.depths):
    p, weights = aligned.p, aligned.weights
    if k == 0:
      p, weights = first_p, first_weights
      predicted = jnp.concatenate([aligned.start[0][:, None], predicted], axis=1)
      logits = jnp.concatenate([aligned.start[1][:, None], logits], axis=1)
    step_loss = jnp.sum(cross_entropy(p, logits) * weights)
    total, norm = total + config.decay**k * step_loss, norm + config.decay**k
    if k == 0:
      q = sampling.standardize(jax.lax.stop_gradient(logits), **mode)
      sums['beta'] = jnp.sum(speculative_sampling.lenient_acceptance_rate(p, q) * weights)
      if config.feature_weight:  # The prediction of f_t, from position t - 1 (or the start).
        regression = optax.huber_loss(predicted, aligned.features).mean(-1)
        total += config.feature_weight * jnp.sum(regression * weights)
  sums['loss'] = total / norm
  sums['weight'] = jnp.sum(first_weights)
  return sums['loss'] / jnp.maximum(sums['weight'], 1.0), sums


def make_step(config: HeadLossConfig, optimizer: optax.GradientTransformation):
  """The (unjitted) step `(state, target_params, batch) -> (state, metric sums)`; only the head trains."""

  def step(state: train.TrainState, target_params: PyTree, batch):
    grads, sums = jax.grad(
      lambda params: head_loss(config, params, target_params, batch), has_aux=True
    )(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return train.TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return step


class _Compiled(NamedTuple):
  """A run's optimizer and jitted functions (`_jitted`)."""

  tx: optax.GradientTransformation
  target_pass: Callable  # (target_params, batch) -> `with_target_outputs`.
  step: Callable  # `make_step`'s, its state donated.
  evaluate: Callable  # (params, target_params, batch) -> `head_loss`'s metric sums.


@functools.lru_cache(maxsize=8)
def _jitted(config: HeadLossConfig, learning_rate: float) -> _Compiled:
  tx = optax.adam(learning_rate)
  return _Compiled(
    tx,
    jax.jit(lambda target_params, batch: with_target_outputs(config, target_params, batch)),
    jax.jit(make_step(config, tx), donate_argnums=0),
    jax.jit(
      lambda params, target_params, batch: head_loss(config, params, target_params, batch)[1]
    ),
  )


def target_sequences(
  target: models.Model, inputs: np.ndarray, max_decode_len: int, temperature: float, rng
) -> Dict[str, np.ndarray]:
  """The training batch of the target's own outputs for `inputs` [B, Lin] (see the module docstring)."""
  decode = models.make_decoder(target, None, temperature=temperature, max_decode_len=max_decode_len)
  return training_batch(target.config, inputs, np.asarray(decode(inputs, rng).tokens))


def training_batch(
  target_config: network.NetworkConfig, inputs: np.ndarray, outputs: np.ndarray
) -> Dict[str, np.ndarray]:
  """`head_loss`'s batch of the target's outputs [B, L] for `inputs` [B, Lin].

  An encoder-decoder's: BOS then the outputs. A decoder-only target's
  `inputs` are its prompts: each sequence is the prompt followed by its
  outputs, left-aligned.
  """
  if not network.is_decoder_only(target_config):
    return distill.sequence_features(inputs, outputs)
  sequences = np.zeros((len(inputs), inputs.shape[1] + outputs.shape[1]), np.int32)
  prompt_lengths = np.sum(np.asarray(inputs) != 0, axis=1)
  for row, (prompt, output) in enumerate(zip(inputs, outputs)):
    sequences[row, : prompt_lengths[row]] = prompt[prompt != 0]
    sequences[row, prompt_lengths[row] : prompt_lengths[row] + outputs.shape[1]] = output
  batch = distill.sequence_features(inputs, sequences)
  del batch['encoder_input_tokens']
  # An output cut at its length without EOS ends before the row's padding (which
  # `sequence_features`, looking for EOS, would weigh in).
  lengths = prompt_lengths + layouts.output_lengths(outputs)
  batch['decoder_loss_weights'] = (np.arange(sequences.shape[1])[None] < lengths[:, None]).astype(
    np.float32
  )
  return batch


def chunk_batches(
  target: models.Model,
  inputs: np.ndarray,
  chunk: int,
  *,
  batch_size: int,
  seed: int,
  data_temperatures: Sequence[float],
  max_decode_len: int,
) -> Dict[int, Dict[str, np.ndarray]]:
  """{step: batch} of the `DATA_CHUNK_STEPS` steps of chunk `chunk` (0-based).

  Each temperature's steps (every len(data_temperatures)-th, in turn) have
  their rows decoded in one call (see the module docstring).
  """
  first = chunk * DATA_CHUNK_STEPS + 1
  steps = range(first, first + DATA_CHUNK_STEPS)
  key = jax.random.fold_in(jax.random.PRNGKey(seed), first)
  batches = {}
  for index, temperature in enumerate(data_temperatures):
    mine = [s for s in steps if (s - 1) % len(data_temperatures) == index]
    if not mine:
      continue
    rows = np.concatenate([step_rows(len(inputs), batch_size, seed, s) for s in mine])
    batch = target_sequences(
      target, inputs[rows], max_decode_len, temperature, jax.random.fold_in(key, index)
    )
    for i, s in enumerate(mine):
      batches[s] = {
        name: value[i * batch_size : (i + 1) * batch_size] for name, value in batch.items()
      }
  return batches


def step_rows(num_rows: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """Row indices of step `step` (1-based): epochs of seeded permutations, by step alone."""
  start = (step - 1) * batch_size
  rows = []
  for index in range(start, start + batch_size):
    epoch, offset = divmod(index, num_rows)
    rows.append(np.random.default_rng([seed, epoch]).permutation(num_rows)[offset])
  return np.asarray(rows)


@dataclasses.dataclass(frozen=True)
class HeadTrainResult:
  """What `train_feature_head` returns: the head's params, the step, its records."""

  params: PyTree
  step: int
  train_metrics: Sequence[Dict[str, Any]]
  eval_metrics: Sequence[Dict[str, Any]]


def _check_head_training(target, data_temperatures, eval_every, eval_inputs) -> None:
  """ValueError naming the problem unless `train_feature_head` can train for `target` so."""
  if target.inputs_bidirectional_attention:
    raise ValueError(
      "Training a feature head for a prefix LM is not implemented (its prompt's features are "
      'bidirectional); train it for a causal decoder-only or an encoder-decoder target.'
    )
  if not data_temperatures:
    raise ValueError(
      'data_temperatures is empty: give the target decoding temperatures, e.g. (0.0, 1.0).'
    )
  if eval_every is not None and eval_inputs is None:
    raise ValueError('eval_every needs eval_inputs, the held-out inputs.')


def _recorded_settings(config: HeadLossConfig, **run: Any) -> Dict[str, Any]:
  """What a head's run records and a resumed run must repeat: the loss's config (the
  head's, the unroll, the sampling mode; not the target's), then `run`'s values."""
  return {
    'head_config': _jsonable_head_config(config.head_config),
    'unroll_steps': config.unroll_steps,
    'decay': config.decay,
    'feature_weight': config.feature_weight,
    'temperature': config.temperature,
    'topk': config.topk,
    'topp': config.topp,
    **run,
  }


def _jsonable_head_config(head_config: feature_head.FeatureHeadConfig) -> Dict[str, Any]:
  """The head's config as the run's settings record it (tuples as lists, no dtype)."""
  return {
    name: list(value) if isinstance(value, tuple) else value
    for name, value in dataclasses.asdict(head_config).items()
    if name != 'dtype'
  }


def _head_loop_steps(
  target: models.Model,
  inputs: np.ndarray,
  compiled: _Compiled,
  eval_inputs: Optional[np.ndarray],
  *,
  batch_size: int,
  seed: int,
  data_temperatures: Sequence[float],
  max_decode_len: int,
  data_passes: int,
) -> train.LoopSteps:
  """`train_feature_head`'s `train.LoopSteps`.

  Each step trains on its batch of `chunk_batches` (the target's decodes of
  int32 [N, Lin] `inputs`, a chunk of steps at a time, each chunk's batches
  `data_passes` times over: `train.data_step`; the target's pass over each batch
  once, `with_target_outputs`); with int32 [M, Lin] `eval_inputs` (None: no
  evaluation), the held-out loss and alpha on the target's T = 1 decodes of
  them, also before the first step.
  """
  key = jax.random.PRNGKey(seed)
  with_targets = lambda batch: compiled.target_pass(target.params, batch)
  held_out = None
  if eval_inputs is not None:  # Key 0: training steps are 1-based.
    held_out = with_targets(
      target_sequences(target, eval_inputs, max_decode_len, 1.0, jax.random.fold_in(key, 0))
    )
  ahead = {}  # The current chunk's batches, with the target's outputs: {data step: batch}.

  def step(state: train.TrainState, step: int):
    data = train.data_step(step, data_passes, DATA_CHUNK_STEPS)
    if data not in ahead:
      ahead.clear()
      batches = chunk_batches(
        target,
        inputs,
        (data - 1) // DATA_CHUNK_STEPS,
        batch_size=batch_size,
        seed=seed,
        data_temperatures=data_temperatures,
        max_decode_len=max_decode_len,
      )
      ahead.update({s: with_targets(batch) for s, batch in batches.items()})
    state, sums = compiled.step(state, target.params, ahead[data])
    return state, sums, sums['weight']

  def per_weight(sums: Mapping[str, Any]) -> Dict[str, float]:
    weight = max(float(sums['weight']), 1.0)
    return {'loss': float(sums['loss']) / weight, 'alpha': float(sums['beta']) / weight}

  summary = lambda totals, step: per_weight(totals)
  evaluate = lambda params: per_weight(
    jax.device_get(compiled.evaluate(params, target.params, held_out))
  )
  postfix = lambda record: dict(loss=f'{record["loss"]:.3f}', alpha=f'{record["alpha"]:.3f}')
  return train.LoopSteps(
    step, summary, postfix, evaluate if held_out is not None else None, evaluate_at_start=True
  )


def _first_head_params(
  head_config: feature_head.FeatureHeadConfig,
  initial_params: Optional[PyTree],
  seed: int,
  target: models.Model,
  embedding_init: bool,
) -> PyTree:
  """A fresh run's first head parameters: `initial_params` (checked, copied) or seeded ones.

  Seeded ones start from the target's embedding with `embedding_init`
  (`feature_head.embedding_aligned_params`).
  """
  if initial_params is None:
    params = feature_head.init_params(head_config, seed)
    if not embedding_init:
      return params
    tokens = jnp.arange(head_config.vocab_size)
    embedding = network.embed_tokens(target.config, target.params, tokens)
    return feature_head.embedding_aligned_params(head_config, params, embedding)
  feature_head.check_params(head_config, initial_params)
  return jax.tree.map(jnp.array, initial_params)  # A copy: the step donates its state.


def train_feature_head(
  model_dir: str,
  target: models.Model,
  head_config: feature_head.FeatureHeadConfig,
  inputs: np.ndarray,
  *,
  max_decode_len: int,
  batch_size: int,
  num_steps: int,
  unroll_steps: int = 3,
  decay: float = 0.8,
  feature_weight: float = 0.0,
  temperature: float = 1.0,
  topk: int = 0,
  topp: float = 0.0,
  data_temperatures: Sequence[float] = (0.0, 1.0),
  data_passes: int = 1,
  learning_rate: float = 3e-3,
  initial_params: Optional[PyTree] = None,
  embedding_init: bool = True,
  seed: int = 0,
  eval_inputs: Optional[np.ndarray] = None,
  eval_every: Optional[int] = None,
  checkpoint_every: int = 100,
  keep_checkpoints: Optional[int] = 2,
  log_every: int = 25,
  progress: bool = False,
) -> HeadTrainResult:
  """Trains (or resumes) a feature head for the frozen `target`; see the module docstring.

  Args:
    model_dir: the head's checkpoint directory; resumed if it has steps.
    target: the frozen target (encoder-decoder, or causal decoder-only).
    head_config: the head's config (`feature_head.config_for(target.config, ...)`).
    inputs: int [N, Lin] encoder inputs (decoder-only: prompts), 0-padded.
    max_decode_len: output tokens decoded per row.
    batch_size: rows per step.
    num_steps: the step to train to.
    unroll_steps: K, the training-time test's unrolled steps (>= 1).
    decay: the weight of step k is decay**k.
    feature_weight: the weight of the feature regression (0: none).
    temperature, topk, topp: the mode of the target's (and head's) standardized distributions.
    data_temperatures: the target's decoding temperatures, one per step in turn.
    data_passes: training steps per decoded batch (see the module docstring).
    learning_rate: Adam's.
    initial_params: the first step's head parameters (default `feature_head.init_params`,
      then `embedding_init`).
    embedding_init: without `initial_params`, start the head's token paths from the
      target's embedding (`feature_head.embedding_aligned_params`).
    seed: the data order, the samples and the default initial parameters.
    eval_inputs: int [M, Lin] held-out inputs; with `eval_every`, held-out metrics.
    eval_every: evaluate every this many steps (and at the end); None: never.
    checkpoint_every, keep_checkpoints, log_every, progress: as `train.Schedule`'s.
  """
  train.check_positive(
    batch_size=batch_size, max_decode_len=max_decode_len, data_passes=data_passes
  )
  schedule = train.Schedule(
    num_steps, checkpoint_every, keep_checkpoints, eval_every, log_every, progress
  )
  _check_head_training(target, data_temperatures, eval_every, eval_inputs)
  config = HeadLossConfig(
    head_config, target.config, unroll_steps, decay, feature_weight, temperature, topk, topp
  )
  compiled = _jitted(config, float(learning_rate))
  inputs = np.asarray(inputs, np.int32)
  settings = _recorded_settings(
    config,
    data_temperatures=list(data_temperatures),
    data_passes=data_passes,
    learning_rate=learning_rate,
    batch_size=batch_size,
    embedding_init=embedding_init and initial_params is None,
    seed=seed,
    num_inputs=len(inputs),
  )
  # Each step's data depends on the step alone, not on where the run starts.
  start = lambda start_step: _head_loop_steps(
    target,
    inputs,
    compiled,
    None if eval_every is None else np.asarray(eval_inputs, np.int32),
    batch_size=batch_size,
    seed=seed,
    data_temperatures=data_temperatures,
    max_decode_len=max_decode_len,
    data_passes=data_passes,
  )
  params, step, train_metrics, eval_metrics = train.resumable_loop(
    model_dir,
    schedule,
    config=target.config,
    optimizer=compiled.tx,
    initial_params=lambda: _first_head_params(
      head_config, initial_params, seed, target, embedding_init
    ),
    settings_file=SETTINGS_FILE,
    settings=settings,
    start=start,
    abstract_params=lambda: feature_head.abstract_params(head_config),
    job='speculative_t5x.training.train_feature_head',
  )
  return HeadTrainResult(params, step, train_metrics, eval_metrics)


# ------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------
def feature_layers_for(
  target_config: network.NetworkConfig, feature_layers: Union[None, str, Sequence[int]]
) -> Tuple[int, ...]:
  """The target decoder layers a head reads: None, the last (EAGLE-1); `FUSED`, EAGLE-3's.

  EAGLE-3 fuses a low, a middle and a top layer; here layers 0, L // 2 and
  L - 1 of the target's L (fewer where they coincide), ending at the last
  so that either output layer fits. A sequence is taken as given.
  """
  num_layers = network.num_decoder_layers(target_config)
  if feature_layers is None:
    return (num_layers - 1,)
  if isinstance(feature_layers, str):
    if feature_layers != FUSED:
      raise ValueError(
        f'feature_layers must be None (the last layer), {FUSED!r} (a low, a middle and the '
        f'top layer, EAGLE-3) or layer indices; got {feature_layers!r}.'
      )
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))
  return tuple(int(layer) for layer in feature_layers)


def train_on_task(
  model_dir: str,
  target: models.Model,
  task: Any,
  *,
  max_decode_len: int,
  num_examples: Optional[int] = None,
  eval_examples: int = 64,
  head_width: int = 256,
  head_layers: int = 1,
  head_num_heads: int = 4,
  head_dim: int = 32,
  head_mlp_dim: int = 512,
  head_output: str = 'own',
  feature_layers: Union[None, str, Sequence[int]] = None,
  eval_every: Optional[int] = 100,
  **training: Any,
) -> HeadTrainResult:
  """`train_feature_head` on a seqio task, the head given by its fields (the gin main's).

  The rows are the task's train split's inputs (the first `num_examples`;
  None: all), as the decode call takes them (`tasks.task_inputs`: a
  decoder-only target's are its prompts); the held-out rows are its
  validation split's first `eval_examples` (evaluated every `eval_every`
  steps; None: never). The head is `feature_head.config_for(target.config,
  feature_layers_for(...), emb_dim=head_width, num_layers=head_layers, ...)`:
  `head_output` 'own' (a narrow output layer of the head's) or 'target'
  (post-projection and the target's frozen logits layer). `training` are
  `train_feature_head`'s other keyword arguments (batch_size, num_steps,
  unroll_steps, ...).
  """
  from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top

  head_config = feature_head.config_for(
    target.config,
    feature_layers_for(target.config, feature_layers),
    emb_dim=head_width,
    num_layers=head_layers,
    num_heads=head_num_heads,
    head_dim=head_dim,
    mlp_dim=head_mlp_dim,
    output=head_output,
  )
  inputs, _ = tasks.task_inputs(task, 'train', num_examples=num_examples)
  eval_inputs = None
  if eval_every is not None:
    eval_inputs, _ = tasks.task_inputs(task, 'validation', num_examples=eval_examples)
  return train_feature_head(
    model_dir,
    target,
    head_config,
    inputs,
    max_decode_len=max_decode_len,
    eval_inputs=eval_inputs,
    eval_every=eval_every,
    **training,
  )


def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `train_on_task` (`gin_utils.run` has parsed the gin flags)."""
  from speculative_t5x.training import train_feature_head as lib  # pylint: disable=g-import-not-at-top

  gin_utils.run_configured(argv, lib.train_on_task, writes='model_dir')


if __name__ == '__main__':
  gin_utils.run(main)
