"""Block verification (Sun et al., ICLR 2025, Algorithm 2): exact, and never fewer tokens.

A float64 enumeration of one step over every draft block gives, per
verification rule, the exact distribution of what an iteration emits; each
is completed with target samples to gamma + 1 tokens and compared with the
target's own distribution. The JAX implementation is then checked against
the enumeration, per fixed draft block, by a chi-square test over many keys.
Both also for an adaptive draft length: blocks that stop after a token the
draft gave probability below a threshold, judged only up to there.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import speculative_sampling
from testing_utils import sequence_chi_square_p_value


def random_tables(vocab_size, gamma, rng, kind):
  """p(. | prefix) and q(. | prefix) for every prefix of length <= gamma."""
  p, q = {}, {}
  for length in range(gamma + 1):
    for prefix in itertools.product(range(vocab_size), repeat=length):
      p[prefix] = rng.dirichlet(np.ones(vocab_size))
      q[prefix] = rng.dirichlet(np.ones(vocab_size))
      if kind == 'zeros':  # Zeros in p and in q.
        p[prefix][0], q[prefix][-1] = 0.0, 0.0
      elif kind == 'equal' and rng.random() < 0.5:
        q[prefix] = p[prefix].copy()
      elif kind == 'disjoint':  # q on the first half of the ids, p on the rest.
        half = vocab_size // 2
        p[prefix][:half], q[prefix][half:] = 0.0, 0.0
      elif kind == 'near_ties':
        p[prefix] = np.full(vocab_size, 1.0) + 1e-9 * rng.standard_normal(vocab_size)
      p[prefix] /= p[prefix].sum()
      q[prefix] /= q[prefix].sum()
  return p, q


def residual(weight, target, draft):
  excess = np.maximum(weight * target - draft, 0.0)
  return excess / excess.sum() if excess.sum() > 1e-12 else target


def emitted_given_draft(p, q, draft, rule):
  """{emitted tokens: probability} of one iteration for a fixed draft block."""
  gamma = len(draft)
  prefix = lambda i: tuple(draft[:i])
  out = {}

  def add(tokens, probability):
    out[tokens] = out.get(tokens, 0.0) + probability

  if rule == 'token':
    reach = 1.0
    for i in range(gamma):
      target, proposal = p[prefix(i)], q[prefix(i)]
      accept = min(1.0, target[draft[i]] / proposal[draft[i]])
      for y, probability in enumerate(residual(1.0, target, proposal)):
        add(prefix(i) + (y,), reach * (1 - accept) * probability)
      reach *= accept
    for y, probability in enumerate(p[prefix(gamma)]):
      add(prefix(gamma) + (y,), reach * probability)
    return out
  weights, stop = [1.0], [None]
  for i in range(1, gamma + 1):
    x = draft[i - 1]
    weights.append(min(weights[-1] * p[prefix(i - 1)][x] / q[prefix(i - 1)][x], 1.0))
    if i < gamma:
      excess = np.maximum(weights[i] * p[prefix(i)] - q[prefix(i)], 0.0).sum()
      denominator = excess + 1 - weights[i]
      stop.append(excess / denominator if denominator > 0 else 0.0)
    else:
      stop.append(weights[gamma])
  for tau in range(gamma + 1):
    probability = (stop[tau] if tau else 1.0) * np.prod([1 - h for h in stop[tau + 1 :]])
    next_probs = (
      p[prefix(gamma)] if tau == gamma else residual(weights[tau], p[prefix(tau)], q[prefix(tau)])
    )
    for y, next_probability in enumerate(next_probs):
      add(prefix(tau) + (y,), probability * next_probability)
  return out


def emitted(p, q, vocab_size, gamma, rule):
  """{emitted tokens: probability} of one iteration, over the draft's blocks."""
  out = {}
  for draft in itertools.product(range(vocab_size), repeat=gamma):
    draft_probability = np.prod([q[draft[:i]][draft[i]] for i in range(gamma)])
    if draft_probability == 0:
      continue
    for tokens, probability in emitted_given_draft(p, q, draft, rule).items():
      out[tokens] = out.get(tokens, 0.0) + draft_probability * probability
  return out


def emitted_adaptive(p, q, vocab_size, gamma, rule, threshold):
  """`emitted` for drafts that stop after a token x_i with q_i(x_i) < threshold."""
  out = {}

  def extend(draft, probability):
    if draft and (len(draft) == gamma or q[draft[:-1]][draft[-1]] < threshold):
      for tokens, emitted_probability in emitted_given_draft(p, q, draft, rule).items():
        out[tokens] = out.get(tokens, 0.0) + probability * emitted_probability
      return
    for x in range(vocab_size):
      if q[draft][x] > 0:
        extend(draft + (x,), probability * q[draft][x])

  extend((), 1.0)
  return out


def completed_with_target(out, p, vocab_size, gamma):
  """The distribution of gamma + 1 tokens: what was emitted, then target samples."""
  full = {}
  for tokens, probability in out.items():
    for tail in itertools.product(range(vocab_size), repeat=gamma + 1 - len(tokens)):
      sequence = tokens + tail
      tail_probability = np.prod(
        [p[sequence[:j]][sequence[j]] for j in range(len(tokens), gamma + 1)]
      )
      full[sequence] = full.get(sequence, 0.0) + probability * tail_probability
  return full


def mean_accepted(out):
  return sum(probability * (len(tokens) - 1) for tokens, probability in out.items())


@pytest.mark.parametrize('gamma', [1, 2, 3])
@pytest.mark.parametrize('kind', ['random', 'zeros', 'equal', 'disjoint', 'near_ties'])
def test_block_verification_emits_the_target_distribution(gamma, kind):
  vocab_size = 3 if gamma < 3 else 2
  p, q = random_tables(vocab_size, gamma, np.random.default_rng(gamma * 7 + len(kind)), kind)
  target = {
    s: np.prod([p[s[:j]][s[j]] for j in range(gamma + 1)])
    for s in itertools.product(range(vocab_size), repeat=gamma + 1)
  }
  expected_lengths = {}
  for rule in ('token', 'block'):
    out = emitted(p, q, vocab_size, gamma, rule)
    full = completed_with_target(out, p, vocab_size, gamma)
    assert max(abs(full.get(s, 0.0) - target[s]) for s in target) < 1e-12, rule
    expected_lengths[rule] = mean_accepted(out)
  assert expected_lengths['block'] >= expected_lengths['token'] - 1e-12


@pytest.mark.parametrize('gamma', [2, 3])
@pytest.mark.parametrize('kind', ['random', 'zeros', 'equal', 'disjoint', 'near_ties'])
def test_an_adaptive_draft_length_keeps_both_rules_exact(gamma, kind):
  """Drafts cut where the draft is unsure, judged up to the cut: still the target's law."""
  vocab_size = 3
  for seed in range(4):
    p, q = random_tables(vocab_size, gamma, np.random.default_rng(100 * seed + gamma), kind)
    target = {
      s: np.prod([p[s[:j]][s[j]] for j in range(gamma + 1)])
      for s in itertools.product(range(vocab_size), repeat=gamma + 1)
    }
    for threshold in (0.2, 0.4, 0.6):
      for rule in ('token', 'block'):
        out = emitted_adaptive(p, q, vocab_size, gamma, rule, threshold)
        full = completed_with_target(out, p, vocab_size, gamma)
        assert max(abs(full.get(s, 0.0) - target[s]) for s in target) < 1e-12, (rule, threshold)


def test_the_papers_two_token_example():
  """Binary vocabulary, p = (1/3, 2/3), q = (2/3, 1/3), gamma 2: 10/9 vs 11/9 tokens."""
  p = {
    prefix: np.array([1 / 3, 2 / 3])
    for n in range(3)
    for prefix in itertools.product(range(2), repeat=n)
  }
  q = {prefix: np.array([2 / 3, 1 / 3]) for prefix in p}
  assert mean_accepted(emitted(p, q, 2, 2, 'token')) == pytest.approx(10 / 9)
  assert mean_accepted(emitted(p, q, 2, 2, 'block')) == pytest.approx(11 / 9)


@pytest.mark.parametrize('deterministic_draft', [False, True])
def test_the_jax_implementation_matches_the_enumeration(deterministic_draft):
  """For fixed draft blocks, (tau, next token) over 40,000 keys vs the exact law."""
  vocab_size, gamma, num_keys = 3, 3, 40_000
  p, q = random_tables(vocab_size, gamma, np.random.default_rng(11), 'random')
  for draft in ((0, 1, 2), (2, 2, 0), (1, 0, 1)):
    if deterministic_draft:  # q one-hot at the drafted token (prompt lookup).
      q = {
        prefix: np.eye(vocab_size)[draft[len(prefix)]] if len(prefix) < gamma else q[prefix]
        for prefix, q_row in q.items()
      }
    exact = emitted_given_draft(p, q, draft, 'block')
    exact = {tokens: probability for tokens, probability in exact.items() if probability > 0}
    prefixes = [tuple(draft[:i]) for i in range(gamma + 1)]
    target_probs = jnp.asarray(np.stack([p[prefix] for prefix in prefixes]), jnp.float32)
    draft_probs = jnp.asarray(np.stack([q[prefix] for prefix in prefixes[:gamma]]), jnp.float32)
    tile = lambda x: jnp.broadcast_to(x, (num_keys,) + x.shape)
    num_accepted, next_token = speculative_sampling.verify(
      jax.random.split(jax.random.PRNGKey(sum(draft)), num_keys),
      tile(jnp.asarray(draft, jnp.int32)),
      None if deterministic_draft else tile(draft_probs),
      tile(target_probs),
      verification='block',
    )
    samples = [
      tuple(draft[:n]) + (int(y),) for n, y in zip(np.asarray(num_accepted), np.asarray(next_token))
    ]
    assert sequence_chi_square_p_value(samples, exact) > 1e-3, draft


@pytest.mark.parametrize('verification', ['token', 'block'])
def test_only_the_drafted_positions_are_judged(verification):
  """verify(num_drafted=n) on a gamma-wide block equals the enumeration of its first n tokens.

  Past n the block holds tokens and q that must be ignored (not zeros).
  """
  vocab_size, gamma, num_keys = 3, 3, 40_000
  p, q = random_tables(vocab_size, gamma, np.random.default_rng(12), 'random')
  for draft, n in (((0, 1, 2), 0), ((2, 2, 0), 1), ((1, 0, 1), 2), ((0, 2, 1), 3)):
    exact = emitted_given_draft(p, q, draft[:n], verification)
    exact = {tokens: probability for tokens, probability in exact.items() if probability > 0}
    prefixes = [tuple(draft[:i]) for i in range(gamma + 1)]
    target_probs = jnp.asarray(np.stack([p[prefix] for prefix in prefixes]), jnp.float32)
    draft_probs = jnp.asarray(np.stack([q[prefix] for prefix in prefixes[:gamma]]), jnp.float32)
    tile = lambda x: jnp.broadcast_to(x, (num_keys,) + x.shape)
    num_accepted, next_token = speculative_sampling.verify(
      jax.random.split(jax.random.PRNGKey(10 + n), num_keys),
      tile(jnp.asarray(draft, jnp.int32)),
      tile(draft_probs),
      tile(target_probs),
      verification=verification,
      num_drafted=jnp.full((num_keys,), n, jnp.int32),
    )
    assert int(jnp.max(num_accepted)) <= n
    samples = [
      tuple(draft[:k]) + (int(y),) for k, y in zip(np.asarray(num_accepted), np.asarray(next_token))
    ]
    assert sequence_chi_square_p_value(samples, exact) > 1e-3, (draft, n)


def test_block_verification_needs_exact_lenience():
  tokens = jnp.zeros((1, 2), jnp.int32)
  probs = jnp.full((1, 3, 4), 0.25)
  with pytest.raises(ValueError, match='needs lenience 1, got 0.5'):
    speculative_sampling.verify(
      jax.random.PRNGKey(0), tokens, probs[:, :2], probs, 0.5, verification='block'
    )
  with pytest.raises(ValueError, match="verification must be 'token' or 'block'"):
    speculative_sampling.verify(
      jax.random.PRNGKey(0), tokens, probs[:, :2], probs, verification='tree'
    )


def test_num_drafted_of_the_wrong_shape_is_a_named_error():
  tokens = jnp.zeros((2, 2), jnp.int32)
  probs = jnp.full((2, 3, 4), 0.25)
  with pytest.raises(ValueError, match=r'num_drafted must have shape \[B\] = \[2\]'):
    speculative_sampling.verify(
      jax.random.PRNGKey(0), tokens, probs[:, :2], probs, num_drafted=jnp.ones((3,), jnp.int32)
    )
