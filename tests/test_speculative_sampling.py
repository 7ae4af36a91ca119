"""Tests for speculative_t5x.speculative_sampling (Algorithm 1's verify step)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from speculative_t5x import sampling
from speculative_t5x import speculative_sampling as spec


# One compilation per input shape; lenience is traced, so it does not add any.
verify = jax.jit(spec.verify, static_argnames='return_beta')


@pytest.fixture
def x64():
  """Float64 JAX inside the test only (the flag is restored afterwards)."""
  with jax.enable_x64(True):
    yield


def first_token_distribution(p, q, lenience=1.0):
  """The exact distribution of the first emitted token, by enumeration.

  Uses the rule's own functions: x ~ q is kept with acceptance_probability,
  otherwise the token comes from residual_distribution.
  """
  kept = q * spec.acceptance_probability(p, q, lenience)
  rejected = jnp.sum(q * (1 - spec.acceptance_probability(p, q, lenience)))
  return kept + rejected * spec.residual_distribution(p, q, lenience)


def first_token_distribution_for_token(p, token, lenience=1.0):
  """The same for a deterministic draft proposing `token`, via its own path."""
  accept = spec.acceptance_probability(p[token], jnp.ones((), p.dtype), lenience)
  kept = jnp.zeros_like(p).at[token].set(accept)
  return kept + (1 - accept) * spec.residual_distribution_for_token(p, jnp.asarray(token), lenience)


def _normalized(weights):
  weights = np.asarray(weights, np.float64)
  return weights / weights.sum()


def _distribution_pairs():
  """(name, p, q), float64 numpy, covering where exactness could break."""
  rng = np.random.default_rng(7)
  v = 8
  random_p = _normalized(rng.dirichlet(np.ones(v)))
  random_q = _normalized(rng.dirichlet(np.ones(v)))
  near_p = _normalized(rng.dirichlet(np.ones(v)))
  near_q = _normalized(near_p * (1 + 1e-9 * rng.standard_normal(v)))
  return [
    ('random', random_p, random_q),
    ('q_equals_p', random_p, random_p),
    (
      'disjoint_supports',
      _normalized([3, 1, 2, 0, 0, 0, 0, 0]),
      _normalized([0, 0, 0, 1, 4, 1, 1, 2]),
    ),
    (
      'q_zero_where_p_positive',
      random_p,
      _normalized(np.where(np.arange(v) % 3 == 0, 0, random_q)),
    ),
    (
      'p_zero_where_q_positive',
      _normalized(np.where(np.arange(v) % 2 == 0, 0, random_p)),
      random_q,
    ),
    ('one_hot_q_in_support', random_p, np.eye(v)[2]),
    ('one_hot_q_outside_support', _normalized([1, 1, 0, 1, 1, 1, 1, 1]), np.eye(v)[2]),
    ('one_hot_p', np.eye(v)[5], random_q),
    ('near_ties', near_p, near_q),
    ('peaked_vs_flat', _normalized([1e6, 1, 1, 1, 1, 1, 1, 1]), _normalized(np.ones(v))),
  ]


@pytest.mark.parametrize(
  'case', range(len(_distribution_pairs())), ids=[name for name, _, _ in _distribution_pairs()]
)
def test_first_token_is_distributed_as_p_exactly(x64, case):
  _, p, q = _distribution_pairs()[case]
  emitted = first_token_distribution(jnp.asarray(p), jnp.asarray(q))
  assert emitted.dtype == jnp.float64
  np.testing.assert_allclose(emitted, p, rtol=0, atol=1e-12)


@pytest.mark.parametrize('token', [0, 3, 7])
def test_deterministic_draft_path_is_exact(x64, token):
  p = jnp.asarray(_normalized([0.3, 0.0, 0.1, 0.2, 0.05, 0.05, 0.1, 0.2]))
  emitted = first_token_distribution_for_token(p, token)
  np.testing.assert_allclose(emitted, p, rtol=0, atol=1e-12)
  np.testing.assert_allclose(
    spec.residual_distribution_for_token(p, jnp.asarray(token), 0.7),
    spec.residual_distribution(p, jnp.eye(8, dtype=jnp.float64)[token], 0.7),
    rtol=0,
    atol=1e-15,
  )


@pytest.mark.parametrize('lenience', [0.9, 0.5, 0.1])
def test_lenience_bounds_each_token_by_p_over_l(x64, lenience):
  deviations = []
  for _, p, q in _distribution_pairs():
    emitted = first_token_distribution(jnp.asarray(p), jnp.asarray(q), lenience)
    np.testing.assert_allclose(emitted.sum(), 1.0, rtol=0, atol=1e-12)
    assert np.all(np.asarray(emitted) >= 0)
    assert np.all(np.asarray(emitted) <= np.asarray(p) / lenience + 1e-12)
    deviations.append(float(jnp.max(jnp.abs(emitted - p))))
  # The relaxation is real: some pair's emitted distribution is not p.
  assert max(deviations) > 1e-2


def test_lenient_example_by_hand(x64):
  # p = (0.2, 0.8), q = (0.8, 0.2), l = 0.5: token 0 is accepted with
  # probability min(1, 0.2 / 0.4) = 0.5, token 1 always; the rejection mass
  # 0.4 goes to the residual max(0, p - 0.5 q) = (0, 0.7) -> token 1.
  p = jnp.array([0.2, 0.8], jnp.float64)
  q = jnp.array([0.8, 0.2], jnp.float64)
  np.testing.assert_allclose(spec.acceptance_probability(p, q, 0.5), [0.5, 1])
  np.testing.assert_allclose(spec.residual_distribution(p, q, 0.5), [0, 1])
  np.testing.assert_allclose(first_token_distribution(p, q, 0.5), [0.4, 0.6])
  np.testing.assert_allclose(spec.lenient_acceptance_rate(p, q, 0.5), 0.6)
  assert float(first_token_distribution(p, q, 0.5)[0]) <= 0.2 / 0.5


def test_acceptance_probability_conventions():
  np.testing.assert_array_equal(
    spec.acceptance_probability(
      jnp.array([0.0, 0.5, 0.3, 0.2, 0.0]), jnp.array([0.0, 0.0, 0.6, 0.2, 0.4])
    ),
    [0.0, 1.0, 0.5, 1.0, 0.0],
  )


def test_residual_falls_back_to_p_when_empty():
  p = jnp.array([0.1, 0.2, 0.7], jnp.float32)
  np.testing.assert_array_equal(spec.residual_distribution(p, p), p)
  np.testing.assert_array_equal(
    spec.residual_distribution_for_token(jnp.eye(3)[1], jnp.asarray(1)), jnp.eye(3)[1]
  )


def test_verify_by_hand():
  v = 4
  one_hot = jnp.eye(v, dtype=jnp.float32)
  # Row 0: target agrees with every draft token -> all 3 accepted, bonus 2.
  # Row 1: position 0 agrees, position 1 has p(x) = 0 -> 1 accepted, and the
  #        residual max(0, p - q) is one-hot at the target's token 3.
  draft_tokens = jnp.array([[1, 0, 3], [1, 0, 3]], jnp.int32)
  draft_probs = one_hot[draft_tokens]
  target_probs = jnp.stack(
    [
      jnp.stack([one_hot[1], one_hot[0], one_hot[3], one_hot[2]]),
      jnp.stack([one_hot[1], one_hot[3], one_hot[3], one_hot[2]]),
    ]
  )
  for q in (draft_probs, None):
    num_accepted, next_token, beta = verify(
      jax.random.key(0), draft_tokens, q, target_probs, return_beta=True
    )
    np.testing.assert_array_equal(num_accepted, [3, 1])
    np.testing.assert_array_equal(next_token, [2, 3])
    np.testing.assert_array_equal(beta, [[1, 1, 1], [1, 0, 1]])
    assert num_accepted.dtype == jnp.int32 and next_token.dtype == jnp.int32


def test_verify_matches_the_enumerated_rule_by_monte_carlo():
  """verify's first emitted token follows the enumerated lenient law."""
  rng = np.random.default_rng(3)
  v, rows = 6, 100_000
  p = rng.dirichlet(np.ones(v))
  q = rng.dirichlet(np.ones(v))
  for lenience in (1.0, 0.6):
    draft_key, verify_key = jax.random.split(jax.random.key(int(10 * lenience)))
    draft_probs = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, 1, v))
    draft_tokens = sampling.sample(draft_key, draft_probs)
    target_probs = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (rows, 2, v))
    num_accepted, next_token = verify(verify_key, draft_tokens, draft_probs, target_probs, lenience)
    first = np.where(np.asarray(num_accepted) == 1, draft_tokens[:, 0], next_token)
    with jax.enable_x64(True):
      expected = np.asarray(first_token_distribution(jnp.asarray(p), jnp.asarray(q), lenience))
    counts = np.bincount(first, minlength=v)
    assert stats.chisquare(counts, rows * expected).pvalue > 1e-3


@jax.jit
def _standardize_and_draft(key, draft_logits, target_logits):
  draft_probs = sampling.standardize(draft_logits)
  return (sampling.sample(key, draft_probs), draft_probs, sampling.standardize(target_logits))


def _random_case(seed, batch, gamma, vocab):
  """Logits with -inf masks (and an occasional +inf), drafts sampled from q.

  Returns draft_tokens int32 [B, γ], draft_probs and target_probs float32.
  """
  rng = np.random.default_rng(seed)

  def logits(shape):
    values = 3 * rng.standard_normal(shape)
    values[rng.random(shape) < 0.3] = -np.inf
    values[rng.random(shape) < 0.02] = np.inf
    return values.astype(np.float32)

  return _standardize_and_draft(
    jax.random.key(seed), logits((batch, gamma, vocab)), logits((batch, gamma + 1, vocab))
  )


@settings(max_examples=40, deadline=None)
@given(
  seed=st.integers(0, 2**31 - 1),
  shape=st.sampled_from([(3, 4, 7), (2, 1, 2), (1, 6, 1)]),
  deterministic=st.booleans(),
  lenience=st.sampled_from([1.0, 0.5, 0.05]),
)
def test_verify_properties(seed, shape, deterministic, lenience):
  batch, gamma, vocab = shape
  draft_tokens, draft_probs, target_probs = _random_case(seed, *shape)
  num_accepted, next_token, beta = verify(
    jax.random.key(seed),
    draft_tokens,
    None if deterministic else draft_probs,
    target_probs,
    lenience,
    return_beta=True,
  )
  num_accepted, next_token = np.asarray(num_accepted), np.asarray(next_token)
  assert num_accepted.shape == next_token.shape == (batch,)
  assert np.all((num_accepted >= 0) & (num_accepted <= gamma))
  assert np.all((next_token >= 0) & (next_token < vocab))
  beta = np.asarray(beta)
  assert beta.shape == (batch, gamma) and beta.dtype == np.float32
  assert np.all(np.isfinite(beta) & (beta >= 0) & (beta <= 1 + 1e-6))
  # Every emitted token has positive target probability at its position.
  target = np.asarray(target_probs)
  for b in range(batch):
    n = num_accepted[b]
    assert np.all(target[b, np.arange(n), draft_tokens[b, :n]] > 0)
    assert target[b, n, next_token[b]] > 0


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), deterministic=st.booleans())
def test_batched_rows_equal_single_rows(seed, deterministic):
  batch = 5
  draft_tokens, draft_probs, target_probs = _random_case(seed, batch, 3, 7)
  if deterministic:
    draft_probs = None
  keys = jax.random.split(jax.random.key(seed), batch)
  batched = verify(keys, draft_tokens, draft_probs, target_probs, return_beta=True)
  for b in range(batch):
    single = verify(
      keys[b : b + 1],
      draft_tokens[b : b + 1],
      None if draft_probs is None else draft_probs[b : b + 1],
      target_probs[b : b + 1],
      return_beta=True,
    )
    for batched_out, single_out in zip(batched, single):
      np.testing.assert_array_equal(batched_out[b], single_out[0])


def test_beta_is_the_overlap_at_lenience_one():
  draft_tokens, draft_probs, target_probs = _random_case(0, 3, 4, 7)
  _, _, beta = verify(jax.random.key(0), draft_tokens, draft_probs, target_probs, return_beta=True)
  np.testing.assert_allclose(
    beta, np.sum(np.minimum(target_probs[:, :4], draft_probs), axis=-1), rtol=1e-6
  )
  _, _, beta = verify(jax.random.key(0), draft_tokens, None, target_probs, return_beta=True)
  np.testing.assert_allclose(
    beta,
    np.take_along_axis(np.asarray(target_probs[:, :4]), np.asarray(draft_tokens)[..., None], -1)[
      ..., 0
    ],
  )


def test_bfloat16_inputs_give_float32_results():
  draft_tokens, draft_probs, target_probs = _random_case(1, 3, 4, 7)
  _, next_token, beta = verify(
    jax.random.key(1),
    draft_tokens,
    draft_probs.astype(jnp.bfloat16),
    target_probs.astype(jnp.bfloat16),
    return_beta=True,
  )
  assert beta.dtype == jnp.float32 and np.all(np.isfinite(beta))
  assert np.all((np.asarray(next_token) >= 0) & (np.asarray(next_token) < 7))


def test_verify_does_no_sort():
  draft_tokens, draft_probs, target_probs = _random_case(2, 3, 4, 7)
  for q in (draft_probs, None):
    jaxpr = jax.make_jaxpr(lambda k, x, q, p: spec.verify(k, x, q, p, return_beta=True))(
      jax.random.key(0), draft_tokens, q, target_probs
    )
    assert not re.search(r'\b(sort|top_k)\[', str(jaxpr))


@pytest.mark.parametrize('lenience', [0.0, -0.5, 1.5, float('nan')])
def test_invalid_lenience(lenience):
  draft_tokens, draft_probs, target_probs = _random_case(0, 1, 2, 3)
  with pytest.raises(ValueError, match='lenience'):
    spec.verify(jax.random.key(0), draft_tokens, draft_probs, target_probs, lenience)


def test_invalid_shapes_and_keys():
  draft_tokens, draft_probs, target_probs = _random_case(0, 2, 3, 5)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='target_probs'):
    spec.verify(key, draft_tokens, draft_probs, target_probs[:, :3])
  with pytest.raises(ValueError, match='draft_probs'):
    spec.verify(key, draft_tokens, draft_probs[..., :4], target_probs)
  with pytest.raises(ValueError, match='draft_tokens'):
    spec.verify(key, draft_tokens[:, :0], None, target_probs[:, :1])
  with pytest.raises(ValueError, match='rng'):
    spec.verify(jax.random.split(key, 3), draft_tokens, draft_probs, target_probs)


@pytest.mark.parametrize('with_draft_probs', [True, False])
def test_one_hot_target_draws_what_sampling_draws(with_draft_probs):
  """Greedy targets: argmax instead of Gumbel noise gives the same tokens."""
  rng = np.random.default_rng(0)
  batch, gamma, vocab = 64, 3, 11
  target_ids = rng.integers(0, vocab, (batch, gamma + 1))
  target_probs = jax.nn.one_hot(target_ids, vocab, dtype=jnp.float32)
  draft_tokens = jnp.asarray(
    np.where(
      rng.random((batch, gamma)) < 0.6,
      target_ids[:, :gamma],
      rng.integers(0, vocab, (batch, gamma)),
    ),
    jnp.int32,
  )
  draft_probs = (
    jax.nn.softmax(jnp.asarray(rng.standard_normal((batch, gamma, vocab)), jnp.float32))
    if with_draft_probs
    else None
  )
  for seed in range(5):
    key = jax.random.PRNGKey(seed)
    sampled = spec.verify(key, draft_tokens, draft_probs, target_probs)
    by_argmax = spec.verify(key, draft_tokens, draft_probs, target_probs, one_hot_target=True)
    np.testing.assert_array_equal(sampled[0], by_argmax[0])
    np.testing.assert_array_equal(sampled[1], by_argmax[1])
