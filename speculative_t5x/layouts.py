"""Token layouts: padding, trimming, shift-right, output lengths, prompt layouts.

Pure functions over token arrays, shared by decoding, α, training data,
inference and the benchmark. The conventions are T5's and T5X's:

  * token id 0 is padding and also BOS; `EOS_ID` (1) ends a sequence;
  * rows of inputs and outputs are tokens then 0-padding; a decode's row ends
    at its EOS, the slots after it are 0;
  * a decoder prompt in T5X's layout (`decoder_prompt_layout`) sits at
    indices 1..P of a row whose index 0 is the BOS slot; the decoder's input
    at position t is the token at t - 1 (`shift_right`), so its logits at
    position P + j predict output j (`continuation_layout`).

The numpy functions (host side) take and return numpy arrays; the jax ones
(`strip_prompts`, `remove_prompts`, `decoder_prompt_layout`) run inside jit.
"""

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import network

EOS_ID = 1  # T5's SentencePiece vocabularies: PAD = BOS = 0, EOS = 1.


# ------------------------------------------------------------------------------
# Host side (numpy).
# ------------------------------------------------------------------------------
def pad_rows(rows: Sequence[Sequence[int]], length: Optional[int] = None) -> np.ndarray:
  """int32 [N, length]: token rows (each ending in EOS), 0-padded.

  `length` None fits the longest row. A row longer than `length` is a
  ValueError naming it: inputs are never silently cut.
  """
  length = max(map(len, rows)) if length is None else length
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(
        f'Input {i} has {len(row)} tokens, more than the input length {length}; '
        'raise the input length (feature length "inputs").'
      )
    out[i, : len(row)] = row
  return out


def trim_padding(inputs: np.ndarray, multiple: int = 1) -> np.ndarray:
  """`inputs` [N, L] without the all-padding columns at the end: [N, L' <= L].

  The width is rounded up to a multiple of `multiple` (a few bucket widths
  keep the number of compiled shapes small). Decodes do not change: padding
  is masked; only the encoder's and cross-attention's wasted work goes.
  """
  used = np.flatnonzero(inputs.any(axis=0))
  width = int(used[-1]) + 1 if used.size else 1
  return inputs[:, : min(-(-width // multiple) * multiple, inputs.shape[1])]


def output_lengths(tokens: np.ndarray, eos_id: int = EOS_ID) -> np.ndarray:
  """int [N]: emitted tokens per row of decodes [N, L] (up to and incl. EOS; L if none)."""
  tokens = np.asarray(tokens)
  is_eos = tokens == eos_id
  return np.where(is_eos.any(axis=1), np.argmax(is_eos, axis=1) + 1, tokens.shape[1])


def shift_right(output_tokens: np.ndarray) -> np.ndarray:
  """int [N, L]: the decoder inputs of outputs [N, L], BOS (0) then all but the last."""
  return np.pad(np.asarray(output_tokens)[:, :-1], ((0, 0), (1, 0)))


def continuation_layout(prompts: Optional[np.ndarray], output_tokens: np.ndarray):
  """The decoder inputs along prompted continuations, and where each output is predicted.

  T5X's layout: BOS, each row's P prompt tokens at 1..P, then its outputs;
  the decoder's logits at position P + j predict output j.

  Args:
    prompts: int [N, Lp] prompts (each row's tokens, then 0-padding), or
      None (every row starts from BOS).
    output_tokens: int [N, L], what follows each prompt.

  Returns:
    (decoder_input_tokens int32 [N, Lp + L], BOS, the prompt, then the
    outputs but the last, 0-padded; positions int32 [N, L], P + j). Without
    prompts they are `shift_right(output_tokens)` and 0..L-1.
  """
  outputs = np.asarray(output_tokens, np.int32)
  num_rows, length = outputs.shape
  prompts = np.zeros((num_rows, 0), np.int32) if prompts is None else np.asarray(prompts, np.int32)
  sequences = np.zeros((num_rows, prompts.shape[1] + length), np.int32)
  sequences[:, : prompts.shape[1]] = prompts
  positions = (prompts != 0).sum(axis=1, dtype=np.int32)[:, None] + np.arange(
    length, dtype=np.int32
  )
  np.put_along_axis(sequences, positions, outputs, axis=1)
  return shift_right(sequences), positions


def prompts_of(target: Any, inputs, decoder_prompts=None):
  """The prompts [N, Lp] of a decode call: a decoder-only target's inputs, else decoder_prompts.

  `target` is a `models.Model` (anything with a `config`); `inputs` [N, Lin]
  are the decode call's `input_tokens`, `decoder_prompts` [N, Lp] or None an
  encoder-decoder's.
  """
  return inputs if network.is_decoder_only(target.config) else decoder_prompts


# ------------------------------------------------------------------------------
# Inside jit (jax).
# ------------------------------------------------------------------------------
def decoder_prompt_layout(prompts: jax.Array, max_decode_len: int) -> jax.Array:
  """Prompts int32 [B, Lp] (tokens, then 0-padding) in T5X's layout [B, Lp + max_decode_len].

  Index 0 is the BOS slot and prompt token i sits at index i + 1, so that
  `max_decode_len` tokens fit after the longest prompt.
  """
  batch, prompt_width = prompts.shape
  layout = jnp.zeros((batch, prompt_width + max_decode_len), jnp.int32)
  return layout.at[:, 1 : prompt_width + 1].set(prompts.astype(jnp.int32))


def strip_prompts(decodes: jax.Array, prompt_lengths: jax.Array, length: int) -> jax.Array:
  """int32 [B, length]: what follows each row's prompt in T5X-layout decodes [B, L].

  decodes[b, P_b : P_b + length] with `prompt_lengths` int32 [B] the P_b
  (the output slot j holds decodes[:, j]); slots past L are 0.
  """
  padded = jnp.pad(decodes, ((0, 0), (0, length)))
  return jax.vmap(lambda row, start: jax.lax.dynamic_slice(row, (start,), (length,)))(
    padded, prompt_lengths
  )


def remove_prompts(decodes: jax.Array, prompt_lengths: jax.Array) -> jax.Array:
  """T5X's `remove_prefix`: each row shifted left by its prompt length, zeros after.

  Args:
    decodes: int32 [B, L] or [B, num_decodes, L].
    prompt_lengths: int32 [B].

  Returns:
    int32, the shape of `decodes`.
  """
  length = decodes.shape[-1]
  if decodes.ndim == 3:
    return jax.vmap(remove_prompts, in_axes=(1, None), out_axes=1)(decodes, prompt_lengths)
  return strip_prompts(decodes, prompt_lengths, length)
