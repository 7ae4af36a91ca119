"""Decode functions: T5X-style temperature sampling and speculative sampling.

Both functions follow T5X's decode-function conventions (`t5x/decoding.py`)
and take every argument of its `temperature_sample`, with its meaning: `inputs,
cache, eos_id, decode_rng, num_decodes, temperature, topk, topp, cache_offset,
initial_index, max_decode_steps, max_decode_steps_hard_limit,
rescale_log_probs, state_callback_fn, logit_callback_fn` (the one exception:
`speculative_sample` refuses a state callback, which edits T5X's loop one token
at a time; see its docstring). `num_decodes` expands the batch in place ([el0,
el0, el1, el1, ...]); the result is `(decodes [B, num_decodes, L], log_probs
[B, num_decodes])` sorted by ascending log probability, so `[:, -1]` is the
most likely decode. A row ends when it emits `eos_id` or fills the output
length; tokens after the end are 0. By default `log_probs` are log
probabilities under the *standardized* distribution that was sampled from
(T5X's `rescale_log_probs=True`): 0 for greedy decoding; with
`rescale_log_probs=False`, under the logits alone. A logit callback
(`logit_callback_fn(logits, state)`) rewrites the target's logits before
temperature, top-k and top-p, so it defines the distribution both functions
sample (see `SamplingLoopState`, `position_state`).

As in T5X, `topk` defaults to 1 (greedy). Pass `topk=0` to sample.

`temperature_sample` is the baseline ("standard decoding"): one target call per
token. `speculative_sample` is Algorithm 1 of Leviathan et al. (2023): per
iteration, a draft proposes `gamma` tokens, the target scores the block
`[last, x_1..x_gamma]` in one call, `verify` accepts a prefix per row and
samples the next token, and every row moves its own position. Each is a single
`jax.lax.while_loop`; nothing returns to the host between iterations.

Sequence layout shared by both loops: `sequences [BN, ...]` holds BOS (0) at
index 0 and output token j at index j + 1; the decoder input at cache position
t is `sequences[:, t]`. A row whose last emitted token sits at index s has a
target cache that is valid for positions < s.

Decoder prompts, as in T5X: `inputs [B, L]` is the decoder input already
shifted right, so a row's P prompt tokens sit at indices 1..P (index 0 is the
BOS slot and is ignored) followed by zeros, and the decodes keep them (T5X's
decoder-only model strips them afterwards). `max_decode_steps` counts tokens
after the prompt. There are two ways in, T5X's two:
  * `initial_index=None`: the decode function writes the prompt itself.
    `temperature_sample` teacher-forces it token by token (T5X's behaviour);
    `speculative_sample` prefills the target and the draft with the whole
    prompt in one block call each, causally.
  * `initial_index` int32 [B] (T5X's decoder-only convention, normally the
    prompt lengths P): the caches arrive prefilled below it (T5X's
    `_compute_kv_cache`; bidirectionally over the prompt for a prefix LM) and
    decoding feeds `inputs[:, initial_index]` first. For `speculative_sample`
    the draft's state must be prefilled too (`drafts.Draft.prefill`).
"""

import functools
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple, Union

import flax
from flax import traverse_util
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafts
from speculative_t5x import judging
from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x import tree as tree_lib

PyTree = Any
Array = jax.Array


@flax.struct.dataclass
class DecodingState:
  """What a single-token `tokens_to_logits` sees (T5X's `DecodingState`).

  Attributes:
    cur_index: int32 [BN] cache position of `cur_token`.
    sequences: int32 [BN, L] tokens so far (see the module docstring).
    cur_token: int32 [BN, 1] the token to feed.
    cache: the decoder cache.
  """

  cur_index: Array
  sequences: Array
  cur_token: Array
  cache: PyTree


# `tokens_to_logits(DecodingState) -> (logits [BN, V], new_cache)`.
TokensToLogits = Callable[[DecodingState], Tuple[Array, PyTree]]
# `score_block(block_tokens [BN, k], start_positions [BN], cache, tree=None)
#   -> (logits [BN, k, V], new_cache)`: the target scores k tokens per row,
# writing their keys/values at positions start..start+k-1 (overwriting). With a
# `tree.Tree` the block is the tree's nodes (`network.apply_decode_block`). A
# draft that reads the target's features (`drafts.FeatureDraft`) needs a scorer
# that also takes `feature_layers=` and then returns ((logits, features
# [BN, k, Df]), new_cache) from the same call.
ScoreBlock = Callable[..., Tuple[Array, PyTree]]
# `compact_cache(cache, start_positions [BN], path [BN, P]) -> cache`: moves
# the keys/values of the accepted tree path's nodes (slots start + path[:, i])
# to consecutive positions start + i (`network.compact_tree_path`).
CompactCache = Callable[[PyTree, Array, Array], PyTree]


# ------------------------------------------------------------------------------
# Batch expansion for num_decodes (T5X's flat_batch_beam_expand / cache_map).
# ------------------------------------------------------------------------------


def flat_batch_expand(x: Array, num_decodes: int, offset: int = 0) -> Array:
  """Repeats each batch row `num_decodes` times in place along axis `offset`."""
  return jnp.repeat(x, num_decodes, axis=offset)


def cache_map(fn: Callable[[Array], Array], cache: PyTree) -> PyTree:
  """Applies `fn` to every cache leaf except scalar `cache_index` counters."""
  frozen = isinstance(cache, flax.core.FrozenDict)
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache) if frozen else cache)
  flat = {k: (v if k[-1] == 'cache_index' else fn(v)) for k, v in flat.items()}
  new_cache = traverse_util.unflatten_dict(flat)
  return flax.core.freeze(new_cache) if frozen else new_cache


def expand_cache(cache: PyTree, num_decodes: int, cache_offset: int = 0) -> PyTree:
  """Expands every batch-leading cache leaf for `num_decodes` samples per row."""
  if num_decodes == 1:
    return cache
  return cache_map(
    functools.partial(flat_batch_expand, num_decodes=num_decodes, offset=cache_offset),
    cache,
  )


def _expand_temperature(temperature, num_decodes: int):
  """A per-row temperature [B] becomes [B * num_decodes]; scalars stay."""
  if isinstance(temperature, (int, float)) or np.ndim(temperature) == 0:
    return temperature
  return flat_batch_expand(jnp.asarray(temperature), num_decodes)


def _sort_by_log_prob(values: Array, log_prob: Array, batch_size: int, num_decodes: int):
  """Unflattens [B*N, ...] to [B, N, ...] and sorts by ascending log_prob [B*N]."""
  log_prob = log_prob.reshape(batch_size, num_decodes)
  order = jnp.argsort(log_prob, axis=-1)
  sorted_log_prob = jnp.take_along_axis(log_prob, order, axis=-1)

  def sort(x):
    x = x.reshape((batch_size, num_decodes) + x.shape[1:])
    index = order.reshape(order.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)

  return jax.tree_util.tree_map(sort, values), sorted_log_prob


def _checked_decode_args(
  inputs, num_decodes, initial_index, max_decode_steps, max_decode_steps_hard_limit, topk, topp
):
  """`max_decode_steps` clipped to the hard limit; ValueError on what both decode functions refuse.

  inputs int32 [B, L]; the rest as `temperature_sample`'s arguments.
  """
  max_decode_steps = clip_max_decode_steps(max_decode_steps, max_decode_steps_hard_limit)
  if inputs.ndim != 2:
    raise ValueError(f'inputs must be [batch, max_decode_len]; got shape {inputs.shape}.')
  if num_decodes < 1:
    raise ValueError(f'num_decodes must be >= 1; got {num_decodes}.')
  if max_decode_steps is not None and not isinstance(max_decode_steps, jax.core.Tracer):
    if np.any(np.asarray(max_decode_steps) < 1):
      raise ValueError(f'max_decode_steps must be >= 1; got {max_decode_steps}.')
  sampling.validate_sampling_args(topk=topk, topp=topp)
  check_initial_index(inputs, initial_index)
  return max_decode_steps


class _ExpandedBatch(NamedTuple):
  """A decode's batch with each row repeated `num_decodes` times in place (BN = B * num_decodes).

  Attributes:
    inputs: int32 [BN, L], the decoder prompts.
    caches: the decode's caches (a tuple), each expanded (`expand_cache`).
    temperature: a scalar, or float [BN].
    limits: int32 [BN], each row's last output index (`_row_limits`).
    start: int32 [BN], where T5X's loop begins: `initial_index`, else 0 (BOS).
    sequences: int32 [BN, L + spare]: BOS (0) at index 0, the prompts, zeros.
  """

  inputs: Array
  caches: Tuple[PyTree, ...]
  temperature: Union[float, Array]
  limits: Array
  start: Array
  sequences: Array


def _expand_batch(
  inputs, caches, num_decodes, temperature, cache_offset, initial_index, max_decode_steps, spare
) -> _ExpandedBatch:
  """The `_ExpandedBatch` of both decode functions; `spare` slots follow the output in `sequences`.

  Arguments as `temperature_sample`'s; `caches` a tuple of caches for batch B.
  """
  inputs = flat_batch_expand(inputs, num_decodes)
  caches = tuple(expand_cache(cache, num_decodes, cache_offset) for cache in caches)
  temperature = _expand_temperature(temperature, num_decodes)
  limits = _row_limits(inputs, max_decode_steps)
  if initial_index is None:
    start = jnp.zeros((inputs.shape[0],), jnp.int32)
  else:
    start = flat_batch_expand(jnp.asarray(initial_index, jnp.int32), num_decodes)
  sequences = jnp.pad(inputs.astype(jnp.int32), ((0, 0), (0, spare))).at[:, 0].set(0)
  return _ExpandedBatch(inputs, caches, temperature, limits, start, sequences)


def _row_limits(inputs: Array, max_decode_steps) -> Array:
  """int32 [BN]: the index in `sequences` of each row's last output slot.

  As in T5X, `max_decode_steps` counts tokens after the decoder prompt.
  """
  max_decode_len = inputs.shape[1]
  if max_decode_steps is None:
    return jnp.full((inputs.shape[0],), max_decode_len, jnp.int32)
  prompt_len = jnp.sum(inputs != 0, axis=1)
  return jnp.minimum(max_decode_len, prompt_len + max_decode_steps).astype(jnp.int32)


def prompt_lengths(inputs: Array) -> Array:
  """int32 [B]: the prompt tokens of each row of `inputs [B, L]` (indices 1..P)."""
  return jnp.sum(inputs[:, 1:] != 0, axis=1).astype(jnp.int32)


def check_prompts(inputs) -> None:
  """Host-side check of decoder prompts `inputs [B, L]`; skipped for traced values.

  ValueError unless every row's prompt is contiguous: non-zero tokens at
  indices 1..P, then only zeros. `temperature_sample` forces non-zero
  entries wherever they are (T5X's teacher forcing), but the speculative
  loop prefills each row's positions < P in one block, so a 0 inside a
  prompt would be fed as a token there. There is always room to decode: the
  output has L slots (indices 1..L) and a prompt at most L - 1 tokens.
  """
  if isinstance(inputs, jax.core.Tracer) or np.ndim(inputs) != 2:
    return
  inputs = np.asarray(inputs)
  nonzero = inputs[:, 1:] != 0
  lengths = nonzero.sum(axis=1)
  contiguous = np.all(nonzero == (np.arange(nonzero.shape[1])[None] < lengths[:, None]), axis=1)
  if not np.all(contiguous):
    row = int(np.argmin(contiguous))
    raise ValueError(
      f'The decoder prompt of row {row} has a 0 (padding) between its tokens: '
      f'{inputs[row].tolist()}. A prompt is its tokens at indices 1..P (index 0 is '
      'the BOS slot) followed only by zeros; remove the padding inside it.'
    )


def check_initial_index(inputs, initial_index) -> None:
  """Host-side check that `initial_index` (int [B] or None) fits `inputs [B, L]`.

  ValueError unless there is one start per row and each leaves room for an
  output token: it must lie in [0, L). Skipped for traced values.
  """
  if initial_index is None or isinstance(initial_index, jax.core.Tracer):
    return
  initial_index = np.asarray(initial_index)
  if initial_index.shape != np.shape(inputs)[:1]:
    raise ValueError(
      f'initial_index must be int [batch] = {np.shape(inputs)[:1]}, one start per row; got '
      f'shape {initial_index.shape}.'
    )
  length = np.shape(inputs)[1]
  bad = (initial_index < 0) | (initial_index >= length)
  if np.any(bad):
    row = int(np.argmax(bad))
    raise ValueError(
      f'initial_index[{row}] = {int(initial_index[row])} leaves no room to decode: the '
      f'output has length {length}, so a row must start at an index in [0, {length}) '
      '(its prompt length). Make the output longer or the prompt shorter.'
    )


# ------------------------------------------------------------------------------
# Baseline: temperature sampling, one target call per token.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class SamplingLoopState:
  """Loop state of `temperature_sample`: T5X's fields (`t5x.decoding.SamplingLoopState`).

  It is what `state_callback_fn` and `logit_callback_fn` receive. Under
  speculation `speculative_sample` builds one per scored position for the
  logit callback (see `position_state`, whose docstring says which fields
  keep T5X's meaning there).

  Attributes:
    step: int32 scalar, loop iterations so far.
    cur_index: int32 [BN] cache position of `cur_token` (rows differ when
      started from `initial_index`; an ended row stays where it ended).
    sequences: int32 [BN, L + 1]: BOS at index 0, the prompt and the tokens
      so far at 1..cur_index, then the prompt's remaining (teacher-forced)
      tokens and zeros; one spare slot at the end.
    cache: the target's decoder cache.
    cur_token: int32 [BN, 1] the token fed next, `sequences[:, cur_index]`.
    ended: bool [BN] (T5X's is [BN, 1]).
    rng: PRNG key.
    log_prob: float32 [BN] the score of the tokens generated so far.
  """

  step: Array
  cur_index: Array
  sequences: Array
  cache: PyTree
  cur_token: Array
  ended: Array
  rng: Array
  log_prob: Array


# T5X's callbacks: `state_callback_fn(state) -> state`, run before each step
# and once on the final state; `logit_callback_fn(logits [BN, V], state) ->
# logits`, run on the target's logits before temperature, top-k and top-p.
StateCallbackFn = Callable[[SamplingLoopState], SamplingLoopState]
LogitCallbackFn = Callable[[Array, SamplingLoopState], Array]


def clip_max_decode_steps(max_decode_steps, max_decode_steps_hard_limit: Optional[int]):
  """`max_decode_steps` clipped to the hard limit, as T5X's `temperature_sample` does.

  The limit applies only when it is set (not None and > 0) and
  `max_decode_steps` is set too. ValueError unless it is a Python int or None.
  """
  if max_decode_steps_hard_limit is None:
    return max_decode_steps
  if not isinstance(max_decode_steps_hard_limit, (int, np.integer)) or isinstance(
    max_decode_steps_hard_limit, bool
  ):
    raise ValueError(
      'max_decode_steps_hard_limit must be a Python int or None (T5X: a fixed limit, known '
      f'when the decode is traced); got {max_decode_steps_hard_limit!r}. Pass a per-batch '
      'cap as max_decode_steps instead.'
    )
  if max_decode_steps_hard_limit > 0 and max_decode_steps is not None:
    return jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
  return max_decode_steps


def token_log_probs(tokens: Array, probs: Array, logits: Optional[Array] = None) -> Array:
  """float32 [...]: the log probabilities that score tokens int32 [...].

  T5X's `rescale_log_probs`: True scores under the distribution sampled from,
  `log probs[token]` (probs float [..., V], standardized: temperature, top-k,
  top-p; 0 for greedy decoding); False under the logits alone,
  `log_softmax(logits)[token]` (logits float [..., V], after any logit
  callback), which is what passing `logits` asks for.
  """
  if logits is None:
    return jnp.log(jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0])
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]


def _take_column(x: Array, index: Array) -> Array:
  """x[b, index[b]] for x [B, L] and index int32 [B]."""
  return jnp.take_along_axis(x, index[:, None], axis=1)[:, 0]


class _SamplingLoop(NamedTuple):
  """What every step of one `temperature_sample` call reads besides its state.

  Attributes:
    tokens_to_logits: the target's one-token scorer.
    sample_args: `temperature` (scalar or float [BN]), `topk`, `topp`.
    eos_id: end-of-sequence id.
    initial_eos_count: int32 [BN], each row's EOS tokens before decoding. T5X's
      end rule: a row ends when its count of EOS grows, so that an EOS in the
      prompt does not end it but one written by the step (sampled, or forced
      by `state_callback_fn`) does.
    limits: int32 [BN], each row's last output index (`_row_limits`).
    max_decode_len: L, the output length (`sequences` has one spare slot).
    rescale_log_probs, state_callback_fn, logit_callback_fn: as
      `temperature_sample`'s.
  """

  tokens_to_logits: TokensToLogits
  sample_args: Mapping[str, Any]
  eos_id: int
  initial_eos_count: Array
  limits: Array
  max_decode_len: int
  rescale_log_probs: bool
  state_callback_fn: Optional[StateCallbackFn]
  logit_callback_fn: Optional[LogitCallbackFn]


def _initial_sampling_state(batch: _ExpandedBatch, rng: Array) -> SamplingLoopState:
  """The loop state before the first step: each row at its start, ended if it has no room."""
  (cache,) = batch.caches
  return SamplingLoopState(
    step=jnp.zeros((), jnp.int32),
    cur_index=batch.start,
    sequences=batch.sequences,
    cache=cache,
    cur_token=_take_column(batch.sequences, batch.start)[:, None],
    ended=batch.start >= batch.limits,
    rng=rng,
    log_prob=jnp.zeros((batch.inputs.shape[0],), jnp.float32),
  )


def _any_row_active(state: Union[SamplingLoopState, 'SpeculativeLoopState']) -> Array:
  """Both loops' condition: some row has not ended."""
  return ~jnp.all(state.ended)


def _sampling_step(loop: _SamplingLoop, state: SamplingLoopState) -> SamplingLoopState:
  """T5X's step: feeds each row's `cur_token`, writes the next token, ends rows.

  A row writes its sampled token at `cur_index + 1`, or keeps the non-zero
  token already there (the prompt, or one `state_callback_fn` forced); an
  ended row rewrites the token it holds and stays. Only sampled tokens of
  active rows add to `log_prob`.
  """
  if loop.state_callback_fn is not None:
    state = loop.state_callback_fn(state)
  rng, sample_rng = jax.random.split(state.rng)
  index = state.cur_index
  logits, new_cache = loop.tokens_to_logits(
    DecodingState(
      cur_index=index,
      sequences=state.sequences[:, : loop.max_decode_len],
      cur_token=state.cur_token,
      cache=state.cache,
    )
  )
  if loop.logit_callback_fn is not None:
    logits = loop.logit_callback_fn(logits, state)
  sampled, probs = sampling.sample_logits(sample_rng, logits, **loop.sample_args)
  forced = _take_column(state.sequences, index + 1)
  in_prompt = forced != 0
  generated = ~in_prompt & ~state.ended
  # An ended row rewrites the token it holds at index + 1, and stays.
  next_token = jnp.where(generated, sampled, forced)
  score = token_log_probs(sampled, probs, None if loop.rescale_log_probs else logits)
  log_prob = state.log_prob + jnp.where(generated, score, 0.0)
  sequences = jax.vmap(lambda row, token, at: row.at[at].set(token))(
    state.sequences, next_token, index + 1
  )
  eos_written = jnp.sum(sequences == loop.eos_id, axis=1) > loop.initial_eos_count
  ended = state.ended | eos_written | (index + 1 >= loop.limits)
  cur_index = jnp.where(ended, index, index + 1)
  return SamplingLoopState(
    step=state.step + 1,
    cur_index=cur_index,
    sequences=sequences,
    cache=new_cache,
    cur_token=_take_column(sequences, cur_index)[:, None],
    ended=ended,
    rng=rng,
    log_prob=log_prob,
  )


def temperature_sample(
  inputs: Array,
  cache: PyTree,
  tokens_to_logits: TokensToLogits,
  eos_id: int,
  decode_rng: Optional[Array] = None,
  num_decodes: int = 1,
  temperature: Union[float, Array] = 1.0,
  topk: int = 1,
  topp: float = 0.0,
  cache_offset: int = 0,
  initial_index: Optional[Array] = None,
  max_decode_steps: Optional[Union[int, Array]] = None,
  max_decode_steps_hard_limit: Optional[int] = None,
  rescale_log_probs: bool = True,
  state_callback_fn: Optional[StateCallbackFn] = None,
  logit_callback_fn: Optional[LogitCallbackFn] = None,
) -> Tuple[Array, Array]:
  """Samples one token per target call, as T5X's `temperature_sample`.

  Args:
    inputs: int32 [B, L] decoder prompt, already shifted right: `inputs[:, 0]`
      is the BOS slot, non-zero entries after it are forced (teacher forcing),
      zeros are sampled. L is the output length.
    cache: the target's decoder cache for batch B (expanded here).
    tokens_to_logits: `DecodingState -> (logits [BN, V], new_cache)`.
    eos_id: end-of-sequence id.
    decode_rng: PRNG key (default `PRNGKey(0)`).
    num_decodes: independent samples per row.
    temperature: scalar or float [B]; 0 means argmax. Every row draws with
      its own key (T5X's per-row path shares one, so that its rows with equal
      logits sample equal tokens; each row's distribution is the same).
    topk: keep the k most likely tokens (0: off). T5X's default 1 is greedy.
    topp: nucleus mass (0: off). At most one of topk/topp may be non-zero.
    cache_offset: batch axis of cache leaves (1 for scanned layers).
    initial_index: optional int32 [B], where each row starts: the cache is
      prefilled below it and `inputs[:, initial_index]` is fed first (T5X's
      decoder-only convention; see the module docstring). None starts at 0.
    max_decode_steps: optional cap on tokens generated after the prompt
      (int, or int [BN] per expanded row).
    max_decode_steps_hard_limit: optional Python int; when it is > 0 and
      `max_decode_steps` is set, `max_decode_steps` is clipped to it (T5X's).
    rescale_log_probs: T5X's: True scores each generated token under the
      distribution it was sampled from, False under the logits alone (see the
      module docstring).
    state_callback_fn: T5X's `state -> state` on the `SamplingLoopState`,
      before every step and once on the final state (e.g. to force a token
      by writing `sequences[:, cur_index + 1]`, which the step then keeps as
      teacher forcing). A row ends when the count of `eos_id` in its
      `sequences` grows, as in T5X, so an EOS written this way ends it too.
    logit_callback_fn: T5X's `(logits [BN, V], state) -> logits`, applied to
      the target's logits of every step (`state` the step's
      `SamplingLoopState`, after `state_callback_fn`) before temperature,
      top-k and top-p: it defines the distribution sampled from.

  Returns:
    `(decodes int32 [B, num_decodes, L], log_probs float32 [B, num_decodes])`,
    sorted by ascending log probability.
  """
  max_decode_steps = _checked_decode_args(
    inputs, num_decodes, initial_index, max_decode_steps, max_decode_steps_hard_limit, topk, topp
  )
  decode_rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  batch_size, max_decode_len = inputs.shape
  # One spare slot past the end keeps the forced-token read in bounds.
  batch = _expand_batch(
    inputs, (cache,), num_decodes, temperature, cache_offset, initial_index, max_decode_steps, 1
  )
  loop = _SamplingLoop(
    tokens_to_logits=tokens_to_logits,
    sample_args=dict(temperature=batch.temperature, topk=topk, topp=topp),
    eos_id=eos_id,
    initial_eos_count=jnp.sum(batch.sequences == eos_id, axis=1),
    limits=batch.limits,
    max_decode_len=max_decode_len,
    rescale_log_probs=rescale_log_probs,
    state_callback_fn=state_callback_fn,
    logit_callback_fn=logit_callback_fn,
  )
  init_state = _initial_sampling_state(batch, decode_rng)
  final_state = lax.while_loop(_any_row_active, functools.partial(_sampling_step, loop), init_state)
  if state_callback_fn is not None:
    final_state = state_callback_fn(final_state)
  decodes = final_state.sequences[:, 1 : max_decode_len + 1]
  return _sort_by_log_prob(decodes, final_state.log_prob, batch_size, num_decodes)


# ------------------------------------------------------------------------------
# Speculative sampling.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class SpeculativeStats:
  """Acceptance statistics gathered inside the compiled loop.

  Per-row fields (`PER_ROW_FIELDS`) are [B, num_decodes] after decoding, in
  the same order as the returned decodes. Aggregate fields count over (row,
  iteration) pairs in which the row was still active.

  Attributes:
    target_calls: int32 scalar, loop iterations (one target block call each).
    iterations: int32 per row, iterations in which the row was active.
    accepted: int32 per row, draft tokens accepted in total.
    emitted: int32 per row, tokens written (the EOS included); equals
      `accepted + iterations` minus the tokens cut off by EOS or the length.
    drafted: int32 per row, draft tokens proposed in total (gamma per
      iteration unless the draft length is adaptive).
    draft_steps: int32 scalar, the draft's rollout steps summed over
      iterations (the batch steps together: each iteration's is the largest
      count drafted by an active row).
    beta_sum: float32 scalar, sum of beta = sum_x min(p, q) over judged
      positions (at each position the context is a target-distributed prefix).
    beta_count: int32 scalar, the number of terms in `beta_sum`.
    record: what the decode's judge recorded (`judging.Judge.record`), over
      the flat batch in the loop's row order (not sorted); () for the exact
      judge, which records nothing.
  """

  target_calls: Array
  iterations: Array
  accepted: Array
  emitted: Array
  drafted: Array
  draft_steps: Array
  beta_sum: Array
  beta_count: Array
  record: PyTree = ()

  PER_ROW_FIELDS = ('iterations', 'accepted', 'emitted', 'drafted')

  @classmethod
  def zeros(cls, flat_size: int, record: PyTree = ()) -> 'SpeculativeStats':
    """Statistics before the first iteration, per-row fields [flat_size], the judge's `record`."""
    zeros_rows = jnp.zeros((flat_size,), jnp.int32)
    return cls(
      target_calls=jnp.zeros((), jnp.int32),
      iterations=zeros_rows,
      accepted=zeros_rows,
      emitted=zeros_rows,
      drafted=zeros_rows,
      draft_steps=jnp.zeros((), jnp.int32),
      beta_sum=jnp.zeros((), jnp.float32),
      beta_count=jnp.zeros((), jnp.int32),
      record=record,
    )

  def map_rows(self, fn: Callable[[Array], Array]) -> 'SpeculativeStats':
    """These statistics with `fn` applied to every per-row field."""
    return self.replace(**{name: fn(getattr(self, name)) for name in self.PER_ROW_FIELDS})

  @property
  def mean_beta(self) -> Array:
    """alpha measured on the fly: the mean of beta over judged positions."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)

  @property
  def tokens_per_target_call(self) -> Array:
    """Mean tokens emitted per active (row, iteration) pair."""
    return jnp.sum(self.emitted) / jnp.maximum(jnp.sum(self.iterations), 1)

  @property
  def mean_acceptance_length(self) -> Array:
    """vLLM's mean_acceptance_length: 1 + accepted draft tokens per iteration.

    The tokens per target call before any cut by EOS or the length limit.
    """
    return 1 + jnp.sum(self.accepted) / jnp.maximum(jnp.sum(self.iterations), 1)

  @property
  def drafted_per_iteration(self) -> Array:
    """Mean draft tokens proposed per active (row, iteration) pair."""
    return jnp.sum(self.drafted) / jnp.maximum(jnp.sum(self.iterations), 1)

  @property
  def finished_row_calls(self) -> Array:
    """Rows of the target calls that were already finished (one batch's statistics).

    At batch > 1 the loop runs until its slowest row ends; every call scores
    all rows. rows * target_calls - sum(iterations), rows the per-row fields'.
    """
    return self.iterations.shape[0] * self.target_calls - jnp.sum(self.iterations)


@flax.struct.dataclass
class SpeculativeLoopState:
  """Loop state of `speculative_sample`.

  Attributes:
    position: int32 [BN] index in `sequences` of each row's last emitted
      token, which is also its next decoder input position.
    sequences: int32 [BN, L + gamma + 2] BOS, outputs, and room for one block
      running past the end (cut from the result).
    cache: the target's decoder cache.
    draft_cache: the draft's state (see `drafts.Draft`).
    ended: bool [BN].
    rng: PRNG key.
    log_prob: float32 [BN].
    stats: `SpeculativeStats` with flat per-row fields [BN].
  """

  position: Array
  sequences: Array
  cache: PyTree
  draft_cache: PyTree
  ended: Array
  rng: Array
  log_prob: Array
  stats: SpeculativeStats


def position_state(
  state: SpeculativeLoopState, block: Array, offset: Union[int, Array], start: Array
) -> SamplingLoopState:
  """The `SamplingLoopState` that T5X's loop would hold when feeding `block[:, offset]`.

  What `speculative_sample` hands a logit callback for one position of a
  block. Per row b, the block's tokens `block[b]` (int32 [BN, k]: the row's
  last emitted token, then its draft tokens) sit at cache positions
  `state.position[b] + 0..k-1`; the callback is about the logits predicting
  the token after `block[b, offset]`. These fields mean exactly what T5X's do
  at that step, so a callback that reads only them defines T5X's
  distribution for the same prefix:
    cur_index: int32 [BN] `state.position + offset`;
    cur_token: int32 [BN, 1] `block[:, offset]`;
    sequences: int32 [BN, L + gamma + 2], the loop's with the block's tokens
      up to `offset` written after each row's position (zeros, or the rest of
      the prompt, beyond cur_index);
    ended: bool [BN], as T5X's for every row that is still decoding (an
      ended row's logits are discarded);
    step: int32 [BN, 1], T5X's step count at that position per row,
      `cur_index - start` (start int32 [BN], where T5X's loop would have
      begun: `initial_index`, else 0). T5X's is a scalar, one for the batch;
      under speculation rows move apart, and [BN, 1] broadcasts against
      logits [BN, V] as that scalar does.
  These are per block, not per position: `cache` is the target's cache
  before the block call (valid below the row's position), `rng` the
  iteration's key, `log_prob` the row's score before the block.

  `offset` may be traced (the draft's rollout steps through it). A token
  tree's node is the block of its path from the root (`node_state`).
  """
  after_position = jnp.arange(state.sequences.shape[1])[None] - state.position[:, None]
  in_block = (after_position >= 1) & (after_position <= offset)
  from_block = jnp.take_along_axis(block, jnp.clip(after_position, 0, block.shape[1] - 1), axis=1)
  cur_index = state.position + offset
  return SamplingLoopState(
    step=(cur_index - start)[:, None],
    cur_index=cur_index,
    sequences=jnp.where(in_block, from_block, state.sequences),
    cache=state.cache,
    cur_token=lax.dynamic_slice_in_dim(block, offset, 1, axis=1),
    ended=state.ended,
    rng=state.rng,
    log_prob=state.log_prob,
  )


def node_state(
  state: SpeculativeLoopState,
  tree: tree_lib.Tree,
  node_tokens: Array,
  node: int,
  start: Array,
) -> SamplingLoopState:
  """`position_state` at one node of a block: its path from the root is the prefix.

  node_tokens int32 [BN, N] are the block's tokens (node 0 the row's last
  emitted token), laid out as the static `tree` (a chain: `Tree.chain`);
  the state is T5X's after feeding node `node`'s path from the root.
  """
  path = np.flatnonzero(tree.ancestors[node])  # Root first: ancestors have lower ids.
  return position_state(state, node_tokens[:, path], len(path) - 1, start)


def apply_logit_callback(
  logit_callback_fn: LogitCallbackFn,
  logits: Array,
  state: SpeculativeLoopState,
  node_tokens: Array,
  tree: tree_lib.Tree,
  start: Array,
) -> Array:
  """The target's block logits [BN, N, V] after the callback, node by node.

  One call per node (N of them, each with batch BN as in T5X), with
  `node_state`: node i's logits are what T5X would have passed the callback
  after feeding the path to node i. A chain's nodes are its positions.

  Why the callback then defines the same distribution as in T5X: it runs
  before temperature, top-k and top-p on the target's logits at every node,
  and `cur_index`, `cur_token`, `sequences`, `ended` and (per row) `step` of
  its state are T5X's at that position (`position_state`; `cache`, `rng` and
  `log_prob` are the block's). A callback that reads only the former gives
  p exactly T5X's, and verification keeps p. The draft's logits get the same
  callback at each rollout step so that q follows p; only p matters for
  exactness.
  """
  return jnp.stack(
    [
      logit_callback_fn(logits[:, i], node_state(state, tree, node_tokens, i, start))
      for i in range(tree.num_nodes)
    ],
    axis=1,
  )


def emit_block(
  state: 'SpeculativeLoopState',
  draft_tokens: Array,
  judgement: judging.Judgement,
  *,
  limits: Array,
  eos_id: int,
  judge: judging.Judge = judging.EXACT,
) -> 'SpeculativeLoopState':
  """Writes each row's accepted tokens and next token; moves positions; counts.

  The bookkeeping of one iteration: cuts each row's block at its end (past
  the accepted prefix, the row's length limit, the first EOS), writes what is
  kept after the row's position, and updates `ended`, `log_prob` and `stats`
  (the judge's record through `judge.record`).

  Args:
    state: the loop state before the iteration's writes.
    draft_tokens: int32 [BN, gamma].
    judgement: the block's `judging.Judgement`.
    limits: int32 [BN], each row's last output index (see `_row_limits`).
    eos_id: end-of-sequence id.
    judge: the judge that made `judgement` (`judging.Judge`), whose record
      this iteration updates; the exact judge's records nothing.
  """
  gamma = draft_tokens.shape[1]
  num_accepted = judgement.num_accepted
  position = state.position
  block_offsets = jnp.arange(gamma + 1, dtype=jnp.int32)
  emitted = emitted_block(draft_tokens, judgement)
  # Cut at each row's end: past the accepted prefix, the length, an EOS.
  slot = position[:, None] + 1 + block_offsets[None]
  keep = (block_offsets[None] <= num_accepted[:, None]) & (slot <= limits[:, None])
  keep &= ~state.ended[:, None]
  is_eos = keep & (emitted == eos_id)
  keep &= jnp.cumsum(is_eos, axis=1) - is_eos == 0  # nothing after the first EOS
  num_kept = jnp.sum(keep, axis=1).astype(jnp.int32)
  written = jnp.where(keep, emitted, 0)
  sequences = jax.vmap(lambda row, values, start: lax.dynamic_update_slice(row, values, (start,)))(
    state.sequences, written, position + 1
  )
  new_position = position + num_kept
  ended = state.ended | jnp.any(is_eos & keep, axis=1) | (new_position >= limits)

  scores = token_log_probs(emitted, judgement.target_probs, judgement.score_logits)
  log_prob = state.log_prob + jnp.sum(jnp.where(keep, scores, 0.0), axis=1)

  active = ~state.ended
  drafted = jnp.where(active, judgement.num_drafted, 0)
  judged = (block_offsets[None, :gamma] <= num_accepted[:, None]) & (
    block_offsets[None, :gamma] < drafted[:, None]
  )
  stats = state.stats
  stats = SpeculativeStats(
    target_calls=stats.target_calls + 1,
    iterations=stats.iterations + active,
    accepted=stats.accepted + jnp.where(active, num_accepted, 0),
    emitted=stats.emitted + num_kept,
    drafted=stats.drafted + drafted,
    # initial=0: an empty batch (B = 0) compiles too, and runs no iteration.
    draft_steps=stats.draft_steps + jnp.max(drafted, initial=0),
    beta_sum=stats.beta_sum + jnp.sum(jnp.where(judged, judgement.beta, 0.0)),
    beta_count=stats.beta_count + jnp.sum(judged),
    record=judge.record(stats.record, judgement, active),
  )
  return state.replace(
    position=new_position, sequences=sequences, ended=ended, log_prob=log_prob, stats=stats
  )


def emitted_block(draft_tokens: Array, judgement: judging.Judgement) -> Array:
  """int32 [BN, gamma + 1]: the accepted draft tokens, then the residual/bonus token.

  Entries past num_accepted repeat the next token; they are not emitted.
  """
  offsets = jnp.arange(draft_tokens.shape[1] + 1)
  padded_draft = jnp.pad(draft_tokens, ((0, 0), (0, 1)))
  return jnp.where(
    offsets[None] < judgement.num_accepted[:, None], padded_draft, judgement.next_token[:, None]
  )


def speculative_cache_length(
  max_decode_len: int, gamma: int, tree: Optional[tree_lib.Tree] = None
) -> int:
  """Cache positions that `speculative_sample` needs: the output plus a block.

  The block is gamma + 1 tokens, or a tree's nodes (root included).
  """
  return max_decode_len + (gamma + 1 if tree is None else tree.num_nodes)


def check_no_state_callback(state_callback_fn: Optional[StateCallbackFn]) -> None:
  """ValueError unless `state_callback_fn` is None: speculation cannot run T5X's state callback.

  T5X calls it before every single-token step, to read or rewrite the loop
  state; a speculative iteration drafts, judges and emits up to gamma + 1
  tokens per row at once, so a rewrite could not reach the tokens inside a
  block. The message names the two ways that do work.
  """
  if state_callback_fn is not None:
    raise ValueError(
      f'state_callback_fn={state_callback_fn!r} cannot mean under speculation what it means '
      "in T5X's temperature_sample, where it edits the loop state before every single-token "
      'step: here each iteration drafts, judges and emits up to gamma + 1 tokens per row at '
      "once. Decode with speculative_t5x.decoding.temperature_sample (T5X's behaviour), or "
      'express the change as a logit_callback_fn, which speculative_sample applies at every '
      'position (to force a token, leave only its logit finite).'
    )


def _checked_settings(
  judge, compact_cache, gamma, lenience, verification, draft_threshold, tree
) -> Tuple[settings_lib.SpeculativeSettings, judging.Judge]:
  """`speculative_sample`'s settings and its judge (None: `judging.EXACT`).

  ValueError on settings `settings.SpeculativeSettings` refuses, on settings
  the judge cannot judge (`judging.Judge.check`), and on a tree without the
  target cache's compaction.
  """
  spec = settings_lib.SpeculativeSettings(
    gamma=gamma,
    lenience=lenience,
    verification=verification,
    draft_threshold=draft_threshold,
    tree=tree,
  )
  judge = judging.EXACT if judge is None else judge
  judge.check(spec)
  if spec.tree is not None and compact_cache is None:
    raise ValueError(
      f'A token tree ({spec.tree}) needs compact_cache, the target cache compaction '
      "(`network.compact_tree_path` for this project's networks; `models.speculative_decode` "
      'passes it).'
    )
  return spec, judge


def _score(
  score_block: ScoreBlock,
  node_tokens: Array,
  positions: Array,
  cache: PyTree,
  feature_layers: Tuple[int, ...],
  **tree_args,
) -> Tuple[Array, Optional[Array], PyTree]:
  """One target block call: (logits [BN, N, V], features [BN, N, Df] or None, new cache).

  The features of `feature_layers` are asked for only when a draft reads them
  (`drafts.Draft.feature_layers` not empty), so that a scorer without the
  keyword serves every other draft.
  """
  if not feature_layers:
    logits, cache = score_block(node_tokens, positions, cache, **tree_args)
    return logits, None, cache
  (logits, features), cache = score_block(
    node_tokens, positions, cache, **tree_args, feature_layers=feature_layers
  )
  return logits, features, cache


def _prefill_prompts(
  score_block: ScoreBlock, draft: drafts.Draft, batch: _ExpandedBatch, max_decode_len: int
) -> Tuple[Array, PyTree, PyTree]:
  """Writes the prompts into both caches, one block call each: (position int32 [BN], caches).

  `speculative_sample` without `initial_index`: the target (through
  `score_block`, causally) and the draft (`draft.prefill`, with the target's
  features if it reads them) see positions 0..L-1 of
  `batch.sequences` (BOS, the prompts, zeros). Skipped at run time when no
  row has a prompt. position: each row's prompt length P, the index of its
  last prompt token, where decoding continues.
  """
  position = prompt_lengths(batch.inputs)

  def prefill(caches):
    cache, draft_cache = caches
    prompt_block = batch.sequences[:, :max_decode_len]
    _, features, cache = _score(
      score_block, prompt_block, jnp.zeros_like(position), cache, draft.feature_layers
    )
    return cache, draft.prefill(draft_cache, prompt_block, position, features=features)

  caches = lax.cond(jnp.any(position > 0), prefill, lambda caches: caches, batch.caches)
  return (position, *caches)


class IterationContext(NamedTuple):
  """What every iteration of one `speculative_sample` call reads besides its state.

  Static configuration, and the per-row constants of the decode.

  Attributes:
    score_block: the target's block scorer (`ScoreBlock`).
    draft: the `drafts.Draft`.
    spec: the decode's `settings.SpeculativeSettings`.
    sample_args: `temperature` (scalar or float [BN]), `topk`, `topp`.
    limits: int32 [BN], each row's last output index (`_row_limits`).
    start: int32 [BN], where T5X's loop would have begun (see
      `position_state`): `initial_index`, else 0 (BOS), as it teacher-forces
      the prompt.
    eos_id: end-of-sequence id.
    judge: the `judging.Judge` that accepts the drafted tokens.
    rescale_log_probs, logit_callback_fn, compact_cache: as
      `speculative_sample`'s.
  """

  score_block: ScoreBlock
  draft: drafts.Draft
  spec: settings_lib.SpeculativeSettings
  sample_args: Mapping[str, Any]
  limits: Array
  start: Array
  eos_id: int
  judge: judging.Judge
  rescale_log_probs: bool
  logit_callback_fn: Optional[LogitCallbackFn]
  compact_cache: Optional[CompactCache]


def _score_nodes(
  loop: IterationContext,
  state: SpeculativeLoopState,
  node_tokens: Array,
  tree: Optional[tree_lib.Tree] = None,
) -> Tuple[Array, Optional[Array], PyTree]:
  """The target's one block call: (logits [BN, N, V], features [BN, N, Df] or None, cache).

  node_tokens int32 [BN, N] at each row's position: a chain's block
  [last, x_1..x_gamma] (tree None, N = gamma + 1), or a tree's nodes. The
  logits are after the logit callback, if any (`apply_logit_callback`); the
  features those the draft reads (`drafts.Draft.feature_layers`).
  """
  tree_args = {} if tree is None else {'tree': tree}
  target_logits, features, cache = _score(
    loop.score_block,
    node_tokens,
    state.position,
    state.cache,
    loop.draft.feature_layers,
    **tree_args,
  )
  drafts.check_shared_vocabulary(loop.draft.vocab_size, target_logits.shape[-1])
  if loop.logit_callback_fn is not None:
    layout = tree_lib.Tree.chain(loop.spec.gamma) if tree is None else tree  # Node i at i.
    target_logits = apply_logit_callback(
      loop.logit_callback_fn, target_logits, state, node_tokens, layout, loop.start
    )
  return target_logits, features, cache


def _initial_loop_state(
  loop: IterationContext, batch: _ExpandedBatch, rng: Array, max_decode_len: int, prefill: bool
) -> SpeculativeLoopState:
  """The loop state before the first iteration, the prompts prefilled if `prefill`.

  Each row starts at its `initial_index` (`prefill` False: both caches arrive
  prefilled below it), or at its prompt's last token after `_prefill_prompts`;
  a row without room to decode starts ended.
  """
  position, (cache, draft_cache) = batch.start, batch.caches
  if prefill:
    position, cache, draft_cache = _prefill_prompts(
      loop.score_block, loop.draft, batch, max_decode_len
    )
  flat_size = batch.inputs.shape[0]
  spec = loop.spec
  return SpeculativeLoopState(
    position=position,
    sequences=batch.sequences,
    cache=cache,
    draft_cache=draft_cache,
    ended=position >= batch.limits,
    rng=rng,
    log_prob=jnp.zeros((flat_size,), jnp.float32),
    stats=SpeculativeStats.zeros(flat_size, loop.judge.init_record(flat_size, spec)),
  )


def _draft_chain(loop: IterationContext, state: SpeculativeLoopState, last_token: Array, rng):
  """The draft's rollout of up to gamma tokens per row after `last_token` int32 [BN, 1].

  Returns `drafts.Draft.propose`'s (draft_tokens int32 [BN, gamma],
  draft_probs float32 [BN, gamma, V] or None, num_drafted int32 [BN] or None,
  draft_cache). With a logit callback, the draft's logits at rollout step i
  get `position_state` of the block so far, so that q follows p.
  """
  callback_args = {}
  if loop.logit_callback_fn is not None:
    # Passed only when set, so that a draft without the argument serves every other decode.
    callback_args['logit_callback'] = lambda logits, i, drafted: loop.logit_callback_fn(
      logits,
      position_state(state, jnp.concatenate([last_token, drafted], axis=1), i, loop.start),
    )
  draft_tokens, draft_probs, num_drafted, draft_cache = loop.draft.propose(
    state.draft_cache,
    state.sequences,
    state.position,
    rng,
    gamma=loop.spec.gamma,
    **loop.sample_args,
    draft_threshold=loop.spec.draft_threshold,
    active=~state.ended,
    **callback_args,
  )
  if loop.spec.draft_threshold and num_drafted is None:
    raise ValueError(
      f'draft_threshold={loop.spec.draft_threshold} needs a draft that stops by its own '
      f'probabilities (a model, n-gram or feature draft); a {type(loop.draft).__name__} always '
      'drafts gamma tokens. Pass draft_threshold=0.'
    )
  return draft_tokens, draft_probs, num_drafted, draft_cache


def chain_iteration(loop: IterationContext, state: SpeculativeLoopState) -> SpeculativeLoopState:
  """One iteration with a chain: draft, score the block in one call, verify, emit.

  The draft proposes x_1..x_gamma per row. With a `draft_threshold` a row
  stops after a token to which its draft gave probability below it (its own
  softmax at temperature 1), and the rollout when every active row has
  (`drafts.rollout_loop`): rows draft 1..gamma tokens and only those are
  judged, still exactly; the block keeps its static size gamma + 1. The
  target scores [last, x_1..x_gamma]; the judge accepts a prefix per row
  and draws the next token (`judging.ExactJudge.judge_chain`:
  `speculative_sampling.verify`); a feature draft
  rewrites its entries over the accepted positions from the target's true
  features; `emit_block` writes and moves each row.
  """
  rng, propose_rng, verify_rng = jax.random.split(state.rng, 3)
  last_token = jnp.take_along_axis(state.sequences, state.position[:, None], axis=1)
  draft_tokens, draft_probs, num_drafted, draft_cache = _draft_chain(
    loop, state, last_token, propose_rng
  )
  block = jnp.concatenate([last_token, draft_tokens], axis=1)
  target_logits, features, cache = _score_nodes(loop, state, block)
  judgement = loop.judge.judge_chain(
    verify_rng,
    draft_tokens,
    draft_probs,
    target_logits,
    loop.sample_args,
    loop.spec,
    num_drafted=num_drafted,
    rescale_log_probs=loop.rescale_log_probs,
  )
  draft_cache = loop.draft.after_verify(
    draft_cache,
    features,
    emitted_block(draft_tokens, judgement),
    state.position,
    judgement.num_accepted,
  )
  return emit_block(
    state.replace(rng=rng, cache=cache, draft_cache=draft_cache),
    draft_tokens,
    judgement,
    limits=loop.limits,
    eos_id=loop.eos_id,
    judge=loop.judge,
  )


def _draft_tree(loop: IterationContext, state: SpeculativeLoopState, rng):
  """The draft's token tree: `drafts.Draft.propose_tree`'s (node_tokens int32 [BN, N],
  node_valid bool [BN, N], node_probs float32 [BN, N, V] or None, draft_cache).

  With a logit callback, the draft's logits at a node get `node_state`.
  """
  callback_args = {}
  if loop.logit_callback_fn is not None:
    # Passed only when set, so that a draft without the argument serves every other decode.
    callback_args['logit_callback'] = lambda logits, node, node_tokens: loop.logit_callback_fn(
      logits, node_state(state, loop.spec.tree, node_tokens, node, loop.start)
    )
  return loop.draft.propose_tree(
    state.draft_cache,
    state.sequences,
    state.position,
    rng,
    tree=loop.spec.tree,
    **loop.sample_args,
    **callback_args,
  )


def tree_iteration(loop: IterationContext, state: SpeculativeLoopState) -> SpeculativeLoopState:
  """One iteration with a static token tree (N nodes, depth gamma).

  The draft proposes every node level by level, children drawn without
  replacement (`drafts.Draft.propose_tree`); the target scores all N in one
  call (`score_block(..., tree=tree)`); the judge accepts a root-to-node
  path (`judging.ExactJudge.judge_tree`: `tree.verify_tree`, recursive
  rejection sampling without replacement); `compact_cache` moves the path's keys/values to consecutive
  positions in the target's cache, and the draft compacts its own (a
  feature draft rewrites its entries over the path from the target's true
  features); `emit_block` writes the path and the next token.
  """
  rng, propose_rng, verify_rng = jax.random.split(state.rng, 3)
  node_tokens, node_valid, node_probs, draft_cache = _draft_tree(loop, state, propose_rng)
  target_logits, features, cache = _score_nodes(loop, state, node_tokens, loop.spec.tree)
  judgement = loop.judge.judge_tree(
    verify_rng,
    node_tokens,
    node_valid,
    node_probs,
    target_logits,
    loop.sample_args,
    loop.spec,
    rescale_log_probs=loop.rescale_log_probs,
  )
  verdict = judgement.verdict
  cache = loop.compact_cache(cache, state.position, verdict.path)
  draft_cache = loop.draft.after_verify(
    draft_cache,
    features,
    emitted_block(verdict.path_tokens, judgement),
    state.position,
    verdict.num_accepted,
    path=verdict.path,
  )
  return emit_block(
    state.replace(rng=rng, cache=cache, draft_cache=draft_cache),
    verdict.path_tokens,
    judgement,
    limits=loop.limits,
    eos_id=loop.eos_id,
    judge=loop.judge,
  )


def _sorted_outputs(final_state: SpeculativeLoopState, batch_size, num_decodes, max_decode_len):
  """`speculative_sample`'s results from its final state: decodes, log_probs and per-row
  stats [B, num_decodes, ...], sorted by ascending log probability."""
  stats = final_state.stats
  decodes = final_state.sequences[:, 1 : max_decode_len + 1]
  per_row = {name: getattr(stats, name) for name in stats.PER_ROW_FIELDS}
  (decodes, per_row), log_prob = _sort_by_log_prob(
    (decodes, per_row), final_state.log_prob, batch_size, num_decodes
  )
  return decodes, log_prob, stats.replace(**per_row)


def speculative_sample(
  inputs: Array,
  cache: PyTree,
  score_block: ScoreBlock,
  eos_id: int,
  decode_rng: Optional[Array] = None,
  num_decodes: int = 1,
  temperature: Union[float, Array] = 1.0,
  topk: int = 1,
  topp: float = 0.0,
  cache_offset: int = 0,
  initial_index: Optional[Array] = None,
  max_decode_steps: Optional[Union[int, Array]] = None,
  max_decode_steps_hard_limit: Optional[int] = None,
  rescale_log_probs: bool = True,
  state_callback_fn: Optional[StateCallbackFn] = None,
  logit_callback_fn: Optional[LogitCallbackFn] = None,
  *,
  draft: drafts.Draft,
  draft_cache: PyTree,
  gamma: int,
  lenience: float = settings_lib.DEFAULTS.lenience,
  verification: str = settings_lib.DEFAULTS.verification,
  draft_threshold: float = settings_lib.DEFAULTS.draft_threshold,
  tree: Optional[tree_lib.Tree] = None,
  compact_cache: Optional[CompactCache] = None,
  judge: Optional[judging.Judge] = None,
) -> Tuple[Array, Array, SpeculativeStats]:
  """Speculative sampling (Algorithm 1) in one compiled while_loop.

  The output is distributed as `temperature_sample`'s with the same arguments
  (exactly for `lenience=1`); with greedy settings it is the same tokens. An
  iteration drafts, scores the block in one target call, verifies and emits:
  `chain_iteration`, or `tree_iteration` with a token tree.

  Args:
    inputs, ..., logit_callback_fn: T5X's, as `temperature_sample`'s, with
      `score_block` (`ScoreBlock`) for `tokens_to_logits`, contiguous prompts
      (`check_prompts`), a `cache` of `speculative_cache_length(L, gamma,
      tree)` positions, both caches prefilled here in one block call each
      unless `initial_index` says they were (see the module docstring),
      temperature, top-k and top-p applied to p and q, no state callback
      (`check_no_state_callback`), and the logit callback at every scored
      position and draft step, where it defines the distribution exactly as
      in T5X (`apply_logit_callback`).
    draft, draft_cache: a `drafts.Draft` (a `drafts.FeatureDraft` needs a
      `score_block` taking `feature_layers`) and its state for batch B
      (`draft.init_cache`, then `draft.prefill` if `initial_index` is given).
    gamma, lenience, verification, draft_threshold, tree: as
      `settings.SpeculativeSettings`'s; the rules' exactness arguments are
      `speculative_sampling.verify`'s and `tree.verify_tree`'s.
    compact_cache: the target cache's compaction (`CompactCache`), for a tree.
    judge: what accepts the drafted tokens (`judging.Judge`, static); None:
      `judging.EXACT`, the exact rules. The one door of any other rule (a
      timing experiment's, defined in the lab; its outputs are then not the
      target's distribution) and of statistics the library does not keep
      (the judge's record, returned as `stats.record`).

  Returns:
    `(decodes int32 [B, num_decodes, L], log_probs float32 [B, num_decodes],
    stats)`, sorted by ascending log probability (per-row stats likewise).
  """
  check_no_state_callback(state_callback_fn)
  max_decode_steps = _checked_decode_args(
    inputs, num_decodes, initial_index, max_decode_steps, max_decode_steps_hard_limit, topk, topp
  )
  check_prompts(inputs)
  spec, judge = _checked_settings(
    judge, compact_cache, gamma, lenience, verification, draft_threshold, tree
  )
  decode_rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  batch_size, max_decode_len = inputs.shape
  spare = spec.gamma + 2  # Room for one block running past the end.
  caches = (cache, draft_cache)
  batch = _expand_batch(
    inputs, caches, num_decodes, temperature, cache_offset, initial_index, max_decode_steps, spare
  )
  loop = IterationContext(
    score_block=score_block,
    draft=draft,
    spec=spec,
    sample_args=dict(temperature=batch.temperature, topk=topk, topp=topp),
    limits=batch.limits,
    start=batch.start,
    eos_id=eos_id,
    judge=judge,
    rescale_log_probs=rescale_log_probs,
    logit_callback_fn=logit_callback_fn,
    compact_cache=compact_cache,
  )
  init_state = _initial_loop_state(loop, batch, decode_rng, max_decode_len, initial_index is None)
  iteration = chain_iteration if spec.tree is None else tree_iteration
  final_state = lax.while_loop(_any_row_active, functools.partial(iteration, loop), init_state)
  return _sorted_outputs(final_state, batch_size, num_decodes, max_decode_len)
