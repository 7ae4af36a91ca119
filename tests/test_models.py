"""`models.generate` on real (tiny, random) networks: greedy equality, exactness, no retrace."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import judging
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import settings
import markov
from testing_utils import (
  EOS,
  decoded_lengths,
  outputs_as_tuples,
  padded_inputs,
  sequence_chi_square_p_value,
  tiny_model,
)


TARGET = tiny_model(seed=0, layers=2, scale=3.0)
DRAFT = tiny_model(seed=1, scale=3.0)


class TestGreedyEquality:
  # `make test`: every draft kind under token verification, and block verification with a
  # model draft (batch 8) and a wrong draft; the other cases are `slow`.
  @pytest.mark.parametrize(
    'draft_kind, batch, gamma, verification',
    [
      pytest.param('model', 1, 1, 'token', marks=pytest.mark.slow),
      pytest.param('model', 3, 4, 'token', marks=pytest.mark.slow),
      ('model', 8, 8, 'token'),
      ('target', 2, 3, 'token'),
      ('wrong', 5, 2, 'token'),
      ('bigram', 4, 5, 'token'),
      ('lookup', 6, 3, 'token'),
      pytest.param('model', 3, 4, 'block', marks=pytest.mark.slow),
      ('model', 8, 7, 'block'),
      pytest.param('target', 2, 3, 'block', marks=pytest.mark.slow),
      ('wrong', 5, 2, 'block'),
      pytest.param('bigram', 4, 5, 'block', marks=pytest.mark.slow),
      pytest.param('lookup', 6, 3, 'block', marks=pytest.mark.slow),
    ],
  )
  def test_speculative_equals_baseline(self, draft_kind, batch, gamma, verification):
    self.check_equals_baseline(draft_kind, batch, gamma, verification)

  @pytest.mark.parametrize(
    'draft_kind, batch, gamma, verification',
    [
      pytest.param('model', 6, 5, 'token', marks=pytest.mark.slow),
      ('model', 6, 5, 'block'),
      pytest.param('model', 1, 7, 'token', marks=pytest.mark.slow),
      ('bigram', 4, 7, 'block'),
      pytest.param('model', 1, 7, 'block', marks=pytest.mark.slow),
      pytest.param('bigram', 4, 7, 'token', marks=pytest.mark.slow),
    ],
  )
  def test_an_adaptive_draft_length_equals_baseline(self, draft_kind, batch, gamma, verification):
    stats = self.check_equals_baseline(draft_kind, batch, gamma, verification, draft_threshold=0.5)
    drafted, iterations = np.asarray(stats.drafted), np.asarray(stats.iterations)
    assert np.all(drafted >= iterations) and drafted.sum() < gamma * iterations.sum()
    assert int(stats.draft_steps) < gamma * int(stats.target_calls)

  def check_equals_baseline(self, draft_kind, batch, gamma, verification, draft_threshold=0.0):
    """Greedy speculative tokens == greedy baseline tokens; returns the stats."""
    inputs = padded_inputs(batch, batch, 9, TARGET.vocab_size)
    kwargs = dict(temperature=0.0, max_decode_len=12)
    baseline = models.generate(TARGET, None, inputs, **kwargs)
    if draft_kind == 'model':
      draft = DRAFT
    elif draft_kind == 'target':
      draft = TARGET
    elif draft_kind == 'wrong':
      unused = sorted(set(range(2, TARGET.vocab_size)) - set(np.asarray(baseline.tokens).ravel()))
      draft = markov.ConstantDraft(token=unused[0], vocab_size=TARGET.vocab_size)
    elif draft_kind == 'bigram':
      draft = drafts.NgramDraft.fit(list(inputs), TARGET.vocab_size)
    else:
      draft = drafts.PromptLookupDraft(vocab_size=TARGET.vocab_size)
    out = models.generate(
      TARGET,
      draft,
      inputs,
      gamma=gamma,
      verification=verification,
      draft_threshold=draft_threshold,
      **kwargs,
    )
    np.testing.assert_array_equal(out.tokens, baseline.tokens)
    emitted, iterations = np.asarray(out.stats.emitted), np.asarray(out.stats.iterations)
    if draft_kind == 'target':
      # Every iteration emits gamma + 1 tokens until the row's end.
      np.testing.assert_array_equal(iterations, -(-emitted // (gamma + 1)))
    if draft_kind == 'wrong':
      np.testing.assert_array_equal(emitted, iterations)
    return out.stats

  def test_a_greedy_row_takes_its_batch_1_iterations_in_any_batch(self):
    """What `theory.replayed_batch_walltime_improvement` predicts batched greedy loops from."""
    inputs = padded_inputs(2, 6, 9, TARGET.vocab_size)
    kwargs = dict(gamma=3, temperature=0.0, max_decode_len=12)
    batched = models.generate(TARGET, DRAFT, inputs, **kwargs).stats
    alone = [models.generate(TARGET, DRAFT, inputs[i : i + 1], **kwargs).stats for i in range(6)]
    alone_iterations = [int(np.asarray(s.iterations).item()) for s in alone]
    np.testing.assert_array_equal(np.ravel(batched.iterations), alone_iterations)
    assert len(set(alone_iterations)) > 1  # Ragged: the rows differ.
    assert int(batched.target_calls) == max(alone_iterations)

  def test_baseline_is_one_token_per_call_greedy_argmax(self):
    """The baseline's first token is the argmax of a teacher-forced forward pass."""
    inputs = padded_inputs(0, 3, 7, TARGET.vocab_size)
    out = models.generate(TARGET, None, inputs, temperature=0.0, max_decode_len=5)
    decoder_inputs = np.concatenate([np.zeros((3, 1), np.int32), np.asarray(out.tokens)[:, :-1]], 1)
    logits = network.Transformer(TARGET.config).apply(
      {'params': TARGET.params},
      inputs,
      decoder_inputs,
      np.ones_like(decoder_inputs),
      enable_dropout=False,
    )
    expected = np.asarray(jnp.argmax(logits, -1))
    alive = np.arange(out.tokens.shape[1]) < decoded_lengths(out.tokens)[:, None]
    np.testing.assert_array_equal(np.where(alive, out.tokens, 0), np.where(alive, expected, 0))


def exact_sequence_distribution(model, input_tokens, length, **sample_args):
  """{output tuple: probability} for one input row, by teacher forcing every prefix."""
  vocab = model.vocab_size
  outputs = list(itertools.product(range(vocab), repeat=length))
  decoder_inputs = np.array([(0,) + o[:-1] for o in outputs], np.int32)
  logits = network.Transformer(model.config).apply(
    {'params': model.params},
    np.repeat(input_tokens[None], len(outputs), 0),
    decoder_inputs,
    np.ones_like(decoder_inputs),
    enable_dropout=False,
  )
  probs = np.asarray(sampling.standardize(logits, **sample_args), np.float64)
  result = {}
  for output, row in zip(outputs, probs):
    prob, prefix = 1.0, []
    for t, token in enumerate(output):
      prob *= row[t, token]
      prefix.append(token)
      if token == EOS:
        break
    key = tuple(prefix)
    if key not in result:  # Outputs sharing a prefix up to EOS are one outcome.
      result[key] = prob
  return result


SAMPLED_MODES = {
  'temperature1': dict(temperature=1.0),
  'topk3': dict(temperature=1.0, topk=3),
  'topp0.7': dict(temperature=0.8, topp=0.7),
}
SAMPLED_SIZES = {  # (gamma, draft_threshold, batch, calls)
  '4096_sequences': (3, 0.0, 2_048, 2),
  '102400_sequences': (3, 0.0, 12_800, 8),
  'adaptive-4096_sequences': (3, 0.9, 2_048, 2),
  'adaptive-gamma7-204800_sequences': (7, 0.9, 12_800, 16),
}
# `make test` runs three 4096-sequence cases: temperature 1 and top-k with token
# verification, top-p with block verification and the adaptive length (each mode, rule and
# length once); the rest, and every full-size case, are `slow`.
SAMPLED_FAST = {
  ('temperature1', 'token', '4096_sequences'),
  ('topk3', 'token', '4096_sequences'),
  ('topp0.7', 'block', 'adaptive-4096_sequences'),
}


@pytest.mark.parametrize(
  'sample_args, verification, gamma, draft_threshold, batch, calls',
  [
    pytest.param(
      args,
      rule,
      *size,
      id=f'{mode}-{rule}-{size_name}',
      marks=() if (mode, rule, size_name) in SAMPLED_FAST else pytest.mark.slow,
    )
    for mode, args in SAMPLED_MODES.items()
    for rule in ('token', 'block')
    for size_name, size in SAMPLED_SIZES.items()
  ],
)
def test_sampled_sequences_follow_the_target(
  sample_args, gamma, draft_threshold, batch, calls, verification
):
  """batch * calls sequences from a tiny network pair vs the target's exact distribution.

  With a draft threshold, rows draft 1..gamma tokens (the adaptive draft length).
  """
  vocab, length = 6, 3
  target = tiny_model(seed=2, vocab_size=vocab, emb_dim=16, scale=2.0)
  draft = tiny_model(seed=3, vocab_size=vocab, emb_dim=16, scale=2.0)
  input_row = np.array([3, 4, 2, EOS, 0], np.int32)
  inputs = np.tile(input_row, (batch, 1))
  samples = []
  for call in range(calls):
    out = models.generate(
      target,
      draft,
      inputs,
      gamma=gamma,
      max_decode_len=length,
      rng=jax.random.PRNGKey(call),
      verification=verification,
      draft_threshold=draft_threshold,
      **sample_args,
    )
    samples += outputs_as_tuples(out.tokens)
  exact = exact_sequence_distribution(target, input_row, length, **sample_args)
  p_value = sequence_chi_square_p_value(samples, exact)
  drafted = float(out.stats.drafted_per_iteration)
  print(
    f'\nchi-square p-value, tiny networks, model draft, gamma={gamma}, {verification}, '
    f'draft_threshold={draft_threshold}, {sample_args}: {p_value:.4f} over {len(samples)} '
    f'sequences, alpha={float(out.stats.mean_beta):.3f}, drafted/iteration={drafted:.2f}'
  )
  assert p_value > 1e-3
  assert drafted < gamma if draft_threshold else drafted == gamma


def test_second_call_with_new_inputs_does_not_recompile():
  inputs = padded_inputs(0, 2, 6, TARGET.vocab_size)
  kwargs = dict(gamma=3, temperature=1.0, max_decode_len=8)
  models.generate(TARGET, DRAFT, inputs, **kwargs)
  compiled = models._generate._cache_size()
  other = models.generate(
    TARGET, DRAFT, padded_inputs(1, 2, 6, TARGET.vocab_size), rng=jax.random.PRNGKey(5), **kwargs
  )
  assert models._generate._cache_size() == compiled
  assert other.tokens.shape == (2, 8)
  # The judge is static and compared by value: the exact one, however named, is the same program.
  models.generate(TARGET, DRAFT, inputs, judge=judging.ExactJudge(), **kwargs)
  assert models._generate._cache_size() == compiled


class TestBadInput:
  def test_vocabulary_mismatch_names_both_sizes(self):
    with pytest.raises(ValueError, match='vocabulary size 40 .* 32'):
      models.generate(TARGET, tiny_model(seed=4, vocab_size=40), np.ones((1, 3), np.int32))

  @pytest.mark.parametrize(
    'kwargs, message',
    [
      (dict(gamma=0), 'gamma'),
      (dict(temperature=-1.0), 'temperature'),
      (dict(topk=2, topp=0.5), 'topk'),
      (dict(topp=1.5), 'topp'),
      (dict(lenience=0.0), 'lenience'),
      (dict(max_decode_len=0), 'max_decode_len'),
    ],
  )
  def test_bad_arguments(self, kwargs, message):
    with pytest.raises(ValueError, match=message):
      models.generate(TARGET, DRAFT, np.ones((1, 3), np.int32), **kwargs)

  def test_token_ids_outside_the_vocabulary(self):
    with pytest.raises(ValueError, match='input_tokens must lie in'):
      models.generate(TARGET, None, np.full((1, 3), 99, np.int32))


class TestArgumentsAtTheApiEdge:
  """Values that used to be silently rounded, clipped or decoded to padding."""

  TARGET = tiny_model(seed=11, vocab_size=16)
  INPUTS = np.array([[3, 4, 1]], np.int32)

  @pytest.mark.parametrize(
    'name, value',
    [
      ('gamma', True),
      ('gamma', 2.0),
      ('gamma', 0),
      ('max_decode_len', 2.5),
      ('max_decode_len', False),
    ],
  )
  def test_non_integers_and_bools_are_errors(self, name, value):
    with pytest.raises(ValueError, match=f'{name} must be an integer >= 1; got {value!r}'):
      models.make_decoder(self.TARGET, self.TARGET, **{name: value})

  def test_ids_outside_the_vocabulary_through_make_decoder(self):
    decode = models.make_decoder(self.TARGET, self.TARGET, gamma=2, max_decode_len=4)
    with pytest.raises(ValueError, match=r'must lie in \[0, 16\).*max 16'):
      decode(np.array([[3, 16, 1]], np.int32), jax.random.PRNGKey(0))
    assert decode(self.INPUTS, jax.random.PRNGKey(0)).tokens.shape == (1, 4)

  def test_a_per_row_temperature_array_is_a_named_error(self):
    with pytest.raises(ValueError, match='one temperature for the batch.*shape \\(2,\\)'):
      models.generate(
        self.TARGET,
        self.TARGET,
        np.repeat(self.INPUTS, 2, axis=0),
        temperature=np.array([0.5, 1.0]),
      )

  @pytest.mark.parametrize('value', [-0.1, 1.0, 2, True, '0.5', None])
  def test_a_bad_draft_threshold_is_a_named_error(self, value):
    with pytest.raises(
      ValueError, match=f'draft_threshold must be a number in .0, 1.; got {value!r}'
    ):
      models.make_decoder(self.TARGET, self.TARGET, draft_threshold=value)

  def test_a_draft_threshold_without_draft_probabilities_is_a_named_error(self):
    lookup = drafts.PromptLookupDraft(vocab_size=self.TARGET.vocab_size)
    with pytest.raises(ValueError, match='draft_threshold=0.5 needs a draft that stops.*Pass'):
      models.generate(self.TARGET, lookup, self.INPUTS, draft_threshold=0.5)

  def test_block_verification_with_lenience_is_a_named_error(self):
    with pytest.raises(ValueError, match="verification='block' is exact only"):
      models.make_decoder(self.TARGET, self.TARGET, lenience=0.9, verification='block')
    with pytest.raises(ValueError, match="verification must be 'token' or 'block'"):
      models.make_decoder(self.TARGET, self.TARGET, verification='tree')

  def test_the_speculative_decode_function_rejects_a_bool_gamma(self):
    with pytest.raises(ValueError, match='gamma must be an integer'):
      decoding.speculative_sample(
        jnp.zeros((1, 4), jnp.int32), {}, None, 1, draft=None, draft_cache={}, gamma=True
      )


class TestEmptyAndMislabelledInputs:
  """Inputs that crashed deep inside the loop or named the wrong argument (issue 20)."""

  @pytest.mark.parametrize('draft', [None, DRAFT, 'lookup'])
  def test_an_empty_batch_decodes_to_an_empty_output(self, draft):
    if draft == 'lookup':
      draft = drafts.PromptLookupDraft(vocab_size=TARGET.vocab_size)
    out = models.generate(TARGET, draft, np.zeros((0, 5), np.int32), max_decode_len=6, gamma=3)
    assert out.tokens.shape == (0, 6) and out.scores.shape == (0,)
    if draft is not None:
      assert out.stats.iterations.shape == (0,) and int(out.stats.target_calls) == 0

  @pytest.mark.parametrize('bad', [40, -1])
  def test_out_of_range_decoder_prompts_name_decoder_prompts(self, bad):
    with pytest.raises(ValueError, match=r'^decoder_prompts must lie in \[0, 32\)'):
      models.generate(
        TARGET, DRAFT, np.ones((2, 5), np.int32), decoder_prompts=np.array([[3, bad], [2, 0]])
      )

  def test_settings_come_as_one_object_or_as_fields_not_both(self):
    spec = settings.SpeculativeSettings(gamma=3, verification='block')
    inputs = np.ones((1, 3), np.int32)
    by_object = models.generate(TARGET, DRAFT, inputs, settings=spec, max_decode_len=6)
    by_fields = models.generate(
      TARGET, DRAFT, inputs, gamma=3, verification='block', max_decode_len=6
    )
    np.testing.assert_array_equal(by_object.tokens, by_fields.tokens)
    with pytest.raises(ValueError, match='either as settings= or as keywords, not both'):
      models.generate(TARGET, DRAFT, inputs, settings=spec, gamma=5)
    with pytest.raises(TypeError, match=r"Unknown speculative setting\(s\) \['gama'\]"):
      models.generate(TARGET, DRAFT, inputs, gama=5)
