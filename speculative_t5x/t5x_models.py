"""The T5X model classes of speculative decoding; this module imports t5x.

`SpeculativeEncoderDecoderModel` and `SpeculativeDecoderOnlyModel` subclass
T5X's `EncoderDecoderModel` and `DecoderOnlyModel`; gin files bind them as
`t5x_models.SpeculativeEncoderDecoderModel` (and `...DecoderOnlyModel`). The
rest of the integration (parameter grafting, the array-level
`t5x_adapter.speculative_predict_batch`) lives in `t5x_adapter`, which imports
without t5x. See
`t5x_adapter`'s docstring for where the draft's parameters live.

`DraftDistillationEncoderDecoderModel` and `DraftDistillationDecoderOnlyModel`
are the same models trained by T5X's `train.py`: the draft learns to match
the frozen target's distributions (`training.losses`, the loss of
`training.distill`; a feature head's `training.train_feature_head`'s, a
parallel draft's `training.parallel_distill`'s), and only the draft's
parameters change (configs/t5x/distill*.gin).
"""

import inspect
import json
from typing import Any, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from etils import epath
import flax
import jax
import jax.numpy as jnp

from speculative_t5x import decoding
from speculative_t5x import feature_head
from speculative_t5x import layouts
from speculative_t5x import network
from speculative_t5x import run_settings
from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x import t5x_adapter
from speculative_t5x.training import losses
from speculative_t5x.training import parallel_distill
from speculative_t5x.training import train_feature_head

T5X_MISSING = (
  'SpeculativeEncoderDecoderModel subclasses t5x.models.EncoderDecoderModel, '
  'but t5x cannot be imported ({error!r}). t5x is not on PyPI: install it '
  'from its source repository, google-research/t5x on GitHub (clone it, then '
  '`pip install -e ./t5x`). Some of its own dependencies (airio, a recent '
  "jestimator) also come from their source repositories; see t5x's "
  'setup.py. The rest of speculative_t5x works without t5x.'
)


try:
  from t5x import checkpoints as t5x_checkpoints
  from t5x import losses as t5x_losses
  from t5x import metrics as t5x_metrics
  from t5x import models as t5x_models
  from t5x import optimizers
except ImportError as error:
  if not (error.name or '').startswith('t5x'):
    raise
  raise ImportError(T5X_MISSING.format(error=error)) from error
import clu.metrics as clu_metrics  # noqa: E402  (a dependency of t5x: after its check)

Array = jax.Array


def _check_decode_fn(decode_fn) -> None:
  """ValueError unless `decode_fn` is a speculative decode function."""
  decode_fn_args = inspect.signature(decode_fn).parameters
  if not {'score_block', 'draft', 'draft_cache', 'gamma'} <= decode_fn_args.keys():
    raise ValueError(
      f'decode_fn must be a speculative decode function such as '
      'speculative_t5x.decoding.speculative_sample (taking score_block, draft, draft_cache '
      f'and gamma); got {getattr(decode_fn, "__name__", decode_fn)!r}. Single-token decode '
      "functions (t5x.decoding.temperature_sample, beam_search) belong to T5X's own "
      'EncoderDecoderModel and DecoderOnlyModel.'
    )


class _SpeculativeMixin:
  """What both speculative T5X models add to theirs: the draft's variables and settings.

  Mixed in before T5X's model class, so that `super()` is T5X's.
  """

  def _set_speculative(self, network_class, module, draft_module, decode_fn, **fields):
    """Checks both networks, `decode_fn` and the settings' fields; keeps them."""
    t5x_adapter.check_networks(module, draft_module, network_class)
    _check_decode_fn(decode_fn)
    self.draft_module = draft_module
    self.settings = settings_lib.SpeculativeSettings(**fields)

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    """T5X's initial variables of the target, with the draft's under 'draft' (a head's: 'draft_head')."""
    variables = super().get_initial_variables(rng, input_shapes, input_types)
    # A key of its own, so that the draft's initialization is independent of
    # the target's (which keeps T5X's).
    draft_variables = t5x_adapter.init_network_variables(
      self.draft_module, jax.random.fold_in(rng, 1), input_shapes
    )
    return flax.core.freeze(
      t5x_adapter.add_draft_variables(
        variables, draft_variables, t5x_adapter.draft_key(self.draft_module)
      )
    )

  def _compute_logits(self, params, batch, dropout_rng=None, mutable=False, other_variables=None):
    """The target's logits; the draft's parameters are dropped (loss, eval, score)."""
    return super()._compute_logits(
      t5x_adapter.strip_draft_params(params), batch, dropout_rng, mutable, other_variables
    )

  def _predict(self, params, batch, rng, decoder_params, num_decodes, return_all_decodes, **prompt):
    """`speculative_predict_batch` with this model's settings."""
    return t5x_adapter.speculative_predict_batch(
      self.module,
      self.draft_module,
      params,
      batch,
      # T5X's fallback for vocabularies without an EOS id.
      eos_id=self.output_vocabulary.eos_id or 1,
      settings=self.settings,
      decode_fn=self._decode_fn,
      rng=rng,
      decoder_params=decoder_params,
      num_decodes=num_decodes,
      return_all_decodes=return_all_decodes,
      **prompt,
    )


_SETTINGS_DOC = """
    Attributes:
      draft_module: the draft network; a `t5x_adapter.ParallelDraftNetwork`
        of one: a parallel draft, gamma tokens from one call over mask tokens
        (`parallel_draft.ParallelDraft`; its parameters {'network',
        'mask_embedding'} under `params['draft']`,
        configs/t5x/speculative_parallel_draft.gin); or a
        `feature_head.FeatureHeadConfig` built for the target: a feature head
        drafting from the target's own features (`drafts.FeatureDraft`; its
        parameters under `params['draft_head']`,
        configs/t5x/speculative_feature_head.gin).
      settings: the `settings.SpeculativeSettings` built from the keyword-only
        `gamma` (static: it sizes the caches; 'auto': by batch size from the
        profile at `speculation_profile`, gin SPECULATION_PROFILE),
        `lenience`, `verification`, `draft_threshold` and `tree` (a token tree
        per call, gin TREE; gamma is then its depth) (gin binds them; see
        `SpeculativeSettings`).
"""


class SpeculativeEncoderDecoderModel(_SpeculativeMixin, t5x_models.EncoderDecoderModel):
  """T5X's `EncoderDecoderModel` decoding speculatively with a draft network.

  Arguments are T5X's, in T5X's order (so existing gin bindings apply), with
  `decode_fn` defaulting to `decoding.speculative_sample`, plus the
  keyword-only `draft_module`, `gamma`, `lenience`, `verification`,
  `draft_threshold`, `speculation_profile` and `tree`. Sampling settings (`temperature`, `topk`, `topp`) are
  bound on the decode function in gin, as T5X does for
  `decoding.temperature_sample`; T5X's default `topk=1` is greedy. See the
  module docstring for where the draft's parameters live.
  """

  def __init__(
    self,
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
    draft_module: Union[
      network.Transformer, t5x_adapter.ParallelDraftNetwork, feature_head.FeatureHeadConfig
    ],
    gamma: Union[int, str, None],
    lenience: float = settings_lib.DEFAULTS.lenience,
    verification: str = settings_lib.DEFAULTS.verification,
    draft_threshold: float = settings_lib.DEFAULTS.draft_threshold,
    speculation_profile: Optional[str] = None,
    tree: Optional[Any] = None,
  ):
    self._set_speculative(
      network.Transformer,
      module,
      draft_module,
      decode_fn,
      gamma=gamma,
      lenience=lenience,
      verification=verification,
      draft_threshold=draft_threshold,
      profile=speculation_profile,
      tree=tree,
    )
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
    the aux dict. With `prompt_with_targets`, `decoder_input_tokens` is
    the decoder prompt, its EOS ids removed (T5X's rule), prefilled in one
    block call per network; the decodes keep the prompt, as T5X's do.
    """
    decoder_prompt = None
    if prompt_with_targets:
      tokens = batch['decoder_input_tokens']
      decoder_prompt = tokens * (tokens != self.output_vocabulary.eos_id)
    defaults = self._default_decoder_params
    return self._predict(
      params,
      batch,
      rng,
      decoder_params,
      defaults.num_decodes if num_decodes is None else num_decodes,
      defaults.return_all_decodes if return_all_decodes is None else return_all_decodes,
      decoder_prompt=decoder_prompt,
    )


class SpeculativeDecoderOnlyModel(_SpeculativeMixin, t5x_models.DecoderOnlyModel):
  """T5X's `DecoderOnlyModel` decoding speculatively with a decoder-only draft.

  Arguments are T5X's, in T5X's order, with `decode_fn` defaulting to
  `decoding.speculative_sample`, plus the keyword-only settings of
  `SpeculativeEncoderDecoderModel`. Decoding follows T5X's
  `DecoderOnlyModel.predict_batch_with_aux`: the prompt is
  `decoder_input_tokens * decoder_causal_attention`, both networks are
  prefilled with it in one block call each (bidirectionally if
  `inputs_bidirectional_attention`, T5X's prefix LM), and the decodes are
  returned without it (T5X's `remove_prefix`). The draft's parameters live
  under `params['draft']`, as for the encoder-decoder model.
  """

  def __init__(
    self,
    module: network.DecoderOnly,
    vocabulary,
    optimizer_def,
    decode_fn=decoding.speculative_sample,
    inputs_bidirectional_attention: bool = False,
    feature_converter_cls=None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor=None,
    *,
    draft_module: Union[
      network.DecoderOnly, t5x_adapter.ParallelDraftNetwork, feature_head.FeatureHeadConfig
    ],
    gamma: Union[int, str, None],
    lenience: float = settings_lib.DEFAULTS.lenience,
    verification: str = settings_lib.DEFAULTS.verification,
    draft_threshold: float = settings_lib.DEFAULTS.draft_threshold,
    speculation_profile: Optional[str] = None,
    tree: Optional[Any] = None,
  ):
    self._set_speculative(
      network.DecoderOnly,
      module,
      draft_module,
      decode_fn,
      gamma=gamma,
      lenience=lenience,
      verification=verification,
      draft_threshold=draft_threshold,
      profile=speculation_profile,
      tree=tree,
    )
    super().__init__(
      module=module,
      vocabulary=vocabulary,
      optimizer_def=optimizer_def,
      decode_fn=decode_fn,
      inputs_bidirectional_attention=inputs_bidirectional_attention,
      feature_converter_cls=feature_converter_cls,
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      loss_normalizing_factor=loss_normalizing_factor,
    )

  def predict_batch_with_aux(
    self,
    params,
    batch: Mapping[str, Array],
    rng: Optional[Array] = None,
    *,
    return_all_decodes: bool = False,
    num_decodes: int = 1,
    decoder_params: Optional[MutableMapping[str, Any]] = None,
  ) -> Tuple[Array, Mapping[str, Array]]:
    """Speculative decoding of a prefix-LM batch; T5X's arguments and results."""
    if 'decoder_causal_attention' not in batch:
      raise ValueError(
        'The batch has no decoder_causal_attention feature, so there is no prompt to '
        "continue: give the task both 'inputs' and 'targets' (seqio's "
        "DecoderFeatureConverter then marks the inputs), as for T5X's DecoderOnlyModel."
      )
    decoder_prompt = batch['decoder_input_tokens'] * batch['decoder_causal_attention']
    decodes, aux = self._predict(
      params,
      batch,
      rng,
      decoder_params,
      num_decodes,
      return_all_decodes,
      decoder_prompt=decoder_prompt,
      inputs_bidirectional_attention=self._inputs_bidirectional_attention,
    )
    return layouts.remove_prompts(decodes, decoding.prompt_lengths(decoder_prompt)), aux


for _cls in (SpeculativeEncoderDecoderModel, SpeculativeDecoderOnlyModel):
  _cls.__doc__ += _SETTINGS_DOC


# ------------------------------------------------------------------------------
# Training the draft through T5X's train.py.
# ------------------------------------------------------------------------------
class DraftOnlyOptimizer(optimizers.OptimizerDef):
  """A T5X optimizer (`OptimizerDef`) applied to `params['draft']` alone (or another `key`).

  The target's parameters are not touched: `apply_gradient` returns them as
  they came (bit for bit: no update, not even a zero one, is added), and the
  optimizer state covers the draft alone (`param_states` is
  `{'draft': <the inner optimizer's state of the draft>}`). This is what T5X's
  `MultiOptimizer` over a traversal of 'draft' computes, except for the state
  of the other parameters: MultiOptimizer keeps a None per target parameter,
  which T5X's orbax checkpointer records but, on resuming, asks for as an
  array (NOT_FOUND); here there is nothing to record, so a stopped run
  resumes, from orbax and legacy checkpoints alike.

  T5X's train step still differentiates the loss in the whole tree: the
  target's gradient is zero (its logits are under stop_gradient) and unused,
  so XLA drops it from the compiled step; with `num_microbatches`, T5X's
  accumulation loop keeps it, a zero buffer of the target's size.

  Attributes:
    inner: the wrapped `OptimizerDef` (e.g. T5X's `adafactor.Adafactor`, or an
      optax optimizer through `optimizers.OptaxWrapper`).
    key: the subtree that trains: `t5x_adapter.DRAFT_KEY` (a draft network) or
      `t5x_adapter.HEAD_KEY` (a feature head).
  """

  def __init__(self, inner: optimizers.OptimizerDef, key: str = t5x_adapter.DRAFT_KEY):
    self.inner = inner
    self.key = key
    super().__init__(inner.hyper_params)

  def init_state(self, params):
    state = self.inner.init_state(params[self.key])
    return optimizers.OptimizerState(state.step, {self.key: state.param_states})

  def apply_gradient(self, hyper_params, params, state, grads):
    key = self.key
    draft, draft_state = self.inner.apply_gradient(
      hyper_params,
      params[key],
      optimizers.OptimizerState(state.step, state.param_states[key]),
      grads[key],
    )
    if isinstance(params, flax.core.FrozenDict):
      params = params.copy({key: draft})
    else:
      params = {**params, key: draft}
    return params, optimizers.OptimizerState(draft_state.step, {key: draft_state.param_states})

  def update_hyper_params(self, **hyper_param_overrides):
    return self.inner.update_hyper_params(**hyper_param_overrides)

  def set_param_axes(self, param_logical_axes):
    """The inner optimizer's factorization rules (T5X's Adafactor) from the draft's axes."""
    if hasattr(self.inner, 'set_param_axes'):
      self.inner.set_param_axes(param_logical_axes[self.key])

  def derive_logical_axes(self, optimizer, param_logical_axes):
    """T5X's partitioning of the state: the inner optimizer's, derived from the draft's axes."""
    key = self.key
    draft = self.inner.derive_logical_axes(
      optimizers.Optimizer(
        self.inner,
        optimizers.OptimizerState(None, optimizer.state.param_states[key]),
        param_logical_axes[key],
      ),
      param_logical_axes[key],
    )
    return optimizers.Optimizer(
      self, optimizers.OptimizerState(None, {key: draft.state.param_states}), param_logical_axes
    )

  def state_dict(self, target, state):
    return self.inner.state_dict(target, state)

  def restore_state(self, opt_target, opt_state, state_dict):
    return self.inner.restore_state(opt_target, opt_state, state_dict)


class _DistillationMixin:
  """What both draft-training models add to the speculative ones: the loss and the optimizer.

  Mixed in before the speculative model class, whose `__init__` has run when
  `_set_distillation` is called.
  """

  def _set_distillation(
    self,
    draft_model,
    *,
    divergence: str,
    jsd_beta: float,
    temperature,
    topk,
    topp,
    unroll_steps: int,
    decay: float,
    feature_weight: float,
    depth: int,
    keep: float,
    depth_weights: Optional[Sequence[float]],
    acceptance_weighting: bool,
    model_dir: Optional[str],
  ) -> None:
    """Checks the loss settings, keeps them, and restricts the optimizer to the draft."""
    sampling.validate_sampling_args(temperature, topk, topp)
    if isinstance(temperature, (list, tuple)) or jnp.ndim(temperature):
      raise ValueError(
        f'temperature must be one number (the decoding temperature the draft is trained for), '
        f'got {temperature!r}.'
      )
    mode = dict(temperature=float(temperature), topk=int(topk), topp=float(topp))
    self._head_loss = None
    self._parallel_loss = None
    if isinstance(self.draft_module, t5x_adapter.ParallelDraftNetwork):
      if getattr(self, '_inputs_bidirectional_attention', False):
        raise ValueError(
          "A parallel draft's mask tokens attend causally (training.parallel_distill's layout): "
          'train it for causal decoder-only targets (and encoder-decoder ones); this target is '
          'a prefix LM (inputs_bidirectional_attention=True).'
        )
      self._parallel_loss = parallel_distill.loss_config(
        self.module.config,
        self.draft_module.config,
        depth=depth,
        keep=keep,
        depth_weights=depth_weights,
        acceptance_weighting=acceptance_weighting,
        divergence=divergence,
        beta=jsd_beta,
        **mode,
      )
      if model_dir is not None:
        _check_or_record_settings(
          model_dir, parallel_distill.recorded_settings(self._parallel_loss)
        )
    elif isinstance(self.draft_module, feature_head.FeatureHeadConfig):
      if divergence != 'tvd':
        raise ValueError(
          f"divergence={divergence!r} is for draft networks; a feature head's loss is "
          "training.train_feature_head's (soft cross entropy with training-time test): "
          'leave divergence unset and set unroll_steps, decay and feature_weight.'
        )
      if getattr(self, '_inputs_bidirectional_attention', False):
        raise ValueError(
          'A feature head trains on causal decoder-only targets (and encoder-decoder ones); '
          'this target is a prefix LM (inputs_bidirectional_attention=True).'
        )
      self._head_loss = train_feature_head.HeadLossConfig(
        self.draft_module,
        self.module.config,
        unroll_steps=int(unroll_steps),
        decay=float(decay),
        feature_weight=float(feature_weight),
        **mode,
      )
    else:
      losses.validate_divergence(divergence, jsd_beta)
    # A T5X model of the draft network alone: its `_compute_logits` is T5X's, so
    # packed batches (segment ids, positions) and prefix-LM attention reach the
    # draft as they reach the target.
    self._draft_model = draft_model
    self.distillation = dict(divergence_name=divergence, beta=float(jsd_beta), **mode)
    if self.optimizer_def is not None:  # None: a model built for inference only.
      self.optimizer_def = DraftOnlyOptimizer(
        self.optimizer_def, t5x_adapter.draft_key(self.draft_module)
      )

  def loss_fn(self, params, batch: Mapping[str, Array], dropout_rng: Optional[Array]):
    """The distillation loss of the draft against the frozen target, and T5X's metrics.

    The target runs without dropout and under `stop_gradient`; the draft
    with T5X's `dropout_rng` (its network's dropout rate; the distillation
    gin files set 0). A draft network's loss is
    `training.losses.distillation_sums`'s weighted sum over
    `decoder_loss_weights`, a feature head's `training.train_feature_head`'s
    (`head_loss`), each divided by `loss_normalizing_factor` if set (T5X's
    convention for its cross entropy). Metrics: `loss`, and `beta`: the mean
    over real tokens of sum_x min(p, q) of the standardized distributions,
    speculative decoding's acceptance probability (alpha on the training
    sequences; a head's first draft token's); for a draft network also T5X's
    base metrics of its logits (`accuracy` of its argmax against the data's
    tokens, timing).

    Returns:
      (loss float32 scalar, metrics {name: clu metric}).
    """
    if self._head_loss is not None:
      return self._head_loss_fn(params, batch)
    if self._parallel_loss is not None:
      return self._parallel_loss_fn(params, batch, dropout_rng)
    target_params, draft_params = t5x_adapter.split_draft_params(params)
    target_logits = self._compute_logits(jax.lax.stop_gradient(target_params), batch)
    draft_logits = self._draft_model._compute_logits(draft_params, batch, dropout_rng)  # pylint: disable=protected-access
    loss_normalizing_factor, weights = t5x_losses.get_loss_normalizing_factor_and_weights(
      self._loss_normalizing_factor, batch
    )
    if weights is None:  # T5X's rule: padding (id 0) weighs nothing, every other token 1.
      weights = jnp.asarray(batch['decoder_target_tokens'] > 0, jnp.float32)
    sums = losses.distillation_sums(target_logits, draft_logits, weights, **self.distillation)
    loss = (
      sums['loss'] if loss_normalizing_factor is None else sums['loss'] / loss_normalizing_factor
    )
    metrics = self._compute_metrics(
      logits=draft_logits, targets=batch['decoder_target_tokens'], mask=weights, loss=loss
    )
    metrics['beta'] = clu_metrics.Average(total=sums['beta'], count=jnp.sum(weights))
    return loss, metrics

  def _head_loss_fn(self, params, batch: Mapping[str, Array]):
    """`loss_fn` of a feature head: `train_feature_head.head_loss` on unpacked batches."""
    if 'decoder_segment_ids' in batch:
      raise ValueError(
        "A feature head trains on unpacked batches (its loss runs the head's own attention "
        'over whole rows): set --gin.train/utils.DatasetConfig.pack=False and '
        '--gin.train_eval/utils.DatasetConfig.pack=False.'
      )
    target_params, head_params = t5x_adapter.split_draft_params(params, t5x_adapter.HEAD_KEY)
    loss_normalizing_factor, _ = t5x_losses.get_loss_normalizing_factor_and_weights(
      self._loss_normalizing_factor, batch
    )
    target_params = jax.lax.stop_gradient(target_params)
    batch = train_feature_head.with_target_outputs(self._head_loss, target_params, batch)
    _, sums = train_feature_head.head_loss(self._head_loss, head_params, target_params, batch)
    loss = (
      sums['loss'] if loss_normalizing_factor is None else sums['loss'] / loss_normalizing_factor
    )
    metrics = {
      'loss': t5x_metrics.AveragePerStep(total=loss),
      'loss_per_nonpadding_target_token': clu_metrics.Average(
        total=sums['loss'], count=sums['weight']
      ),
      'beta': clu_metrics.Average(total=sums['beta'], count=sums['weight']),
    }
    return loss, metrics

  def _parallel_loss_fn(self, params, batch: Mapping[str, Array], dropout_rng: Optional[Array]):
    """`loss_fn` of a parallel draft: `parallel_distill.layout_sums` on unpacked batches.

    The masks' layout is drawn from T5X's step key (`dropout_rng`: the
    step's, so a resumed run lays out each step as an uninterrupted one;
    evaluation, which passes None, a fixed key).
    """
    if 'decoder_segment_ids' in batch:
      raise ValueError(
        "A parallel draft trains on unpacked batches (its layout puts each row's masks after "
        'the whole row): set --gin.train/utils.DatasetConfig.pack=False and '
        '--gin.train_eval/utils.DatasetConfig.pack=False.'
      )
    target_params, draft_params = t5x_adapter.split_draft_params(params)
    teacher = jax.lax.stop_gradient(self._compute_logits(target_params, batch))
    key = jax.random.PRNGKey(0) if dropout_rng is None else dropout_rng
    sums = parallel_distill.layout_sums(self._parallel_loss, draft_params, teacher, batch, key)
    loss_normalizing_factor, _ = t5x_losses.get_loss_normalizing_factor_and_weights(
      self._loss_normalizing_factor, batch
    )
    loss = (
      sums['loss'] if loss_normalizing_factor is None else sums['loss'] / loss_normalizing_factor
    )
    metrics = {
      'loss': t5x_metrics.AveragePerStep(total=loss),
      'loss_per_weight': clu_metrics.Average(total=sums['loss'], count=sums['weight']),
      'beta': clu_metrics.Average(total=sums['beta_depth1'], count=sums['tokens_depth1']),
    }
    for k in range(1, self._parallel_loss.depth + 1):
      metrics[f'beta_depth{k}'] = clu_metrics.Average(
        total=sums[f'beta_depth{k}'], count=sums[f'tokens_depth{k}']
      )
    return loss, metrics


def _check_or_record_settings(model_dir: str, settings: Mapping[str, Any]) -> None:
  """Records a parallel draft's training settings in `model_dir`, or checks them where T5X resumes.

  T5X's train.py resumes from `model_dir`'s latest checkpoint if it has one:
  then the settings recorded there (`run_settings.PARALLEL_DRAFT_SETTINGS_FILE`,
  as `training.parallel_distill` records them) must be these, or a ValueError
  names each difference; otherwise they are recorded (by process 0).
  """
  path = epath.Path(model_dir) / run_settings.PARALLEL_DRAFT_SETTINGS_FILE
  if t5x_checkpoints.latest_step(model_dir) is None:
    if jax.process_index() == 0:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(settings, indent=1))
    return
  if not path.exists():  # A run of an earlier version: not checked.
    return
  differing = run_settings.differences(json.loads(path.read_text()), settings)
  if differing:
    raise ValueError(
      f'{model_dir} holds a parallel-draft distillation with other settings ({path}): '
      f'{run_settings.describe(differing)}. T5X resumes it from its latest checkpoint, so it must '
      'continue as it started: pass the recorded values (--gin.DEPTH, --gin.KEEP, ...), or '
      'start in a new MODEL_DIR.'
    )


_DISTILLATION_DOC = """
    Training (T5X's train.py, configs/t5x/distill*.gin): `loss_fn` is the
    divergence between the frozen target's and the draft's standardized
    distributions (`training.losses`, one implementation with
    `training.distill`), keyword-only arguments:
      divergence: one of `training.losses.DIVERGENCES` ('tvd' by default).
      jsd_beta: the weight of p in 'jsd', in (0, 1).
      temperature, topk, topp: the decoding mode the draft is trained for
        (temperature 0, greedy, by default).
    With a feature head as `draft_module` (configs/t5x/distill_feature_head.gin)
    the loss is `training.train_feature_head.head_loss` instead (soft cross
    entropy against the target's standardized distribution, the head
    unrolled on its own outputs: training-time test), one implementation
    with `train_feature_head`, on unpacked batches:
      unroll_steps, decay, feature_weight: `train_feature_head.HeadLossConfig`'s.
    With a `t5x_adapter.ParallelDraftNetwork` as `draft_module`
    (configs/t5x/distill_parallel_draft.gin) the loss is
    `training.parallel_distill.layout_sums`' (the draft network and its mask
    vector held to the target at depths 1..depth over a conditional
    drop-token layout of the batch; `divergence`, `jsd_beta` and the
    decoding mode as above), one implementation with `parallel_distill`, on
    unpacked batches (encoder-decoder and causal decoder-only targets):
      depth, keep, depth_weights, acceptance_weighting: `parallel_distill`'s.
      model_dir: T5X's MODEL_DIR, where these settings (and the draft
        network's) are recorded, and checked when T5X resumes from it.
    The optimizer (`optimizer_def`, e.g. T5X's Adafactor) is wrapped in
    `DraftOnlyOptimizer`: only `params['draft']` (a head's
    `params['draft_head']`) trains.
"""

_LOSS_DEFAULTS = dict(
  divergence='tvd',
  jsd_beta=0.5,
  temperature=0.0,
  topk=0,
  topp=0.0,
  unroll_steps=3,
  decay=0.8,
  feature_weight=0.0,
  depth=4,
  keep=0.5,
  depth_weights=None,
  acceptance_weighting=False,
  model_dir=None,
)


class DraftDistillationEncoderDecoderModel(_DistillationMixin, SpeculativeEncoderDecoderModel):
  """`SpeculativeEncoderDecoderModel` whose T5X training trains the draft alone.

  Arguments are `SpeculativeEncoderDecoderModel`'s (the same parameter tree:
  the target's as in its T5X checkpoint, the draft's under
  `params['draft']`, so a checkpoint of this model serves `t5x/infer.py`
  with configs/t5x/speculative*.gin), plus the keyword-only loss settings
  below (defaults `_LOSS_DEFAULTS`). Inference and `score_batch` are the
  speculative model's.
  """

  def __init__(self, *args, **kwargs):
    loss = {name: kwargs.pop(name, default) for name, default in _LOSS_DEFAULTS.items()}
    super().__init__(*args, **kwargs)
    draft_model = None  # A feature head or a parallel draft computes its own loss.
    if isinstance(self.draft_module, network.Transformer):
      draft_model = t5x_models.EncoderDecoderModel(
        module=self.draft_module,
        input_vocabulary=self.input_vocabulary,
        output_vocabulary=self.output_vocabulary,
        optimizer_def=None,
      )
    self._set_distillation(draft_model, **loss)


class DraftDistillationDecoderOnlyModel(_DistillationMixin, SpeculativeDecoderOnlyModel):
  """`SpeculativeDecoderOnlyModel` whose T5X training trains the draft alone.

  Arguments are `SpeculativeDecoderOnlyModel`'s plus the keyword-only loss
  settings below (defaults `_LOSS_DEFAULTS`). With
  `inputs_bidirectional_attention` (a prefix LM), both networks attend to the
  task's inputs bidirectionally, as T5X's `DecoderOnlyModel` does; the loss is
  taken on the targets (`decoder_loss_weights` of seqio's
  `DecoderFeatureConverter`).
  """

  def __init__(self, *args, **kwargs):
    loss = {name: kwargs.pop(name, default) for name, default in _LOSS_DEFAULTS.items()}
    super().__init__(*args, **kwargs)
    draft_model = None  # A feature head or a parallel draft computes its own loss.
    if isinstance(self.draft_module, network.DecoderOnly):
      draft_model = t5x_models.DecoderOnlyModel(
        module=self.draft_module,
        vocabulary=self.output_vocabulary,
        optimizer_def=None,
        inputs_bidirectional_attention=self._inputs_bidirectional_attention,
      )
    self._set_distillation(draft_model, **loss)


for _cls in (DraftDistillationEncoderDecoderModel, DraftDistillationDecoderOnlyModel):
  _cls.__doc__ += _DISTILLATION_DOC
