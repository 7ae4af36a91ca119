"""The two networks, `Transformer` (T5 1.1 encoder-decoder) and `DecoderOnly`, and `module_for`.

Their methods are T5X's (`encode`, `decode`, `__call__` with `decode=True`
for T5X's cache protocol) plus the block cache's (`init_decoder_cache`,
`prefill`, `decode_block`; see `network.cache` for the pure-function forms).
"""

from typing import Any, Optional, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp

from speculative_t5x import checks
from speculative_t5x.network.config import DecoderOnlyConfig
from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import T5Config
from speculative_t5x.network.layers import Embed
from speculative_t5x.network.masks import make_attention_mask
from speculative_t5x.network.masks import make_decoder_mask
from speculative_t5x.network.stacks import Decoder
from speculative_t5x.network.stacks import Encoder

Array = jax.Array


class Transformer(nn.Module):
  """The T5 1.1 encoder-decoder with T5X's interface plus block-cached decoding."""

  config: T5Config

  def setup(self):
    cfg = self.config
    if not isinstance(cfg, T5Config):
      raise TypeError(
        f'Transformer takes a T5Config, got {type(cfg).__name__}; '
        'network.module_for(config) picks the module for either config.'
      )
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = Encoder(cfg, shared_embedding=self.token_embedder)
    self.decoder = Decoder(cfg, shared_embedding=self.token_embedder)

  def encode(
    self,
    encoder_input_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    enable_dropout: bool = True,
  ) -> Array:
    """Encodes int32 [B, L] tokens (0 is padding) to [B, L, emb] in `dtype`.

    `encoder_segment_ids` int32 [B, L] restrict attention to equal ids (packing).
    """
    if encoder_input_tokens.ndim != 2:
      raise ValueError(
        f'encoder_input_tokens must be [batch, length], got shape {encoder_input_tokens.shape}.'
      )
    valid = encoder_input_tokens > 0
    mask = make_attention_mask(valid, valid)
    if encoder_segment_ids is not None:
      mask &= make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal)
    return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

  def decode(
    self,
    encoded: Array,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    decoder_segment_ids: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
  ) -> Array:
    """Decoder logits, teacher-forced or (decode=True) one T5X-protocol step.

    Args:
      encoded: [B, input_length, emb] from `encode`.
      encoder_input_tokens: int32 [B, input_length], only for the padding mask.
      decoder_input_tokens: int32 [B, L], the targets shifted right (BOS = 0).
      decoder_target_tokens: int32 [B, L]; 0 marks padding (teacher forcing).
      encoder_segment_ids: int32 [B, input_length] packing ids, or None.
      decoder_segment_ids: int32 [B, L] packing ids, or None.
      decoder_positions: unused, as in T5X (relative biases need no positions).
      enable_dropout: enables dropout (needs a 'dropout' rng).
      decode: T5X's cache protocol. The first call, with `mutable=['cache']`
        and decoder_input_tokens [B, max_len], creates a zero cache of max_len
        positions; each later call takes one token [B, 1], writes it at the
        scalar `cache_index`, attends to positions <= it and increments it.
      max_decode_length: accepted for T5X; the cache's length plays its role.

    Returns:
      float32 logits [B, L, vocab].
    """
    del decoder_positions, max_decode_length
    if decode:
      if encoder_segment_ids is not None:
        raise ValueError('Packing is for training: decode=True takes no encoder_segment_ids.')
      decoder_mask = None
      encoder_decoder_mask = make_attention_mask(
        jnp.ones_like(decoder_target_tokens, bool), encoder_input_tokens > 0
      )
    else:
      decoder_mask = make_decoder_mask(decoder_target_tokens, None, decoder_segment_ids)
      encoder_decoder_mask = make_attention_mask(
        decoder_target_tokens > 0, encoder_input_tokens > 0
      )
      if encoder_segment_ids is not None:
        encoder_decoder_mask &= make_attention_mask(
          decoder_segment_ids, encoder_segment_ids, jnp.equal
        )
    return self.decoder(
      decoder_input_tokens,
      decoder_mask,
      encoded=encoded,
      encoder_decoder_mask=encoder_decoder_mask,
      deterministic=not enable_dropout,
      decode=decode,
    )

  def __call__(
    self,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Optional[Array] = None,
    decoder_segment_ids: Optional[Array] = None,
    encoder_positions: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
  ) -> Array:
    """Encodes and decodes; float32 logits [B, L, vocab] (see `encode`, `decode`).

    `encoder_positions` and `decoder_positions` are unused, as in T5X.
    """
    del encoder_positions
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
    return self.decode(
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      decoder_target_tokens,
      encoder_segment_ids,
      decoder_segment_ids,
      decoder_positions,
      enable_dropout,
      decode,
      max_decode_length,
    )

  def layout_logits(
    self,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_positions: Array,
    decoder_visible: Array,
    decoder_masked: Array,
    mask_embedding: Array,
    enable_dropout: bool = True,
  ) -> Array:
    """Encodes, then `Decoder.layout_logits`: float32 [B, T, vocab].

    Decoder tokens [B, T] at `decoder_positions` int32 [B, T], attending
    where `decoder_visible` bool [B, T, T] says, `mask_embedding` [emb] the
    input where `decoder_masked` bool [B, T]; every decoder token attends to
    the non-padding encoder inputs.
    """
    encoded = self.encode(encoder_input_tokens, enable_dropout=enable_dropout)
    encoder_decoder_mask = make_attention_mask(
      jnp.ones_like(decoder_input_tokens, bool), encoder_input_tokens > 0
    )
    return self.decoder.layout_logits(
      decoder_input_tokens,
      decoder_positions,
      decoder_visible,
      decoder_masked,
      mask_embedding,
      encoded=encoded,
      encoder_decoder_mask=encoder_decoder_mask,
      deterministic=not enable_dropout,
    )

  def init_decoder_cache(
    self, encoded: Array, encoder_input_tokens: Array, cache_length: int
  ) -> None:
    """Builds the cache for `decode_block` (apply with mutable=['cache']).

    Allocates zero self-attention keys/values of `cache_length` positions per
    decoder layer, projects each layer's cross-attention keys/values from
    `encoded` once, and stores the encoder padding mask. Size `cache_length`
    for the longest decode plus the largest block (positions start + k - 1 must
    stay below it).

    Args:
      encoded: [B, input_length, emb] from `encode`.
      encoder_input_tokens: int32 [B, input_length]; 0 is padding.
      cache_length: static number of decoder positions.

    Returns:
      None; `apply` returns `(None, {'cache': cache})`.
    """
    if (
      encoded.ndim != 3
      or encoder_input_tokens.shape != encoded.shape[:2]
      or encoded.shape[2] != self.config.emb_dim
    ):
      raise ValueError(
        f'Expected encoded [batch, length, {self.config.emb_dim}] and '
        'encoder_input_tokens [batch, length]; got '
        f'{encoded.shape} and {encoder_input_tokens.shape}.'
      )
    checks.check_positive_int('cache_length', cache_length)
    self.decoder.init_block_cache(
      encoded.shape[0], int(cache_length), encoded, encoder_input_tokens > 0
    )

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool = False,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """Writes the decoder keys/values of a block at positions 0..W-1; no logits.

    Causal, as `decode_block` at start 0 would write them; the next call
    continues at any position <= W. Apply with mutable=['cache'].

    Args:
      block_tokens: int32 [B, W], the decoder inputs (BOS = 0 first).
      prefix_lengths: int32 [B]; unused (the signature is `DecoderOnly.prefill`'s).
      bidirectional: must be False.
      feature_layers: optional static decoder layer indices (`check_feature_layers`).

    Returns:
      None, or with `feature_layers` the block's features [B, W, len * emb]
      (`select_features`); `apply` also returns `{'cache': new_cache}`.
    """
    if bidirectional:
      raise ValueError(
        "T5X's encoder-decoder has no prefix-LM decoder: its decoder attends "
        'causally. Use bidirectional=False (a DecoderOnly network has prefix-LM '
        'prefills).'
      )
    return self.decoder.prefill(block_tokens, prefix_lengths, False, feature_layers)

  def decode_block(
    self,
    block_tokens: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
    feature_layers: Optional[Tuple[int, ...]] = None,
    masked: Optional[Array] = None,
    mask_embedding: Optional[Array] = None,
  ) -> Array | Tuple[Array, Array]:
    """Scores a block of k tokens per row against the cache; updates the cache.

    Chain (tree=None): row b's tokens sit at positions start_positions[b] + j,
    j < k: each attends causally within the block and to the row's cached
    positions before start_positions[b]; cached entries at later positions
    (stale ones from a rolled-back block) are masked. Keys/values of the block
    overwrite the cache there.

    Tree: the tokens are nodes first_node..first_node+k-1 of the static
    `tree`, whose root (node 0) is the row's last emitted token at slot
    start. Node i's key/value is written at slot start + i; its query sits at
    position start + depths[i] and sees the context (slots < start) and its
    ancestors' slots, whether written by this call or by an earlier one at the
    same start (a draft writes the tree level by level). See
    `tree_attention_layout`; `compact_tree_path` then moves an accepted path
    to consecutive slots. The cross-attention is the same for every node.

    Deterministic. Apply with mutable=['cache']. The caller guarantees
    start_positions[b] + (k, or the tree's N) <= cache_length (inside jit this
    cannot be checked; an out-of-range write would be clamped).

    Args:
      block_tokens: int32 [B, k], the decoder inputs at those positions (nodes).
      start_positions: int32 [B], position of each row's first block token
        (with a tree, the root's slot).
      tree: None, or a static tree with numpy `depths` int [N] and `ancestors`
        bool [N, N] (duck-typed; see `tree_attention_layout`).
      first_node: static int, the tree node of block_tokens[:, 0] (0 without
        a tree); first_node + k <= N.
      feature_layers: optional static decoder layer indices: also return the
        block's features, those layers' outputs concatenated
        (`select_features`; the last layer's is the output before the final
        norm), from this same call.
      masked, mask_embedding: a parallel draft's mask tokens: bool [B, k]
        marks the block positions whose input is `mask_embedding` [emb]
        instead of their token's embedding (None, None: none).

    Returns:
      float32 logits [B, k, vocab], or with `feature_layers` (logits, features
      [B, k, len(feature_layers) * emb] in the compute dtype); `apply` also
      returns `{'cache': new_cache}`.
    """
    return self.decoder.decode_block(
      block_tokens, start_positions, tree, first_node, feature_layers, masked, mask_embedding
    )


class DecoderOnly(nn.Module):
  """T5X's decoder-only model (`DecoderWrapper`) plus block-cached decoding.

  Parameters are T5X's, under its wrapper's `decoder/` scope:
  `token_embedder/embedding`, `relpos_bias/rel_embedding` (one table, causal
  buckets), `layers_{i}/{pre_self_attention_layer_norm, self_attention,
  pre_mlp_layer_norm, mlp}`, `decoder_norm/scale` and `logits_dense/kernel`
  (absent with `logits_via_embedding`).

  Sequence layout (T5X's `DecoderFeatureConverter`): position 0 holds BOS (0)
  and prompt token i sits at position i; a prefix LM marks positions 0..P of a
  prompt of length P in `decoder_causal_attention`.
  """

  config: DecoderOnlyConfig

  def setup(self):
    if not isinstance(self.config, DecoderOnlyConfig):
      raise TypeError(
        f'DecoderOnly takes a DecoderOnlyConfig, got {type(self.config).__name__}; '
        'network.module_for(config) picks the module for either config.'
      )
    self.decoder = Decoder(self.config)

  def __call__(
    self,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    decoder_segment_ids: Optional[Array] = None,
    decoder_positions: Optional[Array] = None,
    decoder_causal_attention: Optional[Array] = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: Optional[int] = None,
    prefill: Optional[bool] = None,
    prefill_lengths: Optional[Array] = None,
  ) -> Array:
    """Teacher-forced logits, or one call of T5X's cache protocol.

    Args:
      decoder_input_tokens: int32 [B, L], the targets shifted right (BOS = 0).
      decoder_target_tokens: [B, L]; 0 marks padding (no attention to or from).
      decoder_segment_ids: int32 [B, L] packing ids, or None.
      decoder_positions: unused, as in T5X (relative biases need no positions).
      decoder_causal_attention: [B, L], 1 where positions attend to each other
        bidirectionally (a prefix LM's inputs), or None (causal).
      enable_dropout: enables dropout (needs a 'dropout' rng).
      decode: T5X's cache protocol, as T5X's `DecoderOnlyModel` drives it. The
        first call (no cache yet; apply with mutable=['cache']) creates zero
        caches of L positions and a scalar `cache_index`, and returns causal
        logits. Each later call takes one token per row [B, 1], writes it at
        the row's `cache_index` (a scalar, or [B] after a prefill), attends to
        positions <= it and increments it. Masks are not used.
      max_decode_length: accepted for T5X; the cache's length plays its role.
      prefill: T5X's prefill (decode False, after the creating call): the
        logits with the mask above while the keys/values of all L positions are
        cached at positions 0..L-1; `cache_index` becomes `prefill_lengths`.
        T5X passes the prompt with the mask `decoder_causal_attention` as
        `decoder_target_tokens`, and prompt lengths P as `prefill_lengths`:
        the cache is then valid at positions < P, and decoding feeds P next.
      prefill_lengths: int32 [B], required with `prefill`.

    Returns:
      float32 logits [B, L, vocab].
    """
    del decoder_positions, max_decode_length
    if decoder_input_tokens.ndim != 2:
      raise ValueError(
        f'decoder_input_tokens must be [batch, length], got shape {decoder_input_tokens.shape}.'
      )
    if prefill and decode:
      raise ValueError(
        'prefill and decode cannot both be True: fill the cache with one prefill=True '
        'call, then decode with decode=True calls (as T5X).'
      )
    if prefill and prefill_lengths is None:
      raise ValueError(
        'prefill=True needs prefill_lengths [batch], the index each row continues at.'
      )
    decoder_mask = None
    if not decode:
      decoder_mask = make_decoder_mask(
        decoder_target_tokens, decoder_causal_attention, decoder_segment_ids
      )
    return self.decoder(
      decoder_input_tokens,
      decoder_mask,
      deterministic=not enable_dropout,
      decode=decode,
      prefill_lengths=prefill_lengths if prefill else None,
    )

  def layout_logits(
    self,
    decoder_input_tokens: Array,
    decoder_positions: Array,
    decoder_visible: Array,
    decoder_masked: Array,
    mask_embedding: Array,
    enable_dropout: bool = True,
  ) -> Array:
    """`Decoder.layout_logits` (see `Transformer.layout_logits`): float32 [B, T, vocab]."""
    return self.decoder.layout_logits(
      decoder_input_tokens,
      decoder_positions,
      decoder_visible,
      decoder_masked,
      mask_embedding,
      deterministic=not enable_dropout,
    )

  def init_decoder_cache(self, batch: int, cache_length: int) -> None:
    """Builds the zero cache for `prefill` and `decode_block` (mutable=['cache']).

    Self-attention keys/values of `cache_length` positions per layer. Size it
    for the longest decode plus the largest block (positions start + k - 1
    must stay below it).

    Args:
      batch: static number of rows.
      cache_length: static number of positions.

    Returns:
      None; `apply` returns `(None, {'cache': cache})`.
    """
    checks.check_positive_int('batch', batch)
    checks.check_positive_int('cache_length', cache_length)
    self.decoder.init_block_cache(int(batch), int(cache_length))

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool = False,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """Writes the keys/values of a block at positions 0..W-1; computes no logits.

    Causal, or with `bidirectional` T5X's prefix LM: a query at position
    q <= prefix_lengths[b] also attends to every key at a position
    <= prefix_lengths[b]. For a prompt of length P (BOS at 0, prompt tokens at
    1..P) pass prefix_lengths = P and a block holding positions 0..P at least
    (W > P; causally W >= P suffices): the cache is then what T5X's prefill
    writes at positions < P, and the decode loop feeds position P next
    (`decode_block` at start P). Later block positions are written too; they
    are stale for decoding, masked until overwritten. Apply with
    mutable=['cache'].

    Args:
      block_tokens: int32 [B, W], the inputs at positions 0..W-1.
      prefix_lengths: int32 [B], P per row (only read if bidirectional).
      bidirectional: prefix-LM attention among positions 0..P.
      feature_layers: optional static decoder layer indices (`check_feature_layers`).

    Returns:
      None, or with `feature_layers` the block's features [B, W, len * emb]
      (`select_features`); `apply` also returns `{'cache': new_cache}`.
    """
    return self.decoder.prefill(block_tokens, prefix_lengths, bidirectional, feature_layers)

  def decode_block(
    self,
    block_tokens: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
    feature_layers: Optional[Tuple[int, ...]] = None,
    masked: Optional[Array] = None,
    mask_embedding: Optional[Array] = None,
  ) -> Array | Tuple[Array, Array]:
    """Scores a block of k tokens (or tree nodes) per row; see `Transformer.decode_block`.

    Args:
      block_tokens: int32 [B, k], the inputs at start_positions[b] + j (chain)
        or tree nodes first_node..first_node+k-1.
      start_positions: int32 [B].
      tree: None (a chain), or a static tree (`depths`, `ancestors`).
      first_node: static int, the tree node of block_tokens[:, 0].
      feature_layers: optional static decoder layer indices (see
        `Transformer.decode_block`).
      masked, mask_embedding: mask tokens (see `Transformer.decode_block`).

    Returns:
      float32 logits [B, k, vocab], or with `feature_layers` (logits, features);
      `apply` also returns `{'cache': new_cache}`.
    """
    return self.decoder.decode_block(
      block_tokens, start_positions, tree, first_node, feature_layers, masked, mask_embedding
    )


def module_for(config: NetworkConfig) -> nn.Module:
  """`Transformer(config)` for a T5Config, `DecoderOnly(config)` for a DecoderOnlyConfig."""
  if isinstance(config, T5Config):
    return Transformer(config)
  if isinstance(config, DecoderOnlyConfig):
    return DecoderOnly(config)
  raise TypeError(
    f'Expected a network.T5Config or network.DecoderOnlyConfig, got {type(config).__name__}.'
  )
