"""Decoder prompts on real (tiny, random) networks, through `models.generate`.

Encoder-decoder pairs with decoder prompts (T5X's `prompt_with_targets`) and
decoder-only pairs (causal, and prefix LMs whose prompt attends to itself):
the prefilled baseline equals teacher forcing, greedy speculative output
equals the baseline token for token with ragged prompts, and sampled
continuations follow the target's exact distribution (chi-square over whole
sequences, exact probabilities by teacher forcing).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
import markov
from testing_utils import (
  EOS,
  decoded_lengths,
  outputs_as_tuples,
  padded_inputs,
  sequence_chi_square_p_value,
  tiny_decoder_only_model,
  tiny_model,
)

VOCAB = 32
ENCODER_DECODER = (tiny_model(seed=0, layers=2, scale=3.0), tiny_model(seed=1, scale=3.0))
DECODER_ONLY = (
  tiny_decoder_only_model(seed=0, layers=2, scale=3.0),
  tiny_decoder_only_model(seed=1, layers=1, scale=3.0),
)
PREFIX_LM = (
  tiny_decoder_only_model(seed=2, layers=2, scale=3.0, inputs_bidirectional_attention=True),
  tiny_decoder_only_model(seed=3, layers=1, scale=3.0, inputs_bidirectional_attention=True),
)
PAIRS = {'encoder_decoder': ENCODER_DECODER, 'decoder_only': DECODER_ONLY, 'prefix_lm': PREFIX_LM}


def ragged_prompts(seed, batch, width, vocab_size=VOCAB):
  """int32 [batch, width]: prompts of 0..width tokens (ids >= 2), then 0-padding.

  Row 0 always has the widest prompt.
  """
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, width + 1, batch)
  lengths[0] = width
  prompts = rng.integers(2, vocab_size, (batch, width))
  prompts[np.arange(width)[None] >= lengths[:, None]] = 0
  return prompts.astype(np.int32), lengths


def pair_inputs(architecture, seed, batch, prompt_width):
  """(input_tokens, decoder_prompts, prompt lengths) for `generate`."""
  prompts, lengths = ragged_prompts(seed, batch, prompt_width)
  if architecture == 'encoder_decoder':
    return padded_inputs(seed, batch, 7, VOCAB), prompts, lengths
  return prompts, None, lengths


def teacher_forced_logits(model, input_tokens, prompts, lengths, outputs):
  """float32 [B, n, V]: the target's logits for outputs [B, n] after each row's prompt.

  The decoder input is BOS, the prompt, the outputs; a prefix LM's positions
  0..P attend to each other (T5X's `decoder_causal_attention`).
  """
  batch, width = prompts.shape
  n = outputs.shape[1]
  sequences = np.zeros((batch, width + n), np.int32)
  for row, prompt_length in enumerate(lengths):
    sequences[row, :prompt_length] = prompts[row, :prompt_length]
    sequences[row, prompt_length : prompt_length + n] = outputs[row]
  decoder_inputs = np.pad(sequences, ((0, 0), (1, 0)))[:, :-1]
  targets = np.ones_like(decoder_inputs)  # No padding mask: every position is real.
  if network.is_decoder_only(model.config):
    causal_attention = None
    if model.inputs_bidirectional_attention:
      causal_attention = (np.arange(width + n)[None] <= lengths[:, None]).astype(np.int32)
    logits = network.DecoderOnly(model.config).apply(
      {'params': model.params},
      decoder_inputs,
      targets,
      decoder_causal_attention=causal_attention,
      enable_dropout=False,
    )
  else:
    logits = network.Transformer(model.config).apply(
      {'params': model.params}, input_tokens, decoder_inputs, targets, enable_dropout=False
    )
  index = lengths[:, None] + np.arange(n)[None]
  return np.take_along_axis(np.asarray(logits), index[..., None], axis=1)


def generate(architecture, draft, input_tokens, prompts, **kwargs):
  target = PAIRS[architecture][0]
  return models.generate(target, draft, input_tokens, decoder_prompts=prompts, **kwargs)


@pytest.mark.parametrize('architecture', list(PAIRS))
def test_the_prefilled_baseline_is_the_argmax_of_teacher_forcing(architecture):
  target = PAIRS[architecture][0]
  input_tokens, prompts, lengths = pair_inputs(architecture, 0, 5, 6)
  out = generate(architecture, None, input_tokens, prompts, temperature=0.0, max_decode_len=8)
  prompt_tokens = input_tokens if prompts is None else prompts
  logits = teacher_forced_logits(
    target, input_tokens, prompt_tokens, lengths, np.asarray(out.tokens)
  )
  expected = np.argmax(logits, -1)
  alive = np.arange(8)[None] < decoded_lengths(out.tokens)[:, None]
  np.testing.assert_array_equal(np.where(alive, out.tokens, 0), np.where(alive, expected, 0))


def test_prefilling_equals_t5x_teacher_forcing_of_the_prompt():
  """Encoder-decoder: the one-block prefill == T5X's token-by-token forcing of the prompt."""
  target = ENCODER_DECODER[0]
  input_tokens, prompts, lengths = pair_inputs('encoder_decoder', 1, 4, 5)
  out = models.generate(target, None, input_tokens, decoder_prompts=prompts, max_decode_len=6)
  layout = layouts.decoder_prompt_layout(jnp.asarray(prompts), 6)
  cache = network.init_decoder_cache(target.config, target.params, input_tokens, layout.shape[1])

  def tokens_to_logits(state):
    logits, cache = network.apply_decode_block(
      target.config, target.params, state.cache, state.cur_token, state.cur_index
    )
    return logits[:, 0], cache

  forced, _ = decoding.temperature_sample(
    layout, cache, tokens_to_logits, EOS, temperature=0.0, max_decode_steps=6
  )
  np.testing.assert_array_equal(
    layouts.strip_prompts(forced[:, -1], jnp.asarray(lengths), 6), out.tokens
  )


def make_draft(kind, architecture, input_tokens, baseline):
  target, draft = PAIRS[architecture]
  if kind == 'model':
    return draft
  if kind == 'wrong':
    unused = sorted(set(range(2, VOCAB)) - set(np.asarray(baseline).ravel()))
    return markov.ConstantDraft(token=unused[0], vocab_size=VOCAB)
  if kind == 'bigram':
    return drafts.NgramDraft.fit(list(input_tokens), VOCAB)
  return drafts.PromptLookupDraft(vocab_size=VOCAB)


GREEDY_CASES = [
  (batch, gamma, kind)
  for (batch, gamma), kind in zip(
    itertools.cycle([(1, 1), (3, 3), (8, 7), (5, 3), (2, 7), (8, 1)]),
    ['model', 'model', 'model', 'bigram', 'lookup', 'wrong', 'lookup', 'bigram'],
  )
]


# `make test` runs each draft kind once, for one architecture in turn (cases 0, 3, 4, 5:
# model, bigram, lookup, wrong); every other (case, architecture) is `slow`.
GREEDY_PARAMS = [
  pytest.param(
    batch,
    gamma,
    draft_kind,
    architecture,
    id=f'{batch}-{gamma}-{draft_kind}-{architecture}',
    marks=() if a == i % len(PAIRS) and i in (0, 3, 4, 5) else pytest.mark.slow,
  )
  for i, (batch, gamma, draft_kind) in enumerate(GREEDY_CASES)
  for a, architecture in enumerate(PAIRS)
]


@pytest.mark.parametrize('batch, gamma, draft_kind, architecture', GREEDY_PARAMS)
def test_greedy_speculative_equals_baseline_with_ragged_prompts(
  architecture, batch, gamma, draft_kind
):
  input_tokens, prompts, lengths = pair_inputs(architecture, batch + gamma, batch, 6)
  kwargs = dict(temperature=0.0, max_decode_len=10)
  baseline = generate(architecture, None, input_tokens, prompts, **kwargs)
  draft = make_draft(draft_kind, architecture, input_tokens, baseline.tokens)
  out = generate(architecture, draft, input_tokens, prompts, gamma=gamma, **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  assert np.all(np.asarray(out.stats.emitted) == decoded_lengths(out.tokens))


def exact_continuations(model, input_row, prompt, length, **sample_args):
  """{continuation tuple: probability} after one prompt, by teacher forcing every output."""
  outputs = np.array(list(itertools.product(range(model.vocab_size), repeat=length)), np.int32)
  count = len(outputs)
  prompts = np.tile(np.asarray(prompt, np.int32), (count, 1))
  logits = teacher_forced_logits(
    model, np.tile(input_row, (count, 1)), prompts, np.full(count, len(prompt)), outputs
  )
  probs = np.asarray(sampling.standardize(jnp.asarray(logits), **sample_args), np.float64)
  result = {}
  for output, row in zip(outputs, probs):
    prob, prefix = 1.0, []
    for t, token in enumerate(output):
      prob *= row[t, token]
      prefix.append(int(token))
      if token == EOS:
        break
    result.setdefault(tuple(prefix), prob)  # Outputs sharing a prefix up to EOS are one outcome.
  return result


SAMPLE_ARGS = {
  'temperature1': dict(temperature=1.0),
  'topk3': dict(temperature=1.0, topk=3),
  'topp0.7': dict(temperature=0.8, topp=0.7),
}
# `make test` runs top-k and top-p for one architecture each (temperature 1 after a
# prompt: test_tree_decoding's continuations), the other pairs (the same sample count)
# are `slow`.
FAST_SAMPLED = {
  ('topk3', 'prefix_lm'),
  ('topp0.7', 'decoder_only'),
}


@pytest.mark.parametrize(
  'architecture, sample_args',
  [
    pytest.param(
      architecture,
      args,
      id=f'{name}-{architecture}',
      marks=() if (name, architecture) in FAST_SAMPLED else pytest.mark.slow,
    )
    for name, args in SAMPLE_ARGS.items()
    for architecture in PAIRS
  ],
)
def test_sampled_continuations_follow_the_target(architecture, sample_args):
  """4096 continuations of a 3-token prompt (tiny vocabulary) vs exact probabilities."""
  vocab, length, batch, calls = 6, 3, 2048, 2
  bidirectional = architecture == 'prefix_lm'
  if architecture == 'encoder_decoder':
    target = tiny_model(seed=2, vocab_size=vocab, emb_dim=16, scale=2.0)
    draft = tiny_model(seed=3, vocab_size=vocab, emb_dim=16, scale=2.0)
  else:
    target, draft = (
      tiny_decoder_only_model(
        seed,
        vocab_size=vocab,
        emb_dim=16,
        layers=layers,
        scale=0.5,
        inputs_bidirectional_attention=bidirectional,
      )
      for seed, layers in ((4, 2), (5, 1))
    )
  prompt = np.array([3, 4, EOS], np.int32)  # A prefix LM's inputs end with EOS.
  input_row = np.array([3, 4, 2, EOS, 0], np.int32)
  if architecture == 'encoder_decoder':
    input_tokens, prompts = np.tile(input_row, (batch, 1)), np.tile(prompt, (batch, 1))
  else:
    input_tokens, prompts = np.tile(prompt, (batch, 1)), None
  samples = []
  for call in range(calls):
    out = models.generate(
      target,
      draft,
      input_tokens,
      decoder_prompts=prompts,
      gamma=3,
      max_decode_len=length,
      rng=jax.random.PRNGKey(call),
      **sample_args,
    )
    samples += outputs_as_tuples(out.tokens)
  exact = exact_continuations(target, input_row, prompt, length, **sample_args)
  p_value = sequence_chi_square_p_value(samples, exact)
  print(
    f'\nchi-square p-value, {architecture} after a prompt, {sample_args}: {p_value:.4f} '
    f'over {len(samples)} sequences, alpha={float(out.stats.mean_beta):.3f}'
  )
  assert len(exact) > 20 and p_value > 1e-3  # Many outcomes: a test that can fail.


@pytest.mark.parametrize(
  'architecture', [pytest.param('encoder_decoder', marks=pytest.mark.slow), 'decoder_only']
)
def test_new_prompts_of_the_same_width_do_not_recompile(architecture):
  kwargs = dict(gamma=3, temperature=1.0, max_decode_len=6)
  draft = PAIRS[architecture][1]
  input_tokens, prompts, _ = pair_inputs(architecture, 0, 3, 5)
  generate(architecture, draft, input_tokens, prompts, **kwargs)
  compiled = models._generate._cache_size()
  input_tokens, prompts, lengths = pair_inputs(architecture, 1, 3, 5)
  out = generate(architecture, draft, input_tokens, prompts, rng=jax.random.PRNGKey(3), **kwargs)
  assert models._generate._cache_size() == compiled
  assert out.tokens.shape == (3, 6)


class TestBadPrompts:
  def test_padding_inside_a_prompt(self):
    inputs, prompts, _ = pair_inputs('encoder_decoder', 0, 2, 4)
    prompts[1] = [5, 0, 6, 0]
    with pytest.raises(ValueError, match='decoder_prompts: The decoder prompt of row 1 has a 0'):
      models.generate(ENCODER_DECODER[0], None, inputs, decoder_prompts=prompts)

  def test_decoder_prompts_for_a_decoder_only_target(self):
    prompts, _ = ragged_prompts(0, 2, 4)
    with pytest.raises(ValueError, match='takes its prompts as input_tokens'):
      models.generate(DECODER_ONLY[0], None, prompts, decoder_prompts=prompts)

  def test_a_prompt_row_per_input_row(self):
    inputs, prompts, _ = pair_inputs('encoder_decoder', 0, 3, 4)
    with pytest.raises(ValueError, match='decoder_prompts has 2 rows but the batch has 3'):
      models.generate(ENCODER_DECODER[0], None, inputs, decoder_prompts=prompts[:2])

  def test_mixed_architectures(self):
    prompts, _ = ragged_prompts(0, 2, 4)
    with pytest.raises(ValueError, match='target is decoder-only but the draft network is'):
      models.generate(DECODER_ONLY[0], ENCODER_DECODER[1], prompts)

  def test_bidirectional_encoder_decoder(self):
    model = ENCODER_DECODER[0]
    with pytest.raises(ValueError, match='inputs_bidirectional_attention=True is for decoder-only'):
      models.Model(model.config, model.params, inputs_bidirectional_attention=True)
