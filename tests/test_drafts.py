"""Draft proposers pinned on small hand-checked arrays."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import drafts
from speculative_t5x import network
import testing_utils

NO_SAMPLING_ARGS = dict(temperature=1.0, topk=0, topp=0.0)


class TestNgramDraft:
  def test_bigram_counts_and_add_k_smoothing(self):
    # Sequences are targets without BOS; BOS (0) is the first context.
    draft = drafts.NgramDraft.fit([[2, 3, 2, 1], [2, 1]], vocab_size=4, order=2, add_k=0.5)
    q = np.exp(np.asarray(draft.log_probs(jnp.array([0, 2, 3]))))
    # After BOS: 2 twice. After 2: 3 once, 1 twice. After 3: 2 once.
    denominators = np.array([2, 3, 1]) + 0.5 * 4
    expected = np.array([[0, 0, 2, 0], [0, 2, 0, 1], [0, 0, 1, 0]]) + 0.5
    np.testing.assert_allclose(q, expected / denominators[:, None], rtol=1e-6)

  def test_unigram_ignores_the_context(self):
    draft = drafts.NgramDraft.fit([[2, 3, 2, 1]], vocab_size=4, order=1, add_k=1.0)
    q = np.exp(np.asarray(draft.log_probs(jnp.array([0, 3]))))
    np.testing.assert_allclose(q, np.tile(np.array([1, 2, 3, 2]) / 8, (2, 1)), rtol=1e-6)

  def test_truncated_continuations_still_normalize(self):
    draft = drafts.NgramDraft.fit([[2, 3, 2, 4, 2, 4]], vocab_size=6, max_continuations=1)
    q = np.exp(np.asarray(draft.log_probs(jnp.array([2]))))
    np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-6)
    assert q[0, 4] > q[0, 3]  # The kept continuation is the most frequent one.

  def test_propose_reports_the_distribution_it_samples_from(self):
    draft = drafts.NgramDraft.fit([[2, 3, 2, 1]], vocab_size=4)
    sequences = jnp.array([[0, 2, 3, 0, 0, 0]])
    tokens, probs, num_drafted, _ = draft.propose(
      {},
      sequences,
      jnp.array([2]),
      jax.random.PRNGKey(0),
      gamma=3,
      temperature=0.0,
      topk=0,
      topp=0.0,
      draft_threshold=0.0,
    )
    # Greedy: after 3 comes 2; after 2, 1 and 3 tie (lowest id wins); after 1,
    # never seen as a context, q is uniform and argmax takes id 0.
    np.testing.assert_array_equal(tokens, [[2, 1, 0]])
    np.testing.assert_array_equal(probs[0, np.arange(3), tokens[0]], 1.0)
    np.testing.assert_array_equal(num_drafted, [3])

  @pytest.mark.parametrize(
    'kwargs, message', [(dict(order=3), 'order'), (dict(add_k=0.0), 'add_k')]
  )
  def test_bad_arguments(self, kwargs, message):
    with pytest.raises(ValueError, match=message):
      drafts.NgramDraft.fit([[2]], vocab_size=4, **kwargs)

  def test_ids_outside_the_vocabulary(self):
    with pytest.raises(ValueError, match=r'\[0, 4\)'):
      drafts.NgramDraft.fit([[2, 7]], vocab_size=4)


class TestPromptLookupDraft:
  def propose(self, input_tokens, generated, gamma, max_ngram=3):
    draft = drafts.PromptLookupDraft(vocab_size=50, max_ngram=max_ngram)
    cache = draft.init_cache(jnp.array([input_tokens]), cache_length=0)
    sequences = jnp.array([[0] + generated + [0] * (gamma + 2)])
    tokens, probs, num_drafted, _ = draft.propose(
      cache,
      sequences,
      jnp.array([len(generated)]),
      jax.random.PRNGKey(0),
      gamma=gamma,
      draft_threshold=0.0,
      **NO_SAMPLING_ARGS,
    )
    assert probs is None and num_drafted is None  # Deterministic: q one-hot, gamma tokens.
    return np.asarray(tokens[0]).tolist()

  def test_copies_the_continuation_of_the_longest_match_in_the_input(self):
    # Suffix [7, 8]: "7 8" occurs once in the input, followed by 9 10 11.
    assert self.propose([5, 7, 8, 9, 10, 11, 1], [4, 7, 8], gamma=3) == [9, 10, 11]

  def test_longer_match_beats_more_recent_shorter_one(self):
    # Suffix [6, 8]: the input has "6 8 20", the output has "3 8 30" (only "8" matches).
    assert self.propose([6, 8, 20, 21, 1], [3, 8, 30, 6, 8], gamma=2) == [20, 21]

  def test_most_recent_among_equal_matches_and_generated_prefix(self):
    # Suffix [8]: input "8 20", output "8 30" later: the output's is the most recent.
    assert self.propose([8, 20, 1], [8, 30, 8], gamma=2) == [30, 8]

  def test_tokens_past_the_known_prefix_are_zero(self):
    assert self.propose([9, 1], [4, 4], gamma=3) == [4, 0, 0]

  def test_no_match_proposes_padding(self):
    assert self.propose([5, 6, 1], [7], gamma=2) == [0, 0]

  def test_a_match_followed_by_padding_is_no_candidate(self):
    # A decoder-only prompt is both the (0-padded) input and the sequence's
    # start: its own end ("... 5 7 8", then padding) must not win over the
    # earlier "7 8 9".
    prompt = [7, 8, 9, 5, 7, 8]
    assert self.propose(prompt + [0, 0], prompt, gamma=3) == [9, 5, 7]


class TestModelDraft:
  """The draft's cache stays exact across the loop's position moves, with catch-ups."""

  @pytest.mark.parametrize('draft_threshold', [0.0, pytest.param(0.45, marks=pytest.mark.slow)])
  def test_rollouts_equal_the_full_forward_pass_after_any_acceptance(self, draft_threshold):
    """Every drafted q is the full forward pass's, whatever was drafted and accepted before.

    With a threshold, rows draft 1..gamma tokens (each stops after its first
    token of probability below it) and the catch-up covers a fully accepted
    partial draft.
    """
    model = testing_utils.tiny_model(seed=3, vocab_size=16, layers=2, scale=3.0)
    draft = model.as_draft()
    gamma, length, batch = 4, 60, 3
    rng = np.random.default_rng(0)
    encoder_inputs = jnp.asarray(rng.integers(2, 16, (batch, 5)), jnp.int32)
    cache = draft.init_cache(encoder_inputs, length + gamma + 1)
    sequences = np.zeros((batch, length + gamma + 2), np.int32)
    positions = np.zeros(batch, np.int32)
    catch_ups, drafted_counts = 0, []
    propose = jax.jit(
      functools.partial(
        draft.propose, gamma=gamma, draft_threshold=draft_threshold, **NO_SAMPLING_ARGS
      )
    )
    # The full forward pass, causal: position t's q depends on tokens <= t only.
    forward = jax.jit(
      lambda decoder_inputs: jax.nn.softmax(
        network.Transformer(model.config).apply(
          {'params': model.params},
          encoder_inputs,
          decoder_inputs,
          jnp.ones_like(decoder_inputs),
          enable_dropout=False,
        )
      )
    )
    for iteration in range(12):
      catch_ups += int(np.sum(positions > np.asarray(cache['written_until'])))
      tokens, probs, num_drafted, cache = propose(
        cache, jnp.asarray(sequences), jnp.asarray(positions), jax.random.PRNGKey(iteration)
      )
      tokens, probs, num_drafted = map(np.asarray, (tokens, probs, num_drafted))
      with_drafts = sequences.copy()
      for row in range(batch):
        with_drafts[row, positions[row] + 1 : positions[row] + 1 + gamma] = tokens[row]
      full_q = np.asarray(forward(jnp.asarray(with_drafts)))
      for row in range(batch):
        n, p = int(num_drafted[row]), int(positions[row])
        drafted_counts.append(n)
        # Every drafted q equals the draft's full forward pass on the prefix.
        expected = full_q[row, p : p + n]
        np.testing.assert_allclose(probs[row, :n], expected, atol=2e-5)
        # The row stopped after its first token below the threshold (T = 1: q is
        # the confidence), and nothing is proposed past it.
        confident = expected[np.arange(n), tokens[row, :n]] >= draft_threshold
        assert confident[:-1].all() and (n == gamma or not confident[-1])
        assert (tokens[row, n:] == 0).all() and (probs[row, n:] == 0).all()
        # Accept all n every third iteration (the case that needs a catch-up).
        accepted = n if iteration % 3 == 0 else int(rng.integers(0, n + 1))
        emitted = list(tokens[row, :accepted]) + [int(rng.integers(2, 16))]
        sequences[row, p + 1 : p + 1 + len(emitted)] = emitted
        positions[row] += len(emitted)
    assert catch_ups >= 4 * batch  # After iterations 0, 3, 6 and 9 at least.
    if draft_threshold:
      assert min(drafted_counts) < gamma and 1 < max(drafted_counts)
    else:
      assert set(drafted_counts) == {gamma}

  def test_the_rollout_stops_when_every_active_row_has_stopped(self):
    """No step runs past the longest draft: later cache positions stay unwritten."""
    model = testing_utils.tiny_model(seed=3, vocab_size=16, scale=3.0)
    draft = model.as_draft()
    gamma, cache_length = 5, 12
    cache = draft.init_cache(jnp.array([[3, 4, 1], [5, 6, 1]], jnp.int32), cache_length)
    sequences = jnp.zeros((2, cache_length + 1), jnp.int32)

    def steps_run(draft_threshold, active=None):
      """(num_drafted, the number of leading positions the rollout wrote)."""
      _, _, num_drafted, new_cache = draft.propose(
        cache,
        sequences,
        jnp.zeros((2,), jnp.int32),
        jax.random.PRNGKey(0),
        gamma=gamma,
        draft_threshold=draft_threshold,
        active=active,
        **NO_SAMPLING_ARGS,
      )
      self_keys = [
        np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(new_cache['decoder'])
        if jax.tree_util.keystr(path).endswith("['self_attention']['cached_key']")
      ]
      # [layers, B, heads, head_dim, cache_length]: the positions any layer wrote.
      written = np.any(np.stack(self_keys) != 0, axis=(0, 1, 2, 3))
      return np.asarray(num_drafted), int(np.sum(written))

    def check(expected_drafted, expected_steps, *args):
      num_drafted, steps = steps_run(*args)
      np.testing.assert_array_equal(num_drafted, expected_drafted)
      assert steps == expected_steps

    check([gamma, gamma], gamma, 0.0)
    # Every token of a random tiny model is below 0.99: one step.
    check([1, 1], 1, 0.99)
    # An inactive row drafts nothing and does not hold the loop.
    check([0, 1], 1, 0.99, jnp.array([False, True]))
    check([gamma, 0], gamma, 0.0, jnp.array([True, False]))


@pytest.mark.parametrize(
  'draft',
  [
    testing_utils.tiny_model(seed=1, vocab_size=8).as_draft(),
    testing_utils.tiny_model(seed=1, vocab_size=8).as_parallel_draft(),
    drafts.NgramDraft.fit([[2, 3, 1]], vocab_size=8),
    drafts.PromptLookupDraft(vocab_size=8),
  ],
)
def test_every_draft_has_the_protocol_members(draft):
  assert isinstance(draft, drafts.Draft)
  for name in ('init_cache', 'prefill', 'propose', 'propose_tree', 'after_verify'):
    assert callable(getattr(draft, name)), name
  assert draft.vocab_size == 8 and draft.feature_layers == ()
