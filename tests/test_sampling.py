"""Tests for speculative_t5x.sampling (standardize and sample)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from speculative_t5x import sampling

NEG_INF = -np.inf


def _log(probs):
  with np.errstate(divide='ignore'):
    return np.log(np.asarray(probs, np.float32))


def test_temperature_one_is_softmax():
  logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, NEG_INF]], np.float32)
  np.testing.assert_allclose(
    sampling.standardize(logits),
    [np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), [0.5, 0.5, 0]],
    rtol=1e-6,
  )


def test_temperature_scales_logits():
  logits = np.array([0.0, np.log(2.0), NEG_INF], np.float32)
  # Temperature 0.5 squares the odds: 1 : 4.
  np.testing.assert_allclose(sampling.standardize(logits, 0.5), [0.2, 0.8, 0], rtol=1e-6)


def test_temperature_zero_is_argmax_with_lowest_id_on_ties():
  logits = np.array([[0.0, 3.0, 3.0, 1.0], [NEG_INF, NEG_INF, 2.0, 2.0]], np.float32)
  np.testing.assert_array_equal(sampling.standardize(logits, 0.0), [[0, 1, 0, 0], [0, 0, 1, 0]])
  # top-k and top-p never change argmax.
  np.testing.assert_array_equal(
    sampling.standardize(logits, 0.0, topk=3), [[0, 1, 0, 0], [0, 0, 1, 0]]
  )
  np.testing.assert_array_equal(
    sampling.standardize(logits, 0.0, topp=0.9), [[0, 1, 0, 0], [0, 0, 1, 0]]
  )


def test_top_k_keeps_the_k_largest_with_lowest_ids_on_ties():
  probs = np.array([0.1, 0.3, 0.2, 0.3, 0.1], np.float32)
  np.testing.assert_allclose(
    sampling.standardize(_log(probs), topk=2), [0, 0.5, 0, 0.5, 0], rtol=1e-6
  )
  np.testing.assert_allclose(
    sampling.standardize(_log(probs), topk=3), [0, 0.375, 0.25, 0.375, 0], rtol=1e-6
  )
  # Tie at the k-th place: the lower id wins.
  np.testing.assert_allclose(
    sampling.standardize(_log(probs), topk=4), [1 / 9, 1 / 3, 2 / 9, 1 / 3, 0], rtol=1e-6
  )
  # k >= V keeps everything.
  np.testing.assert_allclose(sampling.standardize(_log(probs), topk=9), probs, rtol=1e-6)


@pytest.mark.parametrize(
  'topp, kept',
  [
    (0.05, [3]),  # The most likely token alone reaches it.
    (0.39, [3]),
    (0.41, [3, 1]),
    (0.69, [3, 1]),
    (0.71, [3, 1, 0]),  # 0.4 + 0.3 < 0.71: needs the tie at 0.1 (lowest id).
    (0.81, [3, 1, 0, 2]),
    (0.95, [3, 1, 0, 2, 4]),
    (1.0, [0, 1, 2, 3, 4]),
  ],
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(topp, kept):
  probs = np.array([0.1, 0.3, 0.1, 0.4, 0.1], np.float32)
  expected = np.zeros(5)
  expected[kept] = probs[kept] / probs[kept].sum()
  np.testing.assert_allclose(
    sampling.standardize(_log(probs), topp=topp), expected, rtol=1e-5, atol=1e-7
  )


def test_top_p_applies_to_the_tempered_distribution():
  logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
  # At temperature 1, topp=0.75 keeps two tokens; at 0.5 the odds are
  # 25:9:4, so the first token alone (25/38 = 0.66) does not reach 0.75 either,
  # but at 0.25 (625:81:16) it does.
  assert np.count_nonzero(sampling.standardize(logits, 1.0, topp=0.75)) == 2
  assert np.count_nonzero(sampling.standardize(logits, 0.5, topp=0.75)) == 2
  assert np.count_nonzero(sampling.standardize(logits, 0.25, topp=0.75)) == 1


def test_top_p_matches_a_sort_and_cumsum_reference_at_large_vocab():
  rng = np.random.default_rng(0)
  logits = np.round(3 * rng.standard_normal((6, 4000)), 1).astype(np.float32)
  for topp in (0.3, 0.9):
    probs = np.asarray(jax.nn.softmax(logits, -1), np.float64)
    kept = np.asarray(sampling.standardize(logits, topp=topp)) > 0
    for row, row_kept in zip(probs, kept):
      order = np.argsort(-row, kind='stable')
      mass_before = np.cumsum(row[order]) - row[order]
      expected = np.zeros_like(row_kept)
      expected[order[mass_before < topp]] = True
      np.testing.assert_array_equal(row_kept, expected)


def test_per_row_temperature_applies_along_the_first_axis():
  rng = np.random.default_rng(1)
  logits = rng.standard_normal((3, 2, 5)).astype(np.float32)
  temperature = np.array([0.0, 0.7, 1.3], np.float32)
  for kwargs in (dict(), dict(topk=2), dict(topp=0.6)):
    batched = sampling.standardize(logits, temperature, **kwargs)
    for b in range(3):
      np.testing.assert_allclose(
        batched[b],
        sampling.standardize(logits[b], float(temperature[b]), **kwargs),
        rtol=1e-6,
        atol=1e-7,
      )


def test_traced_arguments_match_concrete_ones():
  rng = np.random.default_rng(2)
  logits = rng.standard_normal((3, 5)).astype(np.float32)
  temperature = np.array([0.0, 0.5, 2.0], np.float32)
  jitted = jax.jit(lambda x, t, p: sampling.standardize(x, t, topp=p))
  for topp in (0.0, 0.5, 1.0):
    np.testing.assert_allclose(
      jitted(logits, temperature, topp),
      sampling.standardize(logits, temperature, topp=topp),
      rtol=1e-6,
      atol=1e-7,
    )


def test_bfloat16_with_masks_gives_float32_without_nan():
  logits = jnp.array(
    [[1.0, NEG_INF, 2.0, NEG_INF], [NEG_INF] * 4, [np.inf, 0.0, np.inf, NEG_INF]], jnp.bfloat16
  )
  for kwargs in (
    dict(),
    dict(temperature=0.0),
    dict(topk=1),
    dict(topp=0.5),
    dict(temperature=np.array([0.0, 1.0, 0.3])),
  ):
    probs = sampling.standardize(logits, **kwargs)
    assert probs.dtype == jnp.float32
    assert not np.any(np.isnan(probs))
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    assert probs[0, 1] == 0 and probs[0, 3] == 0


def test_infinity_rules():
  # +inf: uniform over the +inf entries. All -inf: as if all logits were equal.
  logits = np.array([[np.inf, 5.0, np.inf, NEG_INF], [NEG_INF] * 4], np.float32)
  np.testing.assert_array_equal(sampling.standardize(logits), [[0.5, 0, 0.5, 0], [0.25] * 4])
  np.testing.assert_array_equal(sampling.standardize(logits, 0.0), [[1, 0, 0, 0], [1, 0, 0, 0]])


def test_huge_logits_with_small_temperature_do_not_overflow():
  logits = np.array([3e38, 2.9e38, -3e38], np.float32)
  probs = sampling.standardize(logits, 1e-3)
  assert not np.any(np.isnan(probs))
  np.testing.assert_array_equal(probs, [1, 0, 0])


def test_argmax_and_temperature_paths_do_not_sort():
  logits = jnp.zeros((2, 3, 50))

  def primitives(**kwargs):
    return str(jax.make_jaxpr(lambda x: sampling.standardize(x, **kwargs))(logits))

  sort_or_top_k = re.compile(r'\b(sort|top_k)\[')
  assert not sort_or_top_k.search(primitives(temperature=0.0))
  assert not sort_or_top_k.search(primitives(temperature=0.7))
  assert not sort_or_top_k.search(primitives(temperature=0.0, topp=0.9))
  # top-p bisects instead of sorting; top-k is a partial selection.
  assert not sort_or_top_k.search(primitives(topp=0.9))
  assert re.search(r'\btop_k\[', primitives(topk=5))
  assert 'sort[' in str(jax.make_jaxpr(jnp.sort)(logits))  # The check works.


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(topk=2, topp=0.5), 'topk=2 and topp=0.5'),
    (dict(temperature=-0.1), 'temperature'),
    (dict(temperature=np.array([1.0, -1.0])), 'temperature'),
    (dict(temperature=float('nan')), 'temperature'),
    (dict(topk=-1), 'topk'),
    (dict(topk=1.5), 'topk'),
    (dict(topp=-0.1), 'topp'),
    (dict(topp=1.1), 'topp'),
    (dict(temperature=np.ones(3)), 'temperature must be a scalar or have shape'),
  ],
)
def test_invalid_arguments(kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    sampling.standardize(np.zeros((2, 4), np.float32), **kwargs)


def test_sample_follows_probs_and_never_draws_zero_probability_ids():
  probs = np.array([0.0, 0.5, 1e-30, 0.0, 0.25, 1e-7, 0.25 - 1e-7, 0.0], np.float32)
  draws = np.asarray(sampling.sample(jax.random.key(0), np.broadcast_to(probs, (200_000, 8))))
  assert draws.dtype == np.int32
  assert np.all((draws >= 0) & (draws < 8))
  counts = np.bincount(draws, minlength=8)
  assert counts[probs == 0].sum() == 0
  support = [1, 4, 6]
  observed = counts[support]
  weights = probs[support].astype(np.float64)
  expected = observed.sum() * weights / weights.sum()
  assert stats.chisquare(observed, expected).pvalue > 1e-3


@jax.jit
def _standardize_and_sample(key, logits, temperature):
  probs = sampling.standardize(logits, temperature)
  return probs, sampling.sample(key, probs)


@settings(max_examples=40, deadline=None)
@given(
  seed=st.integers(0, 2**31 - 1),
  mask_rate=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
  pos_inf_rate=st.sampled_from([0.0, 0.05]),
  temperature=st.sampled_from([0.0, 1e-6, 0.6, 1.0, 50.0]),
)
def test_standardize_and_sample_properties(seed, mask_rate, pos_inf_rate, temperature):
  rng = np.random.default_rng(seed)
  logits = 20 * rng.standard_normal((4, 3, 9))
  logits[rng.random(logits.shape) < mask_rate] = NEG_INF
  logits[rng.random(logits.shape) < pos_inf_rate] = np.inf
  probs, ids = _standardize_and_sample(
    jax.random.key(seed), logits.astype(np.float32), np.float32(temperature)
  )
  probs, ids = np.asarray(probs), np.asarray(ids)
  assert not np.any(np.isnan(probs)) and np.all(probs >= 0)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  assert np.all((ids >= 0) & (ids < 9))
  assert np.all(np.take_along_axis(probs, ids[..., None], -1) > 0)
  # Masked tokens get nothing, unless every token is masked.
  fully_masked = np.all(logits == NEG_INF, axis=-1, keepdims=True)
  assert np.all(probs[(logits == NEG_INF) & ~fully_masked] == 0)


def test_sample_logits_is_standardize_then_sample():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(64, 17)), jnp.float32)
  rng = jax.random.PRNGKey(3)
  for kwargs in (
    dict(temperature=0.7),
    dict(temperature=1.0, topk=3),
    dict(temperature=1.0, topp=0.8),
  ):
    ids, probs = sampling.sample_logits(rng, logits, **kwargs)
    expected_probs = sampling.standardize(logits, **kwargs)
    np.testing.assert_array_equal(probs, expected_probs)
    np.testing.assert_array_equal(ids, sampling.sample(rng, expected_probs))
  # Greedy: the argmax, without drawing (any key gives the same ids), ties to the lowest id.
  tied = logits.at[:, 5].set(9.0).at[:, 11].set(9.0)
  for key in (rng, jax.random.PRNGKey(4)):
    ids, probs = sampling.sample_logits(key, tied, temperature=0.0)
    np.testing.assert_array_equal(ids, np.full(64, 5))
    np.testing.assert_array_equal(probs, sampling.standardize(tied, temperature=0.0))
  # A traced temperature of 0 still samples the one-hot distribution: the argmax.
  ids, _ = jax.jit(sampling.sample_logits)(rng, tied, jnp.float32(0.0))
  np.testing.assert_array_equal(ids, np.full(64, 5))


@pytest.mark.parametrize('shape', [(7,), (3, 5), (2, 4, 33)])
def test_argmax_equals_jnp_argmax_with_ties_infinities_and_nan(shape):
  rng = np.random.default_rng(sum(shape))
  x = rng.integers(-2, 3, size=shape).astype(np.float32)  # Many ties.
  x.flat[::5] = -np.inf
  x.flat[1::7] = np.inf
  np.testing.assert_array_equal(sampling.argmax(jnp.asarray(x)), jnp.argmax(x, axis=-1))
  x.flat[2::3] = np.nan
  np.testing.assert_array_equal(sampling.argmax(jnp.asarray(x)), jnp.argmax(x, axis=-1))


def test_sample_draws_the_ids_of_jax_categorical():
  probs = jax.nn.softmax(
    jnp.asarray(np.random.default_rng(0).standard_normal((4, 50)), jnp.float32)
  )
  probs = probs.at[:, ::3].set(0.0)
  for i in range(20):
    key = jax.random.PRNGKey(i)
    expected = jax.random.categorical(key, jnp.where(probs > 0, jnp.log(probs), -jnp.inf))
    np.testing.assert_array_equal(sampling.sample(key, probs), expected)


def test_topk_1_is_argmax_at_any_temperature_ties_to_the_lowest_id():
  """T5X's default greedy (topk=1) is the one-hot of the argmax, and counts as greedy."""
  logits = jnp.array([[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 3.0, 3.0], [-jnp.inf, 1.0, 0.0, 1.0]])
  argmax_probs = sampling.standardize(logits, temperature=0.0)
  for temperature in (0.0, 0.7, 1.0, 5.0):
    np.testing.assert_array_equal(
      sampling.standardize(logits, temperature=temperature, topk=1), argmax_probs
    )
  np.testing.assert_array_equal(np.argmax(argmax_probs, axis=-1), [1, 0, 1])
  assert sampling.is_greedy(1.0, topk=1) and not sampling.is_greedy(1.0, topk=2)
  ids, _ = sampling.sample_logits(jax.random.PRNGKey(0), logits, temperature=1.0, topk=1)
  np.testing.assert_array_equal(ids, [1, 0, 1])
