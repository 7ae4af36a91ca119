"""The Hugging Face peer comparison on tiny random pairs: it runs, and it is exact."""

import functools
import sys

import jax
import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x_lab import peers

torch = pytest.importorskip('torch', reason='the Hugging Face comparison needs PyTorch')
transformers = pytest.importorskip(
  'transformers', reason='the Hugging Face comparison needs transformers'
)

VOCAB = 64
EOS = models.EOS_ID


def tiny_target():
  """An untied T5 1.1 (separate logits_dense), float32.

  Deeper decoder than encoder, as the demo's target (transformers' cache needs
  a workaround there, see peers).
  """
  config = network.t5_1_1_config(
    'tiny',
    vocab_size=VOCAB,
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=3,
    dtype='float32',
  )
  params, _ = network.random_params(config, seed=0)
  # Sharper logits than the unit-scale default (fewer near-ties), and EOS
  # likelier, so that some outputs end before the length limit.
  params['decoder']['logits_dense']['kernel'] *= 3.0
  params['decoder']['logits_dense']['kernel'][:, EOS] *= 1.5
  return models.Model(config, params)


def noisy_copy(model, noise, seed):
  """A draft that agrees with `model` often, not always."""
  rng = np.random.default_rng(seed)
  params = jax.tree.map(
    lambda x: x + noise * x.std() * rng.standard_normal(x.shape).astype(np.float32), model.params
  )
  return models.Model(model.config, params)


TARGET = tiny_target()
# The target's architecture, so that both tests share one compiled decode.
DRAFT = noisy_copy(TARGET, noise=0.1, seed=3)
GAMMA = 3
# Three examples, 0-padded to 8, EOS-terminated.
INPUTS = np.array(
  [[5, 17, 33, 9, EOS, 0, 0, 0], [40, 2, 61, 12, 7, 25, 3, EOS], [8, EOS, 0, 0, 0, 0, 0, 0]],
  np.int32,
)
# Long enough for several rounds after a fully accepted one (where
# transformers' assistant cache needs the decoder_attention_mask workaround).
MAX_DECODE_LEN = 16


def test_emitted_tokens_count_up_to_and_including_eos():
  np.testing.assert_array_equal(peers.emitted_tokens(np.array([5, 0, 1, 0, 0])), [5, 0, 1])
  np.testing.assert_array_equal(peers.emitted_tokens(np.array([1, 0, 0])), [1])
  np.testing.assert_array_equal(peers.emitted_tokens(np.array([4, 4, 0])), [4, 4, 0])


@pytest.mark.slow
def test_comparison_runs_end_to_end_and_outputs_agree(tmp_path):
  threads_before = torch.get_num_threads()
  result = peers.compare_with_huggingface(
    TARGET,
    DRAFT,
    INPUTS,
    max_decode_len=MAX_DECODE_LEN,
    gamma=GAMMA,
    workdir=str(tmp_path),
    repetitions=2,
    num_threads=1,
  )
  assert torch.get_num_threads() == threads_before

  # The untied export reproduces our logits under transformers 5.
  assert not TARGET.config.logits_via_embedding
  assert result.target_logits_error <= 1e-4 and result.draft_logits_error <= 1e-4

  # Every system emits our greedy output token for token.
  greedy = np.asarray(models.generate(TARGET, None, INPUTS, max_decode_len=MAX_DECODE_LEN).tokens)
  lengths = [len(peers.emitted_tokens(row)) for row in greedy]
  assert min(lengths) < MAX_DECODE_LEN  # Some example ends with EOS.
  assert [r.system for r in result.systems] == list(peers.SYSTEMS)
  assert result.divergences == ()
  for r in result.systems:
    assert r.identical_fraction == 1.0
    assert r.tokens_per_example == tuple(lengths)
    assert 0 < r.seconds_min <= r.seconds_median <= r.seconds_max
    assert r.tokens_per_second == pytest.approx(r.tokens / r.seconds_median)
    assert r.ms_per_token == pytest.approx(1e3 / r.tokens_per_second)

  # Greedy decoding calls the target once per token. With the same draft and a
  # fixed gamma, HF's assisted loop and ours accept the same tokens, so call
  # the target equally often.
  for system in (peers.OURS_BASELINE, peers.HF_GREEDY):
    assert result[system].target_calls_per_example == tuple(lengths)
  calls = result[peers.HF_ASSISTED].target_calls_per_example
  assert calls == result[peers.OURS_SPECULATIVE].target_calls_per_example
  assert sum(lengths) / (GAMMA + 1) < sum(calls) < sum(lengths)  # Some drafts rejected.

  assert result.speedup(peers.OURS_BASELINE) == result.speedup(peers.HF_GREEDY) == 1.0
  assert result.speedup(peers.HF_ASSISTED) == pytest.approx(
    result[peers.HF_ASSISTED].tokens_per_second / result[peers.HF_GREEDY].tokens_per_second
  )
  assert (
    result.num_examples,
    result.input_length,
    result.gamma,
    result.repetitions,
    result.torch_threads,
  ) == (3, 8, GAMMA, 2, 1)
  assert set(result.versions) == {'jax', 'torch', 'transformers'}
  table = peers.format_markdown(result)
  for system in peers.SYSTEMS:
    assert f'| {system} |' in table
    per_example = result.speedups_per_example(system)
    assert per_example.shape == (3,) and np.all(per_example > 0)
  assert '1 intra-op thread(s)' in table


def _system(system, tokens, seconds):
  """A `SystemResult` of examples with these tokens and median seconds."""
  passes = sum(seconds)
  return peers.SystemResult(
    system=system,
    tokens_per_example=tuple(tokens),
    target_calls_per_example=tuple(tokens),
    seconds_median=passes,
    seconds_min=passes,
    seconds_max=passes,
    identical_fraction=1.0,
    seconds_per_example=tuple(seconds),
  )


def test_the_spread_is_of_each_examples_own_speedup():
  """An easy example (3x) and a hard one (1x): the aggregate hides what the spread shows."""
  result = peers.Comparison(
    systems=(
      _system(peers.OURS_BASELINE, [10, 10], [1.0, 1.0]),
      _system(peers.OURS_SPECULATIVE, [10, 10], [1 / 3, 1.0]),
      # HF's speculative output is one token longer on the second example: per token.
      _system(peers.HF_GREEDY, [10, 10], [2.0, 2.0]),
      _system(peers.HF_ASSISTED, [10, 11], [1.0, 2.2]),
    ),
    divergences=(),
    num_examples=2,
    input_length=8,
    max_decode_len=16,
    gamma=3,
    repetitions=1,
    torch_threads=1,
    cpu_cores=1,
    xla_flags='',
    target_logits_error=0.0,
    draft_logits_error=0.0,
    versions=dict(jax='', torch='', transformers=''),
  )
  np.testing.assert_allclose(result.speedups_per_example(peers.OURS_SPECULATIVE), [3.0, 1.0])
  np.testing.assert_allclose(result.speedups_per_example(peers.HF_ASSISTED), [2.0, 1.0])
  assert result.speedup(peers.OURS_SPECULATIVE) == pytest.approx(2 / (4 / 3))
  spread = result.speedup_spread(peers.OURS_SPECULATIVE)
  assert spread == pytest.approx(dict(mean=2.0, stderr=1.0, min=1.0, max=3.0))
  assert result.speedup_spread(peers.OURS_BASELINE) == dict(mean=1.0, stderr=0.0, min=1.0, max=1.0)
  assert '| 2.00 +- 1.00 (1.00-3.00) |' in peers.format_markdown(result)


@pytest.mark.slow  # Both loops on real networks; the divergence and argument tests below are fast.
def test_draft_equal_to_target_accepts_gamma_per_round_in_both(tmp_path):
  """Acceptance 1: every round emits gamma + 1 tokens, length limit aside.

  Fails if transformers drafted a dynamic number of tokens (its default
  confidence threshold and schedule) or drafted from a garbled cache.
  """
  result = peers.compare_with_huggingface(
    TARGET,
    TARGET,
    INPUTS,
    max_decode_len=MAX_DECODE_LEN,
    gamma=GAMMA,
    workdir=str(tmp_path),
    repetitions=1,
    num_threads=1,
  )
  greedy = np.asarray(models.generate(TARGET, None, INPUTS, max_decode_len=MAX_DECODE_LEN).tokens)
  rounds = tuple(-(-len(peers.emitted_tokens(row)) // (GAMMA + 1)) for row in greedy)
  assert result[peers.OURS_SPECULATIVE].target_calls_per_example == rounds
  assert result[peers.HF_ASSISTED].target_calls_per_example == rounds
  assert all(r.identical_fraction == 1.0 for r in result.systems)


def test_divergence_is_located_and_near_ties_recognized(tmp_path):
  """Token b's output column copies token a's: a and b tie exactly."""
  greedy = peers.emitted_tokens(
    np.asarray(models.generate(TARGET, None, INPUTS[:1], max_decode_len=MAX_DECODE_LEN).tokens)[0]
  )
  position = 1
  a = int(greedy[position])
  b = next(t for t in range(2, VOCAB) if t != a)
  params = jax.tree.map(np.array, TARGET.params)  # Host copies: device arrays are immutable.
  kernel = params['decoder']['logits_dense']['kernel']
  kernel[:, b] = kernel[:, a]
  tied = models.Model(TARGET.config, params)
  hf_tied = peers._export(tied, str(tmp_path / 'hf'), transformers)
  row = INPUTS[:1]
  analyze = functools.partial(
    peers._divergence,
    peers.HF_ASSISTED,
    0,
    greedy,
    our_logits=functools.partial(acceptance.teacher_forced_logits, tied.config, tied.params, row),
    hf_logits=functools.partial(peers._hf_logits, torch, hf_tied, row),
    max_decode_len=MAX_DECODE_LEN,
  )

  theirs = greedy.copy()
  theirs[position] = b
  tie = analyze(theirs)
  assert (tie.position, tie.our_token, tie.their_token) == (position, a, b)
  assert abs(tie.our_gap) <= 1e-6 and abs(tie.their_gap) <= 1e-6
  assert tie.implementation_difference <= 1e-4
  assert tie.near_tie

  decoder_inputs = peers._shift_right(greedy[:position], MAX_DECODE_LEN)
  worst = int(
    np.argmin(
      np.asarray(acceptance.teacher_forced_logits(tied.config, tied.params, row, decoder_inputs))[
        0, position
      ]
    )
  )
  theirs[position] = worst
  clear = analyze(theirs)
  assert clear.their_token == worst and clear.our_gap > 1.0 and not clear.near_tie
  assert clear.their_gap == pytest.approx(-clear.our_gap, abs=1e-4)


@pytest.mark.parametrize(
  'change, message',
  [
    (
      dict(target=models.Model(network.t5_1_1_config('tiny', vocab_size=VOCAB), TARGET.params)),
      'float32',
    ),
    (
      dict(
        draft=models.Model(
          network.t5_1_1_config('tiny', vocab_size=VOCAB + 1, dtype='float32'), DRAFT.params
        )
      ),
      'vocabulary',
    ),
    (dict(input_tokens=INPUTS[0]), r'\[examples, length\]'),
    (dict(input_tokens=np.zeros((2, 4), np.int32)), 'non-padding'),
    (dict(input_tokens=INPUTS + VOCAB), 'vocabulary'),
    (dict(gamma=0), 'gamma'),
    (dict(repetitions=0), 'repetitions'),
    (dict(num_threads=0), 'num_threads'),
  ],
)
def test_bad_arguments_are_named(tmp_path, change, message):
  kwargs = dict(
    target=TARGET,
    draft=DRAFT,
    input_tokens=INPUTS,
    max_decode_len=4,
    gamma=GAMMA,
    workdir=str(tmp_path),
  )
  kwargs.update(change)
  with pytest.raises(ValueError, match=message):
    peers.compare_with_huggingface(**kwargs)
  assert not list(tmp_path.iterdir())  # Rejected before exporting anything.


def test_missing_transformers_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, 'transformers', None)
  with pytest.raises(ImportError, match=r'speculative_t5x\[hf\]'):
    peers.compare_with_huggingface(
      TARGET, DRAFT, INPUTS, max_decode_len=4, gamma=2, workdir='/nonexistent'
    )
