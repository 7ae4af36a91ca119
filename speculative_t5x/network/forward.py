"""Pure functions of either config for the uncached forward pass and its pieces.

`compute_logits` (teacher-forced logits, optionally with features),
`compute_layout_logits` (a parallel draft's, mask tokens at any positions), `encode`,
`embed_tokens` and `logits_from_features` (what a draft head needs from the
target).
"""

from typing import Any, Mapping, Optional, Tuple

import jax

from speculative_t5x import kernels
from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import T5Config
from speculative_t5x.network.config import is_decoder_only
from speculative_t5x.network.config import num_decoder_layers
from speculative_t5x.network.features import check_feature_layers
from speculative_t5x.network.features import select_features
from speculative_t5x.network.stacks import DecoderLayer
from speculative_t5x.network.transformer import Transformer
from speculative_t5x.network.transformer import module_for

Array = jax.Array


def compute_logits(
  config: NetworkConfig,
  params: Any,
  features: Mapping[str, Array],
  dropout_key: Optional[Array] = None,
  feature_layers: Optional[Tuple[int, ...]] = None,
) -> Array | Tuple[Array, Array]:
  """float32 [B, L, V]: T5X's forward pass of either architecture on model features.

  The one place where the architecture picks the module's arguments (T5X's
  `_compute_logits`): training's loss, held-out and benchmark alpha all call
  it. `features` holds a feature converter's arrays: an encoder-decoder's
  int32 [B, Lin] 'encoder_input_tokens' (optionally 'encoder_segment_ids')
  and [B, L] 'decoder_input_tokens', 'decoder_target_tokens' (optionally
  'decoder_segment_ids'); a decoder-only network's [B, L] 'decoder_*'
  arrays, optionally 'decoder_segment_ids', 'decoder_positions' and
  'decoder_causal_attention' (present: a prefix LM whose marked positions
  attend to each other; absent: causal). Other keys are ignored
  ('decoder_loss_weights', a decoder-only network's 'encoder_input_tokens').
  Dropout is on when `dropout_key` is not None.

  With `feature_layers` (static decoder layer indices), (logits, the
  target's features [B, L, len * emb] at every position): the listed decoder
  layers' outputs, captured from this forward pass (flax
  `capture_intermediates`), concatenated (`select_features`).
  """
  options = dict(
    enable_dropout=dropout_key is not None,
    rngs=None if dropout_key is None else {'dropout': dropout_key},
  )
  if feature_layers is not None:
    feature_layers = check_feature_layers(config, feature_layers)
    options.update(
      capture_intermediates=lambda module, method: (
        isinstance(module, DecoderLayer) and method == '__call__'
      ),
      mutable=['intermediates'],
    )
    logits, state = _forward(config, params, features, options)
    layers = state['intermediates']['decoder']
    outputs = [layers[f'layers_{i}']['__call__'][0] for i in range(num_decoder_layers(config))]
    return logits, select_features(outputs, feature_layers)
  return _forward(config, params, features, options)


def _forward(config: NetworkConfig, params: Any, features: Mapping[str, Array], options) -> Any:
  """`module.apply` of the teacher-forced forward pass with `options` (see `compute_logits`)."""
  module = module_for(config)
  if is_decoder_only(config):
    return module.apply(
      {'params': params},
      features['decoder_input_tokens'],
      features['decoder_target_tokens'],
      features.get('decoder_segment_ids'),
      features.get('decoder_positions'),
      features.get('decoder_causal_attention'),
      **options,
    )
  if 'decoder_causal_attention' in features:
    raise ValueError(
      "decoder_causal_attention is for decoder-only prefix LMs; an encoder-decoder's decoder "
      'attends causally. Leave it out of the features.'
    )
  return module.apply(
    {'params': params},
    features['encoder_input_tokens'],
    features['decoder_input_tokens'],
    features['decoder_target_tokens'],
    features.get('encoder_segment_ids'),
    features.get('decoder_segment_ids'),
    **options,
  )


def compute_layout_logits(
  config: NetworkConfig,
  params: Any,
  mask_embedding: Array,
  features: Mapping[str, Array],
  dropout_key: Optional[Array] = None,
) -> Array:
  """float32 [B, T, V]: logits of tokens laid out at any positions, mask tokens among them.

  A parallel draft's teacher-forced pass (`Decoder.layout_logits`):
  `features` holds int32 [B, T] 'decoder_input_tokens' and
  'decoder_positions' (each token's position, for the relative biases),
  bool [B, T, T] 'decoder_visible' (which tokens each token attends to) and
  bool [B, T] 'decoder_masked' (tokens whose input is `mask_embedding` [emb]),
  and for an encoder-decoder int32 [B, Lin] 'encoder_input_tokens'. Dropout
  is on when `dropout_key` is not None.
  """
  options = dict(
    enable_dropout=dropout_key is not None,
    rngs=None if dropout_key is None else {'dropout': dropout_key},
  )
  decoder_args = [
    features['decoder_input_tokens'],
    features['decoder_positions'],
    features['decoder_visible'],
    features['decoder_masked'],
    mask_embedding,
  ]
  if not is_decoder_only(config):
    decoder_args.insert(0, features['encoder_input_tokens'])
  return module_for(config).apply(
    {'params': params}, *decoder_args, method='layout_logits', **options
  )


def encode(config: T5Config, params: Any, input_tokens: Array) -> Array:
  """[B, input_length, emb]: an encoder-decoder's encoder output (no dropout).

  `params` may be `kernels.PackedParams`, as `init_decoder_cache` takes them.
  """
  return Transformer(config).apply(
    kernels.variables(params), input_tokens, enable_dropout=False, method=Transformer.encode
  )


def embed_tokens(config: NetworkConfig, params: Any, tokens: Array) -> Array:
  """[..., emb] in the compute dtype: the decoder's token embedding of int `tokens` [...]."""
  return module_for(config).apply(
    {'params': params}, tokens, method=lambda m, x: m.decoder.embed(x)
  )


def logits_from_features(config: NetworkConfig, params: Any, features: Array) -> Array:
  """float32 [..., vocab]: the decoder's final norm and logits layer on last-layer outputs.

  What `decode_block` computes from its last layer's output, so a feature
  [..., emb] of the last layer (`feature_layers` ending at it) gives the
  target's own logits. `params` may be `kernels.PackedParams` (the CPU kernel).
  """
  return module_for(config).apply(
    kernels.variables(params), features, method=lambda m, y: m.decoder.feature_logits(y)
  )
