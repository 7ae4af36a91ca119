"""A parallel draft (PARD, An et al. 2025): the whole block of gamma tokens from one network call.

A `drafts.ModelDraft` pays gamma sequential network steps per iteration. A
`ParallelDraft` is a draft network adapted to read mask tokens: its one call
per iteration runs over the true tokens the loop accepted since its last call
(the row's last emitted token among them), then gamma - 1 mask tokens, and
its outputs at the last true token and at the masks are gamma distributions
q_1..q_gamma; x_i is sampled from q_i independently of x_1..x_{i-1}. The
verifier needs nothing else: `probs` are exactly the distributions the
tokens were drawn from, so the output is the target's whatever q is.

Per row of a call at position p (the row's last emitted token), with the
draft's keys/values written below `written_until` = w <= p:

  block index    0 .. p-w        p-w+1 .. 2 gamma - 1
  position       w .. p          p+1 ..
  input          true tokens     the mask (gamma - 1 of them used; the rest
                                 are masks too, whose outputs are not read)
  q_i (i = 1..gamma) is the output at block index p - w + i - 1.

The block has the static width 2 gamma: the loop moves a row at most
gamma + 1 tokens per iteration, so p - w <= gamma. Only true tokens are left
in the cache: the masks' keys/values go to the slots from p + 1 on, which a
row's next call (at start p + 1) overwrites and, until then, masks (a block
attends only to slots before its start and within itself). After a call
`written_until` = p + 1 and the cache below it is what a fresh pass over the
true prefix writes.

The mask is a learned input vector, `mask_embedding` [emb], a field of the
draft next to the network's parameters: it takes no id of the vocabulary
the draft shares with its target (a reserved id would be one the draft can
also propose, and with tied embeddings its logit would move as the mask is
trained), and the network's parameter tree stays T5X's, so an ordinary
draft checkpoint loads unchanged and becomes a parallel draft by adding the
vector (`Model.as_parallel_draft`: the mean of the token embeddings unless
given). `network.apply_decode_block(..., masked=, mask_embedding=)` feeds
it; `network.compute_layout_logits` is the teacher-forced pass that
training (`training.parallel_distill`) runs.

Sampling settings, a logit callback and `draft_threshold` behave as for a
model draft: the logits of the one call are handed to `drafts.rollout_loop`
step by step, which standardizes, samples and stops a row after a token it
gave probability below the threshold (which saves only sampling, not network
time: the one call has run; the rows judged are fewer). Token trees are not
supported (the default `propose_tree` refuses): a parallel draft's q_i does
not depend on the tokens before it, so a tree's siblings would share their
children's distributions.
"""

import functools
from typing import Any, Optional

import flax
import jax
from jax import lax
import jax.numpy as jnp

from speculative_t5x import drafts
from speculative_t5x import kernels
from speculative_t5x import network

PyTree = Any
Array = jax.Array


def mean_token_embedding(params: PyTree) -> Array:
  """float32 [emb]: the mean of the decoder's input token embeddings, a mask's starting point.

  `params` is the network's plain tree (T5X's): an encoder-decoder's shared
  `token_embedder/embedding`, else a decoder-only network's
  `decoder/token_embedder/embedding`. The tree says which, so a checkpoint's
  parameters need no config (T5X's restore, `t5x_adapter.start_distillation`).
  """
  tree = params if 'token_embedder' in params else params['decoder']
  return jnp.mean(jnp.asarray(tree['token_embedder']['embedding'], jnp.float32), axis=0)


@flax.struct.dataclass
class ParallelDraft(drafts.Draft):
  """A draft network that proposes gamma tokens per iteration in one call (see the module docstring).

  Attributes:
    params: the draft network's parameters (T5X's tree), or their
      `kernels.PackedParams` for the CPU kernel.
    mask_embedding: float [emb], the mask token's input vector.
    config: its `network.T5Config` or `network.DecoderOnlyConfig` (static).
    inputs_bidirectional_attention: a prefix-LM decoder-only draft (static;
      see `drafts.ModelDraft.prefill`).
  """

  params: PyTree
  mask_embedding: Array
  config: Any = flax.struct.field(pytree_node=False)
  inputs_bidirectional_attention: bool = flax.struct.field(pytree_node=False, default=False)

  def packed(self) -> 'ParallelDraft':
    """This draft with its network on the CPU kernel (`kernels.pack_params`), as decode calls run it.

    Itself where the kernel is off (another backend, no compiler, switched
    off) or the params are packed. Packed once per draft, as
    `models.Model.decode_params` is per model.
    """
    if isinstance(self.params, kernels.PackedParams):
      return self
    return self.replace(params=self._packed_params)

  @functools.cached_property
  def _packed_params(self) -> PyTree:
    return kernels.pack_params(self.config, self.params)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def _model_draft(self) -> drafts.ModelDraft:
    """The same network as a `drafts.ModelDraft`: its cache and prompt prefill are this draft's."""
    return drafts.ModelDraft(self.params, self.config, self.inputs_bidirectional_attention)

  def init_cache(self, encoder_input_tokens: Array, cache_length: int, encoded=None) -> PyTree:
    """`drafts.ModelDraft.init_cache`: {'decoder': its cache, 'written_until': int32 [B]}."""
    return self._model_draft().init_cache(encoder_input_tokens, cache_length, encoded)

  def prefill(self, cache, prompt_block, prompt_lengths, features=None):
    """Writes the prompt's keys/values (`drafts.ModelDraft.prefill`)."""
    return self._model_draft().prefill(cache, prompt_block, prompt_lengths, features)

  def block_logits(self, cache: PyTree, sequences: Array, positions: Array, gamma: int):
    """The one network call: (logits float32 [BN, gamma, V] of q_1..q_gamma, new cache).

    sequences int32 [BN, Ls], positions int32 [BN] as `propose`'s; the block
    of 2 gamma entries per row starts at min(written_until, positions) (see
    the module docstring). Returns the new cache with written_until =
    positions + 1.
    """
    start = jnp.minimum(cache['written_until'], positions)  # [BN]
    index = start[:, None] + jnp.arange(2 * gamma, dtype=jnp.int32)[None]  # [BN, 2 gamma]
    masked = index > positions[:, None]
    tokens = jnp.take_along_axis(sequences, jnp.minimum(index, sequences.shape[1] - 1), axis=1)
    tokens = jnp.where(masked, 0, tokens)
    # The last layer's outputs, whose logits only the gamma rows read are computed (under jit
    # the block's own logits, unused, are dropped): half the logits layer of the whole block.
    last_layer = network.num_decoder_layers(self.config) - 1
    (_, features), decoder_cache = network.apply_decode_block(
      self.config,
      self.params,
      cache['decoder'],
      tokens,
      start,
      feature_layers=(last_layer,),
      masked=masked,
      mask_embedding=self.mask_embedding,
    )
    # q_i is the output at block index (positions - start) + i - 1.
    offsets = (positions - start)[:, None] + jnp.arange(gamma, dtype=jnp.int32)[None]
    q_features = jnp.take_along_axis(features, offsets[:, :, None], axis=1)  # [BN, gamma, emb]
    q_logits = network.logits_from_features(self.config, self.params, q_features)
    return q_logits.astype(jnp.float32), {'decoder': decoder_cache, 'written_until': positions + 1}

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
    """gamma tokens per row from one network call; returns (tokens, probs, num_drafted, cache).

    `block_logits` gives q_1..q_gamma's logits; `drafts.rollout_loop` samples
    x_i from step i's (after the logit callback, if any), reporting the
    standardized q_i it drew from, and applies `draft_threshold` (see the
    module docstring).
    """
    q_logits, cache = self.block_logits(cache, sequences, positions, gamma)
    last_token = jnp.take_along_axis(sequences, positions[:, None], axis=1)[:, 0]

    def step(i, token):
      del token  # q_i does not depend on the tokens drafted before it.
      return lax.dynamic_index_in_dim(q_logits, i, axis=1, keepdims=False), i + 1

    tokens, probs, num_drafted, _ = drafts.rollout_loop(
      step,
      jnp.zeros((), jnp.int32),
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
    return tokens, probs, num_drafted, cache

  @classmethod
  def of(
    cls,
    config: Any,
    params: PyTree,
    mask_embedding: Optional[Array] = None,
    *,
    inputs_bidirectional_attention: bool = False,
  ) -> 'ParallelDraft':
    """A parallel draft of a network's `params`; the mask the mean token embedding unless given.

    `params` may be `kernels.PackedParams` when `mask_embedding` is given
    (the mean is taken over the plain tree).
    """
    if mask_embedding is None:
      mask_embedding = mean_token_embedding(params)
    mask_embedding = jnp.asarray(mask_embedding)
    if mask_embedding.shape != (config.emb_dim,):
      raise ValueError(
        f"mask_embedding must have shape ({config.emb_dim},), the draft's emb_dim; got "
        f'{mask_embedding.shape}. Leave it None to start from the mean token embedding.'
      )
    return cls(params, mask_embedding, config, inputs_bidirectional_attention)
