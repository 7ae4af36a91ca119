"""Features: the outputs of chosen decoder layers, what a draft head reads from the target."""

from typing import Any, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import num_decoder_layers

Array = jax.Array


def check_feature_layers(config: NetworkConfig, feature_layers: Any) -> Tuple[int, ...]:
  """`feature_layers` as a tuple of distinct decoder layer indices in [0, num_layers).

  Layer i's feature is its output (the residual stream after layer i): the
  last layer's is the decoder output before the final norm.
  """
  num_layers = num_decoder_layers(config)
  layers = tuple(feature_layers) if isinstance(feature_layers, (tuple, list)) else None
  if (
    not layers
    or len(set(layers)) != len(layers)
    or not all(isinstance(i, (int, np.integer)) and 0 <= i < num_layers for i in layers)
  ):
    raise ValueError(
      f'feature_layers must be a non-empty tuple of distinct decoder layer indices in '
      f'[0, {num_layers}) (this network has {num_layers} decoder layers; the last, '
      f'{num_layers - 1}, gives the output before the final norm); got {feature_layers!r}.'
    )
  return tuple(int(i) for i in layers)


def select_features(
  layer_outputs: Sequence[Array], feature_layers: Optional[Tuple[int, ...]]
) -> Optional[Array]:
  """[..., len(feature_layers) * emb]: the listed layers' outputs, concatenated in that order.

  None without `feature_layers` (nothing is kept, so XLA can drop unused work).
  """
  if feature_layers is None:
    return None
  return jnp.concatenate([layer_outputs[i] for i in feature_layers], axis=-1)
