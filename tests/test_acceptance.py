"""Tests for speculative_t5x.acceptance: drafts' logits by teacher forcing, the standard error.

The end-to-end alpha checks (against the decode loop, and teacher forcing
against the cached decoders) run on the benchmark's tiny pairs in
tests/lab/test_benchmark.py.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x import drafts
from speculative_t5x import network
from testing_utils import tiny_model


def test_standard_error_uses_the_sample_standard_deviation():
  values = [1.0, 2.0, 4.0, 7.0]
  expected = np.std(values, ddof=1) / 2.0  # s / sqrt(n), n = 4.
  assert acceptance.standard_error(values) == pytest.approx(expected)
  assert acceptance.standard_error(np.array([[1.0, 3.0]])) == pytest.approx(1.0)
  assert acceptance.standard_error([0.5, 0.5, 0.5]) == 0.0
  assert np.isnan(acceptance.standard_error([0.5]))  # One value measures no spread.


def test_an_encoder_decoder_refuses_a_prefix_lm_mask():
  model = tiny_model(seed=0, vocab_size=24)
  tokens = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(ValueError, match='prefix_lengths is for decoder-only prefix LMs'):
    acceptance.teacher_forced_logits(model.config, model.params, tokens, tokens, jnp.ones(1))
  features = dict(
    encoder_input_tokens=tokens,
    decoder_input_tokens=tokens,
    decoder_target_tokens=tokens,
    decoder_causal_attention=tokens,
  )
  with pytest.raises(ValueError, match='decoder_causal_attention is for decoder-only'):
    network.compute_logits(model.config, model.params, features)


def test_draft_logits_of_ngram_and_prompt_lookup_drafts_continue_the_prompt():
  prompts = np.array([[3, 4, 5, 3]], np.int32)
  outputs = np.array([[4, 5, 9]], np.int32)
  inputs = np.array([[7, 8, 1]], np.int32)  # Encoder inputs sharing nothing with the outputs.
  # Prompt lookup's first guesses: 4 after '3' (from '3 4'), then 5, then 3 (from '3 4 5 3').
  lookup = acceptance.draft_logits(
    drafts.PromptLookupDraft(vocab_size=24), inputs, outputs, prompts
  )
  np.testing.assert_array_equal(np.argmax(lookup, -1), [[4, 5, 3]])
  # A bigram conditions the first output on the prompt's last token.
  bigram = drafts.NgramDraft.fit([np.array([3, 9, 4, 5, 1])], 24, order=2)
  logits = acceptance.draft_logits(bigram, inputs, outputs, prompts)
  np.testing.assert_allclose(logits, bigram.log_probs(jnp.array([3, 4, 5]))[None])
