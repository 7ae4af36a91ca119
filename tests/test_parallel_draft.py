"""A parallel draft (`parallel_draft.ParallelDraft`): one network call per block, output exact.

Its cache keeps only true tokens (after any sequence of calls it equals a
fresh pass over the true prefix) and its q_i are those of the teacher-forced
pass over the prefix and i - 1 masks; greedy speculative decodes equal the
greedy baseline token for token; a float64 enumeration of one step with its
q gives the target's distribution; whole sequences sampled with it follow
the target's exact distribution (chi-square) in every sampling mode, after
prompts, for both architectures. The 204,800-sequence cases are `slow`; a
4,096-sequence case per mode runs in `make test`. Run with `pytest -s` to
see the p-values.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import sampling
from test_block_verification import completed_with_target
from test_block_verification import emitted
from test_feature_draft import near_markov
from test_models import exact_sequence_distribution
from test_prompts import exact_continuations
from test_prompts import ragged_prompts
from testing_utils import EOS
from testing_utils import chi_square_test
from testing_utils import decoded_lengths
from testing_utils import outputs_as_tuples
from testing_utils import padded_inputs
from testing_utils import sequence_chi_square_p_value
from testing_utils import tiny_decoder_only_model
from testing_utils import tiny_model

ARCHITECTURES = ('encoder_decoder', 'encoder_decoder_prompt', 'decoder_only', 'prefix_lm')


def perturbed_draft(target, noise, seed=0):
  """The target's network, its logits layer perturbed by `noise`, as a parallel draft.

  q_1 (read at the last true token) is then close to p_1 but not equal, and
  q_i, i > 1 (read at masks), differ more: both the accept and the reject
  paths run at every depth.
  """
  params = jax.tree.map(np.array, target.params)
  kernel = params['decoder']['logits_dense']['kernel']
  kernel += noise * kernel.std() * np.random.default_rng(seed).standard_normal(kernel.shape)
  model = models.Model(target.config, params, target.inputs_bidirectional_attention)
  return model.as_parallel_draft()


def target_and_inputs(architecture, seed, batch, vocab_size=32):
  """(target, draft, input_tokens [B, Lin], decoder prompts [B, P] or None)."""
  prefix_lm = architecture == 'prefix_lm'
  if architecture.startswith('encoder_decoder'):
    target = tiny_model(seed=seed, vocab_size=vocab_size, layers=2, scale=3.0)
    draft = tiny_model(seed=seed + 1, vocab_size=vocab_size, scale=3.0).as_parallel_draft()
    inputs = padded_inputs(seed, batch, 7, vocab_size)
    prompts = None
    if architecture == 'encoder_decoder_prompt':
      prompts = ragged_prompts(seed, batch, 5, vocab_size)[0]
    return target, draft, inputs, prompts
  target = tiny_decoder_only_model(
    seed=seed, vocab_size=vocab_size, scale=3.0, inputs_bidirectional_attention=prefix_lm
  )
  draft = tiny_decoder_only_model(
    seed=seed + 1,
    vocab_size=vocab_size,
    layers=1,
    scale=3.0,
    inputs_bidirectional_attention=prefix_lm,
  ).as_parallel_draft()
  return target, draft, ragged_prompts(seed, batch, 5, vocab_size)[0], None


# ------------------------------------------------------------------------------
# The cache keeps only true tokens; q_i is the teacher-forced pass over the prefix and masks.
# ------------------------------------------------------------------------------
def reference_q_logits(draft, input_row, sequence, position, prompt_length, gamma):
  """float32 [gamma, V]: the uncached pass over sequence[:position + 1] and gamma - 1 masks."""
  width = position + gamma
  tokens = np.zeros((1, width), np.int32)
  tokens[0, : position + 1] = sequence[: position + 1]
  index = np.arange(width)
  visible = index[None, :] <= index[:, None]
  if draft.inputs_bidirectional_attention:
    in_prompt = index <= prompt_length
    visible |= in_prompt[None, :] & in_prompt[:, None]
  features = {
    'decoder_input_tokens': tokens,
    'decoder_positions': index[None].astype(np.int32),
    'decoder_visible': visible[None],
    'decoder_masked': (index > position)[None],
  }
  if not network.is_decoder_only(draft.config):
    features['encoder_input_tokens'] = input_row[None]
  logits = network.compute_layout_logits(draft.config, draft.params, draft.mask_embedding, features)
  return np.asarray(logits)[0, position:]


def self_attention_entries(cache):
  """[(name, keys or values [B, heads, head_dim, L])] of every decoder self-attention cache."""
  return [
    (jax.tree_util.keystr(path), np.asarray(x))
    for path, x in jax.tree_util.tree_leaves_with_path(cache)
    if 'self_attention' in jax.tree_util.keystr(path)
  ]


@pytest.mark.parametrize('architecture', ARCHITECTURES)
def test_the_cache_holds_only_true_tokens_and_q_is_the_teacher_forced_pass(architecture):
  """Calls at ragged positions; afterwards the cache equals a fresh pass over the true prefix."""
  batch, gamma, length = 4, 3, 32
  _, draft, inputs, prompts = target_and_inputs(architecture, 3, batch)
  if network.is_decoder_only(draft.config):
    prompts = inputs  # A decoder-only network's inputs are its prompts.
  prompt_lengths = np.zeros(batch, np.int32) if prompts is None else (prompts > 0).sum(1)
  rng = np.random.default_rng(0)
  cache_length = decoding.speculative_cache_length(length, gamma)
  # The true sequences: BOS, the prompt, then any tokens (the draft never sees its own).
  sequences = rng.integers(2, 32, (batch, length + gamma + 2)).astype(np.int32)
  sequences[:, 0] = 0
  for b, prompt_length in enumerate(prompt_lengths):
    sequences[b, 1 : prompt_length + 1] = prompts[b, :prompt_length] if prompt_length else []
  positions = prompt_lengths.astype(np.int32)
  cache = draft.init_cache(jnp.asarray(inputs), cache_length)
  if prompts is not None:
    cache = draft.prefill(cache, jnp.asarray(sequences[:, :length]), jnp.asarray(positions))
  propose = jax.jit(
    draft.propose, static_argnames=('gamma', 'temperature', 'topk', 'topp', 'draft_threshold')
  )
  for call in range(5):
    _, probs, _, cache = propose(
      cache,
      jnp.asarray(sequences),
      jnp.asarray(positions),
      jax.random.PRNGKey(call),
      gamma=gamma,
      temperature=1.0,
      topk=0,
      topp=0.0,
      draft_threshold=0.0,
    )
    np.testing.assert_array_equal(cache['written_until'], positions + 1)
    for b in range(batch):
      expected = reference_q_logits(
        draft, inputs[b], sequences[b], positions[b], prompt_lengths[b], gamma
      )
      np.testing.assert_allclose(
        np.asarray(probs[b]), np.asarray(jax.nn.softmax(jnp.asarray(expected))), atol=2e-6
      )
    # Ragged acceptance: 0..gamma draft tokens, then the target's token.
    positions = positions + rng.integers(0, gamma + 1, batch).astype(np.int32) + 1
  fresh = network.prefill_decoder_cache(
    draft.config,
    draft.params,
    draft.init_cache(jnp.asarray(inputs), cache_length)['decoder'],
    jnp.asarray(sequences[:, :cache_length]),
    jnp.asarray(prompt_lengths),
    bidirectional=draft.inputs_bidirectional_attention,
  )
  written = np.asarray(cache['written_until'])
  assert np.all(written > prompt_lengths + 5)  # Every call moved every row.
  pairs = list(zip(self_attention_entries(cache['decoder']), self_attention_entries(fresh)))
  assert pairs
  for (name, got), (_, want) in pairs:
    for b in range(batch):
      np.testing.assert_allclose(
        got[b, ..., : written[b]], want[b, ..., : written[b]], atol=2e-5, err_msg=name
      )


def test_the_tokens_are_drawn_from_the_reported_distributions():
  """8,192 rows at one position: each x_i's frequencies against the reported q_i (chi-square)."""
  gamma, rows = 3, 8_192
  target = near_markov(tiny_model(seed=2, vocab_size=6, emb_dim=16, scale=2.0))
  draft = perturbed_draft(target, 1.0)
  inputs = jnp.tile(jnp.array([[3, 4, 2, EOS, 0]], jnp.int32), (rows, 1))
  cache = draft.init_cache(inputs, 8)
  tokens, probs, _, _ = draft.propose(
    cache,
    jnp.zeros((rows, 8), jnp.int32),
    jnp.zeros((rows,), jnp.int32),
    jax.random.PRNGKey(0),
    gamma=gamma,
    temperature=1.0,
    topk=0,
    topp=0.0,
    draft_threshold=0.0,
  )
  for i in range(gamma):
    counts = np.bincount(np.asarray(tokens[:, i]), minlength=6)
    p_value = chi_square_test(counts, np.asarray(probs[0, i], np.float64))[2]
    assert p_value > 1e-3, (i, counts, np.asarray(probs[0, i]))
  # One call: q_i does not depend on x_1..x_{i-1}, the same for every row.
  np.testing.assert_allclose(np.asarray(probs), np.asarray(probs[:1]).repeat(rows, 0), atol=1e-6)


# ------------------------------------------------------------------------------
# Greedy: the speculative decode is the baseline's, token for token.
# ------------------------------------------------------------------------------
GREEDY_FAST = {('encoder_decoder', 8, 4), ('decoder_only', 8, 12), ('prefix_lm', 1, 1)}


@pytest.mark.parametrize(
  'architecture, batch, gamma',
  [
    pytest.param(
      architecture,
      batch,
      gamma,
      marks=() if (architecture, batch, gamma) in GREEDY_FAST else pytest.mark.slow,
    )
    for architecture in ('encoder_decoder', 'encoder_decoder_prompt', 'decoder_only', 'prefix_lm')
    for batch in (1, 8)
    for gamma in (1, 4, 12)
  ],
)
def test_greedy_speculative_equals_baseline(architecture, batch, gamma):
  target, _, inputs, prompts = target_and_inputs(architecture, 5, batch)
  # The target's network as a parallel draft: q_1 is p_1, the masks' q differ, so rows
  # accept 1..gamma tokens per call (ragged).
  draft = target.as_parallel_draft(packed=True)
  kwargs = dict(decoder_prompts=prompts, temperature=0.0, max_decode_len=20)
  baseline = models.generate(target, None, inputs, **kwargs)
  out = models.generate(target, draft, inputs, gamma=gamma, **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  assert np.all(np.asarray(out.stats.emitted) == decoded_lengths(out.tokens))
  tokens_per_call = float(out.stats.tokens_per_target_call)
  assert tokens_per_call >= 1.0
  if gamma > 1:
    assert tokens_per_call < gamma + 1, 'every draft token accepted: acceptance is not ragged'


def test_an_ordinary_random_draft_is_still_exact():
  """A draft never adapted to masks (the mean embedding) keeps greedy output exact."""
  target, draft, inputs, _ = target_and_inputs('encoder_decoder', 7, 8)
  kwargs = dict(temperature=0.0, max_decode_len=12)
  baseline = models.generate(target, None, inputs, **kwargs)
  out = models.generate(target, draft, inputs, gamma=4, draft_threshold=0.3, **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)


# ------------------------------------------------------------------------------
# One step, enumerated in float64 with the draft's own q.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize('sample_args', [dict(temperature=1.0), dict(temperature=0.7, topk=3)])
@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_one_step_enumerated_in_float64_is_the_target(architecture, sample_args):
  """Every block x_1..x_gamma ~ prod q_i, judged by each rule, completed: the target's law."""
  vocab, gamma = 4, 2
  if architecture == 'encoder_decoder':
    target = near_markov(tiny_model(seed=2, vocab_size=vocab, emb_dim=16, scale=2.0))
    inputs = jnp.array([[3, 2, EOS, 0]], jnp.int32)
  else:
    target = near_markov(tiny_decoder_only_model(seed=4, vocab_size=vocab, emb_dim=16, scale=2.0))
    inputs = jnp.zeros((1, 4), jnp.int32)  # No prompt: the draft only takes the batch from it.
  draft = perturbed_draft(target, 1.0)
  cache = draft.init_cache(inputs, 8)
  _, draft_probs, _, _ = draft.propose(
    cache,
    jnp.zeros((1, 8), jnp.int32),
    jnp.zeros((1,), jnp.int32),
    jax.random.PRNGKey(0),
    gamma=gamma,
    draft_threshold=0.0,
    **dict(dict(topk=0, topp=0.0), **sample_args),
  )
  q_rows = np.asarray(draft_probs[0], np.float64)
  q_rows /= q_rows.sum(-1, keepdims=True)
  # The target's standardized p after every prefix of length <= gamma, by teacher forcing.
  blocks = np.array(list(itertools.product(range(vocab), repeat=gamma)), np.int32)
  decoder_inputs = np.pad(blocks, ((0, 0), (1, 0)))
  features = {
    'encoder_input_tokens': np.repeat(np.asarray(inputs), len(blocks), 0),
    'decoder_input_tokens': decoder_inputs,
    'decoder_target_tokens': np.ones_like(decoder_inputs),
  }
  logits = network.compute_logits(target.config, target.params, features)
  standardized = np.asarray(
    sampling.standardize(logits, **dict(dict(topk=0, topp=0.0), **sample_args)), np.float64
  )
  p = {}
  for block, rows in zip(blocks, standardized):
    for j in range(gamma + 1):
      p[tuple(block[:j].tolist())] = rows[j] / rows[j].sum()
  q = {prefix: q_rows[len(prefix)] for prefix in p if len(prefix) < gamma}
  joint = {
    s: np.prod([p[s[:j]][s[j]] for j in range(gamma + 1)])
    for s in itertools.product(range(vocab), repeat=gamma + 1)
  }
  for rule in ('token', 'block'):
    full = completed_with_target(emitted(p, q, vocab, gamma, rule), p, vocab, gamma)
    assert max(abs(full.get(s, 0.0) - joint[s]) for s in joint) < 1e-12, rule


# ------------------------------------------------------------------------------
# Whole sequences against the target's exact distribution (chi-square).
# ------------------------------------------------------------------------------
VOCAB, LENGTH = 6, 3
INPUT_ROW = np.array([3, 4, 2, EOS, 0], np.int32)
PROMPT = np.array([3, 4, EOS], np.int32)
MODES = {
  'temperature1': dict(temperature=1.0),
  'temperature0.7': dict(temperature=0.7),
  'topk3': dict(temperature=1.0, topk=3),
  'topp0.9': dict(temperature=1.0, topp=0.9),
  'greedy': dict(temperature=0.0),
}
SIZES = {True: (2_048, 4_096), False: (12_800, 204_800)}  # fast: (batch, sequences)
FAST_CASES = {
  ('encoder_decoder', 'temperature1'),
  ('encoder_decoder_prompt', 'topk3'),
  ('decoder_only', 'topp0.9'),
  ('prefix_lm', 'temperature0.7'),
  ('decoder_only', 'greedy'),
}


def chi_square_target(architecture):
  if architecture.startswith('encoder_decoder'):
    return near_markov(tiny_model(seed=2, vocab_size=VOCAB, emb_dim=16, scale=2.0))
  return near_markov(
    tiny_decoder_only_model(
      seed=4,
      vocab_size=VOCAB,
      emb_dim=16,
      scale=2.0,
      inputs_bidirectional_attention=architecture == 'prefix_lm',
    )
  )


def sample_sequences(architecture, sample_args, gamma, batch, num_sequences):
  """(outputs as tuples, exact {output: probability}, the last call's stats)."""
  target = chi_square_target(architecture)
  if architecture == 'encoder_decoder':
    input_tokens, prompts = np.tile(INPUT_ROW, (batch, 1)), None
    exact = exact_sequence_distribution(target, INPUT_ROW, LENGTH, **sample_args)
  elif architecture == 'encoder_decoder_prompt':
    input_tokens, prompts = np.tile(INPUT_ROW, (batch, 1)), np.tile(PROMPT, (batch, 1))
    exact = exact_continuations(target, INPUT_ROW, PROMPT, LENGTH, **sample_args)
  else:
    input_tokens, prompts = np.tile(PROMPT, (batch, 1)), None
    exact = exact_continuations(target, PROMPT, PROMPT, LENGTH, **sample_args)
  draft = perturbed_draft(target, 1.0)
  samples = []
  for call in range(-(-num_sequences // batch)):
    out = models.generate(
      target,
      draft,
      input_tokens,
      decoder_prompts=prompts,
      max_decode_len=LENGTH,
      rng=jax.random.PRNGKey(call),
      gamma=gamma,
      **sample_args,
    )
    samples += outputs_as_tuples(out.tokens)
  return samples, exact, out.stats


@pytest.mark.parametrize(
  'architecture, mode, batch, num_sequences',
  [
    pytest.param(
      architecture,
      mode,
      *SIZES[fast],
      id=f'{architecture}-{mode}-{SIZES[fast][1]}',
      marks=() if fast else pytest.mark.slow,
    )
    for architecture in ARCHITECTURES
    for mode in MODES
    for fast in (True, False)
    if fast == ((architecture, mode) in FAST_CASES) or not fast
  ],
)
def test_sampled_sequences_follow_the_target(architecture, mode, batch, num_sequences):
  samples, exact, stats = sample_sequences(architecture, MODES[mode], 3, batch, num_sequences)
  alpha = float(stats.mean_beta)
  if mode == 'greedy':  # One outcome: the target's argmax sequence, every time.
    (greedy,) = [output for output, probability in exact.items() if probability > 0.5]
    assert set(samples) == {greedy}
    return
  p_value = sequence_chi_square_p_value(samples, exact)
  print(
    f'\nchi-square p-value, parallel draft, {architecture}, {mode}: {p_value:.4f} over '
    f'{len(samples)} sequences, alpha {alpha:.3f}, '
    f'tokens/call {float(stats.tokens_per_target_call):.2f}'
  )
  assert sum(probability > 0 for probability in exact.values()) >= 10  # Not nearly deterministic.
  assert p_value > 1e-3
  assert 0.2 < alpha < 0.99  # Both the accept and the reject paths ran.


# ------------------------------------------------------------------------------
# Construction and errors.
# ------------------------------------------------------------------------------
def test_an_ordinary_draft_becomes_a_parallel_draft_with_the_mean_embedding():
  model = tiny_model(seed=1)
  draft = model.as_parallel_draft()
  np.testing.assert_allclose(
    draft.mask_embedding, np.asarray(model.params['token_embedder']['embedding']).mean(0)
  )
  decoder_only = tiny_decoder_only_model(seed=1)
  np.testing.assert_allclose(
    decoder_only.as_parallel_draft().mask_embedding,
    np.asarray(decoder_only.params['decoder']['token_embedder']['embedding']).mean(0),
  )


def test_bad_mask_embeddings_and_trees_are_named_errors():
  model = tiny_model(seed=1)
  with pytest.raises(ValueError, match=r'mask_embedding must have shape \(32,\)'):
    model.as_parallel_draft(np.zeros(5, np.float32))
  with pytest.raises(ValueError, match='A token tree'):
    models.generate(model, model.as_parallel_draft(), padded_inputs(0, 1, 5, 32), tree=(2, 2))
  with pytest.raises(ValueError, match='decoder-only'):
    models.generate(
      model, tiny_decoder_only_model(seed=1).as_parallel_draft(), padded_inputs(0, 1, 5, 32)
    )


def test_the_mean_embedding_is_a_mask_token_of_the_network():
  """masked positions read mask_embedding, not their token: any id gives the same logits."""
  draft = tiny_model(seed=1).as_parallel_draft()
  features = lambda tokens: {
    'encoder_input_tokens': np.array([[5, 6, EOS]], np.int32),
    'decoder_input_tokens': np.array([tokens], np.int32),
    'decoder_positions': np.arange(3)[None].astype(np.int32),
    'decoder_visible': np.tri(3, dtype=bool)[None],
    'decoder_masked': np.array([[False, True, True]]),
  }
  one, two = (
    network.compute_layout_logits(draft.config, draft.params, draft.mask_embedding, features(t))
    for t in ([0, 7, 9], [0, 11, 3])
  )
  np.testing.assert_array_equal(one, two)
  assert parallel_draft.mean_token_embedding(draft.params).shape == (32,)
