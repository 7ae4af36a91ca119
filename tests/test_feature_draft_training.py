"""Training pairs what the decode loop drafts: the training-side twin of the feature tests.

`train_feature_head.aligned_outputs` pairs, at each position t of the
target's outputs, the head's distribution at unroll depth k with the target's
p. A head trained on pairs shifted by one position (the wrong feature, the
wrong next-token embedding, p of the wrong token) trains fine and drafts
poorly with no error; these tests compare the pairs with what the loop
actually draws from and judges against.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import drafts
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import sampling
from speculative_t5x.training import train_feature_head
from test_feature_draft import TARGETS, aligned_head, batch_inputs

GAMMA = 3
MAX_DECODE_LEN = 10


@flax.struct.dataclass
class RecordingProposals(drafts.FeatureDraft):
  """A FeatureDraft that sends each rollout's rows, tokens and distributions to the host."""

  def propose(self, cache, sequences, positions, rng, **rollout_args):
    tokens, probs, num_drafted, cache = super().propose(
      cache, sequences, positions, rng, **rollout_args
    )
    jax.debug.callback(
      lambda *args: PROPOSALS.append(args),
      positions,
      tokens,
      probs,
      rollout_args['active'],
      ordered=True,
    )
    return tokens, probs, num_drafted, cache


PROPOSALS = []


def decode_and_pair(architecture, temperature, seed):
  """Decodes with a recording head; (input_tokens, batch, prompt lengths, aligned outputs)."""
  target = TARGETS[architecture]
  head = aligned_head(target)
  draft = RecordingProposals(head.params, head.target_params, head.config, head.target_config)
  input_tokens, _ = batch_inputs(architecture, seed, 4)
  PROPOSALS.clear()
  out = models.generate(
    target,
    draft,
    input_tokens,
    gamma=GAMMA,
    temperature=temperature,
    max_decode_len=MAX_DECODE_LEN,
    rng=jax.random.PRNGKey(seed),
  )
  jax.effects_barrier()
  outputs = np.asarray(out.tokens)
  batch = train_feature_head.training_batch(target.config, input_tokens, outputs)
  config = train_feature_head.HeadLossConfig(
    head.config, target.config, unroll_steps=GAMMA, temperature=1.0
  )
  batch = {name: jnp.asarray(v) for name, v in batch.items()}
  aligned = train_feature_head.aligned_outputs(
    config,
    head.params,
    target.params,
    train_feature_head.with_target_outputs(config, target.params, batch),
  )
  prompt_lengths = np.zeros(len(outputs), int)
  if architecture == 'decoder_only':
    prompt_lengths = np.sum(input_tokens != 0, axis=1)
  lengths = prompt_lengths + layouts.output_lengths(outputs)
  return batch, lengths, aligned, prompt_lengths


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_every_draft_the_loop_drew_along_the_output_is_trainings_q_at_that_depth(architecture):
  """Rollout step m at loop position P (drafting position P + m) whose earlier drafts are the
  output's tokens drew from the training pass's depth m - 1 distribution at t = P + m - 2."""
  batch, lengths, aligned, prompt_lengths = decode_and_pair(architecture, 1.0, seed=3)
  emitted = np.asarray(batch['decoder_target_tokens'])  # The token at loop position j + 1.
  standardized = lambda logits: np.asarray(sampling.standardize(logits, temperature=1.0))
  depth_q = [standardized(logits) for _, logits in aligned.depths]
  start_q = standardized(aligned.start[1])
  compared, from_start = np.zeros(GAMMA, int), 0
  for positions, tokens, probs, active in PROPOSALS:
    for row, position in enumerate(positions):
      if not active[row]:
        continue
      for m in range(1, GAMMA + 1):
        t = position + m - 2
        if position + m > lengths[row]:  # Past the row's last emitted token.
          break
        if t < 0:  # Step 1 at BOS: the start state's draft of the first token.
          assert aligned.start_weights[row] == 1.0, row
          expected, from_start = start_q[row], from_start + 1
        else:
          assert aligned.weights[row, t] == 1.0, (row, t)
          expected = depth_q[m - 1][row, t]
          compared[m - 1] += 1
        np.testing.assert_allclose(
          probs[row, m - 1], expected, atol=2e-5, err_msg=f'step {m}, t {t}'
        )
        if tokens[row, m - 1] != emitted[row, position + m - 1]:  # Later steps drew off the output.
          break
  assert np.all(compared > 0), compared  # Every depth was checked,
  assert from_start == np.sum(prompt_lengths == 0)  # and every row without a prompt's start.


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_trainings_p_at_t_is_the_targets_distribution_of_the_token_the_head_drafts(architecture):
  """Greedy: the argmax of training's p at t is the output token at position t + 2, the one
  the head at t drafts, and the weights are 1 exactly where that token was emitted."""
  batch, lengths, aligned, prompt_lengths = decode_and_pair(architecture, 0.0, seed=5)
  p, weights = np.asarray(aligned.p), np.asarray(aligned.weights)
  emitted = np.asarray(batch['decoder_target_tokens'])  # The token at loop position j + 1.
  for row, length in enumerate(lengths):
    np.testing.assert_array_equal(weights[row], np.arange(weights.shape[1]) + 2 <= length)
    # Outputs start at position P + 1; the target predicts the first after the prompt too.
    drafted = np.arange(max(prompt_lengths[row] - 1, 0), length - 1)
    np.testing.assert_array_equal(p[row, drafted].argmax(-1), emitted[row, drafted + 1])
    # The start state drafts the token after BOS (a prompt's first is given, not drafted).
    assert aligned.start_weights[row] == 1.0
    if prompt_lengths[row] == 0:
      assert np.argmax(aligned.start_p[row]) == emitted[row, 0]
