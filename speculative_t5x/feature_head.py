"""A feature-level draft head (EAGLE-style) that drafts from the target's own hidden states.

The head sees, at each decoder position t, the target's feature there (the
outputs of `feature_layers`, by default the last decoder layer's output
before the final norm: `network.Transformer.decode_block(feature_layers=...)`)
and the target's own (frozen) embedding of the token at t + 1, and predicts
the target's feature at t + 1, from which the token at t + 2 is drawn:

  input_t   = concat(norm(feature_t) [Df], norm(embed(token_{t+1})) [D])
                                                                    Df = len(feature_layers) * D
  x_t       = pre_projection(input_t)                               [H], the head's own width
  x_t       = T5 decoder layer(s) of width H: causal self-attention with relative
              position biases, cross-attention to the target's encoder output
              (encoder-decoder targets), gated MLP
  h_t       = head_norm(x_t)                                        [H]
  feature^_{t+1} = post_projection(h_t)                             [Df], the predicted feature
  logits_{t+2}   = output 'target': the target's own final norm and logits layer
                   (frozen) on the last layer's slice of feature^;
                   output 'own': the head's own narrow `logits_dense` [H, V] on h_t

The inputs are normalized (T5's RMS norm, a learned scale; each feature
layer's slice on its own), as EAGLE-3's `hidden_norm` and `input_layernorm`:
the target's residual stream before its final norm has an RMS of ~20-30 on
a trained target, its embedding ~1, and the head's own predicted feature
(fed back from the second draft token on) ~1. Unnormalized, the true feature
drowned the embedding of the token just emitted, and one set of weights
served inputs 30x apart in scale: the first draft token (true feature) was
accepted less often than the later ones (predicted feature).

During drafting (EAGLE-1), a position whose true feature is not known yet
(it lies past the target's last call) is fed the head's predicted feature^;
after each verification the loop rewrites the head's cache over the accepted
positions with the true features (`drafts.FeatureDraft.observe`).

Before the first output there is no true feature to read: a row without a
prompt starts from the head's start state, its layer(s) run on a learned
input vector `start_input` [H] (attending to nothing before it; for an
encoder-decoder target, cross-attending to the encoder output) for the
predicted feature^_0 and the first token's logits (`FeatureHead.start`).
Training fits it to the target's first output distribution like every
other position, so the first rollout drafts as well as the later ones
(with zero logits, its draft tokens were almost all rejected).

The head's cost is its own layer(s) at width H, the two projections and the
logits layer it uses: output 'own' with a small H avoids reading the target's
[D, V] logits kernel at every draft step.

`FeatureHeadConfig` (static, hashable), `FeatureHead` (the flax module),
`config_for(target_config, ...)`, `check_target`, `check_params`,
`init_params`, `embedding_aligned_params` (its start from the target's
embedding), and `apply_block` / `init_cache` / `start_state` /
`unrolled` (training's pass) / `logits` as pure functions. The decode-time
ones (`apply_block`, `init_cache`, `start_state`, `logits`) take the head's
parameters as a plain tree or as `kernels.pack_params(config, params,
scope=None)`, on which every dense layer runs the CPU kernel
(`drafts.FeatureDraft.packed`).
"""

import dataclasses
from typing import Any, Optional, Sequence, Tuple

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import kernels
from speculative_t5x import network

Array = jax.Array
PyTree = Any
OUTPUTS = ('target', 'own')


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig:
  """Hyperparameters of a `FeatureHead` and the target it reads.

  Target fields (`config_for` fills them from the target's config; a head
  applied to another target is refused by `check_target`):
    vocab_size: V, the target's vocabulary.
    target_emb_dim: D, the target's width.
    target_num_layers: the target's decoder layers.
    cross_attention: the target is an encoder-decoder (the head attends to
      its encoder output).
    feature_layers: target decoder layer indices whose outputs form the
      feature, concatenated (`network.check_feature_layers`): (L - 1,) is the
      last layer's output before the final norm (EAGLE-1); a low, a middle and
      the top layer is EAGLE-3's fusion.

  Head fields:
    emb_dim: H, the head's own width (its cost is chosen here).
    num_layers: decoder layers of width H.
    num_heads, head_dim, mlp_dim, mlp_activations: as `network.T5Config`'s.
    output: 'target' (post-projection, then the target's frozen final norm
      and logits layer; needs the last target layer in `feature_layers`) or
      'own' (a narrow output layer [H, V] of the head's own).
    dtype: compute dtype (a dtype or its name); parameters are float32.
    dropout_rate: dropout in training.
  """

  vocab_size: int
  target_emb_dim: int
  target_num_layers: int
  cross_attention: bool
  feature_layers: Tuple[int, ...]
  emb_dim: int = 128
  num_layers: int = 1
  num_heads: int = 4
  head_dim: int = 32
  mlp_dim: int = 256
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  output: str = 'target'
  dtype: Any = 'float32'
  dropout_rate: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, 'feature_layers', tuple(int(i) for i in self.feature_layers))
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    if self.output not in OUTPUTS:
      raise ValueError(
        f"FeatureHeadConfig.output must be one of {OUTPUTS} ('target': the target's own "
        f"logits layer; 'own': a narrow output layer of the head's); got {self.output!r}."
      )
    self.target_network_config()  # Checks feature_layers against the target's depth.
    if self.output == 'target' and self.feature_layers[-1] != self.target_num_layers - 1:
      raise ValueError(
        f"output='target' applies the target's final norm and logits layer to the predicted "
        f"feature's last slice, which must be the last decoder layer's "
        f'({self.target_num_layers - 1}); feature_layers is {self.feature_layers}. End '
        f"feature_layers with {self.target_num_layers - 1} or use output='own'."
      )
    self.layer_config  # Checks the head's own fields (positive sizes, activations, dtype).

  @property
  def feature_width(self) -> int:
    """Df: the width of one position's feature (all feature layers, concatenated)."""
    return len(self.feature_layers) * self.target_emb_dim

  @property
  def layer_config(self) -> network.T5Config:
    """The config of the head's decoder layers (width H), as `network.DecoderLayer` takes it."""
    return network.T5Config(
      vocab_size=self.vocab_size,
      dtype=self.dtype,
      emb_dim=self.emb_dim,
      num_heads=self.num_heads,
      num_encoder_layers=1,
      num_decoder_layers=self.num_layers,
      head_dim=self.head_dim,
      mlp_dim=self.mlp_dim,
      mlp_activations=self.mlp_activations,
      dropout_rate=self.dropout_rate,
    )

  def target_network_config(self) -> network.DecoderOnlyConfig:
    """A stand-in target config with this head's target depth (to check layer indices)."""
    stand_in = network.DecoderOnlyConfig(
      vocab_size=self.vocab_size, emb_dim=self.target_emb_dim, num_layers=self.target_num_layers
    )
    network.check_feature_layers(stand_in, self.feature_layers)
    return stand_in


def _architecture(cross_attention: bool) -> str:
  return 'encoder-decoder' if cross_attention else 'decoder-only'


def config_for(
  target_config: network.NetworkConfig,
  feature_layers: Optional[Sequence[int]] = None,
  **head_fields: Any,
) -> FeatureHeadConfig:
  """A `FeatureHeadConfig` for this target; `feature_layers` None is its last layer.

  `head_fields` are the head's own (`emb_dim`, `num_layers`, `output`, ...).
  """
  num_layers = network.num_decoder_layers(target_config)
  return FeatureHeadConfig(
    vocab_size=target_config.vocab_size,
    target_emb_dim=target_config.emb_dim,
    target_num_layers=num_layers,
    cross_attention=not network.is_decoder_only(target_config),
    feature_layers=(num_layers - 1,) if feature_layers is None else tuple(feature_layers),
    **head_fields,
  )


def check_target(config: FeatureHeadConfig, target_config: network.NetworkConfig) -> None:
  """ValueError unless the head was built for a target of this vocabulary, width and architecture.

  A head that reads the wrong features would draft garbage with no error
  (tau = 1 silently); this names both sides instead.
  """
  head = (
    f'vocabulary {config.vocab_size}, width {config.target_emb_dim}, '
    f'{config.target_num_layers} decoder layers, {_architecture(config.cross_attention)}'
  )
  target = (
    f'vocabulary {target_config.vocab_size}, width {target_config.emb_dim}, '
    f'{network.num_decoder_layers(target_config)} decoder layers, '
    f'{_architecture(not network.is_decoder_only(target_config))}'
  )
  if head != target:
    raise ValueError(
      f'The feature head was built for a target with {head}, but the target has {target}. '
      'Build the head for this target (feature_head.config_for(target.config, ...)) and '
      'train it on its features.'
    )


def check_params(config: FeatureHeadConfig, params: PyTree) -> None:
  """ValueError unless `params` have the shapes of `FeatureHead(config)`'s, naming the first misfit."""
  expected = jax.tree_util.tree_leaves_with_path(abstract_params(config))
  actual = dict(jax.tree_util.tree_leaves_with_path(kernels.plain_params(params)))
  for path, leaf in expected:
    name = jax.tree_util.keystr(path)
    shape = getattr(actual.get(path), 'shape', None)
    if shape is None:
      raise ValueError(
        f'Feature head parameter {name} {leaf.shape} is missing: the parameters are of '
        'another head config, or of a head saved before its input norms or its start state '
        'existed; retrain the head (in a new model directory) with this version.'
      )
    if shape != leaf.shape:
      raise ValueError(
        f'Feature head parameter {name} has shape {shape} but the head config '
        f'(width {config.emb_dim}, feature width {config.feature_width}, vocabulary '
        f'{config.vocab_size}, output {config.output!r}) needs {leaf.shape}: the parameters '
        'belong to another head config.'
      )
  if len(actual) != len(expected):
    extra = sorted(
      set(map(jax.tree_util.keystr, actual)) - {jax.tree_util.keystr(p) for p, _ in expected}
    )
    raise ValueError(
      f'Feature head parameters {extra} are not part of a head with output '
      f'{config.output!r} and {config.num_layers} layer(s).'
    )


class FeatureHead(nn.Module):
  """The head (see the module docstring): teacher-forced `__call__` and a block-cached `decode_block`.

  Both return (predicted features [B, k, Df] float32, normalized hidden states
  [B, k, H]); `own_logits` is the narrow output layer (output 'own').
  Parameters: `feature_norms_{i}` (one per feature layer), `embedding_norm`,
  `pre_projection`, `start_input` (the start state's input [H]),
  `relpos_bias`, `layers_{i}` (T5X's decoder layer), `head_norm`,
  `post_projection`, and `logits_dense` for output 'own'.
  """

  config: FeatureHeadConfig

  def setup(self):
    cfg = self.config
    layer_cfg = cfg.layer_config
    dtype = layer_cfg.dtype
    self.feature_norms = [network.LayerNorm(dtype) for _ in cfg.feature_layers]
    self.embedding_norm = network.LayerNorm(dtype)
    self.pre_projection = network.DenseGeneral(
      cfg.emb_dim, dtype=dtype, kernel_axes=('mlp', 'embed')
    )
    self.start_input = network.param_with_axes(
      'start_input',
      nn.initializers.normal(stddev=1.0),
      (cfg.emb_dim,),
      jnp.float32,
      axes=('embed',),
    )
    self.relpos_bias = network.RelativePositionBiases(cfg.num_heads, dtype)
    self.layers = [
      network.DecoderLayer(layer_cfg, cross_attention=cfg.cross_attention)
      for _ in range(cfg.num_layers)
    ]
    self.head_norm = network.LayerNorm(dtype)
    self.post_projection = network.DenseGeneral(
      cfg.feature_width, dtype=jnp.float32, kernel_axes=('embed', 'mlp')
    )
    if cfg.output == 'own':
      self.logits_dense = network.DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=('embed', 'vocab')
      )

  def __call__(
    self,
    features: Array,
    next_embedded: Array,
    encoded: Optional[Array] = None,
    encoder_mask: Optional[Array] = None,
    deterministic: bool = True,
  ) -> Tuple[Array, Array]:
    """Teacher-forced over positions 0..L-1, causal, no cache.

    Args:
      features: [B, L, Df], the (true or predicted) feature at each position.
      next_embedded: [B, L, D], the target's embedding of the token after it.
      encoded: [B, Lin, D], the target's encoder output (encoder-decoder).
      encoder_mask: bool [B, Lin], its non-padding positions.
      deterministic: disables dropout.
    """
    return self.unrolled(features, next_embedded, encoded, encoder_mask, 1, deterministic)[1][0]

  def start(
    self,
    batch: int,
    encoded: Optional[Array] = None,
    encoder_mask: Optional[Array] = None,
    deterministic: bool = True,
  ) -> Tuple[Array, Array]:
    """The start state (module docstring): (predicted feature^_0 [B, 1, Df], hidden [B, 1, H]).

    Uncached: the entry attends only to itself, as the first rollout's
    entries see nothing before them. `encoded` [B, Lin, D] and
    `encoder_mask` bool [B, Lin] for an encoder-decoder target.
    """
    y = jnp.broadcast_to(
      jnp.asarray(self.start_input, self.config.layer_config.dtype), (batch, 1, self.config.emb_dim)
    )
    origin = jnp.zeros((1, 1), jnp.int32)
    self_bias = self._bias(origin, origin, jnp.ones((1, 1, 1, 1), bool))
    cross_bias = self._cross_bias(encoder_mask)
    for layer in self.layers:
      y, _ = layer.with_context(y, [], self_bias, encoded, cross_bias, deterministic)
    return self._outputs(y)

  def unrolled(
    self,
    features: Array,
    next_embedded: Array,
    encoded: Optional[Array],
    encoder_mask: Optional[Array],
    steps: int,
    deterministic: bool = True,
  ) -> Tuple[Tuple[Array, Array], Sequence[Tuple[Array, Array]]]:
    """The training-time test: (the start state, [(predicted, hidden) of depth k] for k < steps).

    The start state is `start`'s, [B, 1, ...]; each depth's outputs are
    [B, L, ...]. Depth 0 reads the true features. The depth-k entry at
    position t is what the rollout computes k steps past the last true
    position t - k: it reads the depth k - 1 prediction made at t - 1 and the
    embedding of the token at t + 1, and sees the true entries at positions
    <= t - k and its own chain, the depth-j entries at t - k + j (j = 1..k),
    exactly the cache a rollout's step k + 1 sees (EAGLE-3's masks). At
    t = k - 1 that is a rollout from the start state (no true entry; position
    0 reads the start's predicted feature); chains longer than that (t < k - 1)
    are cut at position 0 the same way.
    """
    positions = jnp.arange(features.shape[1])
    query, key = positions[:, None], positions[None, :]
    cross_bias = self._cross_bias(encoder_mask)
    start = self.start(features.shape[0], encoded, encoder_mask, deterministic)
    contexts = [[] for _ in self.layers]
    outputs, inputs = [], features
    for depth in range(steps):
      visible = [key <= query - depth] + [key == query - depth + j for j in range(1, depth + 1)]
      visible = jnp.concatenate(visible, axis=1)[None, None]
      key_positions = jnp.tile(positions, depth + 1)[None]
      self_bias = self._bias(positions[None], key_positions, visible)
      y = self._project_inputs(inputs, next_embedded)
      for layer, context in zip(self.layers, contexts):
        y, normed = layer.with_context(y, context, self_bias, encoded, cross_bias, deterministic)
        context.append(normed)
      outputs.append(self._outputs(y))
      # Depth k + 1 reads at position t the depth-k prediction made at t - 1
      # (at position 0, the start state's).
      inputs = jnp.concatenate([start[0], outputs[-1][0][:, :-1]], axis=1)
    return start, outputs

  def init_cache(
    self,
    batch: int,
    cache_length: int,
    encoded: Optional[Array] = None,
    encoder_mask: Optional[Array] = None,
  ) -> None:
    """Zero self-attention caches; with `encoded` the cross-attention keys/values and mask."""
    for layer in self.layers:
      layer.init_cache(batch, cache_length, encoded)
    if encoder_mask is not None:
      self.put_variable('cache', 'encoder_mask', encoder_mask)

  def decode_block(
    self,
    features: Array,
    next_embedded: Array,
    start_positions: Array,
    tree: Any = None,
    first_node: int = 0,
  ) -> Tuple[Array, Array]:
    """k entries per row against the cache (overwriting their slots), laid out as a chain or tree.

    As `network.Transformer.decode_block`'s: a chain's entry j sits at
    start_positions[b] + j and attends causally within the block and to the
    row's cached positions before its start; with a static `tree`, the block
    is nodes first_node..first_node+k-1, node i's entry goes to slot start + i
    and attends to the context and its ancestors' slots
    (`network.tree_attention_layout`). features [B, k, Df], next_embedded
    [B, k, D], start_positions int32 [B].
    """
    cache_length = self.layers[0].self_attention.cache_shape()[1]
    query_positions, key_positions, visible = network.tree_attention_layout(
      start_positions, cache_length, features.shape[1], tree, first_node
    )
    self_bias = self._bias(query_positions, key_positions, visible)
    cross_bias = None
    if self.config.cross_attention:
      cross_bias = self._cross_bias(self.get_variable('cache', 'encoder_mask'))
    y = self._project_inputs(features, next_embedded)
    for layer in self.layers:
      y = layer.decode_block(y, None, self_bias, cross_bias, start_positions + first_node)
    return self._outputs(y)

  def own_logits(self, hidden: Array) -> Array:
    """float32 [..., V] of normalized hidden states [..., H] (output 'own')."""
    return self.logits_dense(hidden)

  def _project_inputs(self, features, next_embedded):
    """pre_projection of the normalized inputs: features [B, k, Df], next_embedded [B, k, D] -> [B, k, H]."""
    width = self.config.target_emb_dim
    slices = [
      norm(features[..., i * width : (i + 1) * width]) for i, norm in enumerate(self.feature_norms)
    ]
    return self.pre_projection(jnp.concatenate(slices + [self.embedding_norm(next_embedded)], -1))

  def _bias(self, query_positions, key_positions, visible):
    relative = self.relpos_bias(query_positions, key_positions, bidirectional=False)
    return jnp.where(visible, relative, network.NEG_INF)

  def _cross_bias(self, encoder_mask):
    if encoder_mask is None:
      return None
    bias = jnp.where(encoder_mask[:, None, None, :], 0.0, network.NEG_INF)
    return bias.astype(self.config.layer_config.dtype)

  def _outputs(self, y):
    hidden = self.head_norm(y)
    return self.post_projection(hidden), hidden


# ------------------------------------------------------------------------------
# Pure functions.
# ------------------------------------------------------------------------------
def _example_args(config: FeatureHeadConfig):
  features = jnp.zeros((1, 1, config.feature_width), jnp.float32)
  embedded = jnp.zeros((1, 1, config.target_emb_dim), jnp.float32)
  if not config.cross_attention:
    return features, embedded
  return features, embedded, jnp.zeros((1, 1, config.target_emb_dim)), jnp.ones((1, 1), bool)


def init_variables(config: FeatureHeadConfig, rng: Array) -> PyTree:
  """`FeatureHead(config)`'s flax variables: 'params' and their logical axes 'params_axes'.

  T5X's partitioner shards the head by 'params_axes' (`t5x_adapter`).
  """
  variables = FeatureHead(config).init(rng, *_example_args(config))
  # `own_logits` is not reached by __call__; initialize it too.
  if config.output == 'own':
    own = FeatureHead(config).init(
      rng, jnp.zeros((1, config.emb_dim)), method=FeatureHead.own_logits
    )
    for collection, tree in own.items():
      variables[collection]['logits_dense'] = tree['logits_dense']
  return variables


def abstract_params(config: FeatureHeadConfig) -> PyTree:
  """The shapes (`jax.ShapeDtypeStruct`) of `FeatureHead(config)`'s parameters, computing nothing."""
  return jax.eval_shape(lambda: init_variables(config, jax.random.PRNGKey(0))['params'])


def init_params(config: FeatureHeadConfig, seed: int = 0) -> PyTree:
  """Random parameters (T5X's initializers; float32), drawn on the host.

  Same per-parameter scales as `network.random_params` (kernels std
  1/sqrt(fan_in), queries further / sqrt(head_dim), layer norm scales 1,
  relative position tables uniform), without compiling `init`.
  """
  params = network.t5x_like_random_params(abstract_params(config), config.head_dim, seed)
  return jax.tree.map(jnp.asarray, params)


def embedding_aligned_params(
  config: FeatureHeadConfig, params: PyTree, target_embedding: Array
) -> PyTree:
  """`params` with the head's token paths started in the target embedding's principal subspace.

  With A [D, r] the top r = min(H, D, V) right singular vectors of the
  target's embedding E [V, D], the embedding's rows of the pre-projection
  become A (scaled to the random init's entry size) and, for output 'own',
  the output layer's first r rows A^T E^T / sqrt(D): the head's width starts
  as coordinates of the target's own token geometry, read on the way in and
  out, instead of a random basis it must first learn. Other parameters are
  kept. On `make demo`'s target (three seeds) held-out alpha rose by 0.008-0.027
  at 60 and 120 training steps and by -0.005 to 0.016 at 180; tokens per
  target call on 256 test sentences by 1-10 % greedily and 0-5 % at T = 1
  (docs/results.md).

  Args:
    config: the head's config.
    params: its parameters (`init_params`'s).
    target_embedding: float [V, D], the target's embedding of tokens 0..V-1
      (`network.embed_tokens`).
  """
  embedding = np.asarray(target_embedding, np.float64)
  width = config.target_emb_dim  # D
  expected = (config.vocab_size, width)
  if embedding.shape != expected:
    raise ValueError(
      f'target_embedding has shape {embedding.shape}; the head reads a target with '
      f'vocabulary and width {expected}. Pass network.embed_tokens(target_config, '
      f'target_params, jnp.arange({config.vocab_size})).'
    )
  _, _, right = np.linalg.svd(embedding, full_matrices=False)
  rank = min(config.emb_dim, *embedding.shape)
  basis = right[:rank].T  # [D, r], orthonormal columns
  params = jax.tree.map(np.array, params)  # Host copies, written below.
  pre = params['pre_projection']['kernel']  # [Df + D, H]; the embedding's rows last.
  rows = slice(config.feature_width, None)
  pre[rows, :rank] = basis * (pre[rows].std() * np.sqrt(width))
  if config.output == 'own':
    params['logits_dense']['kernel'][:rank] = basis.T @ embedding.T / np.sqrt(width)
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def init_cache(
  config: FeatureHeadConfig,
  params: PyTree,
  batch: int,
  cache_length: int,
  encoded: Optional[Array] = None,
  encoder_mask: Optional[Array] = None,
) -> PyTree:
  """The head's block cache: self-attention keys/values as `network.init_decoder_cache`'s.

  For an encoder-decoder target, `encoded` [batch, Lin, D] (the target's
  encoder output) and `encoder_mask` bool [batch, Lin] give the
  cross-attention keys/values and mask.
  """
  if config.cross_attention and encoded is None:
    raise ValueError(
      'A head for an encoder-decoder target attends to its encoder output: pass encoded and '
      'encoder_mask (network.encode of the target).'
    )
  _, variables = FeatureHead(config).apply(
    kernels.variables(params),
    batch,
    cache_length,
    encoded if config.cross_attention else None,
    encoder_mask if config.cross_attention else None,
    method=FeatureHead.init_cache,
    mutable=['cache'],
  )
  return variables['cache']


def apply_block(
  config: FeatureHeadConfig,
  params: PyTree,
  cache: PyTree,
  features: Array,
  next_embedded: Array,
  start_positions: Array,
  *,
  tree: Any = None,
  first_node: int = 0,
) -> Tuple[Tuple[Array, Array], PyTree]:
  """`FeatureHead.decode_block` as a function: ((predicted [B, k, Df], hidden [B, k, H]), cache).

  A chain block, or with a static `tree` (a `tree.Tree`) its nodes from `first_node`.
  """
  if features.shape[-1] != config.feature_width:
    raise ValueError(
      f'The feature head reads features of width {config.feature_width} '
      f'({len(config.feature_layers)} layer(s) x {config.target_emb_dim}) but was given '
      f'features of shape {features.shape}: the target or its feature_layers differ from '
      "the head's."
    )
  outputs, variables = FeatureHead(config).apply(
    kernels.variables(params, cache=cache),
    features,
    next_embedded,
    start_positions.astype(jnp.int32),
    tree,
    first_node,
    method=FeatureHead.decode_block,
    mutable=['cache'],
  )
  return outputs, variables['cache']


def start_state(
  config: FeatureHeadConfig,
  params: PyTree,
  batch: int,
  encoded: Optional[Array] = None,
  encoder_mask: Optional[Array] = None,
) -> Tuple[Array, Array]:
  """`FeatureHead.start` as a function: (predicted [batch, Df], hidden [batch, H]).

  Plain or packed `params`; `encoded` [batch, Lin, D] and `encoder_mask` bool
  [batch, Lin] for an encoder-decoder target.
  """
  predicted, hidden = FeatureHead(config).apply(
    kernels.variables(params),
    batch,
    encoded if config.cross_attention else None,
    encoder_mask if config.cross_attention else None,
    method=FeatureHead.start,
  )
  return predicted[:, 0], hidden[:, 0]


def unrolled(
  config: FeatureHeadConfig,
  params: PyTree,
  features: Array,
  next_embedded: Array,
  encoded: Optional[Array] = None,
  encoder_mask: Optional[Array] = None,
  steps: int = 1,
  dropout_key: Optional[Array] = None,
) -> Tuple[Tuple[Array, Array], Sequence[Tuple[Array, Array]]]:
  """`FeatureHead.unrolled` as a function: (start, depths).

  start: the start state (predicted [B, Df], hidden [B, H]); depths:
  [(predicted [B, L, Df], hidden [B, L, H])] by depth. features [B, L, Df]
  are the target's true features at positions 0..L-1, next_embedded
  [B, L, D] the target's embedding of the token after each.
  """
  (start_predicted, start_hidden), depths = FeatureHead(config).apply(
    {'params': params},
    features,
    next_embedded,
    encoded,
    encoder_mask,
    steps,
    deterministic=dropout_key is None,
    rngs=None if dropout_key is None else {'dropout': dropout_key},
    method=FeatureHead.unrolled,
  )
  return (start_predicted[:, 0], start_hidden[:, 0]), depths


def logits(
  config: FeatureHeadConfig,
  params: PyTree,
  target_config: network.NetworkConfig,
  target_params: PyTree,
  predicted: Array,
  hidden: Array,
) -> Array:
  """float32 [..., V]: the head's next-token logits from its outputs (see the module docstring)."""
  if config.output == 'own':
    return FeatureHead(config).apply(
      kernels.variables(params), hidden, method=FeatureHead.own_logits
    )
  top = predicted[..., -config.target_emb_dim :]
  return network.logits_from_features(target_config, target_params, top)
