r"""Distilling a draft from its frozen target: a draft trained for a high alpha.

The paper's first future-work item is a draft trained to maximize
alpha = E[sum_x min(p, q)]; DistillSpec (Zhou et al., ICLR 2024) does it with
on-policy data and a choice of divergence. `distill` trains a draft network
against a frozen target network, with the training machinery of
`speculative_t5x.training.train` (optax, the orbax layout, resume after a kill,
metrics.jsonl, a progress bar).

Data. Each step takes a batch of inputs from the task's train split (seqio's
stream as in `train.get_dataset`, unpacked: one example a row) and picks the
batch's output sequences from one source, drawn with the probabilities of
`data_mix` from `(seed, step)`:
  'draft': sampled from the draft being trained, at the decoding mode
    (DistillSpec's finding: draft-generated data works best);
  'target': sampled from the target at the decoding mode;
  'ground_truth': the task's targets.
Sampling uses the project's baseline decoder (`models.make_decoder`), with
the PRNG key `fold_in(PRNGKey(seed), step)`. The target's greedy outputs
(temperature 0, source 'target') are decoded ahead, `GREEDY_CHUNK_STEPS`
steps' inputs in one batch (chunks aligned to the step count, the last one
padded, so a resumed run decodes the same batches), which costs a fraction
of decoding each step's 16 rows alone; and their loss needs no target call:
the target's standardized distribution at temperature 0 is the one-hot of its
argmax, which along its own greedy output is the output's next token.
With `data_passes` P > 1 the steps train on each chunk's sequences P times
over, in turn (training step s reads data step
`train.data_step(s, P, GREEDY_CHUNK_STEPS)`, its batch, source and key), so a
step costs 1/P of a decode: on the CPU, decoding the target's greedy outputs
costs several times the step itself. The draft's own samples are made from
the draft as it is at their step, so they are never reused (P = 1 with the
'draft' source).

Loss. At every real position of those sequences, a divergence between the
target's and the draft's standardized next-token distributions at the
decoding mode (`losses.DIVERGENCES`: forward or reverse KL, JSD[beta], TVD),
averaged over real tokens; `losses` defines them, with the greedy case, for
this loop and the T5X model class alike. The running alpha on the progress
bar is the mean beta of the standardized distributions on the step's
sequences.

Evaluation. Every `eval_every` steps and at the end: held-out alpha at each
of `eval_temperatures` on the target's own samples for the first
`eval_examples` inputs of the validation split (the prefixes speculative
decoding judges), with the standard error of per-sequence means; the target's
samples and distributions are computed once per run.

Checkpoints and determinism. `model_dir` holds the draft's 'params' and
'opt_state' in `train`'s layout (`train.checkpoint_manager`), metrics.jsonl
(training and held-out alpha records) and `SETTINGS_FILE` (the loss, decoding
mode, data mix and evaluation settings of the run); the run resumes
from the latest step (`train.resumable_loop`, the loop of `train`), skipping
the inputs already seen, and only with the recorded settings: a resumed run
with another divergence, temperature or any other of them is refused with an
error naming it. The sources and keys
depend only on (seed, step), so a killed and resumed run ends with the
parameters of an uninterrupted one, bit for bit, on the CPU. The first step
starts from `draft`'s parameters (a data-trained draft, or a random one:
`models.random_model`); the optimizer state starts fresh.

Command line (flags as in `gin_utils`; the pair file binds TARGET and DRAFT):

  python -m speculative_t5x.training.distill \
    --gin_file=configs/pairs/gettext_tiny.gin \
    --gin_file=configs/tasks/gettext_ende.gin \
    --gin_file=configs/runs/distill.gin \
    --gin.MODEL_DIR="'/tmp/distilled_draft'" \
    --gin.CHECKPOINT_PATH="'runs/demo/gettext_target'" \
    --gin.DRAFT_CHECKPOINT_PATH="'runs/demo/gettext_draft'" \
    --gin.CORPUS_DIR="'runs/demo/corpus'" \
    --gin.VOCABULARY="'runs/demo/vocabulary/spm_4000.model'"

Encoder-decoder pairs only: the functions take encoder-decoder
`models.Model`s. (Decoder-only networks decode and train, see `network` and
`train`, but distilling one is not implemented.)
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio

from speculative_t5x import acceptance
from speculative_t5x import gin_utils
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import run_settings
from speculative_t5x import sampling
from speculative_t5x import speculative_sampling
from speculative_t5x.data import tasks
from speculative_t5x.training import losses
from speculative_t5x.training import train

PyTree = Any

SOURCES = ('draft', 'target', 'ground_truth')
# Written into model_dir at the start: what the run distills for, with which data and loss.
SETTINGS_FILE = run_settings.DISTILL_SETTINGS_FILE
# Steps whose target greedy outputs are decoded in one batch (see the module docstring).
GREEDY_CHUNK_STEPS = 8


# ------------------------------------------------------------------------------
# The step.
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """What a distillation step computes (hashable: the jitted steps are cached by it).

  Attributes:
    target_config, draft_config: the two networks (same vocabulary).
    divergence: one of `losses.DIVERGENCES`.
    beta: the JSD's weight of p.
    temperature, topk, topp: the decoding mode of the standardized distributions.
  """

  target_config: network.T5Config
  draft_config: network.T5Config
  divergence: str
  beta: float
  temperature: float
  topk: int
  topp: float
  # Greedy only: p is the one-hot of the sequences' next tokens (the target's own greedy
  # outputs), so the step calls no target.
  teacher_from_sequences: bool = False


def make_distill_step(config: DistillConfig, optimizer: optax.GradientTransformation):
  """The (unjitted) step `(state, target_params, batch) -> (state, metric sums)`.

  `batch` holds int32 [B, Lin] 'encoder_input_tokens', int32 [B, L]
  'decoder_input_tokens' and 'decoder_target_tokens' (the sequences), and
  float32 [B, L] 'decoder_loss_weights' (1 at real positions). The sums
  (float32 scalars) are 'loss' and 'beta' (of the standardized
  distributions) summed over real positions, and their count 'weight'.
  """
  mode = dict(temperature=config.temperature, topk=config.topk, topp=config.topp)

  def step(state: train.TrainState, target_params: PyTree, batch):
    if config.teacher_from_sequences:  # One-hot logits: standardized, the one-hot itself.
      target_logits = jnp.where(
        jax.nn.one_hot(batch['decoder_target_tokens'], config.target_config.vocab_size) > 0,
        0.0,
        network.NEG_INF,
      )
    else:
      target_logits = network.compute_logits(config.target_config, target_params, batch)
    weights = batch['decoder_loss_weights'].astype(jnp.float32)
    num_tokens = jnp.maximum(jnp.sum(weights), 1.0)

    def objective(params):
      draft_logits = network.compute_logits(config.draft_config, params, batch)
      sums = losses.distillation_sums(
        target_logits,
        draft_logits,
        weights,
        divergence_name=config.divergence,
        beta=config.beta,
        **mode,
      )
      return sums['loss'] / num_tokens, sums

    grads, sums = jax.grad(objective, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums['weight'] = jnp.sum(weights)
    return train.TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return step


@functools.lru_cache(maxsize=8)
def _jitted_step(config: DistillConfig, optimizer, learning_rate) -> tuple:
  """(optax transformation, jitted step), cached for repeated runs in one process."""
  tx = optimizer(learning_rate)
  return tx, jax.jit(make_distill_step(config, tx), donate_argnums=0)


# ------------------------------------------------------------------------------
# Data.
# ------------------------------------------------------------------------------
def sequence_features(input_tokens: np.ndarray, sequences: np.ndarray) -> Dict[str, np.ndarray]:
  """The step's batch for output sequences [B, L] (tokens, EOS, zeros) of inputs [B, Lin]."""
  lengths = layouts.output_lengths(sequences)
  return {
    'encoder_input_tokens': np.asarray(input_tokens, np.int32),
    'decoder_input_tokens': layouts.shift_right(sequences).astype(np.int32),
    'decoder_target_tokens': np.asarray(sequences, np.int32),
    'decoder_loss_weights': (np.arange(sequences.shape[1])[None] < lengths[:, None]).astype(
      np.float32
    ),
  }


def validate_data_mix(data_mix: Mapping[str, float]) -> Tuple[Tuple[str, ...], np.ndarray]:
  """(sources, probabilities) of a data mix {source: weight >= 0}, weights normalized."""
  unknown = set(data_mix) - set(SOURCES)
  if unknown:
    raise ValueError(f'Unknown data sources {sorted(unknown)} in data_mix; use {SOURCES}.')
  weights = np.array([float(w) for w in data_mix.values()])
  if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
    raise ValueError(f'data_mix weights must be finite, >= 0 and not all 0, got {dict(data_mix)}.')
  return tuple(data_mix), weights / weights.sum()


def step_source(sources: Sequence[str], probabilities: np.ndarray, seed: int, step: int) -> str:
  """The data source of `step` (1-based), a function of (seed, step) alone."""
  return sources[np.random.default_rng((seed, step)).choice(len(sources), p=probabilities)]


def _chunk_start(step: int) -> int:
  """The first step (1-based) of the chunk of `GREEDY_CHUNK_STEPS` steps holding `step`."""
  return (step - 1) // GREEDY_CHUNK_STEPS * GREEDY_CHUNK_STEPS + 1


def _greedy_outputs(
  target: models.Model, inputs: Sequence[np.ndarray], max_decode_len: int
) -> List[np.ndarray]:
  """The target's greedy outputs for each of `inputs` ([B, Lin] each), decoded in one batch.

  The batch is padded to `GREEDY_CHUNK_STEPS` such arrays (repeating the first), so every
  chunk decodes at one shape: one compiled program, and the same outputs in every run.
  """
  rows = list(inputs) + [inputs[0]] * (GREEDY_CHUNK_STEPS - len(inputs))
  decode = models.make_decoder(target, None, max_decode_len=max_decode_len, temperature=0.0)
  outputs = np.asarray(decode(np.concatenate(rows), jax.random.PRNGKey(0)).tokens)
  return np.split(outputs, len(rows))[: len(inputs)]


# ------------------------------------------------------------------------------
# Held-out alpha.
# ------------------------------------------------------------------------------
@dataclasses.dataclass
class HeldOutSet:
  """The target's samples on held-out inputs at one temperature.

  Attributes:
    temperature: the decoding temperature (with the run's top-k / top-p).
    inputs: int32 [N, Lin] encoder inputs.
    features: `sequence_features` of the target's samples [N, L].
    target_probs: float32 [N, L, V], the target's standardized distributions.
  """

  temperature: float
  inputs: np.ndarray
  features: Dict[str, np.ndarray]
  target_probs: jax.Array


def held_out_set(
  target: models.Model,
  inputs: np.ndarray,
  *,
  temperature: float,
  topk: int,
  topp: float,
  max_decode_len: int,
  seed: int,
) -> HeldOutSet:
  """Samples the target on `inputs` [N, Lin] and keeps its distributions along the samples."""
  mode = dict(temperature=temperature, topk=topk, topp=topp)
  decode = models.make_decoder(target, None, max_decode_len=max_decode_len, **mode)
  outputs = np.asarray(decode(inputs, jax.random.PRNGKey(seed)).tokens)
  features = sequence_features(inputs, outputs)
  logits = acceptance.teacher_forced_logits(
    target.config, target.params, inputs, features['decoder_input_tokens']
  )
  return HeldOutSet(temperature, inputs, features, sampling.standardize(logits, **mode))


@functools.partial(jax.jit, static_argnames=('config', 'temperature', 'topk', 'topp'))
def _betas(config, params, features, target_probs, *, temperature, topk, topp):
  draft_probs = sampling.standardize(
    network.compute_logits(config, params, features), temperature, topk, topp
  )
  return speculative_sampling.lenient_acceptance_rate(target_probs, draft_probs)


def held_out_alpha(
  draft_config: network.T5Config, params: PyTree, held_out: HeldOutSet, *, topk: int, topp: float
) -> Tuple[float, float]:
  """(alpha, standard error of per-sequence means) of a draft on a `HeldOutSet`."""
  betas = np.asarray(
    _betas(
      draft_config,
      params,
      held_out.features,
      held_out.target_probs,
      temperature=held_out.temperature,
      topk=topk,
      topp=topp,
    )
  )
  weights = held_out.features['decoder_loss_weights']
  per_sequence = (betas * weights).sum(1) / weights.sum(1)
  alpha = float((betas * weights).sum() / weights.sum())
  return alpha, acceptance.standard_error(per_sequence)


def _validation_inputs(task, feature_lengths, num_examples: int) -> np.ndarray:
  dataset = train.get_dataset(task, 'validation', feature_lengths, num_examples, pack=False)
  batch = next(dataset.as_numpy_iterator())
  return batch['encoder_input_tokens']


def check_pair(target: models.Model, draft: models.Model) -> None:
  """Raises ValueError unless target and draft are encoder-decoders of one vocabulary."""
  if network.is_decoder_only(target.config) or network.is_decoder_only(draft.config):
    raise ValueError(
      'distill takes encoder-decoder pairs (network.T5Config); distilling a decoder-only '
      'pair is not implemented. Train the decoder-only draft with speculative_t5x.training.train.'
    )
  if target.vocab_size != draft.vocab_size:
    raise ValueError(
      f'The target has {target.vocab_size} ids and the draft {draft.vocab_size}: a draft '
      'is distilled into its target vocabulary; build it with the same vocab_size.'
    )


def _jitted_steps(config: DistillConfig, optimizer, learning_rate) -> tuple:
  """(optax transformation, jitted step, jitted step on the target's greedy outputs)."""
  greedy_config = dataclasses.replace(config, teacher_from_sequences=True)
  cached = functools.partial(train.cached_unless_unhashable, _jitted_step)
  tx, step_fn = cached(config, optimizer, learning_rate)
  _, greedy_step_fn = cached(greedy_config, optimizer, learning_rate)
  return tx, step_fn, greedy_step_fn


class StepSequences:
  """Each step's batch of output sequences (see the module docstring).

  Training step s reads data step d = `train.data_step(s, data_passes,
  GREEDY_CHUNK_STEPS)` (d = s with one pass): the batch of the task's train
  split that the seeded order puts at d, and d's source. With the target's
  greedy outputs among the sources, or more than one pass, the split is read
  a chunk of data steps at a time, from the first step of the chunk that
  holds step `start_step + 1`'s (a resumed run reads and decodes that chunk
  whole, as an uninterrupted one), and the sequences that do not depend on
  the draft are made once per chunk. Steps are 1-based and asked for in
  order.
  """

  def __init__(
    self,
    target: models.Model,
    draft_config: network.T5Config,
    task: seqio.Task,
    feature_lengths: Mapping[str, int],
    *,
    batch_size: int,
    num_steps: int,
    sources: Sequence[str],
    probabilities: np.ndarray,
    sample_mode: Mapping[str, Any],
    greedy_targets: bool,
    data_passes: int,
    seed: int,
    start_step: int,
  ):
    self._target, self._draft_config = target, draft_config
    self._num_steps, self._seed, self._passes = num_steps, seed, data_passes
    self._sources, self._probabilities = sources, probabilities
    self._sample_mode, self._greedy_targets = dict(sample_mode), greedy_targets
    self._max_decode_len = feature_lengths['targets']
    self._chunked = greedy_targets or data_passes > 1
    first = self._data_step(start_step + 1)
    self._batches = train.get_dataset(
      task,
      'train',
      feature_lengths,
      batch_size,
      pack=False,
      shuffle=True,
      seed=seed,
      repeat=True,
      skip_batches=(_chunk_start(first) if self._chunked else first) - 1,
    ).as_numpy_iterator()
    self._key = jax.random.PRNGKey(seed)
    # Chunked: the current chunk's {data step: (batch, sequences [B, L])}; the sequences are
    # None for the draft's samples, which are made at their step.
    self._chunk = {}

  def _data_step(self, step: int) -> int:
    return train.data_step(step, self._passes, GREEDY_CHUNK_STEPS)

  def _source(self, data_step: int) -> str:
    return step_source(self._sources, self._probabilities, self._seed, data_step)

  def features(self, step: int, draft_params: PyTree) -> Tuple[str, Dict[str, np.ndarray]]:
    """(the step's source, `sequence_features` of its batch's inputs and sequences).

    The draft's samples come from `draft_params`, the draft as it is at this step.
    """
    data = self._data_step(step)
    source = self._source(data)
    if self._chunked:
      if data not in self._chunk:
        self._read_chunk(data)
      batch, sequences = self._chunk[data]
    else:
      batch, sequences = next(self._batches), None
    if sequences is None:
      sequences = self._sampled_or_given(source, data, batch, draft_params)
    return source, sequence_features(batch['encoder_input_tokens'], sequences)

  def _sampled_or_given(self, source: str, data: int, batch, draft_params) -> np.ndarray:
    """Data step `data`'s sequences [B, L]: the task's targets, or samples from `source`."""
    if source == 'ground_truth':
      return batch['decoder_target_tokens']
    model = self._target if source == 'target' else models.Model(self._draft_config, draft_params)
    decode = models.make_decoder(
      model, None, max_decode_len=self._max_decode_len, **self._sample_mode
    )
    return np.asarray(
      decode(batch['encoder_input_tokens'], jax.random.fold_in(self._key, data)).tokens
    )

  def _read_chunk(self, data: int) -> None:
    """Reads the batches of `data`'s chunk of data steps (those some step up to `num_steps` reads).

    The target's greedy outputs for the chunk's 'target' steps are decoded in
    one batch (`_greedy_outputs`); its samples and the task's targets are
    taken per step; the draft's samples are left to their training step.
    """
    first = _chunk_start(data)
    first_training_step = (first - 1) * self._passes + 1
    last = first + min(GREEDY_CHUNK_STEPS, self._num_steps - first_training_step + 1) - 1
    batches = {s: next(self._batches) for s in range(first, last + 1)}
    greedy = [s for s in batches if self._greedy_targets and self._source(s) == 'target']
    outputs = {}
    if greedy:
      rows = [batches[s]['encoder_input_tokens'] for s in greedy]
      outputs = dict(zip(greedy, _greedy_outputs(self._target, rows, self._max_decode_len)))
    self._chunk = {}
    for s, batch in batches.items():
      source = self._source(s)
      if s in outputs:
        self._chunk[s] = (batch, outputs[s])
      elif source == 'draft':
        self._chunk[s] = (batch, None)
      else:
        self._chunk[s] = (batch, self._sampled_or_given(source, s, batch, None))


def _loop_steps(
  sequences: StepSequences,
  held_out_sets: Sequence[HeldOutSet],
  target: models.Model,
  draft_config: network.T5Config,
  step_fns: Tuple[Callable, Optional[Callable]],
  *,
  topk: int,
  topp: float,
) -> train.LoopSteps:
  """`distill`'s step, interval summary, progress postfix and held-out evaluation.

  `step_fns`: the jitted step, and the one for the target's greedy outputs
  (None unless those are a source), which calls no target.
  """
  step_fn, greedy_step_fn = step_fns
  used = {}  # Steps per source in the logging interval.

  def step(state: train.TrainState, step: int):
    source, features = sequences.features(step, state.params)
    used[source] = used.get(source, 0) + 1
    fn = greedy_step_fn if source == 'target' and greedy_step_fn is not None else step_fn
    state, sums = fn(state, target.params, features)
    return state, sums, sums['weight']

  def summary(totals: Mapping[str, Any], step: int) -> Dict[str, Any]:
    weight = max(float(totals['weight']), 1.0)
    record = {
      'loss': float(totals['loss']) / weight,
      'alpha': float(totals['beta']) / weight,
      'sources': dict(used),
    }
    used.clear()
    return record

  def evaluate(params: PyTree) -> Dict[str, float]:
    record = {}
    for held_out in held_out_sets:
      alpha, stderr = held_out_alpha(draft_config, params, held_out, topk=topk, topp=topp)
      record[alpha_key(held_out.temperature)] = alpha
      record[alpha_key(held_out.temperature) + '_stderr'] = stderr
    return record

  postfix = lambda record: dict(loss=f'{record["loss"]:.3f}', alpha=f'{record["alpha"]:.3f}')
  return train.LoopSteps(
    step,
    summary,
    postfix,
    evaluate if held_out_sets else None,
    evaluate_at_start=True,  # The starting draft's alpha: the curve's first point.
  )


# ------------------------------------------------------------------------------
# Distillation.
# ------------------------------------------------------------------------------
@dataclasses.dataclass
class DistillResult:
  """What `distill` returns.

  Attributes:
    params: the draft's final parameters (T5X tree, float32 jax arrays).
    step: the final step.
    train_metrics: per logging interval, {'step', 'loss' (per real token),
      'alpha' (mean beta on the training sequences), 'sources' ({source:
      steps}), 'tokens' (real sequence tokens), 'tokens_per_second' (of
      those, after the run's first step), 'seconds'}.
    eval_metrics: per evaluation, {'step', 'alpha_T<t>' and 'alpha_T<t>_stderr'
      per evaluation temperature t, 'seconds'}.
  """

  params: PyTree
  step: int
  train_metrics: List[Dict[str, Any]]
  eval_metrics: List[Dict[str, Any]]


def alpha_key(temperature: float) -> str:
  """The name of held-out alpha at this temperature in the evaluation records."""
  return f'alpha_T{temperature:g}'


def _start_distillation_data(
  target: models.Model,
  draft_config: network.NetworkConfig,
  task: seqio.Task,
  feature_lengths: Mapping[str, int],
  start_step: int,
  *,
  step_fns: Tuple[Callable, Optional[Callable]],
  batch_size: int,
  num_steps: int,
  sources: Sequence[str],
  probabilities: np.ndarray,
  sample_mode: Mapping[str, Any],
  greedy_targets: bool,
  data_passes: int,
  seed: int,
  held_out: Optional[Tuple[int, Sequence[float]]],
) -> train.LoopSteps:
  """`distill`'s `train.resumable_loop` start: the step sequences from `start_step`.

  `held_out`: (validation examples, temperatures) of the held-out alpha
  sets, sampled from the target in `sample_mode`'s top-k / top-p; None: no
  evaluation. `step_fns`: the step and the greedy-targets step (or None).
  The rest are `StepSequences`'s.
  """
  top = dict(topk=sample_mode['topk'], topp=sample_mode['topp'])
  held_out_sets = []
  if held_out is not None:
    eval_examples, eval_temperatures = held_out
    inputs = _validation_inputs(task, feature_lengths, eval_examples)
    max_decode_len = feature_lengths['targets']
    held_out_sets = [
      held_out_set(target, inputs, temperature=t, max_decode_len=max_decode_len, seed=seed, **top)
      for t in eval_temperatures
    ]
  sequences = StepSequences(
    target,
    draft_config,
    task,
    feature_lengths,
    batch_size=batch_size,
    num_steps=num_steps,
    sources=sources,
    probabilities=probabilities,
    sample_mode=sample_mode,
    greedy_targets=greedy_targets,
    data_passes=data_passes,
    seed=seed,
    start_step=start_step,
  )
  return _loop_steps(sequences, held_out_sets, target, draft_config, step_fns, **top)


def distill(
  model_dir: str,
  target: models.Model,
  draft: models.Model,
  task: Union[str, seqio.Task],
  *,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  num_steps: int,
  divergence: str = 'tvd',
  beta: float = 0.5,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  data_mix: Optional[Mapping[str, float]] = None,
  data_passes: int = 1,
  learning_rate: optax.ScalarOrSchedule = 0.01,
  optimizer=optax.adafactor,
  seed: int = 0,
  checkpoint_every: int = 100,
  keep_checkpoints: Optional[int] = 2,
  eval_every: Optional[int] = 100,
  eval_examples: int = 128,
  eval_temperatures: Sequence[float] = (0.0, 1.0),
  log_every: int = 25,
  progress: bool = True,
  after_step: Optional[Callable[[int], None]] = None,
) -> DistillResult:
  """Distills `draft` from the frozen `target` (or resumes); see the module docstring.

  Args:
    model_dir: the distilled draft's checkpoint directory; resumed if it has steps.
    target: the frozen target.
    draft: the draft to start from (its parameters are the first step's).
    task: a seqio task name or `seqio.Task` with 'inputs' and 'targets'
      features and a 'train' (and, to evaluate, 'validation') split.
    feature_lengths: {'inputs': Lin, 'targets': L}; L is also the length of
      the sampled sequences.
    batch_size: rows per step.
    num_steps: the step to distill to.
    divergence: one of `losses.DIVERGENCES`.
    beta: the JSD's weight of p.
    temperature, topk, topp: the decoding mode the draft is distilled for.
    data_mix: {source: weight} over `SOURCES`; None is {'draft': 1.0}.
    data_passes: training steps per data step's sequences (see the module
      docstring); above 1 only without the 'draft' source.
    learning_rate: a float or an optax schedule.
    optimizer: called as `optimizer(learning_rate)`; default Adafactor.
    seed: seeds the data order, the sources and the samples.
    checkpoint_every: save every this many steps (and at `num_steps`).
    keep_checkpoints: orbax's `max_to_keep` (None keeps all).
    eval_every: held-out alpha every this many steps and at the end; None never.
    eval_examples: validation inputs of the held-out alpha.
    eval_temperatures: temperatures of the held-out alpha (the run's top-k / top-p).
    log_every: steps per logged (and progress bar) metrics line.
    progress: show a tqdm progress bar.
    after_step: called with each step's number (`train.Schedule`).

  Returns:
    A `DistillResult`.
  """
  train.check_positive(batch_size=batch_size, eval_examples=eval_examples, data_passes=data_passes)
  schedule = train.Schedule(
    num_steps, checkpoint_every, keep_checkpoints, eval_every, log_every, progress, after_step
  )
  losses.validate_divergence(divergence, beta)
  for t in (temperature, *eval_temperatures):
    sampling.validate_sampling_args(t, topk, topp)
  sources, probabilities = validate_data_mix({'draft': 1.0} if data_mix is None else data_mix)
  mix = dict(zip(sources, probabilities.tolist()))
  if data_passes > 1 and mix.get('draft', 0.0) > 0:
    raise ValueError(
      f'data_passes {data_passes} trains on each batch of sequences {data_passes} times, but '
      f'the data mix {mix} samples from the draft, whose samples follow it as it '
      f"trains (on-policy): use data_passes = 1, or the 'target' and 'ground_truth' sources."
    )
  check_pair(target, draft)
  task = train.check_task(task, draft.config, feature_lengths, evaluate=eval_every is not None)
  tasks.hide_gpus_from_tensorflow()
  config = DistillConfig(
    target.config, draft.config, divergence, float(beta), float(temperature), int(topk), float(topp)
  )
  tx, step_fn, greedy_step_fn = _jitted_steps(config, optimizer, learning_rate)
  greedy_targets = sampling.is_greedy(temperature) and 'target' in sources
  settings = dict(
    divergence=divergence,
    beta=beta,
    temperature=temperature,
    topk=topk,
    topp=topp,
    data_mix=mix,
    data_passes=data_passes,
    batch_size=batch_size,
    seed=seed,
    eval_examples=eval_examples,
    eval_temperatures=list(eval_temperatures),
  )

  start = functools.partial(
    _start_distillation_data,
    target,
    draft.config,
    task,
    feature_lengths,
    step_fns=(step_fn, greedy_step_fn if greedy_targets else None),
    batch_size=batch_size,
    num_steps=num_steps,
    sources=sources,
    probabilities=probabilities,
    sample_mode=dict(temperature=temperature, topk=topk, topp=topp),
    greedy_targets=greedy_targets,
    data_passes=data_passes,
    seed=seed,
    held_out=None if eval_every is None else (eval_examples, eval_temperatures),
  )
  params, step, train_metrics, eval_metrics = train.resumable_loop(
    model_dir,
    schedule,
    config=draft.config,
    optimizer=tx,
    # A copy: the step donates its state.
    initial_params=lambda: jax.tree.map(jnp.array, draft.params),
    settings_file=SETTINGS_FILE,
    settings=settings,
    start=start,
    job='speculative_t5x.training.distill',
  )
  return DistillResult(params, step, train_metrics, eval_metrics)


# ------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------
def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `distill` (`gin_utils.run` has parsed the gin flags)."""
  from speculative_t5x.training import distill as distill_lib  # pylint: disable=g-import-not-at-top

  gin_utils.run_configured(argv, distill_lib.distill, writes='model_dir')


if __name__ == '__main__':
  gin_utils.run(main)
