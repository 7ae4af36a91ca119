"""Speculative sampling reproduces the target's joint sequence distribution.

A toy autoregressive target and a different toy draft, both conditioned on the
whole prefix, over a 5-token vocabulary and sequences of 4 tokens: every one of
the 625 sequences has an exact target probability, so 200,000 speculative
samples per configuration are compared with it by a chi-square test, for every
sampling mode, γ ∈ {1, 3, 7} and both verification rules (token: Algorithm 1;
block: Sun et al.'s block verification), with a fixed draft length and with an
adaptive one (the draft, `drafts.rollout_loop`, stops a row after a token it
gave probability below a threshold). `make test` runs a subset (every mode and
rule), the rest are `slow`. Run with `pytest -s` to see the p-values.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import drafts
from speculative_t5x import sampling
from speculative_t5x import speculative_sampling
from testing_utils import chi_square_test

VOCAB_SIZE = 5
LENGTH = 4
NUM_SEQUENCES = 200_000
# Prefix states: s' = (s·V + t + 1) mod K, from s = 0. Without the modulus this
# is bijective base-V numeration, so every prefix shorter than LENGTH has its
# own state (the largest is 155 < K); longer prefixes, which only drafts beyond
# the sequence end reach, may share states.
NUM_STATES = 257
P_VALUE_FLOOR = 1e-3

# mode: (target sampling args, draft sampling args, deterministic draft).
MODES = {
  'temperature_1': (dict(temperature=1.0), dict(temperature=1.0), False),
  'temperature_0.6': (dict(temperature=0.6), dict(temperature=0.6), False),
  'top_k_3': (dict(topk=3), dict(topk=3), False),
  'top_p_0.8': (dict(topp=0.8), dict(topp=0.8), False),
  'argmax': (dict(temperature=0.0), dict(temperature=0.0), False),
  # A deterministic draft (argmax of the draft model, q one-hot, passed to
  # verify as draft_probs=None) under a sampling target.
  'deterministic_draft': (dict(temperature=1.0), dict(temperature=0.0), True),
}
GAMMAS = (1, 3, 7)
# The adaptive draft length's threshold: rows stop early in most iterations.
DRAFT_THRESHOLD = 0.5


def _logit_tables():
  """Target and draft logits [NUM_STATES, V], different but correlated.

  Each table masks some tokens with -inf, independently, so the two supports
  differ (q = 0 where p > 0 and the reverse).
  """
  rng = np.random.default_rng(20230518)
  target = 1.5 * rng.standard_normal((NUM_STATES, VOCAB_SIZE))
  draft = target + 1.2 * rng.standard_normal((NUM_STATES, VOCAB_SIZE))
  for table in (target, draft):
    masked = rng.random(table.shape) < 0.15
    masked[:, 0] = False  # Keep every row non-empty.
    table[masked] = -np.inf
  return jnp.asarray(target, jnp.float32), jnp.asarray(draft, jnp.float32)


TARGET_LOGITS, DRAFT_LOGITS = _logit_tables()


def _next_state(state, token):
  return (state * VOCAB_SIZE + token + 1) % NUM_STATES


@functools.partial(
  jax.jit,
  static_argnames=(
    'gamma',
    'deterministic_draft',
    'verification',
    'draft_temperature',
    'draft_threshold',
  ),
)
def speculative_sequences(
  rng,
  target_table,
  draft_table,
  gamma,
  deterministic_draft,
  verification='token',
  draft_temperature=1.0,
  draft_threshold=0.0,
):
  """Samples NUM_SEQUENCES sequences [N, LENGTH] by speculative sampling.

  Args:
    rng: PRNG key.
    target_table: float32 [NUM_STATES, V], the standardized target
      distribution of each prefix state (standardize works row by row, so
      standardizing each state once and gathering equals standardizing the
      gathered logits, at a fraction of the cost; and the sampling mode stays
      out of the compiled program).
    draft_table: float32 [NUM_STATES, V], the draft's logits: its raw logits
      for a greedy draft (draft_temperature 0; the threshold applies to their
      softmax), else the log of its standardized distribution (sampled at
      draft_temperature 1, so the threshold applies to q itself).
    gamma: the most draft tokens per iteration.
    deterministic_draft: pass draft_probs=None to verify (q one-hot).
    verification: 'token' or 'block' (`speculative_sampling.verify`).
    draft_temperature: 0 (greedy draft) or 1.
    draft_threshold: `drafts.rollout_loop`'s adaptive draft length (0: off).
  """
  rows = jnp.arange(NUM_SEQUENCES)

  def draft_step(carry, token):
    # The first step's token is the last emitted one, already in the state.
    state, first = carry
    state = jnp.where(first, state, _next_state(state, token))
    return draft_table[state], (state, False)

  def iteration(_, carry):
    rng, tokens, length, state, drafted = carry
    rng, draft_rng, verify_rng = jax.random.split(rng, 3)
    draft_tokens, draft_probs, num_drafted, _ = drafts.rollout_loop(
      draft_step,
      (state, True),
      jnp.zeros_like(state),
      draft_rng,
      vocab_size=VOCAB_SIZE,
      gamma=gamma,
      temperature=draft_temperature,
      topk=0,
      topp=0.0,
      draft_threshold=draft_threshold,
    )
    # [N, γ+1]: the state before each drafted token, and after the last one.
    states = [state]
    for i in range(gamma):
      states.append(_next_state(states[-1], draft_tokens[:, i]))
    states = jnp.stack(states, axis=1)
    target_probs = target_table[states]
    num_accepted, next_token = speculative_sampling.verify(
      verify_rng,
      draft_tokens,
      None if deterministic_draft else draft_probs,
      target_probs,
      verification=verification,
      num_drafted=num_drafted,
    )

    # Emitted this iteration: drafts[:n] then next_token; [N, γ+1].
    emitted = jnp.concatenate([draft_tokens, draft_tokens[:, :1]], axis=1)
    emitted = emitted.at[rows, num_accepted].set(next_token)
    offset = jnp.arange(LENGTH)[None, :] - length[:, None]
    written = (offset >= 0) & (offset <= num_accepted[:, None])
    tokens = jnp.where(
      written, jnp.take_along_axis(emitted, jnp.clip(offset, 0, gamma), axis=1), tokens
    )
    state = _next_state(states[rows, num_accepted], next_token)
    return rng, tokens, length + num_accepted + 1, state, drafted + num_drafted

  # Each iteration emits at least one token, so LENGTH iterations suffice.
  zeros = jnp.zeros((NUM_SEQUENCES,), jnp.int32)
  carry = (rng, jnp.zeros((NUM_SEQUENCES, LENGTH), jnp.int32), zeros, zeros, zeros)
  _, tokens, length, _, drafted = jax.lax.fori_loop(0, LENGTH, iteration, carry)
  # Mean tokens drafted per iteration (LENGTH iterations per row, the last
  # ones past the sequence end).
  return tokens, length, jnp.mean(drafted) / LENGTH


def exact_sequence_probabilities(target_args):
  """The target's probability of every sequence, indexed base-V; [V**LENGTH]."""
  sequences = np.stack(
    np.unravel_index(np.arange(VOCAB_SIZE**LENGTH), (VOCAB_SIZE,) * LENGTH), axis=-1
  )
  table = np.asarray(sampling.standardize(TARGET_LOGITS, **target_args), np.float64)
  probs = np.ones(len(sequences))
  state = np.zeros(len(sequences), np.int64)
  for position in range(LENGTH):
    token = sequences[:, position]
    probs *= table[state, token]
    state = _next_state(state, token)
  return probs


def sequence_index(tokens):
  return np.ravel_multi_index(tuple(np.asarray(tokens).T), (VOCAB_SIZE,) * LENGTH)


def sample_mode(mode, gamma, seed=0, verification='token', draft_threshold=0.0):
  """Speculative samples [N, LENGTH] for one sampling mode, γ, rule and threshold."""
  target_args, draft_args, deterministic_draft = MODES[mode]
  # Adaptive runs draw their own keys, independent of the fixed-length runs'.
  adaptive = 100 if draft_threshold else 0
  rng = jax.random.key(1000 * seed + adaptive + 10 * gamma + list(MODES).index(mode))
  greedy_draft = draft_args == dict(temperature=0.0)
  tokens, length, drafted_per_iteration = speculative_sequences(
    rng,
    sampling.standardize(TARGET_LOGITS, **target_args),
    DRAFT_LOGITS if greedy_draft else jnp.log(sampling.standardize(DRAFT_LOGITS, **draft_args)),
    gamma,
    deterministic_draft,
    verification,
    0.0 if greedy_draft else 1.0,
    draft_threshold,
  )
  assert np.all(np.asarray(length) >= LENGTH)
  if draft_threshold and gamma > 1:  # The adaptive length is exercised.
    assert 1 <= float(drafted_per_iteration) < 0.9 * gamma
  else:
    assert float(drafted_per_iteration) == gamma
  return np.asarray(tokens)


def run_configuration(mode, gamma, seed=0, verification='token', draft_threshold=0.0):
  """Returns (statistic, dof, p-value) of speculative vs exact for one case."""
  tokens = sample_mode(mode, gamma, seed, verification, draft_threshold)
  counts = np.bincount(sequence_index(tokens), minlength=VOCAB_SIZE**LENGTH)
  return chi_square_test(counts, exact_sequence_probabilities(MODES[mode][0]))


# (gamma, draft_threshold): at gamma 1 a row drafts its one token whatever the
# threshold, so the adaptive length is exercised from gamma 2 on.
GAMMAS_AND_THRESHOLDS = [(g, 0.0) for g in GAMMAS] + [(g, DRAFT_THRESHOLD) for g in GAMMAS if g > 1]
# `make test` runs every mode under both rules at gamma 3 with the adaptive draft
# length, and temperature 1 also at the fixed gamma 1 (both rules) and 7 (block: 7
# drafts past the sequence end); the other cases (the same sample count each) are
# `slow`, run by `make test-all`.
FAST_GAMMA_AND_THRESHOLD = (3, DRAFT_THRESHOLD)
FAST_TEMPERATURE_1 = {(1, 0.0, 'token'), (1, 0.0, 'block'), (7, 0.0, 'block')}


def _joint_cases():
  for mode in (m for m in MODES if m != 'argmax'):
    for verification in ('token', 'block'):
      for gamma, draft_threshold in GAMMAS_AND_THRESHOLDS:
        fast = (gamma, draft_threshold) == FAST_GAMMA_AND_THRESHOLD or (
          mode == 'temperature_1' and (gamma, draft_threshold, verification) in FAST_TEMPERATURE_1
        )
        yield pytest.param(
          mode,
          gamma,
          verification,
          draft_threshold,
          id=f'{mode}-{verification}-{gamma}-{draft_threshold}',
          marks=() if fast else pytest.mark.slow,
        )


@pytest.mark.parametrize('mode, gamma, verification, draft_threshold', list(_joint_cases()))
def test_joint_distribution_matches_target(mode, gamma, verification, draft_threshold):
  statistic, dof, p_value = run_configuration(mode, gamma, 0, verification, draft_threshold)
  print(
    f'\n[exactness] mode={mode} gamma={gamma} verification={verification} '
    f'draft_threshold={draft_threshold} chi2={statistic:.1f} dof={dof} p={p_value:.4f}'
  )
  assert p_value > P_VALUE_FLOOR


@pytest.mark.parametrize('draft_threshold', [0.0, DRAFT_THRESHOLD], ids=['fixed', 'adaptive'])
@pytest.mark.parametrize('verification', ['token', 'block'])
@pytest.mark.parametrize(
  'gamma',
  [g if g < LENGTH else pytest.param(g, marks=pytest.mark.slow) for g in GAMMAS],
)  # Drafts past the sequence end (gamma 7) run in the sampled tests above.
def test_argmax_emits_the_greedy_sequence(gamma, verification, draft_threshold):
  greedy = []
  state = jnp.zeros((), jnp.int32)
  for _ in range(LENGTH):
    token = jnp.argmax(TARGET_LOGITS[state])
    greedy.append(int(token))
    state = _next_state(state, token)
  np.testing.assert_array_equal(
    sample_mode('argmax', gamma, verification=verification, draft_threshold=draft_threshold),
    np.broadcast_to(greedy, (NUM_SEQUENCES, LENGTH)),
  )
