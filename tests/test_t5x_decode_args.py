"""T5X's decode-function arguments, argument by argument, in both of our decode functions.

`decoding.temperature_sample` and `decoding.speculative_sample` take every argument of
T5X's `decoding.temperature_sample` with its meaning: `max_decode_steps_hard_limit`,
`rescale_log_probs`, `logit_callback_fn` (under speculation applied at every position
of a block or node of a token tree, to the target's logits and the draft's) and
`state_callback_fn` (T5X's in `temperature_sample`; a named error under speculation).
On the Markov target of tests/markov.py, whose sequence probabilities are exact:
chi-square over whole sequences with a callback that forbids some tokens and reshapes
others, greedy equality, scores, and T5X's docstring examples. The tests marked `t5x`
run the same inputs through the real `t5x.decoding.temperature_sample`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import settings
from speculative_t5x import t5x_adapter
from speculative_t5x import tree as tree_lib
import markov
from testing_utils import (
  EOS,
  import_t5x,
  outputs_as_tuples,
  padded_inputs,
  sequence_chi_square_p_value,
  tiny_model,
)


def constraining_callback(logits, state):
  """A T5X logit callback that reads the prefix, to forbid some tokens and reshape others.

  Forbids every token already among the decoder inputs at 1..cur_index but EOS (no
  repeats), and token 3 at odd steps; raises the current token's logit by 1, token 2's
  by 0.7 per position, and doubles token 4's. Reads `sequences`, `cur_index`,
  `cur_token` and `step` (a scalar in `temperature_sample`, [BN, 1] under
  speculation: the reshape makes both [., 1]).
  """
  ids = jnp.arange(logits.shape[-1])
  slots = jnp.arange(state.sequences.shape[1])[None]
  so_far = (slots >= 1) & (slots <= state.cur_index[:, None])
  seen = jnp.any(so_far[..., None] & (state.sequences[..., None] == ids), axis=1)
  step = jnp.reshape(state.step, (-1, 1))
  forbidden = (seen & (ids != EOS)) | ((ids == 3) & (step % 2 == 1))
  logits = jnp.where(ids == state.cur_token, logits + 1.0, logits)
  logits = logits + jnp.where(ids == 2, 0.7 * state.cur_index[:, None], 0.0)
  logits = jnp.where(ids == 4, 2.0 * logits, logits)
  return jnp.where(forbidden, -jnp.inf, logits)


def baseline_fn(target, row_shift, inputs, **decode_args):
  """A jitted `rng -> (decodes, log_probs)` of `temperature_sample`."""
  return jax.jit(
    lambda rng: decoding.temperature_sample(
      inputs, target.cache(row_shift), target.tokens_to_logits, EOS, decode_rng=rng, **decode_args
    )
  )


def speculative_fn(target, row_shift, inputs, draft_cache, gamma, **decode_args):
  """A jitted `(rng, draft) -> (decodes, log_probs, stats)` of `speculative_sample`."""

  @jax.jit
  def run(rng, draft):
    return decoding.speculative_sample(
      inputs,
      target.cache(row_shift),
      target.score_block,
      EOS,
      decode_rng=rng,
      draft=draft,
      draft_cache=draft_cache,
      gamma=gamma,
      **decode_args,
    )

  return run


def make_draft(kind, target, row_shift, vocab):
  """(draft, draft_cache): 'perfect' (the target's table), 'markov' (another table),
  'bigram', 'lookup' (prompt lookup over a fixed input) or 'wrong' (a constant token)."""
  if kind == 'perfect':
    return markov.MarkovDraft(target.table), target.cache(row_shift)
  if kind == 'markov':
    noise = markov.random_table(seed=99, num_positions=target.table.shape[0], vocab_size=vocab)
    return markov.MarkovDraft(0.6 * target.table + noise), target.cache(row_shift)
  if kind == 'bigram':
    return drafts.NgramDraft.fit([[2, 3, 4, 2, 1], [3, 3, 1], [4, 2, 0, 1]], vocab), {}
  if kind == 'lookup':
    draft = drafts.PromptLookupDraft(vocab_size=vocab, max_ngram=2)
    source = np.tile(np.arange(2, vocab, dtype=np.int32)[None], (len(row_shift), 2))
    return draft, draft.init_cache(jnp.asarray(source), cache_length=0)
  assert kind == 'wrong'
  return markov.ConstantDraft(token=vocab - 1, vocab_size=vocab), {}


# ------------------------------------------------------------------------------
# logit_callback_fn: the distribution sampled, exactly, and greedy tokens.
# ------------------------------------------------------------------------------
VOCAB, LENGTH, BATCH = 5, 4, 4096
CHI_SQUARE_TABLE = markov.random_table(seed=5, num_positions=20, vocab_size=VOCAB, scale=1.5)


# `make test` runs the bigram chain (and test_per_row_temperatures_and_top_p_follow_the_target
# both functions with top-p); the baseline alone and the Markov draft with top-p are `slow`.
@pytest.mark.parametrize(
  'draft_kind, gamma, sample_args',
  [
    pytest.param(None, 0, dict(temperature=1.0, topk=0), marks=pytest.mark.slow),
    ('bigram', 3, dict(temperature=1.0, topk=0)),
    pytest.param('markov', 2, dict(temperature=0.8, topk=0, topp=0.85), marks=pytest.mark.slow),
  ],
  ids=['baseline', 'bigram-3-temperature1', 'markov-2-topp0.85'],
)
def test_whole_sequences_follow_the_callback_distribution(draft_kind, gamma, sample_args):
  """Chi-square over complete outputs against the exact probabilities under the callback.

  25 calls x 4096 sequences. The exact distribution applies the same callback to
  each prefix's logits with the state T5X's loop holds there (`markov.next_logits`).
  """
  target = markov.MarkovTarget(CHI_SQUARE_TABLE)
  row_shift = np.zeros(BATCH, np.int32)
  inputs = jnp.zeros((BATCH, LENGTH), jnp.int32)
  args = dict(logit_callback_fn=constraining_callback, **sample_args)
  if draft_kind is None:
    run = baseline_fn(target, row_shift, inputs, **args)
  else:
    draft, draft_cache = make_draft(draft_kind, target, row_shift, VOCAB)
    speculative = speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)

    def run(rng):
      return speculative(rng, draft)

  samples = []
  for seed in range(25):
    samples += outputs_as_tuples(run(jax.random.PRNGKey(seed))[0])
  exact = target.sequence_distribution(
    LENGTH, EOS, logit_callback_fn=constraining_callback, **sample_args
  )
  plain = target.sequence_distribution(LENGTH, EOS, **sample_args)
  # The callback changes the distribution: it forbids outputs that are likely without it.
  assert sum(prob for output, prob in plain.items() if output not in exact) > 0.2
  p_value = sequence_chi_square_p_value(samples, exact)
  print(f'\nchi-square p-value, logit callback, {draft_kind} draft, {sample_args}: {p_value:.4f}')
  assert p_value > 1e-3


def test_the_draft_follows_the_callback_too():
  """A draft with the target's own table, the callback applied to both: q = p, all accepted.

  Were the callback applied to p only, q would propose forbidden tokens and lose
  acceptance; at T = 1 every iteration but a row's last then accepts all gamma.
  """
  vocab, length, gamma = 6, 9, 3
  target = markov.MarkovTarget(markov.random_table(seed=2, num_positions=30, vocab_size=vocab))
  row_shift = np.array([0, 4, 7, 1])
  draft, draft_cache = make_draft('perfect', target, row_shift, vocab)
  inputs = jnp.zeros((len(row_shift), length), jnp.int32)
  args = dict(temperature=1.0, topk=0, logit_callback_fn=constraining_callback)
  _, _, stats = speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)(
    jax.random.PRNGKey(0), draft
  )
  np.testing.assert_array_equal(stats.iterations, -(-stats.emitted // (gamma + 1)))
  assert float(stats.mean_beta) == pytest.approx(1.0, abs=1e-5)


def ragged_prompts(length, vocab):
  """int32 [4, length] decoder prompts of 0..3 tokens in T5X's layout."""
  inputs = np.zeros((4, length), np.int32)
  for row, prompt in enumerate([[], [2], [3, 4], [4, 2, 3]]):
    inputs[row, 1 : len(prompt) + 1] = np.asarray(prompt) % vocab
  return jnp.asarray(inputs)


@pytest.mark.parametrize(
  'draft_kind, gamma', [('perfect', 4), ('bigram', 3), ('lookup', 2), ('wrong', 5)]
)
def test_greedy_speculative_equals_greedy_baseline_with_the_callback(draft_kind, gamma):
  vocab, length = 7, 10
  target = markov.MarkovTarget(
    markov.random_table(seed=gamma, num_positions=40, vocab_size=vocab, scale=3.0)
  )
  row_shift = np.array([0, 3, 5, 9])
  inputs = ragged_prompts(length, vocab)
  args = dict(temperature=0.0, topk=0, logit_callback_fn=constraining_callback)
  baseline, _ = baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(0))
  without, _ = baseline_fn(target, row_shift, inputs, temperature=0.0, topk=0)(
    jax.random.PRNGKey(0)
  )
  assert not np.array_equal(baseline, without)  # The callback changes the greedy tokens.
  draft, draft_cache = make_draft(draft_kind, target, row_shift, vocab)
  decodes, _, _ = speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)(
    jax.random.PRNGKey(0), draft
  )
  np.testing.assert_array_equal(decodes, baseline)


PER_ROW_TEMPERATURES = (0.6, 1.5)
PER_ROW_ARGS = dict(topk=0, topp=0.8, logit_callback_fn=constraining_callback)


def assert_per_row_samples_follow_the_target(run, row_temperatures, name):
  """Chi-square per temperature of `run(rng) -> decodes int [BATCH, LENGTH]` over 25 calls.

  Row i samples at row_temperatures[i] (float [BATCH], PER_ROW_TEMPERATURES' values)
  with PER_ROW_ARGS: top-p 0.8 on the tempered distribution and the callback.
  """
  target = markov.MarkovTarget(CHI_SQUARE_TABLE)
  decodes = np.concatenate([np.asarray(run(jax.random.PRNGKey(seed))) for seed in range(25)])
  for temperature in PER_ROW_TEMPERATURES:
    exact = target.sequence_distribution(
      LENGTH, EOS, logit_callback_fn=constraining_callback, temperature=temperature, topp=0.8
    )
    rows = np.tile(np.asarray(row_temperatures) == np.float32(temperature), 25)
    p_value = sequence_chi_square_p_value(outputs_as_tuples(decodes[rows]), exact)
    print(f'\nchi-square p-value, {name}, temperature {temperature}, top-p 0.8: {p_value:.4f}')
    assert p_value > 1e-3, (name, temperature)


def test_per_row_temperatures_and_top_p_follow_the_target():
  """Per-row temperatures float [B], expanded with num_decodes = 2, top-p 0.8, the callback.

  Both functions; 25 calls x 2048 inputs x 2 decodes per temperature pair.
  """
  target = markov.MarkovTarget(CHI_SQUARE_TABLE)
  num_inputs = BATCH // 2
  row_shift = np.zeros(num_inputs, np.int32)
  inputs = jnp.zeros((num_inputs, LENGTH), jnp.int32)
  temperatures = np.tile(np.asarray(PER_ROW_TEMPERATURES, np.float32), num_inputs // 2)
  args = dict(temperature=temperatures, num_decodes=2, **PER_ROW_ARGS)
  baseline = baseline_fn(target, row_shift, inputs, **args)
  draft, draft_cache = make_draft('bigram', target, row_shift, VOCAB)
  speculative = speculative_fn(target, row_shift, inputs, draft_cache, 3, **args)
  row_temperatures = np.repeat(temperatures, 2)  # [el0, el0, el1, el1, ...]
  for name, run in (
    ('temperature_sample', lambda rng: baseline(rng)[0].reshape(BATCH, LENGTH)),
    ('speculative_sample', lambda rng: speculative(rng, draft)[0].reshape(BATCH, LENGTH)),
  ):
    assert_per_row_samples_follow_the_target(run, row_temperatures, name)


def tree_fn(target, row_shift, inputs, tree, **decode_args):
  """A jitted `(rng, draft) -> (decodes, log_probs, stats)` of `speculative_sample` with a tree.

  The Markov target keeps no keys/values, so compacting its cache is the identity.
  """
  return speculative_fn(
    target,
    row_shift,
    inputs,
    {},
    tree.max_depth,
    tree=tree,
    compact_cache=lambda cache, positions, path: cache,
    **decode_args,
  )


TREE = tree_lib.Tree(parents=(-1, 0, 0, 1, 1, 2, 3))  # Not uniform: depth 3, 7 nodes.


def test_a_token_tree_follows_the_callback_distribution():
  """Chi-square as above with a token tree (bigram draft, T = 1): each node's path is its prefix."""
  target = markov.MarkovTarget(CHI_SQUARE_TABLE)
  row_shift = np.zeros(BATCH, np.int32)
  inputs = jnp.zeros((BATCH, LENGTH), jnp.int32)
  args = dict(temperature=1.0, topk=0, logit_callback_fn=constraining_callback)
  run = tree_fn(target, row_shift, inputs, TREE, **args)
  draft, _ = make_draft('bigram', target, row_shift, VOCAB)
  samples = []
  for seed in range(25):
    samples += outputs_as_tuples(run(jax.random.PRNGKey(seed), draft)[0])
  exact = target.sequence_distribution(
    LENGTH, EOS, logit_callback_fn=constraining_callback, temperature=1.0
  )
  p_value = sequence_chi_square_p_value(samples, exact)
  print(f'\nchi-square p-value, logit callback, token tree {TREE.describe()}: {p_value:.4f}')
  assert p_value > 1e-3


def test_a_greedy_token_tree_equals_greedy_baseline_with_the_callback():
  vocab, length = 7, 10
  target = markov.MarkovTarget(
    markov.random_table(seed=3, num_positions=40, vocab_size=vocab, scale=3.0)
  )
  row_shift = np.array([0, 3, 5, 9])
  inputs = ragged_prompts(length, vocab)
  args = dict(temperature=0.0, topk=0, logit_callback_fn=constraining_callback)
  baseline, _ = baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(0))
  # The target's own bigram statistics: a draft that often agrees, so that paths are accepted.
  draft = drafts.NgramDraft.fit([row[row != 0] for row in np.asarray(baseline[:, 0])], vocab)
  decodes, _, stats = tree_fn(target, row_shift, inputs, TREE, **args)(jax.random.PRNGKey(0), draft)
  np.testing.assert_array_equal(decodes, baseline)
  assert np.sum(stats.accepted) > 0


# ------------------------------------------------------------------------------
# rescale_log_probs.
# ------------------------------------------------------------------------------
def exact_scores(target, row_shift, inputs, decodes, rescale, **sample_args):
  """float64 [B]: each decode's score, token by token from `markov.next_logits`.

  The generated tokens (after each row's prompt, up to its first EOS) scored under
  the standardized distribution (rescale) or `log_softmax` of the callback's logits.
  """
  length = inputs.shape[1]
  scores = []
  for row, decode in enumerate(np.asarray(decodes)):
    prompt_length = int(np.sum(np.asarray(inputs[row, 1:]) != 0))
    sequence, score = [0, *decode[:prompt_length].tolist()], 0.0
    for token in decode[prompt_length:].tolist():
      logits = target.next_logits(sequence, row_shift[row], constraining_callback, length + 1)
      if rescale:
        probs = sampling.standardize(logits, **sample_args)
        score += np.log(np.float64(probs[token]))
      else:
        score += np.float64(jax.nn.log_softmax(logits)[token])
      sequence.append(token)
      if token == EOS:
        break
    scores.append(score)
  return np.asarray(scores)


# `slow`: greedy without rescaling (the same scoring under the logits as top-k without it).
@pytest.mark.parametrize(
  'sample_args, rescale_log_probs',
  [
    (dict(temperature=0.7, topk=3), True),
    (dict(temperature=0.0, topk=0), True),
    (dict(temperature=0.7, topk=3), False),
    pytest.param(dict(temperature=0.0, topk=0), False, marks=pytest.mark.slow),
  ],
  ids=['topk3-True', 'greedy-True', 'topk3-False', 'greedy-False'],
)
def test_scores_follow_rescale_log_probs(rescale_log_probs, sample_args):
  """T5X's rescale_log_probs: True scores under p (0 when greedy), False under the logits.

  Both functions (a chain and a token tree), with the callback (whose logits are the
  ones scored) and prompts.
  """
  vocab, length, gamma = 6, 9, 3
  target = markov.MarkovTarget(markov.random_table(seed=4, num_positions=30, vocab_size=vocab))
  row_shift = np.array([0, 2, 5, 8])
  inputs = ragged_prompts(length, vocab)
  args = dict(logit_callback_fn=constraining_callback, rescale_log_probs=rescale_log_probs)
  args.update(sample_args)
  draft, draft_cache = make_draft('markov', target, row_shift, vocab)
  results = {
    'baseline': baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(1)),
    'speculative': speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)(
      jax.random.PRNGKey(1), draft
    )[:2],
    'tree': tree_fn(target, row_shift, inputs, TREE, **args)(
      jax.random.PRNGKey(1), drafts.NgramDraft.fit([[2, 3, 4, 5, 1], [4, 2, 1]], vocab)
    )[:2],
  }
  for name, (decodes, scores) in results.items():
    expected = exact_scores(
      target, row_shift, inputs, decodes[:, 0], rescale_log_probs, **sample_args
    )
    np.testing.assert_allclose(scores[:, 0], expected, rtol=1e-5, atol=1e-5, err_msg=name)
    if rescale_log_probs and sample_args['temperature'] == 0.0:
      np.testing.assert_array_equal(scores, 0.0)
    else:
      assert np.all(np.asarray(scores) < 0), name


# ------------------------------------------------------------------------------
# max_decode_steps_hard_limit, state_callback_fn, named errors.
# ------------------------------------------------------------------------------
HARD_LIMIT_CASES = {
  # (max_decode_steps, max_decode_steps_hard_limit): tokens generated after each prompt.
  'clipped': (5, 2, [2, 2]),
  'below_the_limit': (2, 5, [2, 2]),
  'limit_0_is_off': (5, 0, [5, 5]),
  'no_steps_no_limit': (None, 2, [9, 8]),
  'per_row_steps': (np.array([3, 1]), 2, [2, 1]),
}


def deterministic_pair(outputs_per_row, vocab):
  """A Markov target under which row r greedily emits outputs_per_row[r][t] at position t."""
  table, row_shift = markov.deterministic_table(outputs_per_row, vocab_size=vocab, stride=16)
  return markov.MarkovTarget(table), row_shift


@pytest.mark.parametrize('case', HARD_LIMIT_CASES)
def test_max_decode_steps_hard_limit_clips_max_decode_steps(case):
  max_decode_steps, hard_limit, generated = HARD_LIMIT_CASES[case]
  target, row_shift = deterministic_pair([[2] * 12, [3] * 12], vocab=6)
  inputs = jnp.asarray([[0, 4, 0, 0, 0, 0, 0, 0, 0, 0], [0, 4, 5, 0, 0, 0, 0, 0, 0, 0]])
  args = dict(max_decode_steps=max_decode_steps, max_decode_steps_hard_limit=hard_limit)
  draft, draft_cache = make_draft('bigram', target, row_shift, 6)
  for decodes in (
    baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(0))[0],
    speculative_fn(target, row_shift, inputs, draft_cache, 3, **args)(jax.random.PRNGKey(0), draft)[
      0
    ],
  ):
    np.testing.assert_array_equal(
      np.sum(np.asarray(decodes)[:, 0] != 0, axis=1) - [1, 2], generated
    )


def test_a_hard_limit_that_is_not_an_int_is_a_named_error():
  target = markov.MarkovTarget(markov.random_table(seed=0, num_positions=10, vocab_size=4))
  inputs = np.zeros((1, 5), np.int32)
  with pytest.raises(ValueError, match='max_decode_steps_hard_limit must be a Python int'):
    decoding.temperature_sample(
      inputs, {}, target.tokens_to_logits, EOS, max_decode_steps=3, max_decode_steps_hard_limit=2.5
    )


def force_eos_after_3(state):
  """T5X's decoding_test state callback: EOS right after the first sampled 3."""
  cur = jnp.take_along_axis(state.sequences, state.cur_index[:, None], axis=1)[:, 0]
  after = jnp.arange(state.sequences.shape[1])[None] == state.cur_index[:, None] + 1
  return state.replace(sequences=jnp.where(after & (cur == 3)[:, None], EOS, state.sequences))


def test_temperature_sample_runs_a_state_callback_as_t5x():
  """T5X's `test_temperature_sample_with_state_callback`, with its expected output."""

  def tokens_to_logits(state):  # All the mass on id 3.
    return jnp.tile(jnp.asarray([[-1e7, -1e7, -1e7, 0.0]]), (state.cur_token.shape[0], 1)), {}

  inputs = np.array([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], np.int32)
  decodes, _ = decoding.temperature_sample(
    inputs, {}, tokens_to_logits, EOS, topk=0, temperature=0.0, state_callback_fn=force_eos_after_3
  )
  np.testing.assert_array_equal(decodes[:, 0], [[5, 6, 7, 3, EOS], [8, 9, 3, EOS, 0]])


def test_speculation_refuses_a_state_callback():
  target = markov.MarkovTarget(markov.random_table(seed=0, num_positions=10, vocab_size=4))
  draft = drafts.NgramDraft.fit([[2, 3]], 4)
  with pytest.raises(ValueError, match='state_callback_fn=.*temperature_sample.*logit_callback_fn'):
    decoding.speculative_sample(
      np.zeros((1, 5), np.int32),
      {},
      target.score_block,
      EOS,
      state_callback_fn=force_eos_after_3,
      draft=draft,
      draft_cache={},
      gamma=2,
    )


# ------------------------------------------------------------------------------
# T5X's docstring examples (`t5x.decoding.temperature_sample`), greedy, any draft.
# ------------------------------------------------------------------------------
# name: (inputs, initial_index, max_decode_steps, hard limit, greedy token per row and
# position, T5X's output with its letters replaced by those tokens).
DOCSTRING_EXAMPLES = {
  'example_1': ([[0, 5, 6, 1, 0]], None, None, None, [[2, 2, 2, 7, 8]], [[5, 6, 1, 7, 8]]),
  'example_2_early_stopping': (
    [[0, 5, 1, 0, 0, 0, 0], [0, 8, 0, 0, 0, 0, 0]],
    None,
    None,
    None,
    [[2, 2, 2, 3, EOS, 4, 4], [2, 4, 5, EOS, 6, 6, 6]],
    [[5, 1, 2, 3, EOS, 0, 0], [8, 4, 5, EOS, 0, 0, 0]],
  ),
  'example_3_prefilled_cache': (
    [[0, 5, 2, 6, 1, 0], [0, 8, 1, 0, 0, 0]],
    [4, 2],
    None,
    None,
    [[2, 2, 2, 2, 7, 8], [2, 2, 3, 4, 5, 6]],
    [[5, 2, 6, 1, 7, 8], [8, 1, 3, 4, 5, 6]],
  ),
  'example_4_max_decode_steps': (
    [[0, 2, 0, 0, 0, 0, 0, 0], [0, 3, 4, 0, 0, 0, 0, 0]],
    [1, 2],
    2,
    None,
    [[2, 5, 6, 7, 7, 7, 7, 7], [2, 2, 8, 9, 7, 7, 7, 7]],
    [[2, 5, 6, 0, 0, 0, 0, 0], [3, 4, 8, 9, 0, 0, 0, 0]],
  ),
  'example_4_hard_limit': (
    [[0, 2, 0, 0, 0, 0, 0, 0], [0, 3, 4, 0, 0, 0, 0, 0]],
    [1, 2],
    6,
    2,
    [[2, 5, 6, 7, 7, 7, 7, 7], [2, 2, 8, 9, 7, 7, 7, 7]],
    [[2, 5, 6, 0, 0, 0, 0, 0], [3, 4, 8, 9, 0, 0, 0, 0]],
  ),
}
EXAMPLE_VOCAB = 10


def example_setup(name):
  inputs, initial_index, steps, hard_limit, greedy, expected = DOCSTRING_EXAMPLES[name]
  target, row_shift = deterministic_pair(greedy, EXAMPLE_VOCAB)
  args = dict(max_decode_steps=steps, max_decode_steps_hard_limit=hard_limit)
  if initial_index is not None:
    args['initial_index'] = jnp.asarray(initial_index, jnp.int32)
  return target, row_shift, jnp.asarray(inputs, jnp.int32), args, np.asarray(expected)


# `slow`: example 4 (initial_index runs fast in example 3; max_decode_steps and its hard limit
# in test_max_decode_steps_hard_limit_clips_max_decode_steps, baseline and speculative).
FAST_DOCSTRING_EXAMPLES = ('example_1', 'example_2_early_stopping', 'example_3_prefilled_cache')


@pytest.mark.parametrize(
  'name',
  [
    pytest.param(name, marks=() if name in FAST_DOCSTRING_EXAMPLES else pytest.mark.slow)
    for name in DOCSTRING_EXAMPLES
  ],
)
def test_t5x_docstring_examples(name):
  """Ours give T5X's documented outputs: baseline, and speculative with every kind of draft."""
  target, row_shift, inputs, args, expected = example_setup(name)
  decodes, _ = baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(0))
  np.testing.assert_array_equal(decodes[:, 0], expected)
  for kind, gamma in (('perfect', 3), ('wrong', 2), ('bigram', 4), ('lookup', 1)):
    draft, draft_cache = make_draft(kind, target, row_shift, EXAMPLE_VOCAB)
    decodes, _, _ = speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)(
      jax.random.PRNGKey(0), draft
    )
    np.testing.assert_array_equal(decodes[:, 0], expected, err_msg=kind)


# ------------------------------------------------------------------------------
# Against the real t5x.decoding.temperature_sample.
# ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def t5x_decoding():
  import_t5x()
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

  return t5x_decoding


def t5x_sample(t5x_decoding, target, row_shift, inputs, rng=None, **decode_args):
  return jax.jit(
    lambda rng: t5x_decoding.temperature_sample(
      inputs, target.cache(row_shift), target.tokens_to_logits, EOS, decode_rng=rng, **decode_args
    )
  )(jax.random.PRNGKey(0) if rng is None else rng)


@pytest.mark.t5x
@pytest.mark.parametrize('name', DOCSTRING_EXAMPLES)
def test_t5x_gives_its_docstring_examples_as_ours_do(t5x_decoding, name):
  target, row_shift, inputs, args, expected = example_setup(name)
  decodes, _ = t5x_sample(t5x_decoding, target, row_shift, inputs, **args)
  np.testing.assert_array_equal(decodes[:, 0], expected)


@pytest.mark.t5x
@pytest.mark.parametrize('case', HARD_LIMIT_CASES)
def test_t5x_hard_limit_as_ours(t5x_decoding, case):
  max_decode_steps, hard_limit, generated = HARD_LIMIT_CASES[case]
  target, row_shift = deterministic_pair([[2] * 12, [3] * 12], vocab=6)
  inputs = jnp.asarray([[0, 4, 0, 0, 0, 0, 0, 0, 0, 0], [0, 4, 5, 0, 0, 0, 0, 0, 0, 0]])
  decodes, _ = t5x_sample(
    t5x_decoding,
    target,
    row_shift,
    inputs,
    max_decode_steps=max_decode_steps,
    max_decode_steps_hard_limit=hard_limit,
  )
  np.testing.assert_array_equal(np.sum(np.asarray(decodes)[:, 0] != 0, axis=1) - [1, 2], generated)


@pytest.mark.t5x
@pytest.mark.parametrize('rescale_log_probs', [True, False])
def test_t5x_greedy_with_the_callback_as_ours(t5x_decoding, rescale_log_probs):
  """T5X's greedy tokens and scores under the callback: ours, baseline and speculative."""
  vocab, length, gamma = 7, 10, 3
  target = markov.MarkovTarget(
    markov.random_table(seed=6, num_positions=40, vocab_size=vocab, scale=3.0)
  )
  row_shift = np.array([0, 3, 5, 9])
  inputs = ragged_prompts(length, vocab)
  args = dict(
    temperature=0.0, logit_callback_fn=constraining_callback, rescale_log_probs=rescale_log_probs
  )
  expected, expected_scores = t5x_sample(t5x_decoding, target, row_shift, inputs, **args)
  ours = [baseline_fn(target, row_shift, inputs, **args)(jax.random.PRNGKey(0))]
  for kind in ('perfect', 'bigram', 'wrong'):
    draft, draft_cache = make_draft(kind, target, row_shift, vocab)
    run = speculative_fn(target, row_shift, inputs, draft_cache, gamma, **args)
    ours.append(run(jax.random.PRNGKey(0), draft)[:2])
  for decodes, scores in ours:
    np.testing.assert_array_equal(decodes, expected)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.t5x
def test_t5x_state_callback_as_ours(t5x_decoding):
  def tokens_to_logits(state):
    return jnp.tile(jnp.asarray([[-1e7, -1e7, -1e7, 0.0]]), (state.cur_token.shape[0], 1)), {}

  inputs = np.array([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], np.int32)
  args = dict(topk=0, temperature=0.0, state_callback_fn=force_eos_after_3)
  expected, _ = t5x_decoding.temperature_sample(inputs, {}, tokens_to_logits, EOS, **args)
  decodes, _ = decoding.temperature_sample(inputs, {}, tokens_to_logits, EOS, **args)
  np.testing.assert_array_equal(decodes, expected)


@pytest.mark.t5x
def test_t5x_per_row_temperatures_and_top_p_sample_the_same_distribution(t5x_decoding):
  """T5X's samples at per-row temperatures with top-p and the callback: the exact distribution.

  The one `test_per_row_temperatures_and_top_p_follow_the_target` holds ours to. T5X's
  per-row path draws every row with one key (its vmap over rows shares `rng1`), so rows
  with equal logits sample equal tokens: its rows are not independent samples, only each
  row's distribution is T5X's. Its 4096 samples per call are therefore 2048 independent
  decodes of a 2-row batch (a vmap over keys).
  """
  target = markov.MarkovTarget(CHI_SQUARE_TABLE)
  temperatures = np.asarray(PER_ROW_TEMPERATURES, np.float32)

  @jax.jit
  def run(rng):
    def two_rows(key):
      return t5x_decoding.temperature_sample(
        jnp.zeros((2, LENGTH), jnp.int32),
        target.cache(np.zeros(2, np.int32)),
        target.tokens_to_logits,
        EOS,
        decode_rng=key,
        temperature=temperatures,
        **PER_ROW_ARGS,
      )[0][:, 0]

    return jax.vmap(two_rows)(jax.random.split(rng, BATCH // 2)).reshape(BATCH, LENGTH)

  assert_per_row_samples_follow_the_target(run, np.tile(temperatures, BATCH // 2), 't5x')


# ------------------------------------------------------------------------------
# Through the T5X predict path: decoder_params reach the decode function.
# ------------------------------------------------------------------------------
def test_predict_batch_passes_t5x_decoder_params_to_the_decode_function():
  """T5X's predict_batch hands `decoder_params` to `decode_fn`; so does ours.

  Greedy with the callback, unscaled scores and a clipped max_decode_steps:
  `t5x_adapter.speculative_predict_batch` gives the baseline's tokens and scores.
  """
  target, draft = tiny_model(seed=0, scale=3.0), tiny_model(seed=1, scale=3.0)
  inputs = padded_inputs(seed=3, batch=3, length=7, vocab_size=target.vocab_size)
  length = 10
  decoder_params = dict(
    temperature=0.0,
    topk=0,
    logit_callback_fn=constraining_callback,
    rescale_log_probs=False,
    max_decode_steps=8,
    max_decode_steps_hard_limit=6,
  )
  expected, expected_scores = jax.jit(
    lambda: models.baseline_decode(
      target.config, target.params, inputs, length, eos_id=EOS, **decoder_params
    )
  )()
  module = network.Transformer(target.config)
  decodes, aux = jax.jit(
    lambda params: t5x_adapter.speculative_predict_batch(
      module,
      network.Transformer(draft.config),
      params,
      {'encoder_input_tokens': inputs, 'decoder_input_tokens': np.zeros((3, length), np.int32)},
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=3),
      decoder_params=decoder_params,
    )
  )({**target.params, t5x_adapter.DRAFT_KEY: draft.params})
  np.testing.assert_array_equal(decodes, expected[:, 0])
  assert np.sum(np.asarray(decodes) != 0, axis=1).max() == 6  # The hard limit.
  np.testing.assert_allclose(aux['scores'], expected_scores[:, 0], rtol=1e-5)
  assert np.all(np.asarray(aux['scores']) < 0)  # Unscaled: not 0 as greedy's rescaled are.


def test_predict_batch_refuses_a_state_callback_before_choosing_a_decode():
  """Named before gamma='auto' could pick the baseline: the same error at every batch size."""
  target = tiny_model(seed=0)
  module = network.Transformer(target.config)
  with pytest.raises(ValueError, match='state_callback_fn=.*logit_callback_fn'):
    t5x_adapter.speculative_predict_batch(
      module,
      module,
      {**target.params, t5x_adapter.DRAFT_KEY: target.params},
      {'encoder_input_tokens': np.ones((2, 3), np.int32), 'decoder_input_tokens': np.zeros((2, 5))},
      eos_id=EOS,
      settings=settings.SpeculativeSettings(gamma=3),
      decoder_params={'state_callback_fn': force_eos_after_3},
    )
