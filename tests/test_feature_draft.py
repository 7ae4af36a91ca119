"""The feature-level draft head (`drafts.FeatureDraft`, `feature_head`): features, exactness, cache.

Random tiny networks. A random head drafts almost nothing the target accepts, so
most tests use a target made nearly Markov (its decoder layers' residual
branches scaled down: the last layer's output is close to the embedding of the
token fed) and a head aligned to it (the embedding passed through, the features
mixed in at a smaller scale): it is accepted often but not always, so rows
accept ragged counts and both the accept and the reject paths run.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import judging
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x.training import train_feature_head
from speculative_t5x_lab import acceptance_counts
from testing_utils import (
  EOS,
  decoded_lengths,
  padded_inputs,
  tiny_decoder_only_model,
  tiny_model,
)


def scale_residual_branches(params, scale):
  """A copy of a decoder's (or head's) params with every layer's output kernels times `scale`."""
  params = jax.tree.map(np.array, params)
  layers = params['decoder'] if 'decoder' in params else params
  for name, layer in layers.items():
    if name.startswith('layers_'):
      for branch in ('self_attention', 'encoder_decoder_attention'):
        if branch in layer:
          layer[branch]['out']['kernel'] *= scale
      layer['mlp']['wo']['kernel'] *= scale
  return params


def near_markov(model, scale=0.3):
  """The model with its decoder layers' residual branches scaled down (see the module docstring)."""
  params = scale_residual_branches(model.params, scale)
  return models.Model(model.config, params, model.inputs_bidirectional_attention)


def head_config(target, **fields):
  fields = dict(dict(emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32), **fields)
  return feature_head.config_for(target.config, **fields)


def random_head(target, seed=0, **fields):
  config = head_config(target, **fields)
  return drafts.FeatureDraft.for_target(target, feature_head.init_params(config, seed), config)


def aligned_head(target, mix=0.3, seed=0):
  """A head of the target's width whose prediction is mostly the next token's embedding.

  pre_projection passes the embedding through and mixes the features in at
  `mix`; post_projection is the identity; the head layer's branches are
  scaled by `mix`, so its keys/values still depend on the features.
  """
  width = target.config.emb_dim
  config = head_config(target, emb_dim=width, mlp_dim=2 * width)
  params = scale_residual_branches(feature_head.init_params(config, seed), mix)
  kernel = params['pre_projection']['kernel']
  kernel[: config.feature_width] *= mix
  kernel[config.feature_width :] = np.eye(width)
  params['post_projection']['kernel'] = np.eye(width, dtype=np.float32)
  return drafts.FeatureDraft.for_target(target, params, config)


ENCODER_DECODER = near_markov(tiny_model(seed=0, layers=2, scale=3.0))
DECODER_ONLY = near_markov(tiny_decoder_only_model(seed=0, layers=2, scale=3.0))
TARGETS = {'encoder_decoder': ENCODER_DECODER, 'decoder_only': DECODER_ONLY}


def batch_inputs(architecture, seed, batch):
  """(input_tokens, decoder_prompts) of a batch: encoder inputs, or decoder-only prompts."""
  target = TARGETS[architecture]
  if architecture == 'encoder_decoder':
    return padded_inputs(seed, batch, 9, target.vocab_size), None
  prompts = padded_inputs(seed, batch, 5, target.vocab_size)
  return np.where(prompts == EOS, 3, prompts), None  # Prompts continue rather than end.


def head_init_cache(draft, input_tokens, cache_length):
  """`draft.init_cache`, given the target's encoder output for an encoder-decoder target."""
  target_config = draft.target_config
  if network.is_decoder_only(target_config):
    return draft.init_cache(input_tokens, cache_length)
  encoded = network.encode(target_config, draft.target_params, input_tokens)
  return draft.init_cache(input_tokens, cache_length, encoded=encoded)


def fresh_features(target, input_tokens, decoder_inputs, feature_layers, prompt_lengths=None):
  """The target's features [B, L, Df] at every decoder input, by one teacher-forced pass."""
  batch = dict(
    decoder_input_tokens=decoder_inputs, decoder_target_tokens=np.ones_like(decoder_inputs)
  )
  if not network.is_decoder_only(target.config):
    batch['encoder_input_tokens'] = input_tokens
  elif target.inputs_bidirectional_attention:
    positions = np.arange(decoder_inputs.shape[1])[None]
    batch['decoder_causal_attention'] = positions <= np.asarray(prompt_lengths)[:, None]
  return np.asarray(
    network.compute_logits(target.config, target.params, batch, feature_layers=feature_layers)[1]
  )


# ------------------------------------------------------------------------------
# Features from the target's own calls.
# ------------------------------------------------------------------------------
# `slow`: the top layer alone; (0, 1) checks it too, beside a lower layer, and the logits from it.
@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
@pytest.mark.parametrize('feature_layers', [pytest.param((1,), marks=pytest.mark.slow), (0, 1)])
def test_block_calls_return_the_features_of_a_fresh_forward_pass(architecture, feature_layers):
  """A prefill and two blocks at ragged positions vs teacher forcing; logits unchanged."""
  target = TARGETS[architecture]
  config, params = target.config, target.params
  input_tokens, _ = batch_inputs(architecture, 0, 3)
  rng = np.random.default_rng(0)
  sequence = rng.integers(2, target.vocab_size, (3, 10)).astype(np.int32)
  sequence[:, 0] = 0
  expected = fresh_features(target, input_tokens, sequence, feature_layers)
  cache = network.init_decoder_cache(config, params, jnp.asarray(input_tokens), 16)
  cache, prefill_features = network.prefill_decoder_cache(
    config, params, cache, sequence[:, :3], np.full(3, 3), feature_layers=feature_layers
  )
  np.testing.assert_allclose(prefill_features, expected[:, :3], atol=1e-5)
  # One block writes positions 3..5; the next starts at ragged positions 3, 4, 5.
  _, cache = network.apply_decode_block(config, params, cache, sequence[:, 3:6], np.full(3, 3))
  starts = np.array([3, 4, 5], np.int32)
  block = np.stack([sequence[b, s : s + 4] for b, s in enumerate(starts)])
  (logits, features), _ = network.apply_decode_block(
    config, params, cache, block, starts, feature_layers=feature_layers
  )
  plain_logits, _ = network.apply_decode_block(config, params, cache, block, starts)
  np.testing.assert_array_equal(logits, plain_logits)
  want = np.stack([expected[b, s : s + 4] for b, s in enumerate(starts)])
  assert features.shape == (3, 4, len(feature_layers) * config.emb_dim)
  np.testing.assert_allclose(features, want, atol=1e-5)
  # The last layer's feature is the output before the final norm: it gives the logits.
  top = np.asarray(features)[..., -config.emb_dim :]
  if feature_layers[-1] == 1:
    np.testing.assert_allclose(
      network.logits_from_features(config, params, top), logits, rtol=1e-5, atol=1e-5
    )


@flax.struct.dataclass
class RecordingFeatureDraft(drafts.FeatureDraft):
  """A FeatureDraft that sends what the loop hands it to the host (jax.debug.callback)."""

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    jax.debug.callback(
      lambda *args: RECORDED.append(('prefill',) + args), features, prompt_lengths, ordered=True
    )
    return super().prefill(cache, prompt_block, prompt_lengths, features)

  def after_verify(self, cache, features, emitted, positions, num_accepted, path=None):
    if path is not None:  # The features of the accepted path's nodes, in path order.
      features = jnp.take_along_axis(features, path[:, :, None], axis=1)
    jax.debug.callback(
      lambda *args: RECORDED.append(('observe',) + args),
      features,
      positions,
      num_accepted,
      ordered=True,
    )
    return super().after_verify(cache, features, emitted, positions, num_accepted)


RECORDED = []


# `slow`: the encoder-decoder's chain (its tree runs fast, and both decoder-only chains).
@pytest.mark.parametrize(
  'architecture, tree',
  [
    pytest.param('encoder_decoder', None, marks=pytest.mark.slow),
    ('decoder_only', None),
    ('prefix_lm', None),
    ('encoder_decoder', (2, 2)),
    pytest.param('decoder_only', (2, 1), marks=pytest.mark.slow),
    pytest.param('prefix_lm', (3, 1), marks=pytest.mark.slow),
  ],
)
def test_the_loop_hands_the_head_the_features_of_a_fresh_forward_pass(architecture, tree):
  """Every true position's feature the loop hands over == teacher forcing the final output.

  With a tree, the features `observe` gets are those of the accepted path's
  nodes (`after_verify` gathers them from the tree call in path order).
  """
  if architecture == 'encoder_decoder':
    target, prompts = ENCODER_DECODER, np.array([[5, 6, 0], [7, 0, 0], [0, 0, 0]], np.int32)
    input_tokens = padded_inputs(1, 3, 9, target.vocab_size)
  else:
    target = TARGETS['decoder_only']
    if architecture == 'prefix_lm':
      target = models.Model(target.config, target.params, inputs_bidirectional_attention=True)
    input_tokens, prompts = np.array([[5, 6, 9], [7, 0, 0], [4, 8, 0]], np.int32), None
  head = aligned_head(target)
  draft = RecordingFeatureDraft(head.params, head.target_params, head.config, head.target_config)
  RECORDED.clear()
  speculative = dict(gamma=3) if tree is None else dict(tree=tree)
  speculative['judge'] = acceptance_counts.AcceptanceCounts()  # The lab's counts by rank.
  out = models.generate(
    target, draft, input_tokens, decoder_prompts=prompts, max_decode_len=8, **speculative
  )
  jax.effects_barrier()
  prompt_rows = input_tokens if prompts is None else prompts
  prompt_lengths = np.sum(prompt_rows != 0, axis=1)
  tokens = np.asarray(out.tokens)
  decoder_inputs = np.zeros((3, 1 + prompt_rows.shape[1] + tokens.shape[1]), np.int32)
  for row, length in enumerate(prompt_lengths):
    decoder_inputs[row, 1 : 1 + length] = prompt_rows[row, :length]
    decoder_inputs[row, 1 + length : 1 + length + tokens.shape[1]] = tokens[row]
  expected = fresh_features(
    target, input_tokens, decoder_inputs, head.feature_layers, prompt_lengths
  )
  kinds = [record[0] for record in RECORDED]
  assert kinds[0] == 'prefill' and set(kinds[1:]) == {'observe'}
  _, features, lengths = RECORDED[0]
  np.testing.assert_array_equal(lengths, prompt_lengths)
  for row, length in enumerate(prompt_lengths):
    np.testing.assert_allclose(features[row, :length], expected[row, :length], atol=1e-5)
  # Inputs at positions < 1 + P + m are true (m tokens emitted, through EOS).
  ended = 1 + prompt_lengths + decoded_lengths(tokens)
  checked = 0
  for _, features, positions, num_accepted in RECORDED[1:]:
    for row in range(3):
      # Positions p..p+n are true; past a row's end nothing is compared.
      stop = min(positions[row] + num_accepted[row] + 1, ended[row])
      count = max(stop - positions[row], 0)
      np.testing.assert_allclose(
        features[row, :count], expected[row, positions[row] : stop], atol=1e-5
      )
      checked += count
  assert checked >= decoded_lengths(tokens).sum()
  assert np.asarray(out.stats.accepted).sum() > 0
  if tree is not None:  # Some path runs through a lower-ranked sibling (path order matters).
    assert np.asarray(out.stats.record.rank_accepted)[..., 1:].sum() > 0


# ------------------------------------------------------------------------------
# Exactness.
# ------------------------------------------------------------------------------
# `make test` keeps each architecture, verification rule and output kind once (ragged
# batches of the target-output head in both architectures, block on the encoder-decoder);
# the other combinations are `slow`.
@pytest.mark.parametrize(
  'architecture, batch, gamma, verification, output',
  [
    pytest.param('encoder_decoder', 1, 3, 'token', 'target', marks=pytest.mark.slow),
    ('encoder_decoder', 5, 4, 'block', 'target'),
    pytest.param('encoder_decoder', 8, 2, 'token', 'own', marks=pytest.mark.slow),
    pytest.param('decoder_only', 1, 4, 'block', 'target', marks=pytest.mark.slow),
    ('decoder_only', 6, 3, 'token', 'target'),
    ('decoder_only', 8, 5, 'token', 'own'),
    ('encoder_decoder', 4, 3, 'token', 'fused'),
  ],
)
def test_greedy_equals_the_baseline_token_for_token(
  architecture, batch, gamma, verification, output
):
  target = TARGETS[architecture]
  input_tokens, _ = batch_inputs(architecture, batch, batch)
  if output == 'target':
    head = aligned_head(target)
  elif output == 'own':
    head = random_head(target, output='own')
  else:  # EAGLE-3's fusion of a low and the top layer, and an output layer of its own.
    head = random_head(target, output='own', feature_layers=(0, 1))
  kwargs = dict(temperature=0.0, max_decode_len=12)
  baseline = models.generate(target, None, input_tokens, **kwargs)
  out = models.generate(
    target, head, input_tokens, gamma=gamma, verification=verification, **kwargs
  )
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  if output == 'target' and batch > 1:  # Ragged: rows accept different counts.
    accepted = np.asarray(out.stats.accepted) / np.asarray(out.stats.iterations)
    assert accepted.max() > 0 and len(set(np.round(accepted, 6))) > 1


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_greedy_with_prompts_and_an_adaptive_length_equals_the_baseline(architecture):
  target = TARGETS[architecture]
  input_tokens, _ = batch_inputs(architecture, 3, 6)
  prompts = None
  if architecture == 'encoder_decoder':
    prompts = np.array([[5, 6], [7, 0], [0, 0], [4, 4], [9, 0], [3, 8]], np.int32)
  kwargs = dict(temperature=0.0, max_decode_len=10, decoder_prompts=prompts)
  baseline = models.generate(target, None, input_tokens, **kwargs)
  out = models.generate(target, aligned_head(target), input_tokens, gamma=5, **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  adaptive = models.generate(
    target, aligned_head(target), input_tokens, gamma=5, draft_threshold=0.9, **kwargs
  )
  np.testing.assert_array_equal(adaptive.tokens, baseline.tokens)
  assert np.sum(adaptive.stats.drafted) < 5 * np.sum(adaptive.stats.iterations)


def test_q_is_the_distribution_the_head_sampled_from():
  """Each drafted token's probs are the standardized softmax of the logits that drew it."""
  target = TARGETS['decoder_only']
  head = aligned_head(target)
  sample_args = dict(temperature=0.7, topk=3, topp=0.0)
  prompts = jnp.asarray(batch_inputs('decoder_only', 0, 4)[0])
  cache = head.init_cache(prompts, 16)
  prompt_block = jnp.pad(prompts, ((0, 0), (1, 0)))
  lengths = decoding.prompt_lengths(prompt_block)
  target_cache = network.init_decoder_cache(target.config, target.params, prompts, 16)
  _, features = network.prefill_decoder_cache(
    target.config, target.params, target_cache, prompt_block, lengths, feature_layers=(1,)
  )
  cache = head.prefill(cache, prompt_block, lengths, features=features)
  sequences = jnp.pad(prompt_block, ((0, 0), (0, 8)))
  tokens, probs, _, _ = head.propose(
    cache, sequences, lengths, jax.random.PRNGKey(0), gamma=3, draft_threshold=0.0, **sample_args
  )
  # Step 1 from the state's logits, step 2 from the head fed its own prediction.
  np.testing.assert_allclose(probs[:, 0], sampling.standardize(cache['logits'], **sample_args))
  (predicted, hidden), _ = head._head_block(
    cache['head'], cache['feature'][:, None], tokens[:, :1], lengths
  )
  second = sampling.standardize(head._logits(predicted[:, 0], hidden[:, 0]), **sample_args)
  np.testing.assert_allclose(probs[:, 1], second, atol=1e-6)
  drawn = jnp.take_along_axis(probs, tokens[..., None], axis=-1)
  assert np.all(np.asarray(drawn) > 0)


# ------------------------------------------------------------------------------
# The head's cache after a rejection.
# ------------------------------------------------------------------------------
HEAD_CACHE_LENGTH = 16
PROMPT_BLOCK = np.array([[0, 5, 6, 0], [0, 7, 8, 9], [0, 4, 0, 0], [0, 3, 3, 0]], np.int32)


def cache_test_inputs(architecture):
  """The rows' input tokens: encoder inputs, or (decoder-only) the prompts."""
  if architecture == 'encoder_decoder':
    return jnp.asarray(padded_inputs(7, len(PROMPT_BLOCK), 9, ENCODER_DECODER.vocab_size))
  return jnp.asarray(PROMPT_BLOCK[:, 1:])


@jax.jit
def one_iteration(draft, input_tokens, num_accepted):
  """(next tokens [B, gamma + 1], head state) after prefill, a rollout and `observe`.

  The rows' prompts are `PROMPT_BLOCK`; a rollout of gamma = 3 drafts from the
  position after each prompt; the target scores the block; then each row
  accepts num_accepted [B] of the draft tokens (any count: the features of
  the accepted prefix are the target's either way) and gets token 2 next.
  """
  target_config, target_params = draft.target_config, draft.target_params
  prompt_block = jnp.asarray(PROMPT_BLOCK)
  starts = decoding.prompt_lengths(prompt_block)
  target_cache = network.init_decoder_cache(
    target_config, target_params, input_tokens, HEAD_CACHE_LENGTH
  )
  target_cache, features = network.prefill_decoder_cache(
    target_config, target_params, target_cache, prompt_block, starts, feature_layers=(1,)
  )
  cache = head_init_cache(draft, input_tokens, HEAD_CACHE_LENGTH)
  cache = draft.prefill(cache, prompt_block, starts, features)
  sequences = jnp.pad(prompt_block, ((0, 0), (0, HEAD_CACHE_LENGTH - prompt_block.shape[1])))
  draft_tokens, _, _, cache = draft.propose(
    cache,
    sequences,
    starts,
    jax.random.PRNGKey(1),
    gamma=3,
    temperature=1.0,
    topk=0,
    topp=0.0,
    draft_threshold=0.0,
  )
  last = jnp.take_along_axis(prompt_block, starts[:, None], axis=1)
  (_, features), _ = network.apply_decode_block(
    target_config,
    target_params,
    target_cache,
    jnp.concatenate([last, draft_tokens], 1),
    starts,
    feature_layers=(1,),
  )
  next_token = jnp.full(num_accepted.shape, 2, jnp.int32)
  judgement = judging.Judgement(num_accepted, num_accepted, next_token, None, None)
  next_tokens = decoding.emitted_block(draft_tokens, judgement)
  return next_tokens, draft.after_verify(cache, features, next_tokens, starts, num_accepted)


def fresh_head_pass(draft, architecture, prefixes, input_tokens):
  """(head cache, predicted [B, Df], hidden [B, H]) of one pass over each row's true prefix.

  Rows are padded to one width: the passes are causal, so a row's entries
  before its end do not see the padding; the outputs are each row's last.
  """
  target = TARGETS[architecture]
  width = max(len(prefix) for prefix in prefixes) - 1
  decoder_inputs = np.zeros((len(prefixes), width), np.int32)
  next_tokens = np.zeros((len(prefixes), width), np.int32)
  for row, prefix in enumerate(prefixes):
    decoder_inputs[row, : len(prefix) - 1] = prefix[:-1]
    next_tokens[row, : len(prefix) - 1] = prefix[1:]
  features = fresh_features(target, input_tokens, decoder_inputs, draft.feature_layers)
  cache = head_init_cache(draft, input_tokens, HEAD_CACHE_LENGTH)
  next_embedded = network.embed_tokens(target.config, target.params, next_tokens)
  (predicted, hidden), head_cache = feature_head.apply_block(
    draft.config,
    draft.params,
    cache['head'],
    jnp.asarray(features),
    next_embedded,
    jnp.zeros(len(prefixes), jnp.int32),
  )
  last = np.array([len(prefix) - 2 for prefix in prefixes])
  rows = np.arange(len(prefixes))
  return head_cache, predicted[rows, last], hidden[rows, last]


def self_attention_entries(head_cache, row, count):
  """Row `row`'s cached keys and values at positions < count, for every head layer."""
  leaves = jax.tree_util.tree_leaves_with_path(head_cache)
  return {
    jax.tree_util.keystr(path): np.asarray(leaf[row, ..., :count])
    for path, leaf in leaves
    if 'self_attention' in jax.tree_util.keystr(path)
  }


def assert_cache_is_a_fresh_pass(
  draft, architecture, input_tokens, prompt_block, next_tokens, num_accepted, cache
):
  """The head's state after an iteration that accepted `num_accepted` [B] of `next_tokens`
  equals a fresh head pass over each row's true prefix (prompt, then the accepted tokens)."""
  starts = np.asarray(decoding.prompt_lengths(prompt_block))
  prefixes = [
    np.concatenate([prompt_block[row, : starts[row] + 1], next_tokens[row, : n + 1]])
    for row, n in enumerate(num_accepted)
  ]
  fresh_cache, predicted, hidden = fresh_head_pass(draft, architecture, prefixes, input_tokens)
  for row, prefix in enumerate(prefixes):
    count = len(prefix) - 1  # Positions 0..p+n are true.
    got = self_attention_entries(cache['head'], row, count)
    want = self_attention_entries(fresh_cache, row, count)
    for name in want:
      np.testing.assert_allclose(got[name], want[name], atol=2e-5, err_msg=f'row {row} {name}')
  np.testing.assert_allclose(cache['feature'], predicted, atol=2e-5)
  np.testing.assert_allclose(cache['logits'], draft._logits(predicted, hidden), atol=2e-4)


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_the_head_cache_after_a_rejection_equals_a_fresh_pass_over_the_true_prefix(architecture):
  """Positions 0..p+n of each row: nothing computed from the head's guesses is left.

  (A variant that rewrites only the last accepted position, keeping the
  rollout's entries before it, fails here at every row that accepted >= 1.)
  """
  draft = aligned_head(TARGETS[architecture])
  input_tokens = cache_test_inputs(architecture)
  num_accepted = np.array([0, 1, 3, 2], np.int32)  # Ragged, up to all of gamma = 3.
  next_tokens, cache = one_iteration(draft, input_tokens, jnp.asarray(num_accepted))
  assert_cache_is_a_fresh_pass(
    draft, architecture, input_tokens, PROMPT_BLOCK, next_tokens, num_accepted, cache
  )


# ------------------------------------------------------------------------------
# Errors.
# ------------------------------------------------------------------------------
def test_a_head_for_another_target_is_refused_naming_both():
  target = TARGETS['decoder_only']
  config = head_config(target)
  params = feature_head.init_params(config)
  wider = tiny_decoder_only_model(seed=0, layers=2, emb_dim=48)
  with pytest.raises(ValueError, match='width 32.*width 48'):
    drafts.FeatureDraft.for_target(wider, params, config)
  other_vocab = tiny_decoder_only_model(seed=0, layers=2, vocab_size=40)
  with pytest.raises(ValueError, match='vocabulary 32.*vocabulary 40'):
    drafts.FeatureDraft.for_target(other_vocab, params, config)
  with pytest.raises(ValueError, match='decoder-only.*encoder-decoder'):
    drafts.FeatureDraft.for_target(tiny_model(seed=0, layers=2), params, config)
  draft = drafts.FeatureDraft.for_target(target, params, config)
  with pytest.raises(ValueError, match='width 32.*width 48'):
    models.generate(wider, draft, np.array([[3, 4]]), gamma=2)


def test_head_parameters_of_another_config_are_refused_naming_both_shapes():
  target = TARGETS['encoder_decoder']
  params = feature_head.init_params(head_config(target, emb_dim=24))
  with pytest.raises(ValueError, match=r'head_norm.*\(24,\).*width 16.*\(16,\)'):
    drafts.FeatureDraft.for_target(target, params, head_config(target))
  own = feature_head.init_params(head_config(target, output='own'))
  with pytest.raises(ValueError, match='logits_dense'):
    drafts.FeatureDraft.for_target(target, own, head_config(target))
  before_norms = dict(feature_head.init_params(head_config(target)))
  del before_norms['embedding_norm']  # A head saved before its input norms existed.
  with pytest.raises(ValueError, match=r'embedding_norm.*is missing.*retrain'):
    drafts.FeatureDraft.for_target(target, before_norms, head_config(target))


def test_bad_head_configs_and_feature_widths_are_refused():
  target = TARGETS['decoder_only']
  with pytest.raises(ValueError, match=r"output='target'.*\(0,\)"):
    head_config(target, feature_layers=(0,))
  with pytest.raises(ValueError, match=r'feature_layers.*\[0, 2\).*\(2,\)'):
    head_config(target, feature_layers=(2,))
  with pytest.raises(ValueError, match='output must be one of'):
    head_config(target, output='shared')
  config = head_config(target, feature_layers=(0, 1))
  draft = drafts.FeatureDraft.for_target(target, feature_head.init_params(config), config)
  cache = draft.init_cache(jnp.ones((1, 2), jnp.int32), 8)
  with pytest.raises(ValueError, match=r'width 64 .*\(1, 1, 32\)'):
    draft.after_verify(
      cache,
      jnp.zeros((1, 1, 32)),
      jnp.zeros((1, 1), jnp.int32),
      jnp.zeros(1, jnp.int32),
      jnp.zeros(1, jnp.int32),
    )


def test_an_encoder_decoder_head_needs_the_targets_encoder_output():
  draft = random_head(TARGETS['encoder_decoder'])
  input_tokens = jnp.ones((2, 5), jnp.int32)
  with pytest.raises(ValueError, match=r"target's encoder output: pass encoded=\(2, 5, 32\).*None"):
    draft.init_cache(input_tokens, 8)
  with pytest.raises(ValueError, match=r'encoded=\(2, 5, 32\).*got \(2, 4, 32\)'):
    draft.init_cache(input_tokens, 8, encoded=jnp.zeros((2, 4, 32)))


# ------------------------------------------------------------------------------
# Training.
# ------------------------------------------------------------------------------
def unrolled_along(draft, input_tokens, decoder_inputs, features, steps):
  """`feature_head.unrolled` of `draft` along int [B, L] `decoder_inputs`: (start, depths).

  Entry t reads `features` [B, L, Df] at t and the embedding of the token at
  t + 1; an encoder-decoder head cross-attends to the target's encoder output
  of `input_tokens`.
  """
  target_config, target_params = draft.target_config, draft.target_params
  next_tokens = np.pad(decoder_inputs[:, 1:], ((0, 0), (0, 1)))
  encoded = encoder_mask = None
  if not network.is_decoder_only(target_config):
    encoded = network.encode(target_config, target_params, input_tokens)
    encoder_mask = input_tokens > 0
  return feature_head.unrolled(
    draft.config,
    draft.params,
    jnp.asarray(features, jnp.float32),
    network.embed_tokens(target_config, target_params, next_tokens),
    encoded,
    encoder_mask,
    steps=steps,
  )


# `slow`: the encoder-decoder (test_feature_draft_training checks the same pairing through the
# decode loop in both architectures).
@pytest.mark.parametrize(
  'architecture', [pytest.param('encoder_decoder', marks=pytest.mark.slow), 'decoder_only']
)
def test_the_training_time_test_computes_what_a_rollout_drafts_from(architecture):
  """Rollout step m + 1's q == the unrolled pass's depth-m distribution at position P - 1 + m.

  The training pass (`feature_head.unrolled`) must see what the rollout's
  cache holds: true entries up to the last true position, then the head's
  own chain. A random head: any mismatch of inputs or masks shows.
  """
  target = TARGETS[architecture]
  draft = random_head(target, seed=3)
  gamma, sample_args = 4, dict(temperature=1.0, topk=0, topp=0.0)
  input_tokens = cache_test_inputs(architecture)
  prompt_block = jnp.asarray(PROMPT_BLOCK)
  lengths = decoding.prompt_lengths(prompt_block)
  target_cache = network.init_decoder_cache(
    target.config, target.params, input_tokens, HEAD_CACHE_LENGTH
  )
  _, features = network.prefill_decoder_cache(
    target.config, target.params, target_cache, prompt_block, lengths, feature_layers=(1,)
  )
  cache = draft.prefill(
    head_init_cache(draft, input_tokens, HEAD_CACHE_LENGTH), prompt_block, lengths, features
  )
  sequences = jnp.pad(prompt_block, ((0, 0), (0, HEAD_CACHE_LENGTH - 4)))
  tokens, probs, _, _ = draft.propose(
    cache,
    sequences,
    lengths,
    jax.random.PRNGKey(2),
    gamma=gamma,
    draft_threshold=0.0,
    **sample_args,
  )
  # Each row's sequence: BOS, its prompt, the drafted tokens.
  rows = np.arange(len(PROMPT_BLOCK))
  width = 4 + gamma
  decoder_inputs = np.zeros((len(rows), width), np.int32)
  for row, length in enumerate(np.asarray(lengths)):
    decoder_inputs[row, : length + 1] = PROMPT_BLOCK[row, : length + 1]
    decoder_inputs[row, length + 1 : length + 1 + gamma] = tokens[row]
  true_features = fresh_features(target, input_tokens, decoder_inputs, draft.feature_layers)
  _, depths = unrolled_along(draft, input_tokens, decoder_inputs, true_features, gamma)
  for m, (predicted, hidden) in enumerate(depths):
    at = np.asarray(lengths) - 1 + m
    q = sampling.standardize(draft._logits(predicted[rows, at], hidden[rows, at]), **sample_args)
    np.testing.assert_allclose(probs[:, m], q, atol=2e-5, err_msg=f'rollout step {m + 1}')


@pytest.mark.parametrize('architecture', list(TARGETS))
def test_a_row_without_a_prompt_drafts_from_the_start_state_as_training_does(architecture):
  """From BOS, rollout step 1's q is the unrolled pass's start state and step m + 1's its
  depth-m entry at position m - 1: the chain from the start, with no true entry before it."""
  target = TARGETS[architecture]
  draft = random_head(target, seed=4)
  gamma, sample_args = 4, dict(temperature=1.0, topk=0, topp=0.0)
  input_tokens = cache_test_inputs(architecture)
  batch = input_tokens.shape[0]
  tokens, probs, _, _ = draft.propose(
    head_init_cache(draft, input_tokens, HEAD_CACHE_LENGTH),
    jnp.zeros((batch, HEAD_CACHE_LENGTH), jnp.int32),
    jnp.zeros((batch,), jnp.int32),
    jax.random.PRNGKey(5),
    gamma=gamma,
    draft_threshold=0.0,
    **sample_args,
  )
  decoder_inputs = np.pad(np.asarray(tokens), ((0, 0), (1, 0)))  # BOS, the drafted tokens.
  # The chain from the start reads no true feature: any stand-in shows a masking error.
  stand_in = np.random.default_rng(6).standard_normal(
    decoder_inputs.shape + (draft.config.feature_width,)
  )
  start, depths = unrolled_along(draft, input_tokens, decoder_inputs, stand_in, gamma)
  q = lambda outputs: sampling.standardize(draft._logits(*outputs), **sample_args)
  np.testing.assert_allclose(probs[:, 0], q(start), atol=2e-5, err_msg='rollout step 1')
  for m in range(1, gamma):
    predicted, hidden = depths[m]
    np.testing.assert_allclose(
      probs[:, m], q((predicted[:, m - 1], hidden[:, m - 1])), atol=2e-5, err_msg=f'step {m + 1}'
    )


TRAIN_TARGET = tiny_model(seed=0, layers=2, scale=3.0)  # Random: a random head drafts poorly.


def train_head(model_dir, num_steps, **kwargs):
  config = head_config(TRAIN_TARGET, emb_dim=32, head_dim=16, mlp_dim=64)
  inputs = padded_inputs(0, 256, 8, TRAIN_TARGET.vocab_size)
  result = train_feature_head.train_feature_head(
    str(model_dir),
    TRAIN_TARGET,
    config,
    inputs,
    max_decode_len=10,
    batch_size=16,
    num_steps=num_steps,
    **kwargs,
  )
  return config, result


def test_training_raises_alpha_held_out_and_in_the_loop(tmp_path):
  """30 steps on the target's own outputs (unrolled 3 steps): alpha rises, measured twice."""
  held_out = padded_inputs(1, 32, 8, TRAIN_TARGET.vocab_size)
  config, result = train_head(tmp_path, 30, eval_inputs=held_out, eval_every=30, log_every=10)
  start, end = result.eval_metrics[0]['alpha'], result.eval_metrics[-1]['alpha']
  print(f'\nheld-out alpha (T = 1) of the head: {start:.3f} at step 0, {end:.3f} at step 30')
  assert end > start + 0.15
  tokens_per_call = {}
  for name, params in (('random', feature_head.init_params(config)), ('trained', result.params)):
    draft = drafts.FeatureDraft.for_target(TRAIN_TARGET, params, config)
    out = models.generate(TRAIN_TARGET, draft, held_out, gamma=3, max_decode_len=10)
    tokens_per_call[name] = float(out.stats.tokens_per_target_call)
  print(f'greedy tokens per target call: {tokens_per_call}')
  assert tokens_per_call['trained'] > tokens_per_call['random'] + 0.2


@pytest.mark.parametrize('width', [16, 32])
def test_the_embedding_aligned_start_reads_and_scores_tokens_in_the_targets_geometry(width):
  """The head's embedding rows span the embedding's top principal directions; with all of
  them (width = D), reading a token's embedding and scoring it with the output layer ranks
  that token first; every other parameter is the random start's."""
  target = TRAIN_TARGET
  config = head_config(target, emb_dim=width, output='own')
  params = feature_head.init_params(config, seed=1)
  embedding = np.asarray(
    network.embed_tokens(target.config, target.params, jnp.arange(target.vocab_size))
  )
  aligned = feature_head.embedding_aligned_params(config, params, embedding)
  rows = np.asarray(aligned['pre_projection']['kernel'])[config.feature_width :]  # [D, H]
  gram = rows.T @ rows
  np.testing.assert_allclose(gram, gram[0, 0] * np.eye(width), atol=1e-4 * gram[0, 0])
  captured = np.sum((embedding @ rows) ** 2) / gram[0, 0]
  singular = np.linalg.svd(embedding, compute_uv=False)
  np.testing.assert_allclose(captured, np.sum(singular[:width] ** 2), rtol=1e-4)
  if width == target.config.emb_dim:
    scores = embedding @ rows @ np.asarray(aligned['logits_dense']['kernel'])  # [V, V]
    assert np.mean(scores.argmax(-1) == np.arange(target.vocab_size)) > 0.9
  changed = {"['pre_projection']['kernel']", "['logits_dense']['kernel']"}
  leaves = lambda tree: {
    jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }
  aligned_leaves = leaves(aligned)
  for name, leaf in leaves(params).items():
    if name not in changed:
      np.testing.assert_array_equal(aligned_leaves[name], leaf)
  features = np.asarray(params['pre_projection']['kernel'])[: config.feature_width]
  np.testing.assert_array_equal(
    np.asarray(aligned['pre_projection']['kernel'])[: config.feature_width], features
  )
  with pytest.raises(ValueError, match=r'shape \(32, 16\).*\(32, 32\).*embed_tokens'):
    feature_head.embedding_aligned_params(config, params, embedding[:, :16])


def test_a_killed_run_resumes_to_the_uninterrupted_parameters(tmp_path):
  _, whole = train_head(tmp_path / 'whole', 4, checkpoint_every=2, log_every=2)
  train_head(tmp_path / 'killed', 2, checkpoint_every=2, log_every=2)
  _, resumed = train_head(tmp_path / 'killed', 4, checkpoint_every=2, log_every=2)
  assert resumed.step == 4 and [r['step'] for r in resumed.train_metrics] == [4]
  jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
  with pytest.raises(ValueError, match='unroll_steps'):
    train_head(tmp_path / 'killed', 6, unroll_steps=5)
  with pytest.raises(ValueError, match='embedding_init'):
    train_head(tmp_path / 'killed', 6, embedding_init=False)


def test_a_run_killed_in_a_second_pass_resumes_to_the_uninterrupted_parameters(tmp_path):
  """With data_passes 2, killed in the first chunk's second pass and resumed past the next
  chunk's decode: each step's batch depends on the step alone."""
  chunk = train_feature_head.DATA_CHUNK_STEPS
  settings = dict(data_passes=2, checkpoint_every=2, log_every=2)
  _, whole = train_head(tmp_path / 'whole', 2 * chunk + 2, **settings)
  train_head(tmp_path / 'killed', chunk + 2, **settings)
  _, resumed = train_head(tmp_path / 'killed', 2 * chunk + 2, **settings)
  jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)


def test_the_loss_settings_are_checked():
  config = head_config(TRAIN_TARGET)
  with pytest.raises(ValueError, match='decay must be in'):
    train_feature_head.HeadLossConfig(config, TRAIN_TARGET.config, decay=0.0)
  with pytest.raises(ValueError, match='unroll_steps'):
    train_feature_head.HeadLossConfig(config, TRAIN_TARGET.config, unroll_steps=0)
  with pytest.raises(ValueError, match='width 32.*width 16'):
    other = tiny_model(seed=0, layers=2, emb_dim=16)
    train_feature_head.HeadLossConfig(config, other.config)
