"""Tests for speculative_t5x.layouts: padding, trimming, shift-right, prompt layouts."""

import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import layouts


def test_pad_rows_pads_and_refuses_to_cut():
  np.testing.assert_array_equal(layouts.pad_rows([[5, 1], [6, 7, 1]]), [[5, 1, 0], [6, 7, 1]])
  np.testing.assert_array_equal(layouts.pad_rows([[5, 1]], 4), [[5, 1, 0, 0]])
  with pytest.raises(ValueError, match='Input 1 has 3 tokens, more than the input length 2'):
    layouts.pad_rows([[5, 1], [6, 7, 1]], 2)


def test_output_lengths_count_up_to_and_including_eos():
  decodes = np.array([[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]])
  np.testing.assert_array_equal(layouts.output_lengths(decodes), [2, 4, 1])
  np.testing.assert_array_equal(layouts.output_lengths(decodes, eos_id=7), [4, 3, 4])


def test_shift_right_starts_from_bos():
  np.testing.assert_array_equal(layouts.shift_right(np.array([[5, 6, 1]])), [[0, 5, 6]])


def test_prompt_layout_and_stripping_invert_each_other():
  prompts = jnp.array([[5, 6], [7, 0]], jnp.int32)
  layout = layouts.decoder_prompt_layout(prompts, 3)
  np.testing.assert_array_equal(layout, [[0, 5, 6, 0, 0], [0, 7, 0, 0, 0]])
  decodes = jnp.array([[5, 6, 8, 9, 1], [7, 8, 1, 0, 0]], jnp.int32)  # Slot j holds token j.
  np.testing.assert_array_equal(
    layouts.strip_prompts(decodes, jnp.array([2, 1]), 3), [[8, 9, 1], [8, 1, 0]]
  )


def test_trim_padding_drops_only_all_zero_columns():
  inputs = np.array([[5, 6, 1, 0, 0, 0, 0], [7, 1, 0, 0, 0, 0, 0]], np.int32)
  np.testing.assert_array_equal(layouts.trim_padding(inputs), inputs[:, :3])
  np.testing.assert_array_equal(layouts.trim_padding(inputs, multiple=2), inputs[:, :4])
  np.testing.assert_array_equal(layouts.trim_padding(inputs, multiple=16), inputs)


def test_continuation_layout_puts_the_outputs_after_each_prompt():
  prompts = np.array([[5, 6, 0], [0, 0, 0]], np.int32)
  outputs = np.array([[7, 8], [9, 1]], np.int32)
  decoder_inputs, positions = layouts.continuation_layout(prompts, outputs)
  np.testing.assert_array_equal(decoder_inputs, [[0, 5, 6, 7, 8], [0, 9, 1, 0, 0]])
  np.testing.assert_array_equal(positions, [[2, 3], [0, 1]])
  # Without prompts: the decoder inputs of the outputs alone.
  decoder_inputs, positions = layouts.continuation_layout(None, outputs)
  np.testing.assert_array_equal(decoder_inputs, layouts.shift_right(outputs))
  np.testing.assert_array_equal(positions, [[0, 1], [0, 1]])
