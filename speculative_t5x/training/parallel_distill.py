r"""Adapting a draft to mask tokens: a parallel draft (PARD) distilled from its frozen target.

A `parallel_draft.ParallelDraft` reads q_k, the distribution of the token k
places after the last true token t, at the (k-1)-th mask after t. Training
teaches the network and the mask vector that: at every predicted position
of a sequence, a divergence between the target's standardized next-token
distribution there (the loss `distill` uses, `losses.distillation_sums`, at
the decoding mode) and the draft's q_k read from the prefix up to t followed
by k - 1 masks.

Conditional drop-token (COD, PARD's). Predicting every position at every
depth k = 1..K costs K copies of the sequence. COD keeps, per row, the
sequence itself (depth 1: the ordinary next-token pass) and for each depth
k >= 2 the masks of only n_k = ceil(L keep^(k-1)) anchors t: the first n_k
of one random order of the row's anchors (those with a real token after
them first), so an anchor kept at depth k is kept at every depth below it,
whose masks its own mask reads. One pass over L (1 + keep + keep^2 + ...)
tokens (`cod_layout`, `network.compute_layout_logits`): the mask of depth k
and anchor t sits at position t + k - 1 and attends to the true tokens up to
t and to its anchor's masks of depths 2..k. The order is drawn from
`fold_in(PRNGKey(seed), step)`, so a resumed run lays out each step as an
uninterrupted one.

Weights. Each predicted position has its real-token weight, times
`depth_weights[k - 1]` (default 1 for every depth); with
`acceptance_weighting` (PARD-2's acceptance-aligned weighting) also times the
probability that speculative decoding reaches depth k from that anchor,
prod_{j < k} beta_j (the acceptance probabilities sum_x min(p, q) of the
anchor's shallower predictions, without gradient): a position the verifier
rarely reaches weighs little.

Data and machinery are `distill`'s: the batches of the task's train split,
each step's sequences from the data mix ('draft': the draft network's own
autoregressive samples at the decoding mode; 'target'; 'ground_truth'), the
target's greedy outputs decoded ahead in chunks (whose one-hot teacher needs
no target call), `train.resumable_loop` (checkpoints, metrics.jsonl, resume
after a kill, refused with other settings). Encoder-decoder pairs only, as
`distill`. No held-out evaluation: the training records carry each depth's
mean beta ('alpha_depth<k>').

Checkpoint format. `model_dir` holds `train`'s layout with `params` =
{'network': the draft network's T5X tree, 'mask_embedding': float32 [emb]},
and `SETTINGS_FILE` (the run's settings with the draft's 'network' and
'config'); `load_parallel_draft(model_dir)` reads it back as a
`ParallelDraft`. The first step starts from `draft` (a distilled draft, a
data-trained one or a random one) with the mask vector `mask_embedding`
(default: the mean token embedding).

Command line (flags as in `gin_utils`; the pair file binds TARGET and DRAFT):

  python -m speculative_t5x.training.parallel_distill \
    --gin_file=configs/pairs/gettext_tiny.gin \
    --gin_file=configs/tasks/gettext_ende.gin \
    --gin_file=configs/runs/parallel_distill.gin \
    --gin.MODEL_DIR="'/tmp/parallel_draft'" \
    --gin.CHECKPOINT_PATH="'runs/demo/gettext_target'" \
    --gin.DRAFT_CHECKPOINT_PATH="'runs/demo/gettext_draft_forward_kl_T0'" \
    --gin.CORPUS_DIR="'runs/demo/corpus'" \
    --gin.VOCABULARY="'runs/demo/vocabulary/spm_4000.model'"
"""

import dataclasses
import functools
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio

from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import run_settings
from speculative_t5x import sampling
from speculative_t5x.data import tasks
from speculative_t5x.training import distill
from speculative_t5x.training import losses
from speculative_t5x.training import train

PyTree = Any
Array = jax.Array

SETTINGS_FILE = run_settings.PARALLEL_DRAFT_SETTINGS_FILE
# What `network.compute_layout_logits` reads of a `cod_layout`.
LAYOUT_FEATURES = ('decoder_input_tokens', 'decoder_positions', 'decoder_visible', 'decoder_masked')


# ------------------------------------------------------------------------------
# The conditional drop-token layout.
# ------------------------------------------------------------------------------
def depth_counts(length: int, depth: int, keep: float) -> Tuple[int, ...]:
  """(n_1 = L, n_2, ..., n_K): anchors per depth, n_k = ceil(L keep^(k-1)) (COD)."""
  return tuple(
    max(1, min(length, math.ceil(length * keep ** (k - 1)))) for k in range(1, depth + 1)
  )


def cod_layout(
  decoder_input_tokens: Array, loss_weights: Array, key: Array, *, depth: int, keep: float
) -> Dict[str, Array]:
  """The one-pass layout of a batch: the sequence, then each depth's kept masks.

  Args:
    decoder_input_tokens: int32 [B, L], the sequences shifted right (BOS first).
    loss_weights: float32 [B, L], 1 at real target positions.
    key: PRNG key of the anchors' order.
    depth: K, the deepest prediction (the gamma the draft is trained for).
    keep: COD's rate in (0, 1]; 1 keeps every anchor at every depth.

  Returns:
    `network.compute_layout_logits`'s decoder features for T = sum n_k tokens
    ('decoder_input_tokens', 'decoder_positions', 'decoder_visible',
    'decoder_masked'), and int32 [B, T] 'anchor' (the last true position
    each token reads: t), int32 [B, T] 'predicted' (the sequence position
    whose target it predicts: t + k - 1, clipped to L - 1) and float32
    [B, T] 'weights' (that target's real-token weight, 0 past the sequence).
    Depth k's tokens are columns sum_{j<k} n_j onwards, depth 1's in
    sequence order, a deeper depth's anchors the first n_k of the row's order.
  """
  batch, length = decoder_input_tokens.shape
  counts = depth_counts(length, depth, keep)
  # One random order of the anchors per row, those with a real next target first.
  noise = jax.random.uniform(key, (batch, length))
  order = jnp.argsort(jnp.where(loss_weights > 0, noise, 1.0 + noise), axis=1).astype(jnp.int32)
  sequence_order = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  anchor = jnp.concatenate([sequence_order] + [order[:, :n] for n in counts[1:]], axis=1)
  depths = np.concatenate([np.full(n, k + 1) for k, n in enumerate(counts)])  # [T]
  slots = np.concatenate([np.arange(n) for n in counts])  # [T]: the anchor's rank in depth k.
  true_token = depths == 1
  # A true key is visible at or before the query's anchor; a mask key only to a mask query
  # of its own anchor (the same slot) at its depth or deeper.
  mask_visible = (slots[None, :] == slots[:, None]) & (depths[None, :] <= depths[:, None])
  mask_visible &= ~true_token[:, None]
  visible = jnp.where(
    jnp.asarray(true_token)[None, None, :],
    anchor[:, None, :] <= anchor[:, :, None],
    jnp.asarray(mask_visible)[None],
  )
  positions = anchor + jnp.asarray(depths - 1, jnp.int32)[None]
  tokens = jnp.take_along_axis(decoder_input_tokens, anchor, axis=1)
  predicted = jnp.minimum(positions, length - 1)
  weights = jnp.take_along_axis(loss_weights.astype(jnp.float32), predicted, axis=1)
  return {
    'decoder_input_tokens': jnp.where(jnp.asarray(true_token)[None], tokens, 0).astype(jnp.int32),
    'decoder_positions': positions,
    'decoder_visible': visible,
    'decoder_masked': jnp.broadcast_to(jnp.asarray(~true_token)[None], tokens.shape),
    'anchor': anchor,
    'predicted': predicted,
    'weights': jnp.where(positions >= length, 0.0, weights),
  }


def reach_probabilities(betas: Array, anchor: Array, counts: Sequence[int]) -> Array:
  """float32 [B, T]: the probability of reaching each prediction, prod_{j < k} beta_j of its anchor.

  `betas` [B, T] are the layout's per-token acceptance probabilities,
  `anchor` and `counts` (n_1..n_K) `cod_layout`'s: depth 1 is always
  reached; the depth-k token of slot s reads beta_1 at its anchor's
  sequence position and beta_j (1 < j < k) at slot s of depth j.
  """
  length = counts[0]
  pieces, reach, start, previous = [jnp.ones_like(betas[:, :length])], None, length, None
  for n in counts[1:]:
    if reach is None:  # Depth 2: beta_1 of the anchor.
      reach = jnp.take_along_axis(betas[:, :length], anchor[:, start : start + n], axis=1)
    else:
      reach = reach[:, :n] * betas[:, previous : previous + n]
    pieces.append(reach)
    previous, start = start, start + n
  return jnp.concatenate(pieces, axis=1)


# ------------------------------------------------------------------------------
# The step.
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ParallelDistillConfig:
  """What a step computes (hashable: the jitted steps are cached by it).

  Attributes:
    target_config, draft_config: the two networks (same vocabulary, same
      architecture; `parallel_distill` runs encoder-decoder pairs, T5X's
      trainer decoder-only ones too).
    divergence, beta, temperature, topk, topp: as `distill.DistillConfig`'s.
    depth: K, the deepest prediction (the gamma the draft is adapted for).
    keep: COD's rate (see the module docstring).
    depth_weights: K weights, one per depth.
    acceptance_weighting: weight each prediction by its reach probability.
    teacher_from_sequences: greedy only: the teacher is the one-hot of the
      sequences' next tokens (the target's own greedy outputs; no target call).
  """

  target_config: network.NetworkConfig
  draft_config: network.NetworkConfig
  divergence: str
  beta: float
  temperature: float
  topk: int
  topp: float
  depth: int
  keep: float
  depth_weights: Tuple[float, ...]
  acceptance_weighting: bool
  teacher_from_sequences: bool = False


def layout_sums(
  config: ParallelDistillConfig,
  params: PyTree,
  teacher: Array,
  batch: Mapping[str, Array],
  key: Array,
) -> Dict[str, Array]:
  """The loss of one batch: the draft's layout predictions held to the target's (see the module docstring).

  The one implementation of the loss, which `make_step` and the T5X model
  class (`t5x_models`, configs/t5x/distill_parallel_draft.gin) minimize.

  Args:
    config: the step's settings (`teacher_from_sequences` is not read here).
    params: the parallel draft's {'network': T5X tree, 'mask_embedding': [emb]}.
    teacher: float32 [B, L, V], the target's logits at the sequence positions
      (under stop_gradient).
    batch: int32 [B, L] 'decoder_input_tokens' (shifted right), float32 [B, L]
      'decoder_loss_weights' (1 at real targets) and, for an encoder-decoder
      draft, int32 [B, Lin] 'encoder_input_tokens'.
    key: PRNG key of the anchors' order (`cod_layout`).

  Returns:
    float32 scalars: 'loss' (the weighted sum of the divergence) and 'weight'
    (its weight), and per depth k 'beta_depth<k>' and 'tokens_depth<k>' (the
    acceptance probability sum_x min(p, q) summed over real predicted
    positions, without gradient, and their count).
  """
  mode = dict(temperature=config.temperature, topk=config.topk, topp=config.topp)
  real = batch['decoder_loss_weights'].astype(jnp.float32)
  layout = cod_layout(
    batch['decoder_input_tokens'], real, key, depth=config.depth, keep=config.keep
  )
  counts = depth_counts(real.shape[1], config.depth, config.keep)
  teacher = jnp.take_along_axis(teacher, layout['predicted'][:, :, None], axis=1)  # [B, T, V]
  depth_weight = np.concatenate(
    [np.full(n, w, np.float32) for n, w in zip(counts, config.depth_weights)]
  )
  features = {name: layout[name] for name in LAYOUT_FEATURES}
  if not network.is_decoder_only(config.draft_config):
    features['encoder_input_tokens'] = batch['encoder_input_tokens']
  draft_logits = network.compute_layout_logits(
    config.draft_config, params['network'], params['mask_embedding'], features
  )
  betas = jax.lax.stop_gradient(losses.acceptance_rates(teacher, draft_logits, **mode))
  weights = layout['weights'] * jnp.asarray(depth_weight)[None]
  if config.acceptance_weighting:
    weights = weights * reach_probabilities(betas, layout['anchor'], counts)
  sums = losses.distillation_sums(
    teacher, draft_logits, weights, divergence_name=config.divergence, beta=config.beta, **mode
  )
  result = {'loss': sums['loss'], 'weight': jnp.sum(weights)}
  start = 0
  for k, n in enumerate(counts, start=1):
    real_k = layout['weights'][:, start : start + n]
    result[f'beta_depth{k}'] = jnp.sum(betas[:, start : start + n] * real_k)
    result[f'tokens_depth{k}'] = jnp.sum(real_k)
    start += n
  return result


def make_step(config: ParallelDistillConfig, optimizer: optax.GradientTransformation):
  """The (unjitted) step `(state, target_params, batch, key) -> (state, metric sums)`.

  `batch` is `distill.sequence_features`'s; `key` lays out its masks
  (`cod_layout`). `state.params` is {'network': ..., 'mask_embedding': [emb]}.
  The sums are `layout_sums`', whose loss per unit of weight is minimized.
  """
  vocab_size = config.target_config.vocab_size

  def step(state: train.TrainState, target_params: PyTree, batch, key):
    if config.teacher_from_sequences:  # One-hot logits: standardized, the one-hot itself.
      one_hot = jax.nn.one_hot(batch['decoder_target_tokens'], vocab_size)
      teacher = jnp.where(one_hot > 0, 0.0, network.NEG_INF)
    else:
      teacher = network.compute_logits(config.target_config, target_params, batch)
    teacher = jax.lax.stop_gradient(teacher)

    def objective(params):
      sums = layout_sums(config, params, teacher, batch, key)
      return sums['loss'] / jnp.maximum(sums['weight'], 1e-6), sums

    grads, sums = jax.grad(objective, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return train.TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return step


@functools.lru_cache(maxsize=8)
def _jitted_step(config: ParallelDistillConfig, optimizer, learning_rate) -> tuple:
  """(optax transformation, jitted step), cached for repeated runs in one process."""
  tx = optimizer(learning_rate)
  return tx, jax.jit(make_step(config, tx), donate_argnums=0)


def _jitted_steps(config: ParallelDistillConfig, optimizer, learning_rate) -> tuple:
  """(optax transformation, jitted step, jitted step on the target's greedy outputs)."""
  greedy_config = dataclasses.replace(config, teacher_from_sequences=True)
  cached = functools.partial(train.cached_unless_unhashable, _jitted_step)
  tx, step_fn = cached(config, optimizer, learning_rate)
  _, greedy_step_fn = cached(greedy_config, optimizer, learning_rate)
  return tx, step_fn, greedy_step_fn


# ------------------------------------------------------------------------------
# The run.
# ------------------------------------------------------------------------------
def _loop_steps(
  sequences: Any,
  target: models.Model,
  step_fns: Tuple[Callable, Optional[Callable]],
  depth: int,
  seed: int,
) -> train.LoopSteps:
  """The run's step, interval summary and progress postfix (no evaluation).

  `sequences`: `distill`'s step sequences; `step_fns`: the jitted step, and
  the one for the target's greedy outputs (None unless those are a source).
  """
  step_fn, greedy_step_fn = step_fns
  key = jax.random.PRNGKey(seed)

  def step(state: train.TrainState, step: int):
    source, features = sequences.features(step, state.params['network'])
    fn = greedy_step_fn if source == 'target' and greedy_step_fn is not None else step_fn
    state, sums = fn(state, target.params, features, jax.random.fold_in(key, step))
    return state, sums, sums['tokens_depth1']

  def summary(totals: Mapping[str, Any], step: int) -> Dict[str, Any]:
    del step
    record = {'loss': float(totals['loss']) / max(float(totals['weight']), 1e-6)}
    for k in range(1, depth + 1):
      tokens = max(float(totals[f'tokens_depth{k}']), 1.0)
      record[f'alpha_depth{k}'] = float(totals[f'beta_depth{k}']) / tokens
    return record

  postfix = lambda record: {
    'loss': f'{record["loss"]:.3f}',
    **{f'a{k}': f'{record[f"alpha_depth{k}"]:.2f}' for k in range(1, depth + 1)},
  }
  return train.LoopSteps(step, summary, postfix, None)


@dataclasses.dataclass
class ParallelDistillResult:
  """What `parallel_distill` returns.

  Attributes:
    draft: the final `parallel_draft.ParallelDraft` (float32 parameters).
    step: the final step.
    train_metrics: per logging interval, {'step', 'loss' (per unit of
      weight), 'alpha_depth<k>' for k = 1..depth (the mean beta of depth k's
      predictions on the training sequences), 'tokens', 'tokens_per_second',
      'seconds'}.
  """

  draft: parallel_draft.ParallelDraft
  step: int
  train_metrics: List[Dict[str, Any]]


def loss_config(
  target_config: network.NetworkConfig,
  draft_config: network.NetworkConfig,
  *,
  depth: int,
  keep: float,
  depth_weights: Optional[Sequence[float]],
  acceptance_weighting: bool,
  divergence: str,
  beta: float,
  temperature: float,
  topk: int,
  topp: float,
) -> ParallelDistillConfig:
  """The checked `ParallelDistillConfig` of a run's loss settings (`parallel_distill`'s arguments).

  Raises ValueError naming the setting for a depth < 1, a keep outside
  (0, 1], depth_weights that are not `depth` finite weights >= 0 (not all
  0), an unknown divergence or invalid sampling settings.
  """
  train.check_positive(depth=depth)
  if not 0.0 < keep <= 1.0:
    raise ValueError(f'keep is the rate of kept anchors per depth, in (0, 1]; got {keep}.')
  if depth_weights is None:
    weights = (1.0,) * depth
  else:
    weights = tuple(float(w) for w in depth_weights)
    if (
      len(weights) != depth or not all(np.isfinite(weights)) or min(weights) < 0 or not any(weights)
    ):
      raise ValueError(
        f'depth_weights must be {depth} finite weights >= 0 (one per depth), not all 0; got '
        f'{list(depth_weights)}. Pass None for equal weights.'
      )
  losses.validate_divergence(divergence, beta)
  sampling.validate_sampling_args(temperature, topk, topp)
  return ParallelDistillConfig(
    target_config,
    draft_config,
    divergence,
    float(beta),
    float(temperature),
    int(topk),
    float(topp),
    int(depth),
    float(keep),
    weights,
    bool(acceptance_weighting),
  )


def recorded_settings(config: ParallelDistillConfig) -> Dict[str, Any]:
  """The settings a run records and a resumed run must repeat: the draft network and the loss.

  `parallel_distill` adds its data's; T5X's trainer (`t5x_models`) records these.
  """
  return dict(
    network=type(config.draft_config).__name__,
    config=run_settings.jsonable_config(config.draft_config),
    depth=config.depth,
    keep=config.keep,
    depth_weights=list(config.depth_weights),
    acceptance_weighting=config.acceptance_weighting,
    divergence=config.divergence,
    beta=config.beta,
    temperature=config.temperature,
    topk=config.topk,
    topp=config.topp,
  )


def parallel_distill(
  model_dir: str,
  target: models.Model,
  draft: models.Model,
  task: Union[str, seqio.Task],
  *,
  feature_lengths: Mapping[str, int],
  batch_size: int,
  num_steps: int,
  depth: int = 4,
  keep: float = 0.5,
  depth_weights: Optional[Sequence[float]] = None,
  acceptance_weighting: bool = False,
  mask_embedding: Optional[Any] = None,
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
  log_every: int = 25,
  progress: bool = True,
  after_step: Optional[Callable[[int], None]] = None,
) -> ParallelDistillResult:
  """Adapts `draft` to mask tokens against the frozen `target` (or resumes); see the module docstring.

  Args:
    model_dir: the parallel draft's checkpoint directory; resumed if it has steps.
    target: the frozen target.
    draft: the draft network to start from (a distilled draft, or
      `models.random_model` from scratch).
    task, feature_lengths, batch_size, num_steps, divergence, beta,
      temperature, topk, topp, data_mix, data_passes, learning_rate,
      optimizer, seed, checkpoint_every, keep_checkpoints, log_every,
      progress, after_step: as `distill.distill`'s.
    depth: K >= 1, the deepest prediction: decode with gamma <= K.
    keep: COD's rate in (0, 1] (1: every anchor at every depth).
    depth_weights: K weights >= 0, one per depth; None: all 1.
    acceptance_weighting: also weight each prediction by the probability
      that verification reaches it (PARD-2 style; see the module docstring).
    mask_embedding: the first step's mask vector float [emb]; None: the
      mean of `draft`'s token embeddings.

  Returns:
    A `ParallelDistillResult`.
  """
  train.check_positive(batch_size=batch_size, data_passes=data_passes)
  config = loss_config(
    target.config,
    draft.config,
    depth=depth,
    keep=keep,
    depth_weights=depth_weights,
    acceptance_weighting=acceptance_weighting,
    divergence=divergence,
    beta=beta,
    temperature=temperature,
    topk=topk,
    topp=topp,
  )
  schedule = train.Schedule(
    num_steps, checkpoint_every, keep_checkpoints, None, log_every, progress, after_step
  )
  sources, probabilities = distill.validate_data_mix(
    {'draft': 1.0} if data_mix is None else data_mix
  )
  mix = dict(zip(sources, probabilities.tolist()))
  if data_passes > 1 and mix.get('draft', 0.0) > 0:
    raise ValueError(
      f'data_passes {data_passes} trains on each batch of sequences {data_passes} times, but '
      f"the data mix {mix} samples from the draft: use data_passes = 1, or the 'target' and "
      "'ground_truth' sources."
    )
  distill.check_pair(target, draft)
  first_params = {
    'network': draft.params,
    'mask_embedding': draft.as_parallel_draft(mask_embedding).mask_embedding,
  }
  task = train.check_task(task, draft.config, feature_lengths)
  tasks.hide_gpus_from_tensorflow()
  tx, step_fn, greedy_step_fn = _jitted_steps(config, optimizer, learning_rate)
  greedy_targets = sampling.is_greedy(temperature) and 'target' in sources
  settings = dict(
    recorded_settings(config),
    data_mix=mix,
    data_passes=data_passes,
    batch_size=batch_size,
    seed=seed,
  )

  def start(start_step: int) -> train.LoopSteps:
    sequences = distill.StepSequences(
      target,
      draft.config,
      task,
      feature_lengths,
      batch_size=batch_size,
      num_steps=num_steps,
      sources=sources,
      probabilities=probabilities,
      sample_mode=dict(temperature=temperature, topk=topk, topp=topp),
      greedy_targets=greedy_targets,
      data_passes=data_passes,
      seed=seed,
      start_step=start_step,
    )
    step_fns = (step_fn, greedy_step_fn if greedy_targets else None)
    return _loop_steps(sequences, target, step_fns, depth, seed)

  params, step, train_metrics, _ = train.resumable_loop(
    model_dir,
    schedule,
    config=draft.config,
    optimizer=tx,
    # A copy: the step donates its state.
    initial_params=lambda: jax.tree.map(jnp.array, first_params),
    settings_file=SETTINGS_FILE,
    settings=settings,
    start=start,
    abstract_params=lambda: {
      'network': network.abstract_params(draft.config)[0],
      'mask_embedding': jax.ShapeDtypeStruct((draft.config.emb_dim,), jnp.float32),
    },
    job='speculative_t5x.training.parallel_distill',
  )
  result = parallel_draft.ParallelDraft.of(
    draft.config, params['network'], params['mask_embedding']
  )
  return ParallelDistillResult(result, step, train_metrics)


# ------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------
def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `parallel_distill` (`gin_utils.run` has parsed the gin flags)."""
  from speculative_t5x.training import parallel_distill as parallel_distill_lib  # pylint: disable=g-import-not-at-top

  gin_utils.run_configured(argv, parallel_distill_lib.parallel_distill, writes='model_dir')


if __name__ == '__main__':
  gin_utils.run(main)
