"""Token trees drafted by a feature head (`drafts.FeatureDraft.propose_tree`, `after_verify`).

Random tiny networks, as tests/test_feature_draft.py's (a nearly Markov target
and a head aligned to it where acceptance must be ragged; a random head where
any mismatch of inputs, masks or positions must show). Greedy tree decoding
equals the baseline token for token; every tree node's q is what a chain along
its path computes; after a tree's verification the head's cache equals a
fresh head pass over the true features of the accepted prefix. The
whole-sequence chi-square tests are tests/test_feature_draft_exactness.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import judging
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import tree as tree_lib
from test_feature_draft import (
  assert_cache_is_a_fresh_pass,
  TARGETS,
  aligned_head,
  batch_inputs,
  head_init_cache,
  random_head,
)
from testing_utils import padded_inputs

# Depth 3, not uniform: node 1 has two children, node 2 one; nodes 3 and 5 one each.
TREE = tree_lib.Tree(parents=(-1, 0, 0, 1, 1, 2, 3, 5))
TREES = {'2-2': (2, 2), '3-1-1': (3, 1, 1), '2-2-1-1': (2, 2, 1, 1), 'non_uniform': TREE}


# ------------------------------------------------------------------------------
# Greedy: the baseline's tokens.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize(
  'architecture, batch, tree_name, output',
  [
    pytest.param('encoder_decoder', 1, '2-2', 'target', marks=pytest.mark.slow),
    ('encoder_decoder', 5, '3-1-1', 'target'),
    pytest.param('encoder_decoder', 8, 'non_uniform', 'own', marks=pytest.mark.slow),
    pytest.param('decoder_only', 1, '2-2-1-1', 'target', marks=pytest.mark.slow),
    ('decoder_only', 6, 'non_uniform', 'target'),
    pytest.param('decoder_only', 8, '3-1-1', 'fused', marks=pytest.mark.slow),
  ],
)
def test_greedy_tree_equals_the_baseline_token_for_token(architecture, batch, tree_name, output):
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
  out = models.generate(target, head, input_tokens, tree=TREES[tree_name], **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  if output == 'target' and batch > 1:  # Ragged: rows accept different counts.
    accepted = np.asarray(out.stats.accepted) / np.asarray(out.stats.iterations)
    assert accepted.max() > 0 and len(set(np.round(accepted, 6))) > 1


@pytest.mark.parametrize(
  'architecture', ['encoder_decoder', pytest.param('prefix_lm', marks=pytest.mark.slow)]
)
def test_greedy_tree_after_ragged_prompts_equals_the_baseline(architecture):
  if architecture == 'encoder_decoder':
    target = TARGETS['encoder_decoder']
    input_tokens = padded_inputs(3, 6, 9, target.vocab_size)
    prompts = np.array([[5, 6], [7, 0], [0, 0], [4, 4], [9, 0], [3, 8]], np.int32)
  else:
    base = TARGETS['decoder_only']
    target = models.Model(base.config, base.params, inputs_bidirectional_attention=True)
    input_tokens, prompts = batch_inputs('decoder_only', 3, 4)[0], None
  kwargs = dict(temperature=0.0, max_decode_len=10, decoder_prompts=prompts)
  baseline = models.generate(target, None, input_tokens, **kwargs)
  out = models.generate(target, aligned_head(target), input_tokens, tree=(2, 2), **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  assert np.asarray(out.stats.accepted).sum() > 0


def test_a_chain_tree_judges_as_the_chain():
  """Greedy, tree=(1, 1, 1) accepts exactly what gamma = 3 does, iteration for iteration."""
  target = TARGETS['decoder_only']
  input_tokens, _ = batch_inputs('decoder_only', 2, 5)
  kwargs = dict(temperature=0.0, max_decode_len=12)
  chain = models.generate(target, aligned_head(target), input_tokens, gamma=3, **kwargs)
  tree = models.generate(target, aligned_head(target), input_tokens, tree=(1, 1, 1), **kwargs)
  np.testing.assert_array_equal(tree.tokens, chain.tokens)
  for name in ('iterations', 'accepted', 'emitted'):
    np.testing.assert_array_equal(getattr(tree.stats, name), getattr(chain.stats, name))


# ------------------------------------------------------------------------------
# One tree iteration by hand.
# ------------------------------------------------------------------------------
CACHE_LENGTH = 16
# Ragged prompts, one row without any (its tree is rooted before position 0).
PROMPT_BLOCK = np.array([[0, 5, 6, 0], [0, 7, 8, 9], [0, 0, 0, 0], [0, 3, 3, 0]], np.int32)


def tree_test_inputs(architecture):
  """The rows' input tokens: encoder inputs, or (decoder-only) the prompts."""
  if architecture == 'encoder_decoder':
    return jnp.asarray(padded_inputs(7, len(PROMPT_BLOCK), 9, TARGETS[architecture].vocab_size))
  return jnp.asarray(PROMPT_BLOCK[:, 1:])


def prefilled(draft, input_tokens):
  """(head state after each row's prompt, target cache, starts P [B])."""
  target_config, target_params = draft.target_config, draft.target_params
  prompt_block = jnp.asarray(PROMPT_BLOCK)
  starts = decoding.prompt_lengths(prompt_block)
  target_cache = network.init_decoder_cache(
    target_config, target_params, input_tokens, CACHE_LENGTH
  )
  target_cache, features = network.prefill_decoder_cache(
    target_config,
    target_params,
    target_cache,
    prompt_block,
    starts,
    feature_layers=draft.feature_layers,
  )
  cache = head_init_cache(draft, input_tokens, CACHE_LENGTH)
  return draft.prefill(cache, prompt_block, starts, features), target_cache, starts


def propose_tree(draft, cache, starts, temperature=1.0):
  sequences = jnp.pad(jnp.asarray(PROMPT_BLOCK), ((0, 0), (0, CACHE_LENGTH - 4)))
  return draft.propose_tree(
    cache,
    sequences,
    starts,
    jax.random.PRNGKey(1),
    tree=TREE,
    temperature=temperature,
    topk=0,
    topp=0.0,
  )


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_every_tree_node_drafts_from_what_a_chain_along_its_path_computes(architecture):
  """node_probs of each fed node == the head run as a chain over the node's path (random head).

  The tree's masks, slots and relative positions must reproduce the chain's
  view: the true entries before the root, then the node's own ancestors.
  """
  draft = random_head(TARGETS[architecture], seed=5)
  cache, _, starts = jax.jit(prefilled)(draft, tree_test_inputs(architecture))
  node_tokens, node_valid, node_probs, _ = jax.jit(propose_tree)(draft, cache, starts)
  assert np.all(node_valid)
  sample_args = dict(temperature=1.0, topk=0, topp=0.0)
  np.testing.assert_allclose(node_probs[:, 0], sampling.standardize(cache['logits'], **sample_args))
  for node in np.flatnonzero(TREE.depths < TREE.max_depth)[1:]:
    path = np.flatnonzero(TREE.ancestors[node])[1:]  # Depth 1 .. the node.
    feature, head_cache = cache['feature'], cache['head']
    for k, ancestor in enumerate(path):
      (predicted, hidden), head_cache = draft._head_block(
        head_cache, feature[:, None], node_tokens[:, ancestor : ancestor + 1], starts + k
      )
      feature = predicted[:, 0]
    chain_q = sampling.standardize(draft._logits(predicted[:, 0], hidden[:, 0]), **sample_args)
    np.testing.assert_allclose(node_probs[:, node], chain_q, atol=2e-5, err_msg=f'node {node}')


@jax.jit
def one_tree_iteration(draft, input_tokens, path, num_accepted):
  """(next tokens [B, D + 1], head state) after prefill, a tree and `after_verify`.

  The target scores the tree (features of every node); each row then accepts
  the nodes of `path` [B, D + 1] (num_accepted [B] past the root; any path:
  its features are the target's either way) and gets token 2 next.
  """
  cache, target_cache, starts = prefilled(draft, input_tokens)
  node_tokens, _, _, cache = propose_tree(draft, cache, starts)
  (_, features), _ = network.apply_decode_block(
    draft.target_config,
    draft.target_params,
    target_cache,
    node_tokens,
    starts,
    tree=TREE,
    feature_layers=draft.feature_layers,
  )
  depth = jnp.arange(TREE.max_depth)
  path_tokens = jnp.take_along_axis(node_tokens, path[:, 1:], axis=1)
  path_tokens = jnp.where(depth[None] < num_accepted[:, None], path_tokens, 0)
  next_token = jnp.full(num_accepted.shape, 2, jnp.int32)
  judgement = judging.Judgement(num_accepted, num_accepted, next_token, None, None)
  next_tokens = decoding.emitted_block(path_tokens, judgement)
  return next_tokens, draft.after_verify(
    cache, features, next_tokens, starts, num_accepted, path=path
  )


@pytest.mark.parametrize('architecture', ['encoder_decoder', 'decoder_only'])
def test_the_head_cache_after_a_tree_equals_a_fresh_pass_over_the_true_prefix(architecture):
  """Positions 0..p+n of each row after ragged paths through lower-ranked siblings.

  (Variants that keep the tree's guessed entries below the last accepted
  position, or gather the nodes' features in node order instead of path
  order, fail here.)
  """
  draft = aligned_head(TARGETS[architecture])
  input_tokens = tree_test_inputs(architecture)
  # Rejected at the root; ranks 1, 0, 0 to a depth-3 leaf; 0 then 1 to a depth-2 leaf; rank 1.
  path = np.array([[0, 0, 0, 0], [0, 2, 5, 7], [0, 1, 4, 4], [0, 2, 2, 2]], np.int32)
  num_accepted = np.array([0, 3, 2, 1], np.int32)
  next_tokens, cache = one_tree_iteration(
    draft, input_tokens, jnp.asarray(path), jnp.asarray(num_accepted)
  )
  assert_cache_is_a_fresh_pass(
    draft, architecture, input_tokens, PROMPT_BLOCK, next_tokens, num_accepted, cache
  )


# ------------------------------------------------------------------------------
# One compiled loop, one encoder pass.
# ------------------------------------------------------------------------------
def test_a_tree_decode_encodes_once_and_a_second_call_does_not_recompile(monkeypatch):
  """The target's encoder is traced once per decode call (the head reads its output)."""
  target = TARGETS['encoder_decoder']
  encode = network.Transformer.encode
  traced = []

  def counting_encode(module, *args, **kwargs):
    traced.append(1)
    return encode(module, *args, **kwargs)

  monkeypatch.setattr(network.Transformer, 'encode', counting_encode)
  kwargs = dict(tree=(2, 1), temperature=1.0, max_decode_len=7)
  inputs = padded_inputs(0, 3, 11, target.vocab_size)  # Shapes no other test compiles.
  models.generate(target, aligned_head(target), inputs, **kwargs)
  assert len(traced) == 1
  compiled = models._generate._cache_size()
  other = models.generate(
    target,
    aligned_head(target, seed=1),
    padded_inputs(1, 3, 11, target.vocab_size),
    rng=jax.random.PRNGKey(5),
    **kwargs,
  )
  assert models._generate._cache_size() == compiled and len(traced) == 1
  assert other.tokens.shape == (3, 7)
