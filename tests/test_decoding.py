"""The decode loops on a Markov target: exact outputs, EOS, cuts, stats, exactness."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import judging
import markov
from testing_utils import EOS, decoded_lengths, outputs_as_tuples, sequence_chi_square_p_value


def run_baseline(
  target, row_shift, length, rng=None, num_decodes=1, inputs=None, initial_index=None, **sample_args
):
  """`temperature_sample` from BOS, or from decoder prompts `inputs` [B, length]."""
  if inputs is None:
    inputs = jnp.zeros((len(row_shift), length), jnp.int32)
  return jax.jit(
    lambda rng: decoding.temperature_sample(
      inputs,
      target.cache(row_shift),
      target.tokens_to_logits,
      EOS,
      decode_rng=rng,
      num_decodes=num_decodes,
      initial_index=initial_index,
      **sample_args,
    )
  )(jax.random.PRNGKey(0) if rng is None else rng)


def speculative_fn(
  target,
  draft_cache,
  row_shift,
  length,
  gamma,
  num_decodes=1,
  draft_threshold=0.0,
  inputs=None,
  judge=None,
  **sample_args,
):
  """A jitted `(rng, draft) -> (decodes, log_probs, stats)`, compiled once per draft structure.

  Decodes from BOS, or from decoder prompts `inputs` [B, length], with `judge`
  (None: the exact one).
  """
  if inputs is None:
    inputs = jnp.zeros((len(row_shift), length), jnp.int32)

  @jax.jit
  def run(rng, draft):
    return decoding.speculative_sample(
      inputs,
      target.cache(row_shift),
      target.score_block,
      EOS,
      decode_rng=rng,
      num_decodes=num_decodes,
      **sample_args,
      draft=draft,
      draft_cache=draft_cache,
      gamma=gamma,
      draft_threshold=draft_threshold,
      judge=judge,
    )

  return run


def run_speculative(target, draft, draft_cache, row_shift, length, gamma, rng=None, **kwargs):
  run = speculative_fn(target, draft_cache, row_shift, length, gamma, **kwargs)
  return run(jax.random.PRNGKey(0) if rng is None else rng, draft)


GREEDY = dict(temperature=0.0, topk=0)


class TestGreedyEquality:
  @pytest.mark.parametrize(
    'draft_kind, gamma',
    [
      ('perfect', 1),
      ('perfect', 5),
      ('wrong', 2),
      ('wrong', 8),
      ('bigram', 3),
      ('bigram', 8),
      ('unigram', 4),
      ('lookup', 1),
      ('lookup', 6),
    ],
  )
  def test_speculative_equals_baseline(self, draft_kind, gamma):
    vocab, length = 7, 11
    table = markov.random_table(seed=gamma, num_positions=40, vocab_size=vocab)
    table[..., vocab - 1] -= 100.0  # The target never emits the last id: a wrong draft's token.
    target = markov.MarkovTarget(table)
    row_shift = np.array([0, 3, 5, 9, 2])
    baseline, _ = run_baseline(target, row_shift, length, **GREEDY)
    draft_cache = {}
    if draft_kind == 'perfect':
      draft, draft_cache = markov.MarkovDraft(target.table), target.cache(row_shift)
    elif draft_kind == 'wrong':
      draft = markov.ConstantDraft(token=vocab - 1, vocab_size=vocab)
    elif draft_kind in ('bigram', 'unigram'):
      corpus = [
        np.asarray(jax.random.randint(jax.random.PRNGKey(i), (9,), 1, vocab)) for i in range(30)
      ]
      draft = drafts.NgramDraft.fit(corpus, vocab, order=2 if draft_kind == 'bigram' else 1)
    else:
      draft = drafts.PromptLookupDraft(vocab_size=vocab, max_ngram=2)
      draft_cache = draft.init_cache(jnp.asarray(baseline[:, 0, ::-1]), cache_length=0)
    decodes, _, stats = run_speculative(
      target, draft, draft_cache, row_shift, length, gamma, **GREEDY
    )
    np.testing.assert_array_equal(decodes, baseline)
    if draft_kind == 'perfect':
      # Every iteration but a row's last accepts all gamma and emits gamma + 1.
      np.testing.assert_array_equal(stats.iterations, -(-stats.emitted // (gamma + 1)))
      np.testing.assert_array_equal(stats.accepted, gamma * stats.iterations)
    if draft_kind == 'wrong':
      np.testing.assert_array_equal(stats.accepted, 0)
      np.testing.assert_array_equal(stats.emitted, stats.iterations)


class TestLoopBehaviour:
  def test_eos_inside_an_accepted_block_ends_the_row_there(self):
    # Row 0 emits EOS as the 3rd token of its first block; row 1 later; row 2 never.
    outputs = [[3, 4, EOS, 5, 5, 5], [3, 4, 5, 6, 3, EOS], [2, 2, 2, 2, 2, 2, 2, 2]]
    table, row_shift = markov.deterministic_table(outputs, vocab_size=8, stride=20)
    target = markov.MarkovTarget(table)
    draft = markov.MarkovDraft(target.table)
    decodes, _, stats = run_speculative(
      target, draft, target.cache(row_shift), row_shift, length=8, gamma=4, **GREEDY
    )
    np.testing.assert_array_equal(
      decodes[:, 0],
      [
        [3, 4, EOS, 0, 0, 0, 0, 0],
        [3, 4, 5, 6, 3, EOS, 0, 0],
        [2, 2, 2, 2, 2, 2, 2, 2],
      ],
    )
    np.testing.assert_array_equal(stats.iterations[:, 0], [1, 2, 2])
    np.testing.assert_array_equal(stats.emitted[:, 0], [3, 6, 8])
    # The perfect draft is always fully accepted; the cut tokens are the rest.
    np.testing.assert_array_equal(stats.accepted[:, 0], 4 * stats.iterations[:, 0])
    assert int(stats.target_calls) == 2

  def test_blocks_running_past_the_length_are_cut(self):
    outputs = [[2] * 12]
    table, row_shift = markov.deterministic_table(outputs, vocab_size=4, stride=24)
    target = markov.MarkovTarget(table)
    decodes, _, stats = run_speculative(
      target,
      markov.MarkovDraft(target.table),
      target.cache(row_shift),
      row_shift,
      length=7,
      gamma=3,
      **GREEDY,
    )
    np.testing.assert_array_equal(decodes[0, 0], [2] * 7)
    assert int(stats.emitted[0, 0]) == 7 and int(stats.iterations[0, 0]) == 2

  def test_max_decode_steps_bounds_every_row(self):
    table = markov.random_table(seed=3, num_positions=30, vocab_size=6)
    table[..., [0, EOS]] = -1e9  # never ends early, never emits PAD
    target = markov.MarkovTarget(table)
    row_shift = np.array([0, 1])
    decodes, _, stats = run_speculative(
      target,
      drafts.NgramDraft.fit([[2, 3, 4]], 6),
      {},
      row_shift,
      length=9,
      gamma=3,
      max_decode_steps=5,
      **GREEDY,
    )
    assert (np.asarray(decodes)[:, 0, :5] != 0).all() and (np.asarray(decodes)[:, 0, 5:] == 0).all()
    baseline, _ = run_baseline(target, row_shift, 9, max_decode_steps=5, **GREEDY)
    np.testing.assert_array_equal(decodes, baseline)

  def test_num_decodes_sorted_and_scored_exactly(self):
    vocab, length = 5, 4
    table = markov.random_table(seed=7, num_positions=20, vocab_size=vocab)
    table[..., EOS] -= 3.0  # Longer outputs, so that samples differ.
    target = markov.MarkovTarget(table)
    row_shift = np.array([0, 2])
    draft = drafts.NgramDraft.fit([[2, 3, 4, 1]], vocab)
    decodes, log_probs, stats = run_speculative(
      target, draft, {}, row_shift, length, gamma=3, num_decodes=6, temperature=1.0, topk=0
    )
    assert decodes.shape == (2, 6, length) and log_probs.shape == (2, 6)
    assert stats.iterations.shape == (2, 6)
    assert np.all(np.diff(np.asarray(log_probs), axis=1) >= 0)
    for row, shift in enumerate(row_shift):
      exact = target.sequence_distribution(length, EOS, row_shift=shift, temperature=1.0)
      for output, log_prob in zip(outputs_as_tuples(decodes[row]), np.asarray(log_probs[row])):
        np.testing.assert_allclose(log_prob, np.log(exact[output]), rtol=1e-5)
    # The samples of one row differ (independent keys per expanded row).
    assert len({tuple(d) for d in np.asarray(decodes[0])}) > 1

  def test_stats_are_consistent(self):
    vocab, length, gamma = 6, 10, 3
    target = markov.MarkovTarget(markov.random_table(seed=11, num_positions=30, vocab_size=vocab))
    row_shift = np.arange(16) % 5
    draft = drafts.NgramDraft.fit([[2, 3, 4, 5, 1]], vocab)
    decodes, _, stats = run_speculative(
      target, draft, {}, row_shift, length, gamma, temperature=1.0, topk=0
    )
    decodes = np.asarray(decodes[:, 0])
    np.testing.assert_array_equal(stats.emitted[:, 0], decoded_lengths(decodes))
    cut = stats.accepted + stats.iterations - stats.emitted
    assert np.all(cut >= 0) and np.all(cut <= gamma)
    assert int(stats.target_calls) == int(stats.iterations.max())
    assert 0.0 < float(stats.mean_beta) < 1.0
    # Judged: the accepted positions and at most one rejected per iteration.
    assert (
      stats.accepted.sum() <= int(stats.beta_count) <= (stats.accepted + stats.iterations).sum()
    )
    assert stats.record == ()  # The exact judge records nothing.

  @pytest.mark.parametrize('verification', ['token', 'block'])
  def test_stats_of_an_adaptive_draft_length(self, verification):
    """Rows draft 1..gamma tokens; only those are judged, counted and stepped."""
    vocab, length, gamma = 6, 12, 5
    table = markov.random_table(seed=11, num_positions=30, vocab_size=vocab, scale=3.0)
    target = markov.MarkovTarget(table)
    row_shift = np.arange(16) % 7
    draft = markov.MarkovDraft(target.table * 0.7)  # Less sure than the target.
    run = speculative_fn(
      target,
      target.cache(row_shift),
      row_shift,
      length,
      gamma,
      draft_threshold=0.6,
      temperature=1.0,
      topk=0,
    )
    _, _, stats = run(jax.random.PRNGKey(3), draft)
    drafted, iterations = np.asarray(stats.drafted[:, 0]), np.asarray(stats.iterations[:, 0])
    assert np.all(iterations <= drafted) and np.all(drafted <= gamma * iterations)
    assert drafted.sum() < gamma * iterations.sum()  # Rows stopped early.
    assert int(stats.draft_steps) < gamma * int(stats.target_calls)
    assert stats.accepted.sum() < drafted.sum()
    assert float(stats.mean_acceptance_length) == pytest.approx(
      1 + stats.accepted.sum() / iterations.sum()
    )
    assert float(stats.drafted_per_iteration) == pytest.approx(drafted.sum() / iterations.sum())
    # Judged: the accepted positions and at most one rejected per iteration, never past a
    # row's draft.
    judged = int(stats.beta_count)
    assert stats.accepted.sum() <= judged <= min((stats.accepted + iterations).sum(), drafted.sum())

  @pytest.mark.parametrize('gamma', [0, -1, 2.5])
  def test_bad_gamma(self, gamma):
    target = markov.MarkovTarget(markov.random_table(seed=1, num_positions=10, vocab_size=4))
    with pytest.raises(ValueError, match='gamma'):
      decoding.speculative_sample(
        jnp.zeros((1, 4), jnp.int32),
        target.cache([0]),
        target.score_block,
        EOS,
        draft=drafts.NgramDraft.fit([[2]], 4),
        draft_cache={},
        gamma=gamma,
      )

  def test_vocabulary_mismatch_names_both_sizes(self):
    target = markov.MarkovTarget(markov.random_table(seed=1, num_positions=10, vocab_size=4))
    with pytest.raises(ValueError, match='vocabulary size 5 .* 4'):
      decoding.speculative_sample(
        jnp.zeros((1, 4), jnp.int32),
        target.cache([0]),
        target.score_block,
        EOS,
        draft=drafts.NgramDraft.fit([[2]], 5),
        draft_cache={},
        gamma=2,
      )


@dataclasses.dataclass(frozen=True)
class IterationsJudge(judging.ExactJudge):
  """The exact rules, recording each row's active iterations [BN] through the record slot."""

  refuse: bool = False

  def check(self, spec):
    if self.refuse:
      raise ValueError(f'refused gamma={spec.gamma}')

  def init_record(self, flat_size, spec):
    return jnp.zeros((flat_size,), jnp.int32)

  def record(self, record, judgement, active):
    return record + active


class TestJudge:
  def test_the_default_judge_is_the_exact_one_and_records_nothing(self):
    vocab, length, gamma = 6, 10, 3
    target = markov.MarkovTarget(markov.random_table(seed=11, num_positions=30, vocab_size=vocab))
    row_shift = np.arange(6) % 5
    draft = drafts.NgramDraft.fit([[2, 3, 4, 5, 1]], vocab)
    outputs = [
      run_speculative(
        target, draft, {}, row_shift, length, gamma, judge=judge, temperature=1.0, topk=0
      )
      for judge in (None, judging.EXACT)
    ]
    for default, exact in zip(*outputs):
      jax.tree_util.tree_map(np.testing.assert_array_equal, default, exact)
    assert outputs[0][2].record == ()  # No arrays in the loop's state, no work.
    # Static, compared by value: an equal judge is the same compiled program.
    assert judging.ExactJudge() == judging.EXACT
    assert hash(judging.ExactJudge()) == hash(judging.EXACT)

  def test_a_judges_record_is_carried_and_returned_and_its_check_runs(self):
    vocab, length, gamma = 6, 10, 3
    target = markov.MarkovTarget(markov.random_table(seed=11, num_positions=30, vocab_size=vocab))
    row_shift = np.arange(6) % 5
    draft = drafts.NgramDraft.fit([[2, 3, 4, 5, 1]], vocab)
    sample = dict(temperature=1.0, topk=0)
    exact = run_speculative(target, draft, {}, row_shift, length, gamma, **sample)
    decodes, log_probs, stats = run_speculative(
      target, draft, {}, row_shift, length, gamma, judge=IterationsJudge(), **sample
    )
    # The same keys in the same order: the same samples; the record is the loop's own count.
    np.testing.assert_array_equal(decodes, exact[0])
    np.testing.assert_array_equal(log_probs, exact[1])
    np.testing.assert_array_equal(stats.record, stats.iterations[:, 0])
    with pytest.raises(ValueError, match='refused gamma=3'):
      run_speculative(
        target, draft, {}, row_shift, length, gamma, judge=IterationsJudge(refuse=True), **sample
      )


WHOLE_SEQUENCE_MODES = {
  'temperature1': dict(temperature=1.0, topk=0),
  'topk3': dict(temperature=0.7, topk=3),
  'topp0.8': dict(temperature=1.0, topk=0, topp=0.8),
}
WHOLE_SEQUENCE_DRAFTS = {
  'bigram-3': ('bigram', 3, 0.0, 25),
  'lookup-3': ('lookup', 3, 0.0, 25),
  'bigram-adaptive-gamma7': ('bigram', 7, 0.15, 50),
}


# `make test` runs the bigram draft at temperature 1 and top-p, and prompt lookup at
# temperature 1 (top-k and the adaptive length: test_models, test_exactness_toy); the
# other pairs (the same sample counts) are `slow`.
WHOLE_SEQUENCE_FAST = {
  ('bigram-3', 'temperature1'),
  ('bigram-3', 'topp0.8'),
  ('lookup-3', 'temperature1'),
}


@pytest.mark.parametrize(
  'sample_args, draft_kind, gamma, draft_threshold, calls',
  [
    pytest.param(
      args,
      *draft,
      id=f'{draft_name}-{mode}',
      marks=() if (draft_name, mode) in WHOLE_SEQUENCE_FAST else pytest.mark.slow,
    )
    for mode, args in WHOLE_SEQUENCE_MODES.items()
    for draft_name, draft in WHOLE_SEQUENCE_DRAFTS.items()
  ],
)
def test_whole_sequences_match_the_target_distribution(
  sample_args, draft_kind, gamma, draft_threshold, calls
):
  """Chi-square over complete outputs (EOS included) of the speculative loop.

  calls x 4096 sequences: 102,400, or 204,800 with an adaptive draft length.
  """
  vocab, length, batch = 5, 4, 4096
  table = markov.random_table(seed=5, num_positions=20, vocab_size=vocab, scale=1.5)
  target = markov.MarkovTarget(table)
  if draft_kind == 'bigram':
    draft, draft_cache = drafts.NgramDraft.fit([[2, 3, 4, 2, 1], [3, 3, 1]], vocab), {}
  else:
    draft = drafts.PromptLookupDraft(vocab_size=vocab, max_ngram=2)
    draft_cache = draft.init_cache(jnp.tile(jnp.asarray([[2, 3, 4, 3, 2, 1]]), (batch, 1)), 0)
  run = speculative_fn(
    target,
    draft_cache,
    np.zeros(batch, np.int32),
    length,
    gamma,
    draft_threshold=draft_threshold,
    **sample_args,
  )
  samples, drafted, iterations = [], 0, 0
  for seed in range(calls):
    decodes, _, stats = run(jax.random.PRNGKey(seed), draft)
    samples += outputs_as_tuples(decodes)
    drafted, iterations = drafted + stats.drafted.sum(), iterations + stats.iterations.sum()
  exact = target.sequence_distribution(length, EOS, **sample_args)
  p_value = sequence_chi_square_p_value(samples, exact)
  print(
    f'\nchi-square p-value, Markov target, {draft_kind} draft, gamma={gamma}, '
    f'draft_threshold={draft_threshold}, {sample_args}: {p_value:.4f} over {len(samples)} '
    f'sequences, drafted/iteration={drafted / iterations:.2f}'
  )
  assert p_value > 1e-3
  assert drafted < gamma * iterations if draft_threshold else drafted == gamma * iterations


def ragged_prompts(seed, batch, length, vocab, max_prompt=None):
  """int32 [batch, length] decoder prompts (shifted right) of lengths 0..max_prompt.

  Tokens in [2, vocab): no PAD inside and no EOS, so every row decodes after it.
  """
  rng = np.random.default_rng(seed)
  max_prompt = length - 1 if max_prompt is None else max_prompt
  lengths = rng.integers(0, max_prompt + 1, batch)
  lengths[0] = max_prompt  # The longest prompt the output allows is always there.
  inputs = np.zeros((batch, length), np.int32)
  for row, prompt_length in enumerate(lengths):
    inputs[row, 1 : prompt_length + 1] = rng.integers(2, vocab, prompt_length)
  return inputs, lengths


class TestPrompts:
  """Decoder prompts: teacher-forced baseline == prefilled speculative loop."""

  @pytest.mark.parametrize('batch', [1, 3, 8])
  @pytest.mark.parametrize('gamma', [1, 3, 7])
  @pytest.mark.parametrize('draft_kind', ['perfect', 'wrong', 'bigram', 'lookup'])
  def test_greedy_speculative_equals_baseline_with_ragged_prompts(self, draft_kind, gamma, batch):
    vocab, length = 7, 12
    table = markov.random_table(seed=gamma + batch, num_positions=40, vocab_size=vocab)
    table[..., vocab - 1] -= 100.0  # The target never emits the last id: a wrong draft's token.
    target = markov.MarkovTarget(table)
    row_shift = np.arange(batch) % 4
    inputs, lengths = ragged_prompts(batch, batch, length, vocab - 1, max_prompt=length - 1)
    baseline, _ = run_baseline(target, row_shift, length, inputs=inputs, **GREEDY)
    draft_cache = {}
    if draft_kind == 'perfect':
      draft, draft_cache = markov.MarkovDraft(target.table), target.cache(row_shift)
    elif draft_kind == 'wrong':
      draft = markov.ConstantDraft(token=vocab - 1, vocab_size=vocab)
    elif draft_kind == 'bigram':
      draft = drafts.NgramDraft.fit(list(inputs[:, 1:]), vocab)
    else:
      draft = drafts.PromptLookupDraft(vocab_size=vocab, max_ngram=2)
      draft_cache = draft.init_cache(jnp.zeros((batch, 1), jnp.int32), cache_length=0)
    decodes, _, stats = run_speculative(
      target, draft, draft_cache, row_shift, length, gamma, inputs=inputs, **GREEDY
    )
    np.testing.assert_array_equal(decodes, baseline)
    # The prompts are kept (T5X's convention) and only what follows is counted.
    np.testing.assert_array_equal(
      np.asarray(decodes)[:, 0, : length - 1] * (inputs[:, 1:] != 0), inputs[:, 1:]
    )
    emitted = np.asarray(stats.emitted)[:, 0]
    assert np.all(emitted >= 1) and np.all(emitted <= length - lengths)
    assert emitted[0] == 1  # The longest prompt leaves room for exactly one token.

  def test_initial_index_starts_from_prefilled_caches(self):
    """T5X's decoder-only convention: the same decodes as teacher forcing the prompt."""
    vocab, length = 6, 10
    target = markov.MarkovTarget(markov.random_table(seed=4, num_positions=30, vocab_size=vocab))
    row_shift = np.array([0, 2, 1])
    inputs, lengths = ragged_prompts(0, 3, length, vocab, max_prompt=6)
    forced, _ = run_baseline(target, row_shift, length, inputs=inputs, **GREEDY)
    prefilled, _ = run_baseline(
      target, row_shift, length, inputs=inputs, initial_index=lengths, **GREEDY
    )
    np.testing.assert_array_equal(prefilled, forced)
    decodes, _, _ = run_speculative(
      target,
      markov.MarkovDraft(target.table),
      target.cache(row_shift),
      row_shift,
      length,
      3,
      inputs=inputs,
      initial_index=jnp.asarray(lengths),
      **GREEDY,
    )
    np.testing.assert_array_equal(decodes, forced)

  def test_max_decode_steps_count_after_the_prompt(self):
    vocab, length = 6, 12
    table = markov.random_table(seed=3, num_positions=30, vocab_size=vocab)
    table[..., [0, EOS]] = -1e9  # never ends early, never emits PAD
    target = markov.MarkovTarget(table)
    inputs, lengths = ragged_prompts(1, 4, length, vocab, max_prompt=5)
    decodes, _, stats = run_speculative(
      target,
      drafts.NgramDraft.fit([[2, 3, 4]], vocab),
      {},
      np.zeros(4, np.int32),
      length,
      3,
      inputs=inputs,
      max_decode_steps=4,
      **GREEDY,
    )
    np.testing.assert_array_equal(stats.emitted[:, 0], 4)
    np.testing.assert_array_equal((np.asarray(decodes)[:, 0] != 0).sum(1), lengths + 4)

  @pytest.mark.parametrize(
    'sample_args',
    [
      dict(temperature=1.0, topk=0),
      dict(temperature=1.0, topk=3),
      dict(temperature=0.8, topk=0, topp=0.7),
    ],
    ids=['temperature1', 'topk3', 'topp0.7'],
  )
  def test_continuations_of_a_prompt_follow_the_target(self, sample_args):
    """Chi-square over whole continuations after a 3-token prompt (bigram draft)."""
    vocab, length, batch, calls = 5, 6, 4096, 12
    target = markov.MarkovTarget(markov.random_table(seed=8, num_positions=20, vocab_size=vocab))
    prompt = (3, 2, 4)
    inputs = np.zeros((batch, length), np.int32)
    inputs[:, 1 : len(prompt) + 1] = prompt
    run = speculative_fn(
      target, {}, np.zeros(batch, np.int32), length, 3, inputs=inputs, **sample_args
    )
    draft = drafts.NgramDraft.fit([[2, 3, 4, 2, 1], [3, 3, 1]], vocab)
    samples = []
    for seed in range(calls):
      decodes, _, _ = run(jax.random.PRNGKey(seed), draft)
      samples += outputs_as_tuples(np.asarray(decodes)[:, 0, len(prompt) :])
    exact = target.sequence_distribution(length, EOS, prompt=prompt, **sample_args)
    p_value = sequence_chi_square_p_value(samples, exact)
    print(f'\nchi-square p-value, Markov target after a prompt, {sample_args}: {p_value:.4f}')
    assert p_value > 1e-3

  def test_bad_prompts_are_named_errors(self):
    target = markov.MarkovTarget(markov.random_table(seed=0, num_positions=10, vocab_size=4))
    draft = drafts.NgramDraft.fit([[2, 3]], 4)
    holes = np.array([[0, 2, 0, 3, 0]], np.int32)
    with pytest.raises(ValueError, match='row 0 has a 0 \\(padding\\) between its tokens'):
      decoding.speculative_sample(
        holes, {}, target.score_block, EOS, draft=draft, draft_cache={}, gamma=2
      )
    prompt = np.array([[0, 2, 3, 0, 0]], np.int32)
    with pytest.raises(ValueError, match='initial_index\\[0\\] = 5 leaves no room'):
      decoding.speculative_sample(
        prompt,
        {},
        target.score_block,
        EOS,
        initial_index=np.array([5]),
        draft=draft,
        draft_cache={},
        gamma=2,
      )
    with pytest.raises(ValueError, match='initial_index must be int \\[batch\\]'):
      decoding.temperature_sample(
        prompt, {}, target.tokens_to_logits, EOS, initial_index=np.array([2, 2])
      )
