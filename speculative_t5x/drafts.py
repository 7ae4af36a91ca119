"""Draft proposers for `decoding.speculative_sample`, behind one small interface.

A draft is a `flax.struct.dataclass`: its arrays (network parameters, n-gram
tables) are pytree leaves, traced as arguments of the jitted decode call, and
its configuration is static. Every draft subclasses `Draft`, which declares
every method the loop calls: `vocab_size`, `init_cache`, `prefill` and
`propose` are each draft's own; `feature_layers`, `propose_tree` and
`after_verify` have defaults for drafts with nothing to do there.

`ModelDraft` is the traced view of a `models.Model` (`Model.as_draft()`): the
`Model` is the host-side object a user loads, checkpoints and shards (target
or draft), not a pytree, while the decode loop needs a pytree with the
network's config static; the two hold the same two fields for that reason.

The speculative loop keeps a draft's state consistent by construction: it only
ever moves a row's position forward over tokens the draft has seen, so a draft
that caches keys/values lacks at most the one token it never fed (the last
draft token, when all drafted tokens were accepted); `ModelDraft` feeds it in
one single-token step, only in iterations where some row needs it.

`FeatureDraft` is not a separate network: an EAGLE-style head
(`feature_head`) that drafts from the target's own features, which the loop
hands it from the target's block call (`after_verify`) and prefill.

An adaptive draft length (`draft_threshold` > 0, Hugging Face's
`assistant_confidence_threshold`): a row stops drafting after a token that the
draft gave probability below the threshold, and the rollout (`rollout_loop`, a
`lax.while_loop`) stops as soon as every active row has stopped, so the steps
it saves are real time at batch 1. Model, n-gram and feature drafts support
it; a deterministic draft (prompt lookup) drafts a fixed gamma.
"""

import functools
from typing import Any, Callable, Iterable, Optional, Tuple

import flax
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import feature_head
from speculative_t5x import kernels
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import tree as tree_lib

PyTree = Any
Array = jax.Array


class Draft:
  """What `decoding.speculative_sample` asks of a draft: every method the loop calls.

  Drafts subclass it. `vocab_size`, `init_cache`, `prefill` and `propose` are
  each draft's own; `feature_layers`, `propose_tree` and `after_verify` have
  defaults for a draft with nothing to do there, so the loop calls the same
  methods of every draft and never asks what kind it is.

  Attributes:
    vocab_size: V, which must equal the target's.
    feature_layers: the target's decoder layers whose features the draft reads
      (a `FeatureDraft`'s); () for every other draft. The loop asks the
      target's block call for them (`score_block(..., feature_layers=...)`)
      and hands them to `prefill` and `after_verify`.
  """

  vocab_size: int
  feature_layers: Tuple[int, ...] = ()

  def init_cache(
    self, encoder_input_tokens: Array, cache_length: int, encoded: Optional[Array] = None
  ) -> PyTree:
    """Per-row state for encoder inputs int32 [B, Lin] and `cache_length` positions.

    Every leaf has the batch as its leading axis, so that the decode function
    can expand it for `num_decodes`. For a decoder-only pair the tokens are
    the prompts (see `prefill`), which a model draft uses only for the batch.
    `encoded` [B, Lin, D]: an encoder-decoder target's encoder output of the
    inputs, computed once per decode call for a draft that reads the target
    (None for the others, which ignore it).
    """
    raise NotImplementedError

  def prefill(
    self,
    cache: PyTree,
    prompt_block: Array,
    prompt_lengths: Array,
    features: Optional[Array] = None,
  ) -> PyTree:
    """The state after each row's decoder prompt, written in one block call.

    `prompt_block` int32 [BN, W]: positions 0..W-1 of the decoder input (BOS,
    prompt tokens at 1..P, anything after); `prompt_lengths` int32 [BN], P;
    `features` [BN, W, Df]: the target's features of the block when the
    draft reads them (`feature_layers`), else None. Afterwards the draft
    behaves as if it had fed positions < P, so that a rollout from position P
    proposes what follows the prompt. Stateless drafts return `cache` (they
    read the prompt from `sequences`).
    """
    raise NotImplementedError

  def propose(
    self,
    cache: PyTree,
    sequences: Array,
    positions: Array,
    rng: Array,
    *,
    gamma: int,
    temperature,
    topk: int,
    topp,
    draft_threshold: float,
    active: Optional[Array] = None,
    logit_callback: Optional[Callable[..., Array]] = None,
  ) -> Tuple[Array, Optional[Array], Optional[Array], PyTree]:
    """Proposes up to gamma tokens per row: (tokens, probs, num_drafted, new cache).

    `sequences` int32 [BN, Ls]: `sequences[b, positions[b]]` is row b's last
    emitted token (index 0 is BOS; see `decoding`), `positions` int32 [BN].
    `tokens` int32 [BN, gamma]; `probs` float32 [BN, gamma, V] are the
    standardized distributions the tokens were sampled from (at these
    sampling settings), or None when the draft is deterministic (its q is
    one-hot at the proposed token). `num_drafted` int32 [BN] counts each
    row's drafted tokens (tokens and probs past it are 0 and are not
    judged), or None for all gamma: a draft that supports `draft_threshold`
    stops a row after a token it gave probability below it (see
    `rollout_loop`); `active` bool [BN] marks the rows whose proposals are
    judged (None: all), so that ended rows do not keep a rollout going.

    `logit_callback(logits [BN, V], i, drafted [BN, gamma]) -> logits` (T5X's
    `logit_callback_fn`, None without one): for the draft to apply to its
    logits of rollout step i before standardizing them (`drafted`: the
    tokens drafted before step i, zeros from i on; see `rollout_loop`), so
    that q follows the callback as p does. A deterministic draft may ignore
    it: exactness needs only that `probs` are what the tokens were drawn from.
    """
    raise NotImplementedError

  def propose_tree(
    self,
    cache: PyTree,
    sequences: Array,
    positions: Array,
    rng: Array,
    *,
    tree: tree_lib.Tree,
    temperature,
    topk: int,
    topp,
    logit_callback: Optional[Callable[..., Array]] = None,
  ) -> Tuple[Array, Array, Optional[Array], PyTree]:
    """A token tree of N nodes per row: (node_tokens, node_valid, node_probs, new cache).

    node_tokens int32 [BN, N] (node 0 the row's last emitted token),
    node_valid bool [BN, N], node_probs float32 [BN, N, V] the q each node's
    children were drawn from, or None (see `tree_rollout`); with a logit
    callback, `logit_callback(logits, node, node_tokens [BN, N])`. Drafts
    that rank candidates by probability (model, n-gram, feature) have one;
    the default refuses.
    """
    del cache, sequences, positions, rng, temperature, topk, topp, logit_callback
    raise ValueError(
      f'A token tree ({tree}) needs a draft that ranks its candidates by probability (a '
      f'model, n-gram or feature draft); a {type(self).__name__} proposes one continuation. '
      'Pass tree=None.'
    )

  def after_verify(
    self,
    cache: PyTree,
    features: Optional[Array],
    emitted: Array,
    positions: Array,
    num_accepted: Array,
    path: Optional[Array] = None,
  ) -> PyTree:
    """The state after the target judged the block: what the draft keeps of it.

    `positions` int32 [BN]: each row's position before the block;
    `num_accepted` int32 [BN] the draft tokens accepted; `emitted` int32
    [BN, D + 1] the accepted tokens, then the target's next token. For a
    chain `path` is None; after a tree it is the accepted path int32
    [BN, D + 1] of node ids from the root (`tree.verify_tree`), and the draft
    moves the path's state to consecutive positions. `features`: the
    target's features of the block's nodes [BN, N, Df] for a draft that
    reads them, else None. The default keeps the state as it is (a model
    draft's chain state is made whole by its next `propose`).
    """
    del features, emitted, positions, num_accepted, path
    return cache


def rollout_loop(
  step: Callable[[PyTree, Array], Tuple[Array, PyTree]],
  carry: PyTree,
  last_token: Array,
  rng: Array,
  *,
  vocab_size: int,
  gamma: int,
  temperature,
  topk: int,
  topp,
  draft_threshold: float,
  active: Optional[Array] = None,
  logit_callback: Optional[Callable[[Array, Array, Array], Array]] = None,
) -> Tuple[Array, Array, Array, PyTree]:
  """Samples up to gamma draft tokens per row, stopping rows that become unsure.

  Step i feeds each row's current token (first `last_token` int32 [BN]) to
  `step(carry, tokens) -> (logits [BN, V], carry)` and samples token i + 1
  from the standardized logits. With `draft_threshold` > 0 a row stops after
  a token whose probability under the draft's own softmax (its logits at
  temperature 1, before top-k/top-p, so that greedy decoding has a
  confidence too) is below the threshold; that token is still proposed, so
  an active row drafts 1..gamma tokens. The `lax.while_loop` ends when every
  active row has stopped (rows with `active` False stop before the first
  step and draft 0), so the saved steps cost nothing. Stopping depends only
  on the draft's own tokens, which keeps verification exact (see
  `speculative_sampling.verify`). The rng of step i is
  `jax.random.split(rng, gamma)[i]` whatever the threshold.

  `logit_callback(logits [BN, V], i, tokens [BN, gamma]) -> logits`, if
  given, rewrites step i's logits before anything reads them (`tokens`: the
  draft tokens so far, zeros from i on); see `Draft.propose`.

  Returns:
    (tokens int32 [BN, gamma], probs float32 [BN, gamma, V], num_drafted
    int32 [BN], the final carry); tokens and probs are 0 past a row's count.
    `step` runs `max(num_drafted)` times; a stopped row keeps being fed
    (the batch moves together) but its later samples are discarded.
  """
  keys = jax.random.split(rng, gamma)
  batch = last_token.shape[0]
  drafting = jnp.ones((batch,), bool) if active is None else jnp.asarray(active, bool)

  def body(state):
    i, token, drafting, num_drafted, carry, tokens, probs = state
    logits, carry = step(carry, token)
    if logit_callback is not None:
      logits = logit_callback(logits, i, tokens)
    token, step_probs = sampling.sample_logits(keys[i], logits, temperature, topk, topp)
    tokens = tokens.at[:, i].set(jnp.where(drafting, token, 0))
    probs = probs.at[:, i].set(jnp.where(drafting[:, None], step_probs, 0.0))
    num_drafted = num_drafted + drafting
    if draft_threshold > 0:
      log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
      confidence = jnp.exp(jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0])
      drafting &= confidence >= draft_threshold
    return i + 1, token, drafting, num_drafted, carry, tokens, probs

  state = (
    jnp.zeros((), jnp.int32),
    last_token,
    drafting,
    jnp.zeros((batch,), jnp.int32),
    carry,
    jnp.zeros((batch, gamma), jnp.int32),
    jnp.zeros((batch, gamma, vocab_size), jnp.float32),
  )
  _, _, _, num_drafted, carry, tokens, probs = lax.while_loop(
    lambda state: (state[0] < gamma) & jnp.any(state[2]), body, state
  )
  return tokens, probs, num_drafted, carry


def tree_rollout(
  step_level: Callable[[PyTree, Array, int], Tuple[Array, PyTree]],
  carry: PyTree,
  root_token: Array,
  rng: Array,
  *,
  tree: tree_lib.Tree,
  vocab_size: int,
  temperature,
  topk: int,
  topp,
  logit_callback: Optional[Callable[[Array, int, Array], Array]] = None,
) -> Tuple[Array, Array, Array, PyTree]:
  """Drafts every node of a static token tree, one batched step per depth.

  Level d's nodes (node 0, the root `root_token` int32 [BN], at d = 0) are fed
  together: `step_level(carry, tokens [BN, w], first_node) -> (logits
  [BN, w, V], carry)`, where `first_node` is the level's first node id (a
  model draft writes node i's key/value at tree slot i). Each fed node's
  children are drawn without replacement from its standardized q
  (`tree.draw_children`: Gumbel-top-k, or the k most likely when greedy, ranked
  by the draft's own logits), in the order of their sibling ranks. The
  deepest level is never fed. The rng of level d is `split(rng, D)[d]`.
  `logit_callback(logits [BN, V], node, node_tokens [BN, N]) -> logits`, if
  given, rewrites each fed node's logits first (node: its static id;
  node_tokens: those drafted so far, zeros below the node's level).

  Returns:
    (node_tokens int32 [BN, N] with node 0 the root, node_valid bool [BN, N]
    (False for a child drawn past q's support, e.g. under top-k; the root is
    True), node_probs float32 [BN, N, V] (the standardized q each node's
    children were drawn from; 0 for the deepest level), the final carry).
  """
  batch = root_token.shape[0]
  greedy = sampling.is_greedy(temperature, topk)
  keys = jax.random.split(rng, tree.max_depth)
  node_tokens = jnp.zeros((batch, tree.num_nodes), jnp.int32).at[:, 0].set(root_token)
  node_valid = jnp.zeros((batch, tree.num_nodes), bool).at[:, 0].set(True)
  node_probs = jnp.zeros((batch, tree.num_nodes, vocab_size), jnp.float32)
  for depth in range(tree.max_depth):
    start, stop = tree.levels[depth]
    child_start, child_stop = tree.levels[depth + 1]
    logits, carry = step_level(carry, node_tokens[:, start:stop], start)
    if logit_callback is not None:
      logits = jnp.stack(
        [logit_callback(logits[:, i], start + i, node_tokens) for i in range(stop - start)], axis=1
      )
    probs = sampling.standardize(logits, temperature=temperature, topk=topk, topp=topp)
    node_probs = node_probs.at[:, start:stop].set(probs)
    width, max_children = stop - start, int(tree.num_children[start:stop].max())
    # Greedy q is one-hot: its children are ranked by the draft's own logits.
    ranked = jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if greedy else probs
    drawn, valid = tree_lib.draw_children(
      keys[depth], ranked.reshape(batch * width, vocab_size), max_children, greedy=greedy
    )
    # Level d + 1 in node order: child c is rank ranks[c] of parent parents[c].
    children = np.arange(child_start, child_stop)
    flat = (np.asarray(tree.parents)[children] - start) * max_children + tree.ranks[children]
    drawn, valid = drawn.reshape(batch, -1)[:, flat], valid.reshape(batch, -1)[:, flat]
    node_tokens = node_tokens.at[:, child_start:child_stop].set(drawn)
    node_valid = node_valid.at[:, child_start:child_stop].set(
      valid & node_valid[:, tree.parents[child_start:child_stop]]
    )
  return node_tokens, node_valid, node_probs, carry


def check_shared_vocabulary(draft_vocab_size: int, target_vocab_size: int) -> None:
  """Raises ValueError unless draft and target have the same vocabulary size."""
  if draft_vocab_size != target_vocab_size:
    raise ValueError(
      f'The draft has vocabulary size {draft_vocab_size} but the target has '
      f'{target_vocab_size}: speculative decoding needs one shared vocabulary.'
    )


# ------------------------------------------------------------------------------
# A smaller network of this project.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class ModelDraft(Draft):
  """A draft network (`network.Transformer`) with its own encoder pass.

  Attributes:
    params: the draft's parameter tree.
    config: its `network.T5Config` or `network.DecoderOnlyConfig` (static).
    inputs_bidirectional_attention: a prefix-LM decoder-only draft, whose
      prompt positions attend to each other (static; see `prefill`).
  """

  params: PyTree
  config: Any = flax.struct.field(pytree_node=False)
  inputs_bidirectional_attention: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init_cache(self, encoder_input_tokens: Array, cache_length: int, encoded=None) -> PyTree:
    """Encodes the inputs (if the draft has an encoder); returns its state [B, ...].

    `{'decoder': the network's decoder cache, 'written_until': int32 [B]}`:
    row b's cached keys/values are those of its tokens at positions
    < written_until[b] (entries at later positions are stale or unwritten).
    The draft encodes the inputs itself (`encoded` is the target's).
    """
    del encoded
    return {
      'decoder': network.init_decoder_cache(
        self.config, self.params, encoder_input_tokens, cache_length
      ),
      'written_until': jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32),
    }

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    """Writes the keys/values of the prompt block (see `Draft.prefill`)."""
    decoder_cache = network.prefill_decoder_cache(
      self.config,
      self.params,
      cache['decoder'],
      prompt_block,
      prompt_lengths,
      bidirectional=self.inputs_bidirectional_attention,
    )
    return {'decoder': decoder_cache, 'written_until': prompt_lengths.astype(jnp.int32)}

  def decode_step(self, decoder_cache, tokens, positions):
    """One single-token cached step: (logits [BN, V], new decoder cache).

    tokens: int32 [BN], the decoder inputs at positions int32 [BN].
    """
    logits, decoder_cache = network.apply_decode_block(
      self.config, self.params, decoder_cache, tokens[:, None], positions
    )
    return logits[:, 0], decoder_cache

  def catch_up(self, cache, sequences, positions):
    """Writes the one key/value a row may lack before `positions`; returns the cache.

    A rollout that drafts n tokens feeds the tokens at positions p..p+n-1,
    so when an iteration accepts all n the next one starts at p + n + 1 and
    the last draft token, at p + n, was never fed. Rows in that state
    (positions > written_until; the decode loop never leaves a larger gap)
    feed it now, in one single-token step, skipped entirely (`lax.cond`) when
    no row needs it. Other rows write their token at `positions` instead,
    which the rollout's first step overwrites.
    """
    missing = positions > cache['written_until']

    def feed_missing(decoder_cache):
      start = jnp.where(missing, positions - 1, positions)
      tokens = jnp.take_along_axis(sequences, start[:, None], axis=1)[:, 0]
      return self.decode_step(decoder_cache, tokens, start)[1]

    decoder_cache = lax.cond(jnp.any(missing), feed_missing, lambda c: c, cache['decoder'])
    return {
      'decoder': decoder_cache,
      'written_until': jnp.maximum(cache['written_until'], positions),
    }

  def rollout(
    self,
    cache,
    sequences,
    positions,
    rng,
    *,
    gamma,
    temperature,
    topk,
    topp,
    draft_threshold,
    active=None,
    logit_callback=None,
  ):
    """Up to gamma single-token steps from each row's last token (see `rollout_loop`).

    Step i feeds the token at position p + i (first the row's last emitted
    token) and samples draft token i + 1 from its standardized distribution.
    Assumes every key/value before `positions` is written (see `catch_up`).
    Returns (tokens, probs, num_drafted, cache); row b's keys/values are then
    valid below p + num_drafted[b] (those fed for its drafted tokens).
    """
    last_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]

    def step(carry, token):
      position, decoder_cache = carry
      logits, decoder_cache = self.decode_step(decoder_cache, token, position)
      return logits, (position + 1, decoder_cache)

    tokens, probs, num_drafted, (_, decoder_cache) = rollout_loop(
      step,
      (positions, cache['decoder']),
      last_token,
      rng,
      vocab_size=self.vocab_size,
      gamma=gamma,
      temperature=temperature,
      topk=topk,
      topp=topp,
      draft_threshold=draft_threshold,
      active=active,
      logit_callback=logit_callback,
    )
    cache = {'decoder': decoder_cache, 'written_until': positions + num_drafted}
    return tokens, probs, num_drafted, cache

  def propose(self, cache, sequences, positions, rng, **rollout_args):
    """Rolls the draft out from each row's position (see `catch_up`, `rollout`)."""
    cache = self.catch_up(cache, sequences, positions)
    return self.rollout(cache, sequences, positions, rng, **rollout_args)

  def propose_tree(self, cache, sequences, positions, rng, *, tree, **sample_args):
    """Drafts a token tree from each row's position (see `tree_rollout`).

    Level d is one tree-masked block call at the row's position
    (`network.apply_decode_block(..., tree=tree, first_node=...)`): node i's
    key/value goes to slot positions + i, which `after_verify` rearranges once
    the target has judged the tree. Afterwards `written_until` is the
    position: only the context is known to be in place until then.
    """
    cache = self.catch_up(cache, sequences, positions)
    root_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]

    def step_level(decoder_cache, tokens, first_node):
      return network.apply_decode_block(
        self.config, self.params, decoder_cache, tokens, positions, tree=tree, first_node=first_node
      )

    node_tokens, node_valid, node_probs, decoder_cache = tree_rollout(
      step_level,
      cache['decoder'],
      root_token,
      rng,
      tree=tree,
      vocab_size=self.vocab_size,
      **sample_args,
    )
    return (
      node_tokens,
      node_valid,
      node_probs,
      {'decoder': decoder_cache, 'written_until': positions},
    )

  def after_verify(self, cache, features, emitted, positions, num_accepted, path=None):
    """After a tree, moves the accepted path's keys/values to consecutive positions.

    path int32 [BN, D + 1], the accepted nodes from the root, num_accepted
    int32 [BN] their count past it (`tree.verify_tree`). The draft fed every
    node above the deepest level, so the root and the path's first
    min(num_accepted, D - 1) nodes are in place afterwards; a path of D ends
    at a leaf, whose key/value `catch_up` feeds next. After a chain the state
    stays: `catch_up` feeds the one token it lacks.
    """
    del features, emitted
    if path is None:
      return cache
    decoder_cache = network.compact_tree_path(self.config, cache['decoder'], positions, path)
    depth = path.shape[1] - 1
    return {
      'decoder': decoder_cache,
      'written_until': positions + jnp.minimum(num_accepted + 1, depth),
    }


# ------------------------------------------------------------------------------
# A head that reads the target's features (EAGLE-style).
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class FeatureDraft(Draft):
  """Drafts with a `feature_head.FeatureHead` from the target's own features.

  The head's state per row (`init_cache`): its block cache ('head', keys and
  values by position, as a model draft's), and the head's output at the
  row's last true position ('feature' float32 [B, Df], its predicted
  feature; 'logits' float32 [B, V], the first draft token's logits), or
  before any, its start state (`feature_head.FeatureHead.start`). The
  loop keeps them true (see `after_verify`): after each verification, the head is
  rerun over the block with the target's true features at the row's
  accepted positions, overwriting whatever the rollout wrote there from its
  own guesses. A rollout then samples draft token 1 from 'logits' (the
  true feature of the last accepted token and the embedding of the token
  after it), and each later token from the head fed its own predicted
  feature (EAGLE-1). A token tree (`propose_tree`) expands each depth's
  frontier in one tree-masked head call; after the target judges it,
  `after_verify` rewrites the head's entries over the accepted path.

  Attributes:
    params: the head's parameters: a plain tree, or with `packed()` their
      `kernels.PackedParams` for the CPU kernel.
    target_params: the target's parameters, read frozen (its embedding, and
      its final norm and logits layer with output 'target').
    config: the head's `feature_head.FeatureHeadConfig` (static).
    target_config: the target's network config (static).
  """

  params: PyTree
  target_params: PyTree
  config: feature_head.FeatureHeadConfig = flax.struct.field(pytree_node=False)
  target_config: Any = flax.struct.field(pytree_node=False)

  def __post_init__(self):
    feature_head.check_target(self.config, self.target_config)

  @classmethod
  def for_target(cls, target: Any, params: PyTree, config: feature_head.FeatureHeadConfig):
    """The head `params` of `config` for a `models.Model` target, shapes checked."""
    feature_head.check_params(config, params)
    return cls(params, target.params, config, target.config)

  def packed(self) -> 'FeatureDraft':
    """This head with every dense layer on the CPU kernel (`kernels.pack_params`), as decode calls run it.

    The head's layers all run per draft step or per judged block, a few rows
    at a time: XLA's dot streams a small-M matmul at a fraction of the
    kernel's rate on the CPU (see `kernels`). Itself where the kernel is off
    (another backend, no compiler, switched off) or the params are packed.
    """
    if isinstance(self.params, kernels.PackedParams):
      return self
    return self.replace(params=self._packed_params)

  @functools.cached_property
  def _packed_params(self) -> PyTree:
    # Packed once per head, as `models.Model.decode_params` is per model: every
    # `generate` call asks for it.
    return kernels.pack_params(self.config, self.params, scope=None)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def feature_layers(self):
    return self.config.feature_layers

  def init_cache(
    self, encoder_input_tokens: Array, cache_length: int, encoded: Optional[Array] = None
  ) -> PyTree:
    """The head's state for B rows before any true feature (see the class docstring).

    An empty block cache, and the head's start state
    (`feature_head.start_state`): a row without a prompt drafts its first
    tokens from it. `encoded` [B, Lin, D]: for an encoder-decoder target,
    the target's encoder output of `encoder_input_tokens` (`network.encode`),
    which the head's cross-attention reads; the decode call computes it once
    for both (`models.speculative_decode`). Ignored for a decoder-only target.
    """
    batch = encoder_input_tokens.shape[0]
    encoder_mask = None
    if self.config.cross_attention:
      expected = encoder_input_tokens.shape + (self.config.target_emb_dim,)
      if encoded is None or tuple(encoded.shape) != expected:
        raise ValueError(
          "A feature head for an encoder-decoder target reads the target's encoder output: "
          f'pass encoded={expected} (network.encode of the target on the inputs, as '
          'models.speculative_decode does); got '
          f'{None if encoded is None else tuple(encoded.shape)}.'
        )
      encoder_mask = encoder_input_tokens > 0
    else:
      encoded = None
    head_cache = feature_head.init_cache(
      self.config, self.params, batch, cache_length, encoded, encoder_mask
    )
    predicted, hidden = feature_head.start_state(
      self.config, self.params, batch, encoded, encoder_mask
    )
    return self._last_outputs(head_cache, predicted, hidden)

  def _logits(self, predicted, hidden):
    return feature_head.logits(
      self.config, self.params, self.target_config, self.target_params, predicted, hidden
    )

  def _head_block(self, head_cache, features, next_tokens, start_positions, **tree_args):
    """The head over k entries per row: ((predicted [BN, k, Df], hidden), cache).

    A chain block, or with `tree=` and `first_node=` a tree level (see
    `feature_head.apply_block`).
    """
    next_embedded = network.embed_tokens(self.target_config, self.target_params, next_tokens)
    return feature_head.apply_block(
      self.config, self.params, head_cache, features, next_embedded, start_positions, **tree_args
    )

  def after_verify(self, cache, features, emitted, positions, num_accepted, path=None):
    """Rewrites each row's head cache over its accepted positions with the true features.

    After a tree, `features` [BN, N, Df] are the target's at every node of its
    tree call, gathered here in path order (`path` int32 [BN, D + 1] as
    `tree.verify_tree`'s); the rewrite covers the row's positions p..p+D:
    everything the next tree (rooted at slot p + num_accepted) sees as
    context; the guesses left in later slots are overwritten by that tree
    before it reads them. After a chain, one head call over the block at the rows' positions p (as the target's):
    entry j (position p + j) reads the target's true feature there,
    `features` [BN, k, Df], and the embedding of the token at p + j + 1,
    `emitted` int32 [BN, k] (the accepted draft tokens, then the target's
    next token). Entries j <= num_accepted [BN] are the row's
    true positions; later ones are masked until overwritten. The head's
    output at entry num_accepted, the row's new last true position, gives
    the next rollout's first draft token. Returns the new cache.
    """
    if path is not None:
      features = jnp.take_along_axis(features, path[:, :, None], axis=1)
    (predicted, hidden), head_cache = self._head_block(cache['head'], features, emitted, positions)
    take = lambda x: jnp.take_along_axis(x, num_accepted[:, None, None], axis=1)[:, 0]
    return self._last_outputs(head_cache, take(predicted), take(hidden))

  def _last_outputs(self, head_cache, predicted, hidden):
    """The state with the head's outputs at each row's last true position [BN, ...]."""
    return {
      'head': head_cache,
      'feature': predicted.astype(jnp.float32),
      'logits': self._logits(predicted, hidden).astype(jnp.float32),
    }

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    """Writes the head's entries of each row's prompt positions 0..P-1 (see `Draft.prefill`).

    `features` [BN, W, Df]: the target's features of `prompt_block` [BN, W]
    (from its prefill call: `network.prefill_decoder_cache(...,
    feature_layers=...)` or the target's block call). A row without a prompt
    (P = 0) keeps the start state.
    """
    if features is None:
      raise ValueError(
        "A FeatureDraft's prefill reads the target's features of the prompt "
        '(features=[batch, width, feature width]); decoding.speculative_sample and '
        'models.speculative_decode pass them.'
      )
    next_tokens = jnp.pad(prompt_block[:, 1:], ((0, 0), (0, 1)))
    (predicted, hidden), head_cache = self._head_block(
      cache['head'], features, next_tokens, jnp.zeros_like(prompt_lengths)
    )
    last = jnp.maximum(prompt_lengths - 1, 0)
    take = lambda x: jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
    state = self._last_outputs(head_cache, take(predicted), take(hidden))
    has_prompt = prompt_lengths > 0
    for name in ('feature', 'logits'):
      state[name] = jnp.where(has_prompt[:, None], state[name], cache[name])
    return state

  def propose(self, cache, sequences, positions, rng, **rollout_args):
    """Up to gamma tokens per row (see `rollout_loop`); returns (tokens, probs, num_drafted, cache).

    Step 1 samples from the state's 'logits'; step i > 1 runs the head one
    position on (p + i - 2, first the row's position p) with the previous
    step's predicted feature and the embedding of the token just drafted.
    The head's entries at p.. are guesses; `after_verify` rewrites them.
    """
    last_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]

    def step(carry, token):
      i, feature, logits, position, head_cache = carry

      def advance(operands):
        feature, _, position, head_cache = operands
        (predicted, hidden), head_cache = self._head_block(
          head_cache, feature[:, None], token[:, None], position
        )
        state = self._last_outputs(head_cache, predicted[:, 0], hidden[:, 0])
        return state['feature'], state['logits'], position + 1, state['head']

      # Step 1's logits are the state's (the head already read the last token).
      feature, logits, position, head_cache = lax.cond(
        i > 0, advance, lambda operands: operands, (feature, logits, position, head_cache)
      )
      return logits, (i + 1, feature, logits, position, head_cache)

    carry = (jnp.zeros((), jnp.int32), cache['feature'], cache['logits'], positions, cache['head'])
    tokens, probs, num_drafted, carry = rollout_loop(
      step, carry, last_token, rng, vocab_size=self.vocab_size, **rollout_args
    )
    return tokens, probs, num_drafted, dict(cache, head=carry[-1])

  def propose_tree(self, cache, sequences, positions, rng, *, tree, **sample_args):
    """Drafts a token tree from each row's position (see `tree_rollout`).

    As a chain's rollout, node i's head entry reads its parent's predicted
    feature and the embedding of its own token, and sits one position before
    the node (at the parent's depth): the root's children are drawn from the
    state's 'logits' (no head call), and each deeper level is one
    tree-masked head call whose slots are those of the tree rooted at slot
    p - 1, the row's last true entry (node i at p - 1 + i). Those entries are
    guesses; `after_verify`, over the accepted path, rewrites them.
    """
    root_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]
    batch = positions.shape[0]
    # Each fed node's predicted feature (the root's: the state's), read by its children.
    node_features = jnp.zeros((batch, tree.num_nodes, self.config.feature_width), jnp.float32)
    node_features = node_features.at[:, 0].set(cache['feature'])

    def step_level(carry, tokens, first_node):
      node_features, head_cache = carry
      if first_node == 0:  # The root: its children's logits are the state's.
        return cache['logits'][:, None], carry
      nodes = np.arange(first_node, first_node + tokens.shape[1])
      (predicted, hidden), head_cache = self._head_block(
        head_cache,
        node_features[:, np.asarray(tree.parents)[nodes]],
        tokens,
        positions - 1,
        tree=tree,
        first_node=first_node,
      )
      node_features = node_features.at[:, nodes].set(predicted.astype(jnp.float32))
      logits = self._logits(predicted, hidden).astype(jnp.float32)
      return logits, (node_features, head_cache)

    node_tokens, node_valid, node_probs, (_, head_cache) = tree_rollout(
      step_level,
      (node_features, cache['head']),
      root_token,
      rng,
      tree=tree,
      vocab_size=self.vocab_size,
      **sample_args,
    )
    return node_tokens, node_valid, node_probs, dict(cache, head=head_cache)


# ------------------------------------------------------------------------------
# Unigram and bigram tables (the paper's Table 3 baselines; c ~ 0).
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class NgramDraft(Draft):
  """An add-k smoothed unigram (order 1) or bigram (order 2) model.

  The bigram is stored sparsely so that a 32k vocabulary needs no V x V
  table: for every context token, its `max_continuations` most frequent
  continuations and their counts. The draft distribution is

    q(x | prev) = (add_k + count(prev, x)) / (context_total(prev) + add_k * V)

  where counts beyond the kept continuations are dropped from both numerator
  and `context_total`, so q is always a proper distribution and it is exactly
  the distribution the tokens are sampled from. For order 1, `next_ids` is
  [1, V] (every token) and the context is ignored.

  Attributes:
    next_ids: int32 [C, K] continuation ids per context (C = V, or 1).
    next_counts: float32 [C, K] their counts (0 for unused slots).
    context_totals: float32 [C] the sum of kept counts per context.
    add_k: smoothing mass per token (static).
    order: 1 or 2 (static).
    vocab_size: V (static).
  """

  next_ids: Array
  next_counts: Array
  context_totals: Array
  add_k: float = flax.struct.field(pytree_node=False)
  order: int = flax.struct.field(pytree_node=False)
  vocab_size: int = flax.struct.field(pytree_node=False)

  @classmethod
  def fit(
    cls,
    token_sequences: Iterable[np.ndarray],
    vocab_size: int,
    order: int = 2,
    add_k: float = 0.1,
    max_continuations: int = 64,
  ) -> 'NgramDraft':
    """Counts n-grams over target-side token sequences.

    Args:
      token_sequences: 1-D integer arrays, each a target sequence without BOS
        (as seqio's `targets` feature: tokens then EOS). BOS (0) is prepended
        so the first token is conditioned on BOS, as in decoding.
      vocab_size: V, the target's vocabulary size.
      order: 1 (unigram) or 2 (bigram).
      add_k: add-k smoothing, > 0 so that every token has q > 0.
      max_continuations: K, continuations kept per context (bigram only).
    """
    if order not in (1, 2):
      raise ValueError(f'order must be 1 (unigram) or 2 (bigram); got {order}.')
    if add_k <= 0:
      raise ValueError(f'add_k must be > 0 so that q covers every token; got {add_k}.')
    pairs = []
    for tokens in token_sequences:
      tokens = np.asarray(tokens, dtype=np.int64)
      tokens = tokens[tokens != 0]
      if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(
          f'Token ids must lie in [0, {vocab_size}); got min {tokens.min()}, '
          f'max {tokens.max()}. Is vocab_size the target vocabulary size?'
        )
      contexts = np.zeros_like(tokens) if order == 1 else np.concatenate([[0], tokens[:-1]])
      pairs.append(contexts * vocab_size + tokens)
    values, counts = np.unique(np.concatenate(pairs or [np.zeros(0, np.int64)]), return_counts=True)
    contexts, tokens = values // vocab_size, values % vocab_size
    if order == 1:
      next_ids = np.arange(vocab_size, dtype=np.int32)[None]
      next_counts = np.zeros((1, vocab_size), np.float32)
      next_counts[0, tokens] = counts
    else:
      # Rank continuations within each context by count (ties: lower id first).
      ranked = np.lexsort((tokens, -counts, contexts))
      contexts, tokens, counts = contexts[ranked], tokens[ranked], counts[ranked]
      group_start = np.searchsorted(contexts, contexts, side='left')
      rank = np.arange(contexts.size) - group_start
      kept = rank < max_continuations
      next_ids = np.zeros((vocab_size, max_continuations), np.int32)
      next_counts = np.zeros((vocab_size, max_continuations), np.float32)
      next_ids[contexts[kept], rank[kept]] = tokens[kept]
      next_counts[contexts[kept], rank[kept]] = counts[kept]
    return cls(
      next_ids=jnp.asarray(next_ids),
      next_counts=jnp.asarray(next_counts),
      context_totals=jnp.asarray(next_counts.sum(axis=1)),
      add_k=float(add_k),
      order=order,
      vocab_size=vocab_size,
    )

  def log_probs(self, previous_tokens: Array) -> Array:
    """float32 [BN, V]: log q(. | previous token) for previous_tokens [BN]."""
    context = jnp.zeros_like(previous_tokens) if self.order == 1 else previous_tokens
    denominator = self.context_totals[context] + self.add_k * self.vocab_size  # [BN]
    rows = jnp.arange(previous_tokens.shape[0])[:, None]
    counts = jnp.zeros((previous_tokens.shape[0], self.vocab_size), jnp.float32)
    counts = counts.at[rows, self.next_ids[context]].add(self.next_counts[context])
    return jnp.log((counts + self.add_k) / denominator[:, None])

  def init_cache(self, encoder_input_tokens: Array, cache_length: int, encoded=None) -> PyTree:
    del encoder_input_tokens, cache_length, encoded  # An n-gram keeps no per-row state.
    return {}

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    del prompt_block, prompt_lengths, features  # The context is the last token of `sequences`.
    return cache

  def propose(self, cache, sequences, positions, rng, **rollout_args):
    """Samples from q(. | previous token) step by step (see `rollout_loop`)."""
    last_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]
    tokens, probs, num_drafted, _ = rollout_loop(
      lambda carry, token: (self.log_probs(token), carry),
      (),
      last_token,
      rng,
      vocab_size=self.vocab_size,
      **rollout_args,
    )
    return tokens, probs, num_drafted, cache

  def propose_tree(self, cache, sequences, positions, rng, *, tree, **sample_args):
    """Drafts a token tree from q(. | each node's token) (see `tree_rollout`)."""
    root_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]
    level_log_probs = lambda carry, tokens, first_node: (
      self.log_probs(tokens.reshape(-1)).reshape(tokens.shape + (self.vocab_size,)),
      carry,
    )
    node_tokens, node_valid, node_probs, _ = tree_rollout(
      level_log_probs, (), root_token, rng, tree=tree, vocab_size=self.vocab_size, **sample_args
    )
    return node_tokens, node_valid, node_probs, cache


# ------------------------------------------------------------------------------
# Prompt lookup: copy a continuation from the input or the generated prefix.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class PromptLookupDraft(Draft):
  """Copies what followed the longest recent match of the last tokens.

  The search space is the encoder input (for a decoder-only pair, the
  prompts given to `init_cache`) followed by the decoder's sequence: its
  prompt, if any, then the generated tokens. For the last `max_ngram` tokens
  of that sequence, every earlier place where the
  longest suffix (at least one token) occurs is a candidate; the most recent
  candidate with the longest match wins, and the gamma tokens that followed it
  are proposed (zeros past the known tokens). Without any match it proposes
  zeros (PAD), which the target rejects at no extra cost. Deterministic, so q
  is one-hot at the proposal (`probs` is None).

  Attributes:
    vocab_size: the target's vocabulary size (static; token ids must be below it).
    max_ngram: the longest suffix matched (static).
  """

  vocab_size: int = flax.struct.field(pytree_node=False)
  max_ngram: int = flax.struct.field(pytree_node=False, default=3)

  def init_cache(self, encoder_input_tokens: Array, cache_length: int, encoded=None) -> PyTree:
    del cache_length, encoded
    return {'input_tokens': encoder_input_tokens.astype(jnp.int32)}

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    del prompt_block, prompt_lengths, features  # The search reads the prompt from `sequences`.
    return cache

  def propose(
    self,
    cache,
    sequences,
    positions,
    rng,
    *,
    gamma,
    temperature,
    topk,
    topp,
    draft_threshold,
    active=None,
    logit_callback=None,
  ):
    """Copies gamma tokens per row; no adaptive length (num_drafted None)."""
    # Deterministic whatever the sampling mode (a logit callback included: the
    # target's p alone decides what is kept); no confidence to threshold.
    del rng, temperature, topk, topp, draft_threshold, active, logit_callback
    input_tokens = cache['input_tokens']
    input_len = input_tokens.shape[1]
    # [BN, Lin + Ls]: input, then BOS and the generated tokens.
    context = jnp.concatenate([input_tokens, sequences], axis=1)
    index = jnp.arange(context.shape[1])[None]
    seq_index = index - input_len
    known = jnp.where(
      seq_index < 0, context != 0, (seq_index >= 1) & (seq_index <= positions[:, None])
    )
    # A candidate j proposes context[j:]; its first token must be known (at or
    # before the row's position, or a non-padding input token). Otherwise the
    # end of an input would win whenever the output repeats its last tokens,
    # e.g. after a decoder-only prompt, which is both the input and the
    # sequence's start, and propose padding.
    candidate = known
    match_len = jnp.zeros(context.shape, jnp.int32)
    still_matching = candidate
    for k in range(self.max_ngram):
      suffix_index = input_len + positions - k  # [BN]
      suffix_token = jnp.take_along_axis(context, suffix_index[:, None], axis=1)
      suffix_known = (positions - k >= 1)[:, None]
      shifted = jnp.roll(context, k + 1, axis=1)  # shifted[j] = context[j - k - 1]
      shifted_known = jnp.roll(known, k + 1, axis=1) & (index >= k + 1)
      # Stay inside one region: a match must not straddle input and output.
      same_region = (index - k - 1 >= input_len) == (index >= input_len)
      still_matching &= suffix_known & shifted_known & same_region & (shifted == suffix_token)
      match_len += still_matching
    # Longest match, most recent among equals; no match gives score 0.
    score = jnp.where(match_len > 0, match_len * context.shape[1] + index, 0)
    best = jnp.argmax(score, axis=1)
    has_match = jnp.max(score, axis=1) > 0
    copy_index = best[:, None] + jnp.arange(gamma)[None]
    copy_known = jnp.take_along_axis(known, jnp.minimum(copy_index, context.shape[1] - 1), axis=1)
    tokens = jnp.take_along_axis(context, jnp.minimum(copy_index, context.shape[1] - 1), axis=1)
    tokens = jnp.where(has_match[:, None] & copy_known & (copy_index < context.shape[1]), tokens, 0)
    return tokens.astype(jnp.int32), None, None, cache
