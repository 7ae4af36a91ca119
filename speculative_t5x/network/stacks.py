"""The encoder and decoder stacks (and their layers) of both networks.

`Decoder` holds the block-cached decoding: `decode_block` (a chain or the
nodes of a token tree against a per-row cache), `prefill`, and T5X's own
cache protocol (`decode=True`, `prefill_lengths`).
"""

from typing import Any, Optional, Sequence, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp

from speculative_t5x.network.attention import MultiHeadDotProductAttention
from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import T5Config
from speculative_t5x.network.config import is_decoder_only
from speculative_t5x.network.config import num_decoder_layers
from speculative_t5x.network.features import select_features
from speculative_t5x.network.layers import DenseGeneral
from speculative_t5x.network.layers import Embed
from speculative_t5x.network.layers import LayerNorm
from speculative_t5x.network.layers import MlpBlock
from speculative_t5x.network.layers import RelativePositionBiases
from speculative_t5x.network.masks import causal_mask
from speculative_t5x.network.masks import make_attention_mask
from speculative_t5x.network.masks import mask_to_bias
from speculative_t5x.network.masks import tree_attention_layout

Array = jax.Array


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP blocks with residuals."""

  config: T5Config

  @nn.compact
  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    x = LayerNorm(cfg.dtype, name='pre_attention_layer_norm')(inputs)
    x = MultiHeadDotProductAttention(cfg, name='attention')(x, x, bias, deterministic=deterministic)
    x = inputs + dropout(x, deterministic)
    y = LayerNorm(cfg.dtype, name='pre_mlp_layer_norm')(x)
    y = MlpBlock(cfg, name='mlp')(y, deterministic)
    return x + dropout(y, deterministic)


class Encoder(nn.Module):
  """Token embedding, encoder layers with bidirectional relative biases, norm."""

  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(
    self, encoder_input_tokens: Array, encoder_mask: Array, deterministic: bool
  ) -> Array:
    """int32 [B, L] tokens, bool [B, 1, L, L] mask -> [B, L, emb] in `dtype`."""
    cfg = self.config
    positions = jnp.arange(encoder_input_tokens.shape[1])[None]
    bias = RelativePositionBiases(cfg.num_heads, cfg.dtype, name='relpos_bias')(
      positions, positions, bidirectional=True
    )
    bias = mask_to_bias(encoder_mask, bias)
    x = self.shared_embedding(encoder_input_tokens)
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f'layers_{i}')(x, bias, deterministic)
    x = LayerNorm(cfg.dtype, name='encoder_norm')(x)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic)


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, optional cross-attention and MLP blocks.

  `cross_attention=False` is T5X's decoder-only layer: the same parameters
  without `pre_cross_attention_layer_norm` and `encoder_decoder_attention`.
  The three entry points differ only in how the self-attention sees keys.
  """

  config: NetworkConfig
  cross_attention: bool = True

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = LayerNorm(cfg.dtype)
    self.self_attention = MultiHeadDotProductAttention(cfg)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = LayerNorm(cfg.dtype)
      self.encoder_decoder_attention = MultiHeadDotProductAttention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(
    self,
    inputs: Array,
    encoded: Optional[Array],
    self_bias: Array,
    cross_bias: Optional[Array],
    deterministic: bool,
  ) -> Array:
    """Uncached: [B, L, emb] -> [B, L, emb]; biases [B|1, heads|1, L, L|input_length]."""
    attend = lambda x: self.self_attention(x, x, self_bias, deterministic=deterministic)
    return self._layer(inputs, attend, encoded, cross_bias, deterministic)

  def init_cache(self, batch: int, cache_length: int, encoded: Optional[Array]):
    """Zero self-attention caches; cross-attention keys/values unless `encoded` is None."""
    self.self_attention.init_self_cache(batch, cache_length)
    if encoded is not None:
      self.encoder_decoder_attention.init_cross_cache(encoded)

  def decode_block(
    self,
    inputs: Array,
    encoded: Optional[Array],
    self_bias: Array,
    cross_bias: Optional[Array],
    start_positions: Array,
  ) -> Array:
    """Cached, deterministic: [B, k, emb] -> [B, k, emb].

    Writes the block's keys/values at each row's start_positions and attends
    over the cache (`self_bias` [B, heads, k, cache_length]). `encoded`
    [B, input_length, emb] is re-projected for cross-attention (T5X's
    protocol); None uses the cross-attention keys/values cached by `init_cache`.
    """
    attend = lambda x: self.self_attention.attend_block(x, self_bias, start_positions)
    return self._layer(inputs, attend, encoded, cross_bias, True)

  def prefill(self, inputs: Array, self_bias: Array, cross_bias: Optional[Array]) -> Array:
    """Deterministic [B, W, emb] -> [B, W, emb] of a block at positions 0..W-1.

    Attends within the block (`self_bias` [B|1, heads, W, W]) and caches its
    keys/values; cross-attention uses the cached encoder keys/values.
    """
    attend = lambda x: self.self_attention.prefill_self_cache(x, self_bias)
    return self._layer(inputs, attend, None, cross_bias, True)

  def with_context(
    self,
    inputs: Array,
    context: Sequence[Array],
    self_bias: Array,
    encoded: Optional[Array],
    cross_bias: Optional[Array],
    deterministic: bool,
  ) -> Tuple[Array, Array]:
    """Uncached, with more self-attention keys: (output [B, q, emb], normalized inputs).

    The self-attention's keys/values are those of concat(context + [the
    normalized inputs]) along the length: `context` holds the normalized
    inputs of other calls ([B, k_i, emb] each; this call's second output), and
    `self_bias` [B|1, heads|1, q, sum k_i + q] says what each query sees. A
    draft head's training-time test uses it (`feature_head`).
    """
    normed = self.pre_self_attention_layer_norm(inputs)
    keys = jnp.concatenate([*context, normed], axis=1)
    attend = lambda x: self.self_attention(x, keys, self_bias, deterministic=deterministic)
    return self._layer(inputs, attend, encoded, cross_bias, deterministic), normed

  def _layer(self, inputs, self_attend, encoded, cross_bias, deterministic):
    x = inputs + self.dropout(
      self_attend(self.pre_self_attention_layer_norm(inputs)), deterministic
    )
    if self.cross_attention:
      y = self.pre_cross_attention_layer_norm(x)
      if encoded is None:
        y = self.encoder_decoder_attention.attend_cached(y, cross_bias)
      else:
        y = self.encoder_decoder_attention(y, encoded, cross_bias, deterministic=deterministic)
      x = x + self.dropout(y, deterministic)
    z = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(z, deterministic)


class Decoder(nn.Module):
  """Decoder layers with causal relative biases (one table), norm and logits.

  With a `T5Config`, the encoder-decoder's decoder: layers with cross-attention,
  embedding with the model's `shared_embedding`. With a `DecoderOnlyConfig`,
  T5X's decoder-only stack: no cross-attention and its own `token_embedder`.
  """

  config: NetworkConfig
  shared_embedding: Optional[nn.Module] = None

  @property
  def _decoder_only(self) -> bool:
    return is_decoder_only(self.config)

  def setup(self):
    cfg = self.config
    if self._decoder_only:
      self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype)
    self.layers = [
      DecoderLayer(cfg, cross_attention=not self._decoder_only)
      for _ in range(num_decoder_layers(cfg))
    ]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab')
      )

  def __call__(
    self,
    decoder_input_tokens: Array,
    decoder_mask: Optional[Array],
    *,
    encoded: Optional[Array] = None,
    encoder_decoder_mask: Optional[Array] = None,
    deterministic: bool,
    decode: bool = False,
    prefill_lengths: Optional[Array] = None,
  ) -> Array:
    """Teacher-forced logits, or one call of T5X's cache protocol.

    Args:
      decoder_input_tokens: int32 [B, L] (L == 1 for a cached step).
      decoder_mask: bool [B, 1, L, L], which positions each position attends
        to (`make_decoder_mask`); None is causal.
      encoded: [B, input_length, emb], the encoder output (encoder-decoder).
      encoder_decoder_mask: bool [B, 1, L, input_length] (encoder-decoder).
      deterministic: disables dropout.
      decode: T5X's cache protocol: the first call (no cache yet) creates zero
        caches of length L and a scalar `cache_index` and returns causal
        logits; later calls feed one token per row at `cache_index` (a scalar,
        or [B] after a prefill) and increment it.
      prefill_lengths: T5X's prefill (decoder-only, after the creating call,
        decode False): int32 [B]. The logits are computed with `decoder_mask`
        while the keys/values of all L positions are cached; `cache_index`
        becomes prefill_lengths (entries from there on are stale, masked until
        overwritten).

    Returns:
      float32 logits [B, L, vocab].
    """
    batch, length = decoder_input_tokens.shape
    cross_bias = None
    if encoder_decoder_mask is not None:
      cross_bias = mask_to_bias(encoder_decoder_mask).astype(self.config.dtype)
    y = self.dropout(self._embedder()(decoder_input_tokens), deterministic)
    if decode and self.has_variable('cache', 'cache_index'):
      if length != 1:
        raise ValueError(
          'A decode=True step feeds one token per row: decoder_input_tokens '
          f'must be [batch, 1], got {decoder_input_tokens.shape}.'
        )
      index = self.get_variable('cache', 'cache_index')
      start_positions = jnp.broadcast_to(index, (batch,)).astype(jnp.int32)
      y, _ = self._decode_block(y, encoded, cross_bias, start_positions)
      self.put_variable('cache', 'cache_index', index + 1)
      return self._logits(y, deterministic=True)
    if decode:
      for layer in self.layers:
        layer.init_cache(batch, length, encoded=None)
      self.put_variable('cache', 'cache_index', jnp.array(0, jnp.int32))
    positions = jnp.arange(length)[None]
    allowed = causal_mask(positions, positions) if decoder_mask is None else decoder_mask
    self_bias = self._self_bias(positions, positions, allowed)
    if prefill_lengths is not None:
      if not self.has_variable('cache', 'cache_index'):
        raise ValueError(
          'prefill=True fills the cache made by a first decode=True call (as '
          "T5X's DecoderOnlyModel._compute_kv_cache makes it); there is none."
        )
      self._check_block(
        decoder_input_tokens, prefill_lengths, 'prefill_lengths', 'decoder_input_tokens'
      )
      y = self._prefill(y, self_bias, cross_bias, (len(self.layers) - 1,))
      self.put_variable('cache', 'cache_index', jnp.asarray(prefill_lengths, jnp.int32))
      return self._logits(y, deterministic=True)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    return self._logits(y, deterministic)

  def init_block_cache(
    self,
    batch: int,
    cache_length: int,
    encoded: Optional[Array] = None,
    encoder_mask: Optional[Array] = None,
  ):
    """Zero self-attention caches per layer (`MultiHeadDotProductAttention.init_self_cache`).

    With `encoded` [batch, input_length, emb] and `encoder_mask` bool
    [batch, input_length] (encoder-decoder), also the cross-attention
    keys/values and the mask.
    """
    for layer in self.layers:
      layer.init_cache(batch, cache_length, encoded)
    if encoder_mask is not None:
      self.put_variable('cache', 'encoder_mask', encoder_mask)

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
    """See `Transformer.decode_block`."""
    cross_bias = self._block_cross_bias('decode_block')
    self._check_block(block_tokens, start_positions, 'start_positions')
    y = self._inputs(block_tokens, masked, mask_embedding)
    y, features = self._decode_block(
      y, None, cross_bias, start_positions.astype(jnp.int32), tree, first_node, feature_layers
    )
    logits = self._logits(y, deterministic=True)
    return logits if feature_layers is None else (logits, features)

  def layout_logits(
    self,
    decoder_input_tokens: Array,
    positions: Array,
    visible: Array,
    masked: Array,
    mask_embedding: Array,
    *,
    encoded: Optional[Array] = None,
    encoder_decoder_mask: Optional[Array] = None,
    deterministic: bool,
  ) -> Array:
    """Uncached logits of tokens at arbitrary positions with an arbitrary visibility.

    What a parallel draft trains on (and what its cached blocks are checked
    against): token t of a row sits at position `positions[b, t]` (for the
    relative biases) and attends to the tokens `visible[b, t]` marks; where
    `masked` its input is `mask_embedding` instead of its token's embedding.

    Args:
      decoder_input_tokens: int32 [B, T].
      positions: int32 [B, T].
      visible: bool [B, T, T], visible[b, i, j]: token i attends to token j.
      masked: bool [B, T].
      mask_embedding: [emb].
      encoded: [B, input_length, emb] (encoder-decoder), else None.
      encoder_decoder_mask: bool [B, 1, T, input_length] (encoder-decoder).
      deterministic: disables dropout.

    Returns:
      float32 logits [B, T, vocab].
    """
    cross_bias = None
    if encoder_decoder_mask is not None:
      cross_bias = mask_to_bias(encoder_decoder_mask).astype(self.config.dtype)
    shape = decoder_input_tokens.shape
    if positions.shape != shape or visible.shape != shape + shape[1:]:
      raise ValueError(
        f'Expected positions [batch, T] and visible [batch, T, T] for tokens {shape}; got '
        f'{positions.shape} and {visible.shape}.'
      )
    y = self.dropout(self._inputs(decoder_input_tokens, masked, mask_embedding), deterministic)
    self_bias = self._self_bias(positions, positions, visible[:, None])
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    return self._logits(y, deterministic)

  def prefill(
    self,
    block_tokens: Array,
    prefix_lengths: Array,
    bidirectional: bool,
    feature_layers: Optional[Tuple[int, ...]] = None,
  ) -> Optional[Array]:
    """See `DecoderOnly.prefill`; the block's features with `feature_layers`, else None."""
    cross_bias = self._block_cross_bias('prefill')
    prefix_lengths = jnp.asarray(prefix_lengths, jnp.int32)
    self._check_block(block_tokens, prefix_lengths, 'prefix_lengths')
    positions = jnp.arange(block_tokens.shape[1])[None]
    allowed = causal_mask(positions, positions)
    if bidirectional:
      in_prefix = positions <= prefix_lengths[:, None]
      allowed = jnp.logical_or(allowed, make_attention_mask(in_prefix, in_prefix))
    self_bias = self._self_bias(positions, positions, allowed)
    return self._prefill(self._embedder()(block_tokens), self_bias, cross_bias, feature_layers)

  def _block_cross_bias(self, method: str) -> Optional[Array]:
    """Checks that the block cache exists; its cross-attention bias (None if decoder-only)."""
    has_cache = self.layers[0].self_attention.has_variable('cache', 'cached_key')
    if not self._decoder_only:
      has_cache = has_cache and self.has_variable('cache', 'encoder_mask')
    if not has_cache:
      model = 'DecoderOnly' if self._decoder_only else 'Transformer'
      raise ValueError(
        f'{method} needs the cache made by {model}.init_decoder_cache '
        "(apply it with mutable=['cache'] and pass {'cache': ...} here)."
      )
    if self._decoder_only:
      return None
    encoder_mask = self.get_variable('cache', 'encoder_mask')
    return mask_to_bias(encoder_mask[:, None, None, :]).astype(self.config.dtype)

  def _check_block(
    self, block_tokens: Array, positions: Array, positions_name: str, tokens_name='block_tokens'
  ):
    """Raises unless tokens [batch, k] and positions [batch] fit the cache."""
    batch, cache_length = self.layers[0].self_attention.cache_shape()
    if (
      block_tokens.ndim != 2
      or positions.shape != block_tokens.shape[:1]
      or block_tokens.shape[0] != batch
    ):
      raise ValueError(
        f"Expected {tokens_name} [batch, k] and {positions_name} [batch] with the cache's "
        f'batch {batch}; got {block_tokens.shape} and {positions.shape}.'
      )
    if block_tokens.shape[1] > cache_length:
      raise ValueError(
        f'A block of {block_tokens.shape[1]} tokens does not fit a cache of length {cache_length}.'
      )

  def _decode_block(
    self, y, encoded, cross_bias, start_positions, tree=None, first_node=0, feature_layers=None
  ):
    """Block (chain or tree nodes, see `tree_attention_layout`) through the layers.

    Returns (the last layer's output, `select_features` of every layer's).
    """
    cache_length = self.layers[0].self_attention.cache_shape()[1]
    query_positions, key_positions, visible = tree_attention_layout(
      start_positions, cache_length, y.shape[1], tree, first_node
    )
    self_bias = self._self_bias(query_positions, key_positions, visible)
    # Node i's key/value goes to slot start + i.
    write_positions = start_positions + first_node if first_node else start_positions
    outputs = []
    for layer in self.layers:
      y = layer.decode_block(y, encoded, self_bias, cross_bias, write_positions)
      outputs.append(y)
    return y, select_features(outputs, feature_layers)

  def _prefill(self, y, self_bias, cross_bias, feature_layers=None):
    # Without features only the caches are needed: under jit, XLA drops the
    # last layer's attention output and MLP when the caller discards them.
    outputs = []
    for layer in self.layers:
      y = layer.prefill(y, self_bias, cross_bias)
      outputs.append(y)
    return select_features(outputs, feature_layers)

  def _self_bias(self, query_positions, key_positions, allowed):
    """[B|1, heads, q, k]: causal-bucket relative biases where `allowed`, else NEG_INF.

    T5X's decoders use causal buckets even where a prefix LM attends forward:
    a later key then shares bucket 0 with the query's own position.
    """
    relative = self.relpos_bias(query_positions, key_positions, bidirectional=False)
    return mask_to_bias(allowed, relative)

  def _inputs(
    self, tokens: Array, masked: Optional[Array], mask_embedding: Optional[Array]
  ) -> Array:
    """[B, k, emb]: the embedding of tokens int32 [B, k], `mask_embedding` [emb] where `masked`.

    `masked` bool [B, k] marks a parallel draft's mask tokens (their token
    ids are ignored); both None: every position embeds its token.
    """
    y = self._embedder()(tokens)
    if masked is None and mask_embedding is None:
      return y
    if masked is None or mask_embedding is None:
      raise ValueError(
        'Mask tokens need both masked [batch, k] and mask_embedding [emb]; got only '
        f'{"masked" if mask_embedding is None else "mask_embedding"}.'
      )
    if masked.shape != tokens.shape or mask_embedding.shape != (self.config.emb_dim,):
      raise ValueError(
        f"Expected masked {tokens.shape} (the tokens' shape) and mask_embedding "
        f'({self.config.emb_dim},); got {masked.shape} and {mask_embedding.shape}.'
      )
    return jnp.where(masked[..., None], mask_embedding.astype(y.dtype), y)

  def _embedder(self) -> Embed:
    return self.token_embedder if self._decoder_only else self.shared_embedding

  def embed(self, tokens: Array) -> Array:
    """int [...] -> [..., emb]: the decoder's token embedding (no dropout)."""
    return self._embedder()(tokens)

  def feature_logits(self, features: Array) -> Array:
    """float32 logits [..., vocab] of last-layer outputs [..., emb]: final norm, logits layer."""
    return self._logits(features, deterministic=True)

  def _logits(self, y, deterministic):
    y = self.dropout(self.decoder_norm(y), deterministic)
    if self.config.logits_via_embedding:
      # The tied embedding needs 1/sqrt(emb) to keep logits at unit scale.
      return self._embedder().attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)
