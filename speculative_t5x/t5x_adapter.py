"""T5X integration: speculative decoding inside T5X's `infer.py`.

`SpeculativeEncoderDecoderModel` is a `t5x.models.EncoderDecoderModel` whose
`predict_batch_with_aux` runs `decoding.speculative_sample` with a draft
network, so that a T5X inference command decodes speculatively by adding one
gin file (`configs/t5x/speculative_xxl_small.gin` and its siblings):

  python -m t5x.infer \
    --gin_search_paths=/path/to/speculative_t5x \
    --gin_file=t5x/examples/t5/t5_1_1/examples/base_wmt_infer.gin \
    --gin_file=configs/t5x/speculative_xxl_small.gin \
    --gin.CHECKPOINT_PATH=... --gin.DRAFT_CHECKPOINT_PATH=... ...

(`configs/t5x/speculative.gin` documents the whole command.)

Parameters. One tree holds both networks: the target's parameters at the top
level, in T5X's tree (a T5X checkpoint of the target restores unchanged), and
the draft's under `params['draft']`. `get_initial_variables` builds both trees
and both `params_axes`, so T5X's partitioner shards the draft by the same
logical axis rules, and the jitted inference step takes the draft's parameters
as traced arguments (not as constants folded into the program).

Restoring. T5X restores one checkpoint. `graft_draft_checkpoint(path)` makes a
`utils.RestoreCheckpointConfig.state_transformation_fns` entry that adds the
draft checkpoint's parameters to the restored state under `target/draft`;
T5X then casts and shards them with the rest (legacy and orbax T5X
checkpoints alike: both treat the grafted host arrays as values stored with
the checkpoint's structure).

Scoring and training see the target only: `loss_fn`, `eval_fn` and
`score_batch` all compute logits through `_compute_logits`, which drops
`params['draft']`.

t5x is optional. This module imports without it, and so do its functions over
arrays (`speculative_predict_batch`, `graft_draft_params`, ...), which the
model class calls and which tests and notebooks use directly; only the class
needs t5x: `t5x_adapter.SpeculativeEncoderDecoderModel` imports it on first
access and raises ImportError with installation instructions if it is missing.
"""

import functools
import inspect
from typing import Any, Callable, Dict, Mapping, MutableMapping, Optional, Tuple

from absl import logging
import flax
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import checkpoints
from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import network
from speculative_t5x import speculative_sampling

PyTree = Any
Array = jax.Array
# `(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`, as
# `t5x.checkpoints.RestoreStateTransformationFn`.
RestoreStateTransformationFn = Callable[..., PyTree]

# Where the draft's parameters (and their logical axes) live in the tree.
DRAFT_KEY = 'draft'

_T5X_MISSING = (
    'SpeculativeEncoderDecoderModel subclasses t5x.models.EncoderDecoderModel, '
    'but t5x cannot be imported ({error!r}). t5x is not on PyPI: install it '
    'from its source repository, google-research/t5x on GitHub (clone it, then '
    '`pip install -e ./t5x`). Some of its own dependencies (airio, a recent '
    'jestimator) also come from their source repositories; see t5x\'s '
    'setup.py. The rest of speculative_t5x works without t5x.')


# ------------------------------------------------------------------------------
# Parameters: the target's tree with the draft's under 'draft'.
# ------------------------------------------------------------------------------
def split_draft_params(params: Mapping[str, Any]) -> Tuple[Dict[str, Any], PyTree]:
  """(target params without the draft, the draft's params) from one tree."""
  if DRAFT_KEY not in params:
    raise ValueError(
        f"The parameters have no '{DRAFT_KEY}' subtree (top-level keys: {sorted(params)}). "
        'Restore the draft with the state transformation of graft_draft_checkpoint '
        '(configs/t5x/speculative.gin adds it), or initialize with '
        'SpeculativeEncoderDecoderModel.get_initial_variables.')
  return strip_draft_params(params), params[DRAFT_KEY]


def strip_draft_params(params: Mapping[str, Any]) -> Dict[str, Any]:
  """The target's parameters: `params` without its 'draft' subtree, if any."""
  return {name: subtree for name, subtree in params.items() if name != DRAFT_KEY}


def add_draft_variables(variables: Mapping[str, Any],
                        draft_variables: Mapping[str, Any]) -> Dict[str, Any]:
  """The target's variables with the draft's `params` and `params_axes` under 'draft'.

  Args:
    variables: `module.init(...)` of the target: 'params' and 'params_axes'.
    draft_variables: the same of the draft.

  Returns:
    An unfrozen copy of `variables` whose 'params' and 'params_axes' each
    have a 'draft' entry, so that T5X's `InferenceState` and partitioner see
    one consistent tree.
  """
  variables = flax.core.unfreeze(variables)
  for collection in ('params', 'params_axes'):
    if collection not in draft_variables or collection not in variables:
      raise ValueError(
          f"Both networks need '{collection}' (params with logical axis annotations, as "
          f'network.Transformer makes them); the target has {sorted(variables)} and the draft '
          f'{sorted(draft_variables)}.')
    if DRAFT_KEY in variables[collection]:
      raise ValueError(f"The target network's {collection} already has a '{DRAFT_KEY}' entry; "
                       'it cannot also hold a draft network.')
    variables[collection][DRAFT_KEY] = flax.core.unfreeze(draft_variables[collection])
  return variables


def init_network_variables(module: network.Transformer, rng: Array,
                           input_shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, Any]:
  """`module.init` on ones of T5X's input shapes (`encoder_input_tokens`, `decoder_input_tokens`)."""
  encoder_tokens = jnp.ones(input_shapes['encoder_input_tokens'], jnp.int32)
  decoder_tokens = jnp.ones(input_shapes['decoder_input_tokens'], jnp.int32)
  return flax.core.unfreeze(module.init(rng, encoder_tokens, decoder_tokens, decoder_tokens,
                                        enable_dropout=False))


# ------------------------------------------------------------------------------
# Restoring: graft a draft checkpoint into the restored state.
# ------------------------------------------------------------------------------
def graft_draft_params(state_dict: Mapping[str, Any], draft_params: PyTree,
                       target_state_dict: Mapping[str, Any]) -> Dict[str, Any]:
  """`state_dict` with `draft_params` at `state_dict['target']['draft']`.

  Args:
    state_dict: a T5X optimizer state dict read from a checkpoint
      (`{'target': params, 'state': ...}`; leaves are arrays, tensorstore
      specs or orbax metadata, left as they are).
    draft_params: the draft's parameter tree of host arrays.
    target_state_dict: the state of the model being restored (leaves with
      `.shape`); its `target/draft` subtree fixes the tree and shapes that
      `draft_params` must have.

  Returns:
    A new state dict; `state_dict` is not modified.
  """
  expected = target_state_dict.get('target', {}).get(DRAFT_KEY)
  if expected is None:
    raise ValueError(
        f"The model being restored has no '{DRAFT_KEY}' parameters: grafting a draft checkpoint "
        'needs MODEL = @t5x_adapter.SpeculativeEncoderDecoderModel() (configs/t5x/*.gin).')
  expected_shapes = {path: tuple(leaf.shape)
                     for path, leaf in traverse_util.flatten_dict(expected).items()}
  found_shapes = {path: tuple(np.shape(leaf))
                  for path, leaf in traverse_util.flatten_dict(draft_params).items()}
  if found_shapes != expected_shapes:
    missing = sorted(expected_shapes.keys() - found_shapes.keys())
    unexpected = sorted(found_shapes.keys() - expected_shapes.keys())
    mis_shaped = sorted(path for path in expected_shapes.keys() & found_shapes.keys()
                        if expected_shapes[path] != found_shapes[path])
    if mis_shaped:
      path = mis_shaped[0]
      problem = (f'{"/".join(path)} has shape {found_shapes[path]}, but the draft network '
                 f'needs {expected_shapes[path]}')
    elif missing:
      problem = f'{"/".join(missing[0])} is missing'
    else:
      problem = f'{"/".join(unexpected[0])} is not a parameter of the draft network'
    raise ValueError(
        f'The draft checkpoint does not match the configured draft network: {problem} '
        f'({len(missing)} missing, {len(unexpected)} unexpected, {len(mis_shaped)} mis-shaped). '
        'Check DRAFT_SIZE (or the draft network config) against DRAFT_CHECKPOINT_PATH.')
  return {**state_dict, 'target': {**state_dict['target'], DRAFT_KEY: draft_params}}


def graft_draft_checkpoint(draft_checkpoint_path: str,
                           dtype: Optional[str] = None) -> RestoreStateTransformationFn:
  """A `RestoreCheckpointConfig.state_transformation_fns` entry adding a draft.

  In gin (configs/t5x/speculative.gin does this):

    utils.RestoreCheckpointConfig.state_transformation_fns = [
        @t5x_adapter.graft_draft_checkpoint()]
    t5x_adapter.graft_draft_checkpoint.draft_checkpoint_path = %DRAFT_CHECKPOINT_PATH

  The returned function reads the draft checkpoint each time T5X restores a
  target checkpoint (`checkpoints.load_params`: a T5X checkpoint, legacy or
  orbax, a model directory meaning its latest step; also this project's
  orbax checkpoints and Hugging Face directories) and grafts its parameters
  under `target/draft` (`graft_draft_params`). When T5X resumes from a
  checkpoint that already holds a draft (`is_resuming=True`), that draft is
  kept.

  Args:
    draft_checkpoint_path: where the draft's checkpoint is (local or gs://).
    dtype: cast the draft's parameters on reading (e.g. 'bfloat16'); None
      keeps the stored dtypes. T5X casts all restored parameters to
      `RestoreCheckpointConfig.dtype` afterwards in any case.

  Returns:
    `graft(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`.
  """
  if not draft_checkpoint_path or not isinstance(draft_checkpoint_path, str):
    raise ValueError('graft_draft_checkpoint needs the draft checkpoint path; set '
                     f'DRAFT_CHECKPOINT_PATH (got {draft_checkpoint_path!r}).')

  def graft(state_dict, target_state_dict, *, is_resuming=False):
    if is_resuming and DRAFT_KEY in state_dict.get('target', {}):
      return state_dict
    logging.info('Grafting the draft checkpoint %s under target/%s.', draft_checkpoint_path,
                 DRAFT_KEY)
    draft_params = checkpoints.load_params(draft_checkpoint_path, dtype=dtype)
    return graft_draft_params(state_dict, draft_params, target_state_dict)

  return graft


# ------------------------------------------------------------------------------
# Prediction: both encoders, both caches, the block scorer, speculative_sample.
# ------------------------------------------------------------------------------
def check_networks(module: Any, draft_module: Any) -> None:
  """Raises ValueError unless both are `network.Transformer`s with one vocabulary."""
  for name, value in (('module', module), ('draft_module', draft_module)):
    if not isinstance(value, network.Transformer):
      raise ValueError(
          f'{name} must be a speculative_t5x.network.Transformer (T5X\'s T5 1.1 parameter tree '
          'plus the block-cached decoding that speculative decoding needs); got '
          f'{type(value).__module__}.{type(value).__qualname__}. In gin: '
          f'{name} = @speculative_network.Transformer().')
  drafts.check_shared_vocabulary(draft_module.config.vocab_size, module.config.vocab_size)


def speculative_predict_batch(
    module: network.Transformer,
    draft_module: network.Transformer,
    params: Mapping[str, Any],
    batch: Mapping[str, Array],
    *,
    eos_id: int,
    gamma: int,
    lenience: float = 1.0,
    decode_fn: Callable[..., Tuple[Array, Array, decoding.SpeculativeStats]] = (
        decoding.speculative_sample),
    rng: Optional[Array] = None,
    decoder_params: Optional[Mapping[str, Any]] = None,
    num_decodes: int = 1,
    return_all_decodes: bool = False,
) -> Tuple[Array, Dict[str, Array]]:
  """Decodes a T5X batch speculatively: the computation of `predict_batch_with_aux`.

  Encodes the inputs with both networks, builds both block caches with room
  for the output plus one block (`decoding.speculative_cache_length`), and
  calls `decode_fn` with the target's block scorer and a `drafts.ModelDraft`.

  Args:
    module: the target network.
    draft_module: the draft network (same vocabulary).
    params: the target's parameters with the draft's under 'draft'.
    batch: T5X's encoder-decoder features: `encoder_input_tokens` int32
      [B, input_length] (0 is padding) and `decoder_input_tokens` int32
      [B, L], whose width L is the output length (its values are unused:
      decoding starts from BOS).
    eos_id: end-of-sequence id.
    gamma: draft tokens per iteration.
    lenience: 1 is exact; below 1 see `speculative_sampling.verify`.
    decode_fn: a speculative decode function with the signature of
      `decoding.speculative_sample` (sampling settings bound in gin).
    rng: PRNG key for sampling, passed as `decode_rng`.
    decoder_params: more keyword arguments of `decode_fn` (e.g.
      `temperature`, `max_decode_steps`); 'gamma' and 'lenience' here override
      the arguments of the same names.
    num_decodes: samples per input.
    return_all_decodes: return every sample, not only the most likely one.

  Returns:
    `(decodes, aux)`. decodes: int32 [B, L], or [B, num_decodes, L] with
    `return_all_decodes` (ascending log probability). aux, arrays whose
    leading axis is the batch (as T5X's `predict_with_aux` output needs), per
    decode [B] (or [B, num_decodes]):
      scores: float32 log probability under the target's standardized
        distribution (0 for greedy decoding);
      iterations, accepted, emitted: int32 loop iterations in which the row
        was active, draft tokens accepted, tokens written;
    and per batch, repeated for each input [B]:
      batch_target_calls: int32 target block calls (loop iterations);
      batch_mean_beta: float32 mean acceptance probability beta over the
        batch's judged draft positions (alpha measured on the fly).
  """
  check_networks(module, draft_module)
  decoder_params = {'gamma': gamma, 'lenience': lenience, **(decoder_params or {})}
  if rng is not None:
    if decoder_params.get('decode_rng') is not None:
      raise ValueError("Pass the sampling key either as `rng` or as decoder_params['decode_rng'], "
                       'not both.')
    decoder_params['decode_rng'] = rng
  decoder_params.setdefault('eos_id', eos_id)
  speculative_sampling.validate_lenience(decoder_params['lenience'])
  target_params, draft_params = split_draft_params(params)
  encoder_input_tokens = batch['encoder_input_tokens']
  decoder_input_tokens = batch['decoder_input_tokens']
  cache_length = decoding.speculative_cache_length(decoder_input_tokens.shape[1],
                                                   decoder_params['gamma'])
  cache = network.init_decoder_cache(module.config, target_params, encoder_input_tokens,
                                     cache_length)
  draft = drafts.ModelDraft(params=draft_params, config=draft_module.config)

  def score_block(block_tokens, start_positions, cache):
    return network.apply_decode_block(module.config, target_params, cache, block_tokens,
                                      start_positions)

  decodes, scores, stats = decode_fn(
      inputs=jnp.zeros(decoder_input_tokens.shape, jnp.int32),
      cache=cache,
      score_block=score_block,
      num_decodes=num_decodes,
      draft=draft,
      draft_cache=draft.init_cache(encoder_input_tokens, cache_length),
      **decoder_params)
  aux = {'scores': scores, 'iterations': stats.iterations, 'accepted': stats.accepted,
         'emitted': stats.emitted}
  if not return_all_decodes:
    decodes = decodes[:, -1]
    aux = {name: value[:, -1] for name, value in aux.items()}
  batch_size = decodes.shape[0]
  aux['batch_target_calls'] = jnp.full((batch_size,), stats.target_calls)
  aux['batch_mean_beta'] = jnp.full((batch_size,), stats.mean_beta)
  return decodes, aux


# ------------------------------------------------------------------------------
# The T5X model (needs t5x, imported on first access).
# ------------------------------------------------------------------------------
def _import_t5x_models():
  try:
    from t5x import models  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(_T5X_MISSING.format(error=error)) from error
  return models


@functools.cache
def _speculative_model_class() -> type:
  """Defines `SpeculativeEncoderDecoderModel` once t5x can be imported."""
  t5x_models = _import_t5x_models()

  class SpeculativeEncoderDecoderModel(t5x_models.EncoderDecoderModel):
    """T5X's `EncoderDecoderModel` decoding speculatively with a draft network.

    Arguments are T5X's, in T5X's order (so existing gin bindings apply), with
    `decode_fn` defaulting to `decoding.speculative_sample`, plus the
    keyword-only `draft_module`, `gamma` and `lenience`. Sampling settings
    (`temperature`, `topk`, `topp`) are bound on the decode function in gin,
    as T5X does for `decoding.temperature_sample`; T5X's default `topk=1` is
    greedy. See the module docstring for where the draft's parameters live.

    Attributes:
      draft_module: the draft network.
      gamma: draft tokens per iteration (static: it sizes the caches).
      lenience: 1 is exact speculative sampling; below 1 trades exactness for
        acceptance (Appendix A.5 of Leviathan et al.).
    """

    def __init__(self,
                 module: network.Transformer,
                 input_vocabulary,
                 output_vocabulary,
                 optimizer_def,
                 decode_fn=decoding.speculative_sample,
                 feature_converter_cls=None,
                 label_smoothing: float = 0.0,
                 z_loss: float = 0.0,
                 loss_normalizing_factor=None,
                 default_decoder_params=None,
                 *,
                 draft_module: network.Transformer,
                 gamma: int,
                 lenience: float = 1.0):
      check_networks(module, draft_module)
      decoding.check_positive_int('gamma', gamma)
      speculative_sampling.validate_lenience(lenience)
      decode_fn_args = inspect.signature(decode_fn).parameters
      if not {'score_block', 'draft', 'draft_cache', 'gamma'} <= decode_fn_args.keys():
        raise ValueError(
            f'decode_fn must be a speculative decode function such as '
            'speculative_t5x.decoding.speculative_sample (taking score_block, draft, draft_cache '
            f'and gamma); got {getattr(decode_fn, "__name__", decode_fn)!r}. Single-token decode '
            "functions (t5x.decoding.temperature_sample, beam_search) belong to T5X's "
            'EncoderDecoderModel.')
      self.draft_module = draft_module
      self.gamma = int(gamma)
      self.lenience = lenience
      super().__init__(
          module=module,
          input_vocabulary=input_vocabulary,
          output_vocabulary=output_vocabulary,
          optimizer_def=optimizer_def,
          decode_fn=decode_fn,
          feature_converter_cls=feature_converter_cls,
          label_smoothing=label_smoothing,
          z_loss=z_loss,
          loss_normalizing_factor=loss_normalizing_factor,
          default_decoder_params=default_decoder_params,
      )

    def get_initial_variables(self, rng, input_shapes, input_types=None):
      """T5X's initial variables of the target, with the draft's under 'draft'."""
      variables = super().get_initial_variables(rng, input_shapes, input_types)
      # A key of its own, so that the draft's initialization is independent of
      # the target's (which keeps T5X's).
      draft_variables = init_network_variables(self.draft_module, jax.random.fold_in(rng, 1),
                                               input_shapes)
      return flax.core.freeze(add_draft_variables(variables, draft_variables))

    def _compute_logits(self, params, batch, dropout_rng=None, mutable=False,
                        other_variables=None):
      """The target's logits; the draft's parameters are dropped (loss, eval, score)."""
      return super()._compute_logits(strip_draft_params(params), batch, dropout_rng, mutable,
                                     other_variables)

    def predict_batch_with_aux(
        self,
        params,
        batch: Mapping[str, Array],
        rng: Optional[Array] = None,
        decoder_params: Optional[MutableMapping[str, Any]] = None,
        return_all_decodes: Optional[bool] = None,
        num_decodes: Optional[int] = None,
        prompt_with_targets: bool = False,
    ) -> Tuple[Array, Mapping[str, Array]]:
      """Speculative decoding of a batch (see `speculative_predict_batch`).

      Arguments and results are T5X's, with acceptance statistics added to
      the aux dict. `prompt_with_targets` (decoder prompts) is not supported.
      """
      if prompt_with_targets:
        raise ValueError('SpeculativeEncoderDecoderModel decodes from BOS: prompt_with_targets '
                         '(decoder prompts) is not supported.')
      defaults = self._default_decoder_params
      return speculative_predict_batch(
          self.module,
          self.draft_module,
          params,
          batch,
          # T5X's fallback for vocabularies without an EOS id.
          eos_id=self.output_vocabulary.eos_id or 1,
          gamma=self.gamma,
          lenience=self.lenience,
          decode_fn=self._decode_fn,
          rng=rng,
          decoder_params=decoder_params,
          num_decodes=defaults.num_decodes if num_decodes is None else num_decodes,
          return_all_decodes=(defaults.return_all_decodes if return_all_decodes is None
                              else return_all_decodes),
      )

  SpeculativeEncoderDecoderModel.__qualname__ = SpeculativeEncoderDecoderModel.__name__
  return SpeculativeEncoderDecoderModel


def __getattr__(name: str):
  if name == 'SpeculativeEncoderDecoderModel':
    return _speculative_model_class()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
