"""A position-dependent Markov "target" whose sequence probabilities are exact.

Used by the decoding tests to pin the loop's behaviour (EOS inside a block,
cuts at the length bound, uneven rows) and to check exactness of whole
sequences without a network: the logits of the next token depend on the cache
position of the current token, its id and a per-row shift kept in the cache.
"""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import sampling


class MarkovTarget:
  """logits(next | position t, token) = table[t + row_shift, token].

  Attributes:
    table: float32 [P, V, V] next-token logits per (position, current token).
  """

  def __init__(self, table):
    self.table = jnp.asarray(table, jnp.float32)

  @property
  def vocab_size(self) -> int:
    return self.table.shape[-1]

  def cache(self, row_shift) -> dict:
    """The 'cache': only the per-row shift [B] (batch-leading, so it expands)."""
    return {'row_shift': jnp.asarray(row_shift, jnp.int32)}

  def score_block(self, block_tokens, start_positions, cache, tree=None):
    """Logits of a block of consecutive positions, or of a token tree's nodes (at their depths)."""
    offsets = jnp.arange(block_tokens.shape[1]) if tree is None else jnp.asarray(tree.depths)
    positions = start_positions[:, None] + offsets[None]
    positions = jnp.minimum(positions + cache['row_shift'][:, None], self.table.shape[0] - 1)
    return self.table[positions, block_tokens], cache

  def tokens_to_logits(self, state: decoding.DecodingState):
    logits, cache = self.score_block(state.cur_token, state.cur_index, state.cache)
    return logits[:, 0], cache

  def next_logits(self, sequence, row_shift=0, logit_callback_fn=None, width=None):
    """float32 [V]: the logits that follow the decoder inputs `sequence` (BOS, prompt, outputs).

    With a T5X `logit_callback_fn(logits, state)`, rewritten by it, `state` being
    the `decoding.SamplingLoopState` that `temperature_sample` holds when it feeds
    `sequence[-1]` after starting at BOS: `sequences` int32 [1, width] (`sequence`,
    then zeros), `cur_index` and `step` the position of `sequence[-1]`.
    """
    position = len(sequence) - 1
    logits = self.table[min(position + row_shift, self.table.shape[0] - 1), sequence[-1]]
    if logit_callback_fn is None:
      return logits
    sequences = np.zeros((1, width), np.int32)
    sequences[0, : len(sequence)] = sequence
    return _apply_logit_callback(logit_callback_fn, logits[None], sequences, position)[0]

  def sequence_distribution(
    self, length, eos_id, row_shift=0, prompt=(), logit_callback_fn=None, **sample_args
  ):
    """Exact probabilities of every complete output (tokens then EOS or length).

    With a decoder `prompt` (tokens at positions 1..P), the outputs are its
    continuations: at most `length - P` tokens, the prompt itself not included.
    With a T5X `logit_callback_fn`, each step's logits are rewritten by it first
    (see `next_logits`). Returns a dict {output tuple (without trailing padding):
    probability}.
    """
    probs = np.asarray(sampling.standardize(self.table, **sample_args), np.float64)
    result = {}
    output_length = length - len(prompt)

    def next_probs(sequence):
      if logit_callback_fn is None:
        return probs[min(len(sequence) - 1 + row_shift, probs.shape[0] - 1), sequence[-1]]
      logits = self.next_logits(sequence, row_shift, logit_callback_fn, width=length + 1)
      return np.asarray(sampling.standardize(logits, **sample_args), np.float64)

    def extend(prefix, prob):
      if prob == 0.0:
        return
      if len(prefix) == output_length or (prefix and prefix[-1] == eos_id):
        result[tuple(prefix)] = result.get(tuple(prefix), 0.0) + prob
        return
      row = next_probs([0, *prompt, *prefix])
      for next_token in range(self.vocab_size):
        extend(prefix + [next_token], prob * row[next_token])

    extend([], 1.0)
    return result


@functools.partial(jax.jit, static_argnums=0)
def _apply_logit_callback(logit_callback_fn, logits, sequences, cur_index):
  """`logit_callback_fn(logits [1, V], state)` with `temperature_sample`'s state at cur_index."""
  cur_index = jnp.full((1,), cur_index, jnp.int32)
  state = decoding.SamplingLoopState(
    step=cur_index[0],
    cur_index=cur_index,
    sequences=sequences,
    cache={},
    cur_token=jnp.take_along_axis(sequences, cur_index[:, None], axis=1),
    ended=jnp.zeros((1,), bool),
    rng=jax.random.PRNGKey(0),
    log_prob=jnp.zeros((1,), jnp.float32),
  )
  return logit_callback_fn(logits, state)


def deterministic_table(outputs_per_row, vocab_size, stride):
  """A table under which row r (row_shift r * stride) greedily emits outputs_per_row[r].

  Position t + r * stride prefers outputs_per_row[r][t] whatever the current
  token, so rows decode different, known sequences. Returns (table, row_shift).
  """
  table = np.zeros((len(outputs_per_row) * stride, vocab_size, vocab_size), np.float32)
  for row, outputs in enumerate(outputs_per_row):
    assert len(outputs) <= stride
    for t, token in enumerate(outputs):
      table[row * stride + t, :, token] = 10.0
  return table, np.arange(len(outputs_per_row)) * stride


def random_table(seed, num_positions, vocab_size, scale=2.0):
  """float32 [P, V, V] standard normal logits times `scale`."""
  return (
    np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (num_positions, vocab_size, vocab_size)))
    * scale
  )


@flax.struct.dataclass
class MarkovDraft(drafts.Draft):
  """A draft that samples from a Markov table (the target's own for a perfect draft)."""

  table: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.table.shape[-1]

  def init_cache(self, row_shift):
    return {'row_shift': jnp.asarray(row_shift, jnp.int32)}

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    return cache  # Markov: the next token depends only on the position and the last token.

  def propose(self, cache, sequences, positions, rng, **rollout_args):
    last = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]

    def step(position, token):
      index = jnp.minimum(position + cache['row_shift'], self.table.shape[0] - 1)
      return self.table[index, token], position + 1

    tokens, probs, num_drafted, _ = drafts.rollout_loop(
      step, positions, last, rng, vocab_size=self.vocab_size, **rollout_args
    )
    return tokens, probs, num_drafted, cache


@flax.struct.dataclass
class ConstantDraft(drafts.Draft):
  """A deterministic draft that always proposes `token` (one-hot q)."""

  token: int = flax.struct.field(pytree_node=False)
  vocab_size: int = flax.struct.field(pytree_node=False)

  def init_cache(self, encoder_input_tokens, cache_length, encoded=None):
    return {}

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    return cache

  def propose(self, cache, sequences, positions, rng, *, gamma, **sampling_args):
    del sampling_args  # Deterministic; always gamma tokens (num_drafted None).
    return jnp.full((sequences.shape[0], gamma), self.token, jnp.int32), None, None, cache
