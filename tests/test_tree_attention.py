"""Tests of tree attention in `decode_block` and of `compact_tree_path`.

A tree block scores every node of a static token tree in one call; each node
must get the logits a teacher-forced forward pass gives at the end of the
row's context plus the node's root-to-node path. Both architectures, a prefix
LM among them, with rows at different start positions over stale cache
entries.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import network

VOCAB = 64
# Tiny float32 models, the sizes of test_network.py and test_decoder_only_network.py.
SIZES = dict(emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, dropout_rate=0.0)
T5_CONFIG = network.T5Config(
  vocab_size=VOCAB, dtype=jnp.float32, num_encoder_layers=2, num_decoder_layers=2, **SIZES
)
DECODER_ONLY_CONFIG = network.DecoderOnlyConfig(
  vocab_size=VOCAB, dtype=jnp.float32, num_layers=2, **SIZES
)
CACHE_LENGTH = 24


class _Tree:
  """A stand-in for `tree.Tree`: `depths` and `ancestors` of a parents tuple."""

  def __init__(self, parents):
    self.parents = tuple(parents)
    size = len(parents)
    self.depths = np.zeros(size, np.int32)
    self.ancestors = np.eye(size, dtype=bool)
    for node in range(1, size):
      self.depths[node] = self.depths[parents[node]] + 1
      self.ancestors[node] |= self.ancestors[parents[node]]

  def __hash__(self):
    return hash(self.parents)

  def __eq__(self, other):
    return isinstance(other, _Tree) and other.parents == self.parents

  def path(self, node):
    """Nodes from the root to `node`."""
    return [j for j in range(node + 1) if self.ancestors[node, j]]

  def levels(self):
    """(first node, number of nodes) of each depth."""
    return [
      (int(np.argmax(self.depths == d)), int(np.sum(self.depths == d)))
      for d in range(self.depths.max() + 1)
    ]


BRANCHING_2_2 = _Tree((-1, 0, 0, 1, 1, 2, 2))
UNEVEN = _Tree((-1, 0, 0, 0, 1, 1, 3, 4, 4, 6))


def _chain(size):
  return _Tree((-1,) + tuple(range(size - 1)))


_init_cache = jax.jit(network.init_decoder_cache, static_argnums=(0, 3))
_prefill = jax.jit(network.prefill_decoder_cache, static_argnums=0, static_argnames='bidirectional')
_decode_block = jax.jit(
  network.apply_decode_block, static_argnums=0, static_argnames=('tree', 'first_node')
)
_compact = jax.jit(network.compact_tree_path, static_argnums=0)
_compute_logits = jax.jit(network.compute_logits, static_argnums=0)


class _Case:
  """A batch of rows with contexts of different lengths written into a cache.

  Row b's decoder inputs are `sequences[b]` (BOS 0 first); positions
  < starts[b] are its context, written by a prefill with junk past the
  context; the root of a tree (or a chain's first token) sits at starts[b].
  """

  def __init__(self, kind, seed=0):
    rng = np.random.default_rng(seed)
    self.kind = kind
    self.config = T5_CONFIG if kind == 'encoder_decoder' else DECODER_ONLY_CONFIG
    self.params = network.random_params(self.config, seed=seed + 1)[0]
    self.starts = np.array([3, 6, 1])
    batch = len(self.starts)
    self.sequences = rng.integers(2, VOCAB, (batch, CACHE_LENGTH)).astype(np.int32)
    self.sequences[:, 0] = 0
    self.inputs = rng.integers(2, VOCAB, (batch, 7)).astype(np.int32)  # Encoder inputs.
    self.inputs[0, 5:] = 0
    self.inputs[2, 3:] = 0
    width = self.starts.max() + 1
    junk = rng.integers(2, VOCAB, (batch, width))
    block = np.where(np.arange(width) <= self.starts[:, None], self.sequences[:, :width], junk)
    cache = _init_cache(self.config, self.params, jnp.asarray(self.inputs), CACHE_LENGTH)
    self.cache = _prefill(
      self.config,
      self.params,
      cache,
      jnp.asarray(block, jnp.int32),
      jnp.asarray(self.starts, jnp.int32),
      bidirectional=kind == 'prefix_lm',
    )
    self.rng = rng

  def stale(self, size):
    """The cache with junk written at slots start..start+size-1 of each row."""
    junk = jnp.asarray(self.rng.integers(2, VOCAB, (len(self.starts), size)), jnp.int32)
    return self.decode(self.cache, junk)[1]

  def decode(self, cache, tokens, starts=None, **tree):
    starts = self.starts if starts is None else starts
    return _decode_block(
      self.config, self.params, cache, jnp.asarray(tokens), jnp.asarray(starts, jnp.int32), **tree
    )

  def forward(self, continuations):
    """Teacher-forced logits [len(rows), L, vocab] of context + continuation per row.

    `continuations` is a list of (row, tokens placed from the row's start on).
    """
    rows = [b for b, _ in continuations]
    sequences = np.ones((len(rows), CACHE_LENGTH), np.int32)
    for i, (b, tokens) in enumerate(continuations):
      sequences[i, : self.starts[b]] = self.sequences[b, : self.starts[b]]
      sequences[i, self.starts[b] : self.starts[b] + len(tokens)] = tokens
    features = {
      'decoder_input_tokens': sequences,
      'decoder_target_tokens': np.ones_like(sequences),
      'encoder_input_tokens': self.inputs[rows],
    }
    if self.kind == 'prefix_lm':
      features['decoder_causal_attention'] = (
        np.arange(CACHE_LENGTH) <= self.starts[rows][:, None]
      ).astype(np.int32)
    if self.kind != 'encoder_decoder':
      del features['encoder_input_tokens']
    return np.asarray(_compute_logits(self.config, self.params, features))

  def tree_tokens(self, tree):
    """int32 [B, N]: the root (the token at the row's start) and random drafted nodes."""
    tokens = self.rng.integers(2, VOCAB, (len(self.starts), len(tree.depths))).astype(np.int32)
    tokens[:, 0] = self.sequences[np.arange(len(self.starts)), self.starts]
    return tokens

  def tree_reference(self, tree, tokens):
    """float32 [B, N, vocab]: each node's teacher-forced logits at the end of its path."""
    nodes = range(len(tree.depths))
    batch = len(self.starts)
    full = self.forward([(b, tokens[b, tree.path(i)]) for b in range(batch) for i in nodes])
    full = full.reshape(batch, len(tree.depths), *full.shape[1:])
    return np.stack(
      [[full[b, i, self.starts[b] + tree.depths[i]] for i in nodes] for b in range(batch)]
    )


CASES = ['encoder_decoder', 'decoder_only', 'prefix_lm']


@functools.lru_cache(maxsize=None)
def _case(kind):
  return _Case(kind, seed=CASES.index(kind))


def _self_attention_caches(config, cache):
  """{(layer, name): [B, L, heads, head_dim]}, the self-attention caches' positions moved first."""
  return {
    (i, name): np.moveaxis(
      np.asarray(cache['decoder'][f'layers_{i}']['self_attention'][name]), -1, 1
    )
    for i in range(network.num_decoder_layers(config))
    for name in ('cached_key', 'cached_value')
  }


@pytest.mark.parametrize(  # `make test`: the uneven tree (depths 1-3 side by side).
  'tree',
  [pytest.param(BRANCHING_2_2, marks=pytest.mark.slow), UNEVEN],
  ids=['branching_2_2', 'uneven'],
)
@pytest.mark.parametrize('kind', CASES)
def test_tree_block_equals_teacher_forcing_of_each_path(kind, tree):
  """One call, and level-by-level calls as a draft makes them, over stale entries."""
  case = _case(kind)
  size = len(tree.depths)
  stale = case.stale(size + 2)  # Junk also past the tree: it must stay masked.
  tokens = case.tree_tokens(tree)
  expected = case.tree_reference(tree, tokens)
  logits, cache = case.decode(stale, tokens, tree=tree)
  assert logits.shape == (3, size, VOCAB)
  np.testing.assert_allclose(logits, expected, atol=1e-5)
  # A path's logits differ from a chain's: the test sees the tree.
  chain, _ = case.decode(stale, tokens)
  assert np.abs(np.asarray(chain) - expected).max() > 1e-2
  levels, by_level = [], stale
  for first, count in tree.levels():
    level_logits, by_level = case.decode(
      by_level, tokens[:, first : first + count], tree=tree, first_node=first
    )
    levels.append(np.asarray(level_logits))
  np.testing.assert_allclose(np.concatenate(levels, axis=1), expected, atol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), by_level, cache)


@pytest.mark.parametrize('kind', CASES)
def test_chain_tree_is_bit_identical_to_chain_block(kind):
  """tree=None is the chain rule; a chain tree gives the very same bits."""
  case = _case(kind)
  k = 4
  tokens = np.stack([case.sequences[b, s : s + k] for b, s in enumerate(case.starts)])
  stale = case.stale(k + 2)
  logits, cache = case.decode(stale, tokens)
  tree_logits, tree_cache = case.decode(stale, tokens, tree=_chain(k))
  np.testing.assert_array_equal(tree_logits, logits)
  jax.tree.map(np.testing.assert_array_equal, tree_cache, cache)
  # A longer chain tree written in two calls.
  first, cache = case.decode(stale, tokens[:, :2], tree=_chain(k + 1))
  second, _ = case.decode(cache, tokens[:, 2:], tree=_chain(k + 1), first_node=2)
  np.testing.assert_allclose(np.concatenate([first, second], 1), logits, atol=1e-5)
  full = case.forward([(b, tokens[b]) for b in range(3)])
  expected = np.stack([full[b, s : s + k] for b, s in enumerate(case.starts)])
  np.testing.assert_allclose(logits, expected, atol=1e-5)


@pytest.mark.parametrize('kind', CASES)
def test_compacted_path_equals_a_fresh_chain_decode(kind):
  """Per-row accepted paths move to consecutive slots; decoding continues after them."""
  case = _case(kind)
  tree = UNEVEN
  tokens = case.tree_tokens(tree)
  _, cache = case.decode(case.stale(len(tree.depths)), tokens, tree=tree)
  # Row 2 accepted one node; its path's later entries are arbitrary nodes.
  paths = np.array([tree.path(7), tree.path(9), [0, 2, 8, 1]], np.int32)
  accepted = np.array([3, 3, 1])
  compacted = _compact(case.config, cache, jnp.asarray(case.starts, jnp.int32), paths)
  path_tokens = np.take_along_axis(tokens, paths, axis=1)
  _, fresh = case.decode(case.cache, path_tokens)
  got = _self_attention_caches(case.config, compacted)
  want = _self_attention_caches(case.config, fresh)
  for name in got:
    for b, s in enumerate(case.starts):
      window = slice(s, s + accepted[b] + 1)
      np.testing.assert_allclose(got[name][b, window], want[name][b, window], atol=1e-5)
      # The context before the start is untouched.
      np.testing.assert_array_equal(got[name][b, :s], want[name][b, :s])
  if kind == 'encoder_decoder':  # Cross-attention caches and the mask are untouched.
    untouched = lambda c: (
      c['decoder']['encoder_mask'],
      [c['decoder'][f'layers_{i}']['encoder_decoder_attention'] for i in range(2)],
    )
    jax.tree.map(np.testing.assert_array_equal, untouched(compacted), untouched(cache))
  following = case.rng.integers(2, VOCAB, (3, 2)).astype(np.int32)
  logits, _ = case.decode(compacted, following, starts=case.starts + accepted + 1)
  full = case.forward(
    [(b, np.concatenate([path_tokens[b, : accepted[b] + 1], following[b]])) for b in range(3)]
  )
  for b, s in enumerate(case.starts + accepted + 1):
    np.testing.assert_allclose(logits[b], full[b, s : s + 2], atol=1e-5)


def test_bad_trees_blocks_and_paths_fail_while_tracing():
  """Errors surface under jax.eval_shape: nothing is computed."""
  params, _ = network.abstract_params(T5_CONFIG)
  inputs = jnp.ones((2, 5), jnp.int32)
  cache = jax.eval_shape(lambda p: network.init_decoder_cache(T5_CONFIG, p, inputs, 8), params)
  starts = jnp.zeros(2, jnp.int32)

  def decode_block(tokens, **tree):
    fn = functools.partial(network.apply_decode_block, T5_CONFIG, **tree)
    return jax.eval_shape(fn, params, cache, jnp.ones(tokens, jnp.int32), starts)

  decode_block((2, 3), tree=BRANCHING_2_2, first_node=3)  # Fits: nodes 3..5 of 7.
  with pytest.raises(ValueError, match='tree of 10 nodes does not fit a cache of length 8'):
    decode_block((2, 1), tree=UNEVEN)
  with pytest.raises(ValueError, match='first_node \\+ k must be <= 7'):
    decode_block((2, 3), tree=BRANCHING_2_2, first_node=5)
  with pytest.raises(ValueError, match='needs a tree'):
    decode_block((2, 3), first_node=1)
  with pytest.raises(ValueError, match='static int'):
    decode_block((2, 3), tree=BRANCHING_2_2, first_node=jnp.int32(1))
  with pytest.raises(TypeError, match='depths'):
    decode_block((2, 3), tree=(-1, 0, 0))
  upside_down = _Tree((-1, 0, 0))
  upside_down.ancestors = upside_down.ancestors.T.copy()
  with pytest.raises(ValueError, match='j > i'):
    decode_block((2, 3), tree=upside_down)
  malformed = _Tree((-1, 0, 0))
  malformed.ancestors = malformed.ancestors[:, :2]
  with pytest.raises(ValueError, match='ancestors bool \\[N, N\\]'):
    decode_block((2, 3), tree=malformed)
  with pytest.raises(ValueError, match='start_positions'):
    decode_block((3, 3), tree=BRANCHING_2_2)

  def compact(starts, path, cache=cache):
    fn = functools.partial(network.compact_tree_path, T5_CONFIG)
    return jax.eval_shape(fn, cache, jnp.asarray(starts, jnp.int32), jnp.asarray(path, jnp.int32))

  assert jax.tree.map(lambda x: x.shape, compact([0, 1], [[0, 2], [0, 1]])) == jax.tree.map(
    lambda x: x.shape, cache
  )
  with pytest.raises(ValueError, match='path \\[batch, P\\]'):
    compact([0, 1], [0, 2])
  with pytest.raises(ValueError, match='path \\[batch, P\\]'):
    compact([0, 1, 2], [[0, 2], [0, 1]])
  with pytest.raises(ValueError, match='path \\[batch, P\\]'):
    compact([0, 1], np.zeros((2, 9)))
  with pytest.raises(ValueError, match='init_decoder_cache'):
    compact([0, 1], [[0, 2], [0, 1]], cache={'decoder': {}})
