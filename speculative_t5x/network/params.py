"""Parameter shapes, counts and sizes, and host-side random parameters."""

from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x.network.config import NetworkConfig
from speculative_t5x.network.config import is_decoder_only
from speculative_t5x.network.config import num_decoder_layers
from speculative_t5x.network.layers import NUM_BUCKETS
from speculative_t5x.network.transformer import module_for


def abstract_params(config: NetworkConfig) -> Tuple[dict, dict]:
  """Shapes of `module_for(config)`'s parameters, computing nothing.

  Returns:
    (params, params_axes): `jax.ShapeDtypeStruct`s (float32) in the tree of
    `module_for(config).init(...)['params']`, and the logical axes
    `['params_axes']`.
  """
  module = module_for(config)
  tokens = jnp.ones((1, 1), jnp.int32)
  # The encoder-decoder takes encoder inputs, decoder inputs and targets.
  args = (tokens,) * (2 if is_decoder_only(config) else 3)
  variables = jax.eval_shape(
    lambda: module.init(jax.random.PRNGKey(0), *args, enable_dropout=False)
  )
  return variables['params'], variables['params_axes']


def parameter_count(params: Any) -> int:
  """The number of parameters in a tree of arrays or `jax.ShapeDtypeStruct`s.

  E.g. `parameter_count(abstract_params(config)[0])`, computing nothing.
  """
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params))


def decoder_weight_bytes(config: NetworkConfig, bytes_per_parameter: int = 4) -> int:
  """Bytes of parameters one cached decoder step reads (float32 storage by default).

  Every decoder layer's attention (and, encoder-decoder, cross-attention) and
  MLP kernels, the layer norms and position table, and the logits kernel (or,
  with `logits_via_embedding`, the whole token embedding). Computed from the
  config alone, so it can be known before JAX starts (`xla_flags`).
  """
  cross_attention = not is_decoder_only(config)
  attention = 4 * config.emb_dim * config.num_heads * config.head_dim
  mlp = (len(config.mlp_activations) + 1) * config.emb_dim * config.mlp_dim
  layer = (1 + cross_attention) * attention + mlp + (2 + cross_attention) * config.emb_dim
  logits = config.vocab_size * config.emb_dim
  parameters = (
    num_decoder_layers(config) * layer + config.emb_dim + logits + config.num_heads * NUM_BUCKETS
  )
  return parameters * bytes_per_parameter


def random_params(config: NetworkConfig, seed: int = 0) -> Tuple[dict, dict]:
  """Random parameters drawn on the host, with no XLA compilation.

  Same tree, shapes and per-parameter scales as `module_for(config).init`
  (embedding N(0, 1); kernels std 1/sqrt(fan_in), queries further /
  sqrt(head_dim); relative position tables uniform with variance
  2/(heads + buckets); layer norm scales 1), but not its random stream or its
  truncation. `init` compiles one random-number program per parameter, which
  takes seconds on a CPU even for tiny models; this is for tests and timing.

  Args:
    config: the network's config.
    seed: numpy seed.

  Returns:
    (params, params_axes): float32 numpy arrays and their logical axes, as
    `module_for(config).init(...)['params']` and `['params_axes']`.
  """
  shapes, params_axes = abstract_params(config)
  return t5x_like_random_params(shapes, config.head_dim, seed), params_axes


def t5x_like_random_params(shapes: Any, head_dim: int, seed: int) -> Any:
  """float32 numpy arrays of `shapes` (a tree of shaped leaves) at T5X's initializer scales.

  Embeddings and learned input vectors std 1; kernels std 1/sqrt(fan_in),
  queries further / sqrt(head_dim); relative position tables uniform with
  variance 2/(heads + buckets); layer norm scales 1. Shared by
  `random_params` and the feature head's.
  """
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    shape = leaf.shape
    if name == 'embedding':
      value = rng.standard_normal(shape)
    elif name == 'rel_embedding':
      limit = np.sqrt(6.0 / sum(shape))
      value = rng.uniform(-limit, limit, shape)
    elif name == 'scale':
      value = np.ones(shape)
    elif len(shape) == 1:  # A learned input vector (a feature head's start), as an embedding row.
      value = rng.standard_normal(shape)
    else:
      value = rng.standard_normal(shape) / np.sqrt(shape[0])
      if path[-2].key == 'query':
        value /= np.sqrt(head_dim)
    return value.astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)
