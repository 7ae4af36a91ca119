"""Where decoding's time goes: step costs, one iteration part by part, bytes and bandwidth.

Every figure is timed inside one compiled `lax.fori_loop` of the part, with
the shapes of the decode call (batch, cache length, gamma, sampling mode),
after a warm-up, as the median of repetitions; the host's dispatch of a call
is never inside a step. The parts of one speculative iteration
(`decoding.speculative_sample`'s body) are

  draft_catch_up: `drafts.ModelDraft.catch_up`'s single-token step, needed
      only after an iteration that accepted all gamma tokens;
  draft_rollout: the gamma draft steps with their sampling (`propose` for
      drafts without a network);
  draft_observe: a feature head's rewrite of its cache over the judged block
      from the target's true features (`drafts.FeatureDraft.after_verify`), once
      per iteration (0 for other drafts);
  (both with flushed caches when target and draft together exceed the
  last-level cache, as in the loop, where the draft runs after the target;)
  target_block: the target's one call on gamma + 1 tokens;
  judge: the decode's judge (`judging.ExactJudge.judge_chain` by default),
    standardizing p and verifying;
  emit: `decoding.emit_block`, the writes, positions and statistics (the
    judge's record among them);

and of one baseline step, `target_step` (one token) and `sampling`
(`sampling.sample_logits`). What a decode call measures beyond their sum is
reported as unexplained, never folded into a part.

Both architectures go through the same code: the network functions dispatch
on the config (`network.init_decoder_cache`, `apply_decode_block`,
`prefill_decoder_cache`). With prompts (a decoder-only network's, or an
encoder-decoder's decoder prompts) the caches are prefilled with random
prompts of the given width first, as `models.prefilled_target_cache` does in
a decode call, the steps run right after them, and the per-call set-up
(`target_encode`, `draft_encode`) includes the prefill.

`decoder_step_bytes` counts what a cached decoder step must read and
`memory_bandwidth` measures what this machine streams, so a step's time can
be set against its floor (bytes / bandwidth) in the same run.

Timings on a shared CPU are only as good as its quiet: `LoadMonitor` samples
the load average and the other processes busy on the CPU (`busy_processes`)
while a measurement runs, for its report.
"""

import dataclasses
import functools
import os
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import judging
from speculative_t5x import kernels
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x_lab import xla_flags

PyTree = Any
Array = jax.Array


def median_seconds(fn: Callable[[], Any], repetitions: int) -> float:
  """Median wall time of `fn()` (blocked until ready) after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repetitions):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(statistics.median(times))


@functools.partial(jax.jit, static_argnames=('step', 'steps'))
def _run_steps(operands, carry, *, step, steps):
  """`steps` calls of `step(operands, i, carry) -> carry` in one compiled loop.

  Operands (parameters, caches) are arguments, never closed-over constants,
  so that XLA neither embeds them in the program nor folds the work away.
  """
  return lax.fori_loop(0, steps, lambda i, c: step(operands, i, c), carry)


def step_seconds(
  step: Callable, operands: PyTree, carry: PyTree, *, steps: int = 16, repetitions: int = 7
) -> float:
  """Seconds per call of `step(operands, i, carry) -> carry` inside a compiled loop.

  The carry must depend on everything the step computes (e.g. a checksum of
  a full reduction of its outputs), or XLA may skip the work.
  """
  run = lambda: _run_steps(operands, carry, step=step, steps=steps)
  return median_seconds(run, repetitions) / steps


def cold_step_seconds(
  step: Callable, operands: PyTree, *, steps: int = 16, repetitions: int = 7
) -> float:
  """`step_seconds` with the CPU caches flushed before every call of `step`.

  In a decode loop each part runs after the others have streamed far more
  than the last-level cache (the target alone reads its whole decoder per
  call), so a small network's weights come from DRAM every time; timed back
  to back they would stay cached and look up to 2x cheaper. Each step here
  first reads a buffer of twice the cache size; the time of that read alone is
  subtracted. `step` must carry a float32 scalar checksum. On accelerators
  this is plain `step_seconds`.
  """
  if jax.default_backend() != 'cpu':
    return step_seconds(
      step, operands, jnp.zeros((), jnp.float32), steps=steps, repetitions=repetitions
    )
  flush = jnp.ones((2 * xla_flags.last_level_cache_bytes() // 4,), jnp.float32)

  def flush_then_step(operands_and_flush, i, checksum, step=step):
    operands, flush = operands_and_flush
    checksum = checksum + jnp.sum(_vary(flush, checksum)) * 1e-12
    return step(operands, i, checksum) if step is not None else checksum

  timed = functools.partial(
    step_seconds,
    operands=(operands, flush),
    carry=jnp.zeros((), jnp.float32),
    steps=steps,
    repetitions=repetitions,
  )
  return max(timed(flush_then_step) - timed(functools.partial(flush_then_step, step=None)), 0.0)


def _checksum(*arrays) -> Array:
  """A float32 scalar that reads every element of `arrays`."""
  return sum(jnp.sum(jnp.asarray(a, jnp.float32)) for a in arrays)


def _vary(x: Array, checksum: Array) -> Array:
  """`x`, made to depend on the loop's carry so that XLA cannot hoist its users.

  A part whose inputs are all loop-invariant would be computed once, before
  the loop (loop-invariant code motion), and time as nothing.
  """
  return x + (checksum == jnp.inf).astype(x.dtype)


def random_encoder_inputs(
  batch_size: int, input_length: int, vocab_size: int, seed: int = 0
) -> Array:
  """int32 [batch_size, input_length] ids in [2, vocab_size), no padding."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(2, vocab_size, (batch_size, input_length)), jnp.int32)


# ------------------------------------------------------------------------------
# Network steps.
# ------------------------------------------------------------------------------


def _target_block_step(params, i, carry, *, config, block_size, start):
  cache, checksum = carry
  batch_size = checksum.shape[0]
  tokens = _vary(jnp.full((batch_size, block_size), 2, jnp.int32), checksum[0])
  # The same start each step: the cache (carried, so written in place as in
  # the decode loop) is attended to over its whole length.
  logits, cache = network.apply_decode_block(
    config, params, cache, tokens, jnp.full((batch_size,), start, jnp.int32)
  )
  return cache, checksum + jnp.sum(logits, axis=(1, 2)) * 1e-9


def random_prompt_block(batch_size: int, prompt_length: int, vocab_size: int) -> Optional[Array]:
  """int32 [batch_size, prompt_length + 1]: BOS, then a full random prompt (T5X's layout).

  None for `prompt_length` 0 (no prompt, nothing to prefill).
  """
  if not prompt_length:
    return None
  prompts = random_encoder_inputs(batch_size, prompt_length, vocab_size, seed=1)
  return layouts.decoder_prompt_layout(prompts, 1)


@functools.partial(
  jax.jit, static_argnames=('config', 'cache_length', 'inputs_bidirectional_attention')
)
def _target_encode(
  params, inputs, prompt_block, *, config, cache_length, inputs_bidirectional_attention
):
  """A decode call's set-up of the target's cache: the encoder, then the prompt's prefill."""
  cache, _ = models.prefilled_target_cache(
    config,
    params,
    inputs,
    cache_length,
    prompt_block,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  return cache


def network_step_seconds(
  config: network.NetworkConfig,
  params: PyTree,
  *,
  batch_size: int,
  input_length: int,
  block_size: int,
  cache_length: int,
  prompt_length: int = 0,
  inputs_bidirectional_attention: bool = False,
  repetitions: int = 7,
) -> float:
  """Seconds of one cached decoder call on `block_size` tokens per row.

  Either architecture. The cache is a decode call's: `input_length` random
  encoder inputs encoded (a decoder-only network takes only the batch from
  them) and, with `prompt_length` > 0, a random prompt of that many tokens
  prefilled (a decoder-only network's prompt, or decoder prompts); the block
  then sits right after the prompt. The whole cache (`cache_length`
  positions) is attended to, as in a decode call of that length; the logits
  are fully read.
  """
  inputs = random_encoder_inputs(batch_size, input_length, config.vocab_size)
  cache = _target_encode(
    params,
    inputs,
    random_prompt_block(batch_size, prompt_length, config.vocab_size),
    config=config,
    cache_length=cache_length,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  step = functools.partial(
    _target_block_step, config=config, block_size=block_size, start=prompt_length
  )
  return step_seconds(
    step, params, (cache, jnp.zeros((batch_size,), jnp.float32)), repetitions=repetitions
  )


# ------------------------------------------------------------------------------
# The parts of one iteration.
# ------------------------------------------------------------------------------


@dataclasses.dataclass
class IterationParts:
  """Seconds of each part of one speculative iteration, and of a baseline step.

  Attributes:
    gamma: draft tokens per iteration.
    verification: the rule the judge part ran ('token' or 'block').
    draft_catch_up: one draft step that `propose` runs only in iterations
      after a fully accepted block (0 for drafts without a network).
    draft_rollout: the gamma-token proposal without the catch-up.
    draft_observe: a feature head's rewrite of its cache over the block, every
      iteration (`drafts.FeatureDraft.after_verify`; 0 for other drafts).
    target_block: one target call on gamma + 1 tokens.
    judge: standardizing the block's target logits and verifying.
    emit: writes, positions and statistics.
    target_step: one target call on one token (the baseline's step).
    sampling: the baseline's sampling of one token.
    target_encode: per decode call, the target's encoder (if any), cache
      set-up and prompt prefill (if any).
    draft_encode: per decode call, the draft's `init_cache` and `prefill`.

    draft_timed_cold: whether the draft's parts were timed with flushed
      caches (`cold_step_seconds`): when target and draft together exceed the
      last-level cache, as they then do in the loop.
  """

  gamma: int
  verification: str
  draft_catch_up: float
  draft_rollout: float
  target_block: float
  judge: float
  emit: float
  target_step: float
  sampling: float
  target_encode: float
  draft_encode: float
  draft_observe: float = 0.0
  draft_timed_cold: bool = False

  def iteration_seconds(self, catch_up_rate: float) -> float:
    """Expected seconds per iteration when a catch-up runs at `catch_up_rate`."""
    return (
      catch_up_rate * self.draft_catch_up
      + self.draft_rollout
      + self.draft_observe
      + self.target_block
      + self.judge
      + self.emit
    )

  @property
  def baseline_step_seconds(self) -> float:
    return self.target_step + self.sampling

  def call_seconds(
    self, *, tokens: float, tokens_per_call: float, catch_up_rate: float
  ) -> Dict[str, float]:
    """Predicted seconds of one decode call of one row: baseline and speculative.

    Args:
      tokens: tokens the row emits.
      tokens_per_call: expected tokens per iteration (Eq. 1, or
        `theory.expected_iterations` for rows cut at a length).
      catch_up_rate: the fraction of iterations that run the draft's catch-up.
    """
    return dict(
      baseline=self.target_encode + tokens * self.baseline_step_seconds,
      speculative=(
        self.target_encode
        + self.draft_encode
        + tokens / tokens_per_call * self.iteration_seconds(catch_up_rate)
      ),
    )

  @property
  def c(self) -> float:
    """The paper's c: a draft step (with its sampling) / a target step.

    A feature head's per-iteration rewrite of its cache (`draft_observe`) is
    part of its drafting cost: spread over its gamma steps here.
    """
    return (self.draft_rollout + self.draft_observe) / self.gamma / self.target_step

  @property
  def verify_cost(self) -> float:
    """v(gamma): a (gamma + 1)-token target call / a one-token call."""
    return self.target_block / self.target_step

  def as_ms(self) -> Dict[str, float]:
    return {
      field.name: 1000.0 * getattr(self, field.name)
      for field in dataclasses.fields(self)
      if field.type is float
    }


def _draft_rollout_step(operands, i, checksum, *, draft, gamma, sample_args):
  draft_cache, sequences, positions, rng = operands
  rng = jax.random.fold_in(rng, i)
  sequences = _vary(sequences, checksum)
  # All gamma tokens (no draft threshold): `iteration_breakdown` scales the
  # rollout by the steps an adaptive length really ran.
  rollout_args = dict(gamma=gamma, draft_threshold=0.0, **sample_args)
  if isinstance(draft, drafts.ModelDraft):
    tokens, probs, _, _ = draft.rollout(draft_cache, sequences, positions, rng, **rollout_args)
  else:
    tokens, probs, _, _ = draft.propose(draft_cache, sequences, positions, rng, **rollout_args)
  return checksum + _checksum(tokens) + (0.0 if probs is None else _checksum(probs) * 1e-9)


def _draft_observe_step(operands, i, checksum, *, draft):
  draft_cache, features, next_tokens, positions = operands
  num_accepted = jnp.zeros_like(positions)
  state = draft.after_verify(
    draft_cache, _vary(features, checksum), next_tokens, positions, num_accepted
  )
  return checksum + _checksum(state['logits']) * 1e-9


def _draft_catch_up_step(operands, i, checksum, *, draft):
  draft_cache, sequences, positions = operands
  logits, _ = draft.decode_step(draft_cache['decoder'], _vary(sequences[:, 0], checksum), positions)
  return checksum + _checksum(logits) * 1e-9


def _judge_step(operands, i, checksum, *, sample_args, settings, judge):
  rng, draft_tokens, draft_probs, target_logits = operands
  judgement = judge.judge_chain(
    jax.random.fold_in(rng, i),
    _vary(draft_tokens, checksum),
    draft_probs,
    _vary(target_logits, checksum),
    sample_args,
    settings,
  )
  return checksum + _checksum(judgement.num_accepted, judgement.next_token, judgement.beta)


def _emit_step(operands, i, state, *, eos_id, judge):
  draft_tokens, judgement, limits = operands
  # Rewind the positions so that every step writes as the decode loop does.
  state = state.replace(position=state.position % 8)
  return decoding.emit_block(
    state,
    _vary(draft_tokens, state.log_prob[0]),
    judgement,
    limits=limits,
    eos_id=eos_id,
    judge=judge,
  )


def _sampling_step(operands, i, checksum, *, sample_args):
  rng, logits = operands
  token, probs = sampling.sample_logits(
    jax.random.fold_in(rng, i), _vary(logits, checksum), **sample_args
  )
  return checksum + _checksum(token) + _checksum(probs) * 1e-9


@functools.partial(jax.jit, static_argnames=('cache_length',))
def _draft_encode(draft, inputs, prompt_block, encoded=None, *, cache_length):
  """A decode call's set-up of the draft's state: `init_cache`, then the prompt's prefill.

  `encoded`: the target's encoder output that a feature head of an
  encoder-decoder target reads (computed once per call for both).
  """
  cache = draft.init_cache(inputs, cache_length, encoded=encoded)
  if prompt_block is None:
    return cache
  lengths = decoding.prompt_lengths(prompt_block)
  features = None
  if draft.feature_layers:  # The target's features of the prompt (random).
    features = jnp.ones(prompt_block.shape + (draft.config.feature_width,), jnp.float32)
  return draft.prefill(cache, prompt_block, lengths, features=features)


@dataclasses.dataclass(frozen=True)
class _TimedCall:
  """The decode call whose iteration `iteration_parts` times, with random inputs of its shapes.

  inputs: int32 [batch_size, input_length]; prompt_block: int32 [batch_size,
  prompt_length + 1] (BOS, then the prompt), or None without prompts.
  """

  target_config: network.NetworkConfig
  target_params: PyTree
  batch_size: int
  input_length: int
  prompt_length: int
  max_decode_len: int
  gamma: int
  inputs_bidirectional_attention: bool
  sample_args: Dict[str, Any]
  repetitions: int
  inputs: Array
  prompt_block: Optional[Array]

  @property
  def length(self) -> int:
    """Positions the decode writes: the prompt's and the decoded tokens'."""
    return self.prompt_length + self.max_decode_len

  @property
  def cache_length(self) -> int:
    return decoding.speculative_cache_length(self.length, self.gamma)

  def network_step_seconds(self, block_size: int) -> float:
    """`network_step_seconds` of the target on `block_size` tokens per row, at this call's shapes."""
    return network_step_seconds(
      self.target_config,
      self.target_params,
      batch_size=self.batch_size,
      input_length=self.input_length,
      block_size=block_size,
      cache_length=self.cache_length,
      prompt_length=self.prompt_length,
      inputs_bidirectional_attention=self.inputs_bidirectional_attention,
      repetitions=self.repetitions,
    )


# The parts of `IterationParts` that are the target's alone: another draft's
# measurement at the same settings can supply them.
_TARGET_PARTS = ('target_step', 'target_block', 'target_encode', 'sampling')


def _target_parts_seconds(
  call: _TimedCall, sampling_logits: Array, target_step: Optional[float]
) -> Dict[str, float]:
  """Seconds of the target's parts (`_TARGET_PARTS`).

  Its one-token step (unless `target_step` is given) and (gamma + 1)-token
  block, its set-up (encoder, prefill), and the baseline's sampling of
  float32 [batch_size, vocab_size] `sampling_logits`.
  """
  if target_step is None:
    target_step = call.network_step_seconds(block_size=1)
  target_block = call.network_step_seconds(block_size=call.gamma + 1)
  target_encode = median_seconds(
    lambda: _target_encode(
      call.target_params,
      call.inputs,
      call.prompt_block,
      config=call.target_config,
      cache_length=call.cache_length,
      inputs_bidirectional_attention=call.inputs_bidirectional_attention,
    ),
    call.repetitions,
  )
  baseline_sampling = step_seconds(
    functools.partial(_sampling_step, sample_args=call.sample_args),
    (jax.random.PRNGKey(0), sampling_logits),
    jnp.zeros((), jnp.float32),
    repetitions=call.repetitions,
  )
  return dict(
    target_step=target_step,
    target_block=target_block,
    target_encode=target_encode,
    sampling=baseline_sampling,
  )


def _draft_timer(call: _TimedCall, draft) -> Tuple[Callable[[Callable, PyTree], float], bool]:
  """How to time a draft's steps: `(time_draft(step, operands) -> seconds, timed_cold)`.

  The draft runs after the target in the loop: its weights are evicted when
  the two do not fit the last-level cache together, so its steps are then
  timed with the caches flushed (`cold_step_seconds`).
  """
  draft_bytes = draft_weight_bytes(draft)
  target_bytes = network.decoder_weight_bytes(call.target_config)
  if draft_bytes is not None and target_bytes + draft_bytes > xla_flags.last_level_cache_bytes():
    return functools.partial(cold_step_seconds, repetitions=call.repetitions), True
  zero = jnp.zeros((), jnp.float32)
  return lambda step, operands: step_seconds(
    step, operands, zero, repetitions=call.repetitions
  ), False


def _draft_parts_seconds(call: _TimedCall, draft) -> Dict[str, Any]:
  """Seconds of the draft's parts, and whether its steps were timed cold.

  Its set-up (`_draft_encode`) and its steps from a cache halfway through the
  decode: the rollout of all gamma tokens (a `ParallelDraft`'s one call), a `ModelDraft`'s one-token
  catch-up, a `FeatureDraft`'s observe of the target's features of a
  [batch_size, gamma + 1] block (0.0 for drafts without the part).
  """
  cache_length, batch_size, gamma = call.cache_length, call.batch_size, call.gamma
  encoded = None
  if isinstance(draft, drafts.FeatureDraft) and not network.is_decoder_only(call.target_config):
    # The decode call's encoder output, shared with the target: not the draft's cost.
    encoded = network.encode(call.target_config, call.target_params, call.inputs)
  encode = lambda: _draft_encode(
    draft, call.inputs, call.prompt_block, encoded, cache_length=cache_length
  )
  draft_cache = encode()
  sequences = jnp.full((batch_size, cache_length + 1), 2, jnp.int32)
  positions = jnp.full((batch_size,), call.prompt_length + call.max_decode_len // 2, jnp.int32)
  if isinstance(draft_cache, dict) and 'written_until' in draft_cache:
    draft_cache = dict(draft_cache, written_until=positions)  # No catch-up inside.
  time_draft, timed_cold = _draft_timer(call, draft)
  rollout = time_draft(
    functools.partial(_draft_rollout_step, draft=draft, gamma=gamma, sample_args=call.sample_args),
    (draft_cache, sequences, positions, jax.random.PRNGKey(0)),
  )
  catch_up = observe = 0.0
  if isinstance(draft, drafts.ModelDraft):
    catch_up = time_draft(
      functools.partial(_draft_catch_up_step, draft=draft), (draft_cache, sequences, positions)
    )
  if isinstance(draft, drafts.FeatureDraft):
    block = (batch_size, gamma + 1)
    features = jnp.ones(block + (draft.config.feature_width,), jnp.float32)
    next_tokens = jnp.full(block, 2, jnp.int32)
    observe = time_draft(
      functools.partial(_draft_observe_step, draft=draft),
      (draft_cache, features, next_tokens, positions),
    )
  return dict(
    draft_rollout=rollout,
    draft_catch_up=catch_up,
    draft_observe=observe,
    draft_encode=median_seconds(encode, call.repetitions),
    draft_timed_cold=timed_cold,
  )


def _random_block(call: _TimedCall, draft, rng: Array) -> Tuple[Array, Array, Optional[Array]]:
  """Random stand-ins for one iteration's block: `(target_logits, draft_tokens, draft_probs)`.

  target_logits float32 [batch_size, gamma + 1, vocab_size]; draft_tokens
  int32 [batch_size, gamma]; draft_probs float32 [batch_size, gamma,
  vocab_size], or None for a `PromptLookupDraft` (it proposes without
  probabilities).
  """
  batch_size, gamma, vocab_size = call.batch_size, call.gamma, call.target_config.vocab_size
  keys = jax.random.split(rng, 3)
  target_logits = jax.random.normal(keys[0], (batch_size, gamma + 1, vocab_size))
  draft_tokens = jax.random.randint(keys[1], (batch_size, gamma), 2, vocab_size)
  draft_probs = None
  if not isinstance(draft, drafts.PromptLookupDraft):
    draft_probs = sampling.standardize(
      jax.random.normal(keys[2], (batch_size, gamma, vocab_size)), **call.sample_args
    )
  return target_logits, draft_tokens, draft_probs


def _judge_and_emit_seconds(
  call: _TimedCall, settings, block, rng: Array, judge: judging.Judge
) -> Dict[str, float]:
  """Seconds of the judge step and of the emit step on a `_random_block`.

  The emit step writes into a loop state whose sequences are int32
  [batch_size, length + gamma + 2], as the decode loop's.
  """
  target_logits, draft_tokens, draft_probs = block
  batch_size, gamma = call.batch_size, call.gamma
  time_steps = functools.partial(step_seconds, repetitions=call.repetitions)
  judge_settings = dict(sample_args=call.sample_args, settings=settings, judge=judge)
  judge_seconds = time_steps(
    functools.partial(_judge_step, **judge_settings),
    (rng, draft_tokens, draft_probs, target_logits),
    jnp.zeros((), jnp.float32),
  )
  judgement = judge.judge_chain(
    rng, draft_tokens, draft_probs, target_logits, call.sample_args, settings
  )
  state = decoding.SpeculativeLoopState(
    position=jnp.zeros((batch_size,), jnp.int32),
    sequences=jnp.zeros((batch_size, call.length + gamma + 2), jnp.int32),
    cache={},
    draft_cache={},
    ended=jnp.zeros((batch_size,), bool),
    rng=rng,
    log_prob=jnp.zeros((batch_size,), jnp.float32),
    stats=decoding.SpeculativeStats.zeros(batch_size, judge.init_record(batch_size, settings)),
  )
  limits = jnp.full((batch_size,), call.length, jnp.int32)
  emit = time_steps(
    functools.partial(_emit_step, eos_id=-1, judge=judge), (draft_tokens, judgement, limits), state
  )
  return dict(judge=judge_seconds, emit=emit)


def iteration_parts(
  target_config: network.NetworkConfig,
  target_params: PyTree,
  draft,
  settings: settings_lib.SpeculativeSettings,
  *,
  batch_size: int,
  input_length: int,
  max_decode_len: int,
  prompt_length: int = 0,
  inputs_bidirectional_attention: bool = False,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  judge: Optional[judging.Judge] = None,
  target_step: Optional[float] = None,
  target_parts: Optional[IterationParts] = None,
  repetitions: int = 7,
) -> IterationParts:
  """Times each part of one iteration of `speculative_sample` at these settings.

  Shapes are the decode call's (`models.make_decoder`'s): the caches have
  `decoding.speculative_cache_length(prompt_length + max_decode_len, gamma)`
  positions, prefilled with a random prompt of `prompt_length` tokens when
  it is > 0, the logits the target's vocabulary. Random logits stand in for
  the networks' where only their shapes matter (verification, sampling).

  Args:
    target_config, target_params: the target network (either architecture).
    draft: a draft from `drafts` (a `models.Model` as `.as_draft()`).
    settings: the decode's `settings.SpeculativeSettings`: gamma sizes the
      block and the rollout (timed at all gamma tokens), lenience and
      verification are the rule the judge step runs.
    batch_size, max_decode_len: the decode call's shape.
    input_length: Lin, the width of the input tokens (a decoder-only
      network's input tokens are its prompts: Lin = prompt_length).
    prompt_length: Lp, the width of the prompts (a decoder-only network's,
      or an encoder-decoder's decoder prompts); 0: none.
    inputs_bidirectional_attention: the target is a prefix LM (its prefill).
    temperature, topk, topp: the call's sampling settings.
    judge: the decode's judge (`judging.Judge`; None: the exact one), whose
      chain rule the judge step times and whose record the emit step keeps.
    target_step: seconds of a one-token target step, if already measured
      (it does not depend on gamma).
    target_parts: another draft's parts at these settings, whose target parts
      (target step and block, encode, the baseline's sampling) are reused:
      only this draft's parts are timed, so drafts compared in one run share
      one measurement of the target's.
    repetitions: timed runs per part (median).
  """
  call = _TimedCall(
    target_config,
    target_params,
    batch_size=batch_size,
    input_length=input_length,
    prompt_length=prompt_length,
    max_decode_len=max_decode_len,
    gamma=settings.gamma,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
    sample_args=dict(temperature=temperature, topk=topk, topp=topp),
    repetitions=repetitions,
    inputs=random_encoder_inputs(batch_size, input_length, target_config.vocab_size),
    prompt_block=random_prompt_block(batch_size, prompt_length, target_config.vocab_size),
  )
  rng = jax.random.PRNGKey(0)
  block = _random_block(call, draft, rng)
  if target_parts is None:
    target = _target_parts_seconds(call, block[0][:, 0], target_step)
  else:
    target = {name: getattr(target_parts, name) for name in _TARGET_PARTS}
  draft_parts = _draft_parts_seconds(call, draft)
  judge = judging.EXACT if judge is None else judge
  verify_parts = _judge_and_emit_seconds(call, settings, block, rng, judge)
  return IterationParts(
    gamma=settings.gamma,
    verification=settings.verification,
    **target,
    **draft_parts,
    **verify_parts,
  )


# ------------------------------------------------------------------------------
# Bytes and bandwidth.
# ------------------------------------------------------------------------------


def decoder_step_bytes(
  config: network.NetworkConfig,
  params: PyTree,
  *,
  batch_size: int,
  block_size: int,
  input_length: int,
  cache_length: int,
) -> int:
  """Bytes a cached decoder call on `block_size` tokens per row must read.

  Every decoder parameter (in its stored dtype; the token embedding whole
  when it also computes the logits, else only the block's rows), and each
  layer's self-attention keys/values over the whole cache and, for an
  encoder-decoder, cross-attention keys/values over the `input_length`
  inputs, in the compute dtype. Activations are left out: at decoding sizes
  they stay in cache.
  """
  decoder_only = network.is_decoder_only(config)
  # A decoder-only network keeps its embedding inside `decoder/`; T5 shares it.
  embedding = (params['decoder'] if decoder_only else params)['token_embedder']['embedding']
  embedding_itemsize = jnp.dtype(embedding.dtype).itemsize
  decoder_params = (
    sum(
      int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
      for x in jax.tree_util.tree_leaves(params['decoder'])
    )
    - decoder_only * int(np.prod(embedding.shape)) * embedding_itemsize
  )
  rows = embedding.shape[0] if config.logits_via_embedding else batch_size * block_size
  embedding_bytes = rows * embedding.shape[1] * embedding_itemsize
  kv_width = config.num_heads * config.head_dim * jnp.dtype(config.dtype).itemsize
  num_layers, cross_length = (
    (config.num_layers, 0) if decoder_only else (config.num_decoder_layers, input_length)
  )
  cache_bytes = 2 * num_layers * batch_size * kv_width * (cache_length + cross_length)
  return decoder_params + embedding_bytes + cache_bytes


@jax.jit
def _stream(x):
  return jnp.sum(x)


def memory_bandwidth(num_bytes: int = 512 * 2**20, repetitions: int = 5) -> float:
  """Bytes per second this machine streams from memory: a reduction over `num_bytes`.

  The array is far larger than any cache, so this is the rate a decoder
  step's weights can be read at, the floor of its time. (One call of 512 MiB
  takes ~10 ms on a CPU: its dispatch is negligible.)
  """
  x = jnp.ones((num_bytes // 4,), jnp.float32)
  return num_bytes / median_seconds(lambda: _stream(x), repetitions)


def machine(bandwidth: Optional[float] = None) -> Dict[str, Any]:
  """What a measurement ran on: device, CPU model and family, cores, memory bandwidth.

  CPUs differ about 2x in bandwidth (docs/results.md, "Machines"), so every report
  and profile names its machine. `bandwidth` in bytes/s (measured if None).
  """
  cpu = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        key, value = key.strip(), value.strip()
        if key in ('model name', 'cpu family') and key not in cpu:
          cpu[key] = value
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return dict(
    device=str(jax.devices()[0].device_kind),
    platform=jax.default_backend(),
    cpu=cpu.get('model name'),
    cpu_family=cpu.get('cpu family'),
    cores=cores,
    bandwidth_gb_per_s=(memory_bandwidth() if bandwidth is None else bandwidth) / 1e9,
  )


def draft_weight_bytes(draft) -> Optional[int]:
  """Bytes of weights a draft network's step reads; None for drafts without one.

  A model draft's decoder, read once per step, and a parallel draft's, read
  once per call (`network.decoder_weight_bytes`); a feature head's
  own parameters and, with output 'target', the target's final norm and
  logits layer that it applies (`drafts.FeatureDraft`).
  """
  nbytes = lambda tree: sum(
    int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
  )
  if isinstance(draft, (drafts.ModelDraft, parallel_draft.ParallelDraft)):
    return network.decoder_weight_bytes(draft.config)
  if not isinstance(draft, drafts.FeatureDraft):
    return None
  # On packed params a step reads each kernel's packed copy instead of it: count one.
  head = nbytes(kernels.plain_params(draft.params))
  if draft.config.output == 'target':  # The logits kernel [D, V] and the final norm [D], float32.
    head += 4 * (draft.config.vocab_size + 1) * draft.config.target_emb_dim
  return head


def step_floor(step_bytes: int, seconds: float, bandwidth: float) -> Mapping[str, float]:
  """A step's bytes against the floor: {bytes, floor_ms, measured_ms, achieved GB/s, ratio}."""
  floor = step_bytes / bandwidth
  # A step below timing resolution (a tiny model, cold time minus flush <= 0)
  # has no meaningful rate.
  achieved = step_bytes / seconds / 1e9 if seconds > 0 else None
  return dict(
    bytes=int(step_bytes),
    floor_ms=1000 * floor,
    measured_ms=1000 * seconds,
    achieved_gb_per_s=achieved,
    bandwidth_gb_per_s=bandwidth / 1e9,
    over_floor=seconds / floor,
  )


# ------------------------------------------------------------------------------
# What else runs on the machine.
# ------------------------------------------------------------------------------
def _cpu_seconds(pid: int) -> Optional[float]:
  """CPU seconds (user + system) process `pid` has used, from /proc; None if it is gone."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      # The command (field 2) is parenthesized and may hold spaces: split after it.
      fields = f.read().rsplit(b')', 1)[1].split()
  except (OSError, IndexError):
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')  # utime, stime.


def _command(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode('utf-8', 'replace').strip()
  except OSError:
    return ''


def cpu_times() -> Tuple[float, Dict[int, float]]:
  """(time.monotonic(), {pid: CPU seconds used so far}) of every other process, from /proc.

  The first reading of `busy_since`; {} where there is no /proc.
  """
  if not os.path.isdir('/proc'):
    return time.monotonic(), {}
  pids = [int(name) for name in os.listdir('/proc') if name.isdigit() and int(name) != os.getpid()]
  used = {pid: _cpu_seconds(pid) for pid in pids}
  return time.monotonic(), {pid: seconds for pid, seconds in used.items() if seconds is not None}


def busy_since(
  before: Tuple[float, Dict[int, float]], threshold: float = 5.0
) -> Dict[int, Dict[str, Any]]:
  """{pid: {'cpu_percent', 'command'}}: processes that used >= threshold % since `before`.

  Percent of one core (a process's threads add up, as in `top`); `before` is a
  `cpu_times()` reading. Processes gone since are skipped.
  """
  start, used_before = before
  elapsed = time.monotonic() - start
  busy = {}
  for pid, used in used_before.items():
    now = _cpu_seconds(pid)
    if now is None:
      continue
    percent = 100.0 * (now - used) / elapsed
    if percent >= threshold:
      busy[pid] = dict(cpu_percent=percent, command=_command(pid)[:160])
  return busy


def busy_processes(interval: float = 1.0, threshold: float = 5.0) -> Dict[int, Dict[str, Any]]:
  """`busy_since` a `cpu_times()` reading `interval` s ago: what else used the CPU meanwhile."""
  before = cpu_times()
  time.sleep(interval)
  return busy_since(before, threshold)


class LoadMonitor:
  """Samples the load average and the busy processes every `period` s while it runs.

  A daemon thread; each sample costs one `busy_processes` (about a second of
  sleeping, a few ms of CPU), so timings are not disturbed. Use as a context
  manager around the measurement; `summary` says what it saw.
  """

  def __init__(self, period: float = 30.0):
    self._period = period
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self.samples: List[Dict[str, Any]] = []

  def _run(self):
    while True:
      busy = busy_processes()
      self.samples.append(
        dict(time=time.time(), load_average=list(os.getloadavg()), busy=list(busy.values()))
      )
      if self._stop.wait(self._period):
        return

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc_info):
    self._stop.set()
    self._thread.join()

  def summary(self, since: float = 0.0) -> Dict[str, Any]:
    """What the samples taken at `since` (a time.time()) or later saw.

    {'samples', 'load_average_1min': {min, max} (None without samples),
    'busy': [{command, peak_cpu_percent, samples (it was busy in)}]}.
    """
    samples = [sample for sample in self.samples if sample['time'] >= since]
    peaks: Dict[str, Dict[str, Any]] = {}
    for sample in samples:
      for process in sample['busy']:
        seen = peaks.setdefault(process['command'], dict(peak_cpu_percent=0.0, samples=0))
        seen['peak_cpu_percent'] = max(seen['peak_cpu_percent'], process['cpu_percent'])
        seen['samples'] += 1
    loads = [sample['load_average'][0] for sample in samples]
    return dict(
      samples=len(samples),
      load_average_1min=dict(min=min(loads), max=max(loads)) if loads else None,
      busy=[
        dict(command=command, **seen)
        for command, seen in sorted(peaks.items(), key=lambda item: -item[1]['samples'])
      ],
    )
