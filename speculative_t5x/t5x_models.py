"""The T5X model classes of speculative decoding; this module imports t5x.

`SpeculativeEncoderDecoderModel` and `SpeculativeDecoderOnlyModel` subclass
T5X's `EncoderDecoderModel` and `DecoderOnlyModel`; gin files bind them as
`t5x_models.SpeculativeEncoderDecoderModel` (and `...DecoderOnlyModel`). The
rest of the integration (parameter grafting, the array-level
`t5x_adapter.speculative_predict_batch`) lives in `t5x_adapter`, which imports
without t5x. See
`t5x_adapter`'s docstring for where the draft's parameters live.
"""

import inspect
from typing import Any, Mapping, MutableMapping, Optional, Tuple, Union

import flax
import jax

from speculative_t5x import decoding
from speculative_t5x import layouts
from speculative_t5x import network
from speculative_t5x import settings as settings_lib
from speculative_t5x import t5x_adapter

T5X_MISSING = (
  'SpeculativeEncoderDecoderModel subclasses t5x.models.EncoderDecoderModel, '
  'but t5x cannot be imported ({error!r}). t5x is not on PyPI: install it '
  'from its source repository, google-research/t5x on GitHub (clone it, then '
  '`pip install -e ./t5x`). Some of its own dependencies (airio, a recent '
  "jestimator) also come from their source repositories; see t5x's "
  'setup.py. The rest of speculative_t5x works without t5x.'
)


try:
  from t5x import models as t5x_models
except ImportError as error:
  if not (error.name or '').startswith('t5x'):
    raise
  raise ImportError(T5X_MISSING.format(error=error)) from error

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
    """T5X's initial variables of the target, with the draft's under 'draft'."""
    variables = super().get_initial_variables(rng, input_shapes, input_types)
    # A key of its own, so that the draft's initialization is independent of
    # the target's (which keeps T5X's).
    draft_variables = t5x_adapter.init_network_variables(
      self.draft_module, jax.random.fold_in(rng, 1), input_shapes
    )
    return flax.core.freeze(t5x_adapter.add_draft_variables(variables, draft_variables))

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
      draft_module: the draft network.
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
    draft_module: network.Transformer,
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
    draft_module: network.DecoderOnly,
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
