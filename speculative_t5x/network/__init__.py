"""T5X's T5 1.1 encoder-decoder and decoder-only networks (flax.linen), block-cached.

Two networks rebuilt from T5X so that their parameter trees, shapes,
initializers, logical axis annotations (`params_axes`), config field names and
method signatures are T5X's: a T5X checkpoint loads without conversion, and
T5X's models can train, score and decode with them (`decode=True` follows
T5X's cache protocol):

  * `Transformer(T5Config)`: the minimal T5 (`t5x/examples/t5/network.py`),
    for T5X's `EncoderDecoderModel`.
  * `DecoderOnly(DecoderOnlyConfig)`: the decoder-only model
    (`t5x/examples/decoder_only/network.py`, `DecoderWrapper`), for T5X's
    `DecoderOnlyModel`, prefix LM (`decoder_causal_attention`, `prefill=True`)
    included.
One set of layers serves both: the decoder-only stack is the encoder-decoder's
decoder without cross-attention and with its own token embedding.

What is new is block-cached decoding for speculative decoding:

  module = module_for(config)
  # Transformer: (encoded, encoder_input_tokens, cache_length); DecoderOnly:
  # (batch, cache_length).
  _, variables = module.apply({'params': params}, ..., cache_length,
                              method='init_decoder_cache', mutable=['cache'])
  # Optional: write positions 0..W-1 (a decoder-only model's prompt).
  _, variables = module.apply({'params': params, **variables}, block_tokens,
                              prefix_lengths, bidirectional, method='prefill',
                              mutable=['cache'])
  logits, variables = module.apply({'params': params, **variables}, block_tokens,
                                   start_positions, method='decode_block',
                                   mutable=['cache'])

`decode_block` scores k >= 1 tokens per row at per-row positions, writes their
keys and values there (overwriting), and attends to the cached positions before
each row's start. With static `feature_layers` it (and `prefill`) also returns
the features of every scored position, those decoder layers' outputs (the last
layer's is the output before the final norm), from the same call: what a draft
head that reads the target (`drafts.FeatureDraft`) drafts from. A row is
rolled back by passing a smaller start position next time: entries at
positions >= the start are masked until overwritten. `prefill` writes a
block's keys and values at positions 0..W-1 without computing logits; for a
decoder-only model it can attend bidirectionally within the prompt (T5X's
prefix LM). With `tree=` (tree speculative decoding), `decode_block` scores
nodes of a static token tree instead of a chain: node i is written at slot
start + i and attends to the context and its ancestors, at position
start + depth; `compact_tree_path` then moves an accepted root-to-node path to
consecutive slots. With `masked` and `mask_embedding`, `decode_block` feeds
a parallel draft's mask tokens (a learned input vector instead of a token's
embedding); `compute_layout_logits` is their teacher-forced pass, tokens at
any positions with any visibility. Sequence layout of both: position 0 holds BOS (token 0); a
decoder-only prompt token i sits at position i, so after a prefill of a prompt
of length P the loop feeds position P first. The cache's layout is in
`network.cache`'s docstring.

Pure functions that take either config: `module_for(config)`,
`init_decoder_cache(config, params, input_tokens, cache_length)`,
`prefill_decoder_cache(config, params, cache, block_tokens, prefix_lengths,
bidirectional=...)`, `apply_decode_block(config, params, cache, block_tokens,
start_positions, tree=None, first_node=0)`, `compact_tree_path(config, cache,
start_positions, path)`, `compute_logits`, `compute_layout_logits`,
`abstract_params`, `random_params`, `decoder_weight_bytes`.

Modules, by concern (this package exports their public names, which is
where callers and gin files name them: `network.T5Config`,
`network.Transformer`):
  config       `T5Config`, `DecoderOnlyConfig`, named sizes.
  layers       dense, RMS norm, embedding, relative position biases, MLP.
  attention    multi-head attention and its key/value caches.
  masks        attention masks and biases, the tree attention layout.
  features     which decoder layers' outputs a call returns.
  stacks       the encoder and decoder stacks and their layers.
  transformer  `Transformer`, `DecoderOnly`, `module_for`.
  cache        the block cache's pure functions and layout.
  forward      the uncached forward pass (`compute_logits`) and its pieces.
  params       parameter shapes, counts, bytes and random parameters.
"""

from speculative_t5x.network.attention import dot_product_attention as dot_product_attention
from speculative_t5x.network.attention import (
  MultiHeadDotProductAttention as MultiHeadDotProductAttention,
)
from speculative_t5x.network.cache import apply_decode_block as apply_decode_block
from speculative_t5x.network.cache import compact_tree_path as compact_tree_path
from speculative_t5x.network.cache import ENCODER_MASK_AXES as ENCODER_MASK_AXES
from speculative_t5x.network.cache import init_decoder_cache as init_decoder_cache
from speculative_t5x.network.cache import KV_CACHE_AXES as KV_CACHE_AXES
from speculative_t5x.network.cache import prefill_decoder_cache as prefill_decoder_cache
from speculative_t5x.network.config import decoder_only_config as decoder_only_config
from speculative_t5x.network.config import DECODER_ONLY_SIZES as DECODER_ONLY_SIZES
from speculative_t5x.network.config import DecoderOnlyConfig as DecoderOnlyConfig
from speculative_t5x.network.config import is_decoder_only as is_decoder_only
from speculative_t5x.network.config import NetworkConfig as NetworkConfig
from speculative_t5x.network.config import num_decoder_layers as num_decoder_layers
from speculative_t5x.network.config import t5_1_1_config as t5_1_1_config
from speculative_t5x.network.config import T5_1_1_SIZES as T5_1_1_SIZES
from speculative_t5x.network.config import T5Config as T5Config
from speculative_t5x.network.features import check_feature_layers as check_feature_layers
from speculative_t5x.network.features import select_features as select_features
from speculative_t5x.network.forward import compute_layout_logits as compute_layout_logits
from speculative_t5x.network.forward import compute_logits as compute_logits
from speculative_t5x.network.forward import embed_tokens as embed_tokens
from speculative_t5x.network.forward import encode as encode
from speculative_t5x.network.forward import logits_from_features as logits_from_features
from speculative_t5x.network.layers import DenseGeneral as DenseGeneral
from speculative_t5x.network.layers import Embed as Embed
from speculative_t5x.network.layers import LayerNorm as LayerNorm
from speculative_t5x.network.layers import MAX_DISTANCE as MAX_DISTANCE
from speculative_t5x.network.layers import MlpBlock as MlpBlock
from speculative_t5x.network.layers import NUM_BUCKETS as NUM_BUCKETS
from speculative_t5x.network.layers import param_with_axes as param_with_axes
from speculative_t5x.network.layers import relative_position_bucket as relative_position_bucket
from speculative_t5x.network.layers import RelativePositionBiases as RelativePositionBiases
from speculative_t5x.network.masks import make_attention_mask as make_attention_mask
from speculative_t5x.network.masks import make_decoder_mask as make_decoder_mask
from speculative_t5x.network.masks import NEG_INF as NEG_INF
from speculative_t5x.network.masks import tree_attention_layout as tree_attention_layout
from speculative_t5x.network.params import abstract_params as abstract_params
from speculative_t5x.network.params import decoder_weight_bytes as decoder_weight_bytes
from speculative_t5x.network.params import parameter_count as parameter_count
from speculative_t5x.network.params import random_params as random_params
from speculative_t5x.network.params import t5x_like_random_params as t5x_like_random_params
from speculative_t5x.network.stacks import Decoder as Decoder
from speculative_t5x.network.stacks import DecoderLayer as DecoderLayer
from speculative_t5x.network.stacks import Encoder as Encoder
from speculative_t5x.network.stacks import EncoderLayer as EncoderLayer
from speculative_t5x.network.transformer import DecoderOnly as DecoderOnly
from speculative_t5x.network.transformer import module_for as module_for
from speculative_t5x.network.transformer import Transformer as Transformer
