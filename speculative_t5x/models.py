"""The notebook-level API: a network with its parameters, and one `generate` call.

  target = models.Model(config, params)
  draft = models.Model(draft_config, draft_params)        # or an n-gram draft
  out = models.generate(target, draft, input_tokens, gamma=5, temperature=0.0,
                        max_decode_len=64)
  out.tokens        # int32 [B, 64]: EOS, then zeros, as T5X
  out.stats         # acceptance statistics (None for draft=None)

Encoder-decoder pairs (`network.T5Config`) take encoder inputs and optional
`decoder_prompts`; decoder-only pairs (`network.DecoderOnlyConfig`, T5X's
`DecoderOnlyModel`) take their prompts as `input_tokens`. Either way a prompt
is prefilled in one block call per network and `tokens` is what follows it:
`max_decode_len` tokens at most, the prompt not repeated.

`generate(target, None, ...)` runs the baseline (`decoding.temperature_sample`)
with the same network, so the two are directly comparable. Each distinct
configuration (shapes, draft structure, gamma, sampling arguments, ...) is
compiled once and cached; the PRNG key and the parameters are traced, so new
keys, new weights of the same shapes and new inputs of the same shapes do not
recompile. `make_decoder` validates a configuration once and returns the
compiled call, for loops that time or stream many batches.
"""

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Mapping, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import judging
from speculative_t5x import kernels
from speculative_t5x import layouts
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import run_settings
from speculative_t5x import sampling
from speculative_t5x import checks
from speculative_t5x import settings as settings_lib

PyTree = Any
Array = jax.Array
# What `generate` and `make_decoder` take as a draft: a `Model` (used through
# `Model.as_draft()`) or any `drafts.Draft`.
Draft = Union['Model', drafts.Draft]

EOS_ID = layouts.EOS_ID
# What `train.train` records in its model directory beside the checkpoints.
TRAIN_SETTINGS_FILE = run_settings.TRAIN_SETTINGS_FILE


@dataclasses.dataclass(frozen=True)
class Model:
  """A network configuration and its parameter tree.

  Attributes:
    config: the network's `network.T5Config` (encoder-decoder) or
      `network.DecoderOnlyConfig`.
    params: its parameters (T5X's tree: `token_embedder/embedding`, ...).
    inputs_bidirectional_attention: a decoder-only prefix LM (T5X's
      `DecoderOnlyModel.inputs_bidirectional_attention`): prompt positions
      attend to each other when the prompt is prefilled.
  """

  config: Any
  params: PyTree
  inputs_bidirectional_attention: bool = False

  def __post_init__(self):
    if self.inputs_bidirectional_attention and not network.is_decoder_only(self.config):
      raise ValueError(
        'inputs_bidirectional_attention=True is for decoder-only prefix LMs (a '
        'network.DecoderOnlyConfig); an encoder-decoder decoder attends causally.'
      )
    # Host (numpy) leaves go to the device once, here: a jitted call given a
    # numpy array copies it on every call (for T5-small-size weights on CPU,
    # ~30 ms per decode call; the whole model per call on an accelerator).
    # Device arrays, sharded or not, are kept as they are.
    on_device = lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x
    object.__setattr__(self, 'params', jax.tree.map(on_device, self.params))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @functools.cached_property
  def decode_params(self) -> PyTree:
    """What decode calls take: `kernels.pack_params(config, params)`, made once per model.

    On the CPU (float32, the kernel built and switched on) the params with a
    packed copy of the decoder's dense kernels for the small-M kernel;
    otherwise `params` itself. Baseline and speculative decoding both use it,
    so their greedy outputs stay equal token for token.
    """
    return kernels.pack_params(self.config, self.params)

  def as_draft(self, *, packed: bool = False) -> drafts.ModelDraft:
    """This model as the draft of a speculative pair; on `decode_params` if `packed`."""
    return drafts.ModelDraft(
      params=self.decode_params if packed else self.params,
      config=self.config,
      inputs_bidirectional_attention=self.inputs_bidirectional_attention,
    )

  def as_parallel_draft(
    self, mask_embedding: Optional[Array] = None, *, packed: bool = False
  ) -> parallel_draft.ParallelDraft:
    """This model as a parallel draft (`parallel_draft.ParallelDraft`), on `decode_params` if `packed`.

    `mask_embedding` float [emb]: the mask token's input vector, trained
    (`training.parallel_distill`); None starts from the mean of this model's
    token embeddings (`parallel_draft.mean_token_embedding`), which turns an
    ordinary draft checkpoint into an untrained parallel draft.
    """
    draft = parallel_draft.ParallelDraft.of(
      self.config,
      self.params,
      mask_embedding,
      inputs_bidirectional_attention=self.inputs_bidirectional_attention,
    )
    return draft.replace(params=self.decode_params) if packed else draft


@flax.struct.dataclass
class GenerateOutput:
  """What `generate` returns.

  Attributes:
    tokens: int32 [B, max_decode_len], each row's decode after its prompt (if
      any): tokens, EOS, zeros.
    scores: float32 [B], log probability of each decode under the target's
      standardized distribution (0 for greedy decoding).
    stats: `decoding.SpeculativeStats` with per-row fields [B], or None for
      the baseline.
    gamma: the gamma that ran (static; 0: the baseline), which gamma='auto'
      chose for this batch's size.
  """

  tokens: Array
  scores: Array
  stats: Optional[decoding.SpeculativeStats]
  gamma: int = flax.struct.field(pytree_node=False, default=0)


def as_draft(draft: Draft):
  """A `drafts` draft for a decode call: a `Model`, a feature head or a parallel draft on packed parameters (as the target's)."""
  if isinstance(draft, (drafts.FeatureDraft, parallel_draft.ParallelDraft)):
    return draft.packed()
  return draft.as_draft(packed=True) if isinstance(draft, Model) else draft


def prefilled_target_cache(
  config: Any,
  params: PyTree,
  input_tokens: Array,
  cache_length: int,
  decoder_prompt: Optional[Array] = None,
  *,
  prefill_width: Optional[int] = None,
  inputs_bidirectional_attention: bool = False,
  feature_layers: Optional[Tuple[int, ...]] = None,
  encoded: Optional[Array] = None,
) -> Tuple[PyTree, Optional[Array]] | Tuple[PyTree, Optional[Array], Optional[Array]]:
  """The target's block cache, prefilled with the decoder prompts if there are any.

  Args:
    config: the target's `network.T5Config` or `network.DecoderOnlyConfig`.
    params: its parameters.
    input_tokens: int32 [B, Lin]: encoder inputs (a decoder-only network uses
      only the batch size).
    cache_length: static cache positions.
    decoder_prompt: optional int32 [B, L] prompts in T5X's layout (see
      `decoding`: BOS slot, tokens at indices 1..P, zeros).
    prefill_width: static W, positions 0..W-1 written by the prefill (default
      L); must exceed every prompt length.
    inputs_bidirectional_attention: a prefix LM (decoder-only only): the
      prompt's positions 0..P attend to each other.
    feature_layers: optional static decoder layer indices: also return the
      prefill's features of the prompt block (for a `drafts.FeatureDraft`).
    encoded: optional [B, Lin, D], an encoder-decoder's encoder output of
      `input_tokens` when the caller computed it (`network.init_decoder_cache`).

  Returns:
    (cache, initial_index): initial_index int32 [B] is each row's prompt
    length P (where decoding starts), or None without `decoder_prompt`. With
    `feature_layers`, (cache, initial_index, features [B, W, Df] or None).
  """
  cache = network.init_decoder_cache(config, params, input_tokens, cache_length, encoded)
  features = None
  if decoder_prompt is None:
    initial_index = None
  else:
    initial_index = decoding.prompt_lengths(decoder_prompt)
    width = decoder_prompt.shape[1] if prefill_width is None else prefill_width
    cache = network.prefill_decoder_cache(
      config,
      params,
      cache,
      decoder_prompt[:, :width],
      initial_index,
      bidirectional=inputs_bidirectional_attention,
      feature_layers=feature_layers,
    )
    if feature_layers is not None:
      cache, features = cache
  return (cache, initial_index) if feature_layers is None else (cache, initial_index, features)


def speculative_decode(
  target_config: Any,
  target_params: PyTree,
  draft: Any,
  input_tokens: Array,
  max_decode_len: int,
  *,
  gamma: int,
  decoder_prompt: Optional[Array] = None,
  prefill_width: Optional[int] = None,
  inputs_bidirectional_attention: bool = False,
  decode_fn: Callable[..., Tuple[Array, Array, decoding.SpeculativeStats]] = (
    decoding.speculative_sample
  ),
  best_only: bool = True,
  **decode_args,
) -> Tuple[Array, Array, decoding.SpeculativeStats]:
  """One speculative decode call on this project's networks: the set-up `generate` and T5X share.

  Builds the target's block cache and the draft's, both with room for the
  output plus one block (`decoding.speculative_cache_length`), prefills both
  with the decoder prompts in one block call each (if any), and calls
  `decode_fn` with the target's block scorer.

  Args:
    target_config: the target network's config (encoder-decoder or
      decoder-only).
    target_params: its parameters (without a draft subtree).
    draft: a `drafts.Draft` (e.g. `drafts.ModelDraft`) over the target's
      vocabulary (`decoding.speculative_sample` checks it when it traces).
    input_tokens: int32 [B, Lin] encoder inputs, 0-padded (for a decoder-only
      target: what the draft's `init_cache` takes, e.g. the prompts).
    max_decode_len: the output length L, the prompts included.
    gamma: draft tokens per iteration (it sizes the caches), a tree's depth.
    decoder_prompt: optional int32 [B, L] decoder prompts in T5X's layout
      (see `decoding`); decoding starts after each row's prompt.
    prefill_width: static width of the prompt block (`prefilled_target_cache`).
    inputs_bidirectional_attention: the target is a prefix LM.
    decode_fn: a decode function with `decoding.speculative_sample`'s signature.
    best_only: keep only the most likely decode of each row (the last, as
      T5X's decode functions sort ascending), with its per-row statistics.
    **decode_args: the rest of `decode_fn`'s keyword arguments (`eos_id`,
      `decode_rng`, `temperature`, `num_decodes`, `lenience`, `tree`,
      `judge`, ...); with a `tree` the caches fit its nodes and the target
      cache's compaction (`network.compact_tree_path`) is passed as
      `compact_cache`.

  Returns:
    `(decodes, scores, stats)`: int32 [B, L] (prompts included, T5X's
    layout), float32 [B] and per-row stats fields [B] with `best_only`;
    otherwise [B, num_decodes, L], [B, num_decodes] and [B, num_decodes]
    (ascending log probability). Aggregate stats fields are for the whole
    batch either way.
  """
  tree = decode_args.get('tree')
  cache, initial_index, draft_cache, decoder_prompt = _prefilled_caches(
    target_config,
    target_params,
    draft,
    input_tokens,
    max_decode_len,
    decoding.speculative_cache_length(max_decode_len, gamma, tree),
    decoder_prompt,
    prefill_width=prefill_width,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  if tree is not None:
    decode_args['compact_cache'] = functools.partial(network.compact_tree_path, target_config)
  decodes, scores, stats = decode_fn(
    inputs=decoder_prompt,
    cache=cache,
    score_block=functools.partial(_score_block, target_config, target_params),
    draft=draft,
    draft_cache=draft_cache,
    gamma=gamma,
    # Only with a prompt, so that decode functions without prompts still fit.
    **({} if initial_index is None else {'initial_index': initial_index}),
    **decode_args,
  )
  if best_only:  # The last: T5X's decode functions sort ascending.
    decodes, scores, stats = decodes[:, -1], scores[:, -1], stats.map_rows(lambda x: x[:, -1])
  return decodes, scores, stats


def _prefilled_caches(
  target_config: Any,
  target_params: PyTree,
  draft: Any,
  input_tokens: Array,
  max_decode_len: int,
  cache_length: int,
  decoder_prompt: Optional[Array],
  *,
  prefill_width: Optional[int],
  inputs_bidirectional_attention: bool,
) -> Tuple[PyTree, Optional[Array], PyTree, Array]:
  """`speculative_decode`'s caches: (target cache, initial_index, draft cache, decoder prompt).

  Both caches have `cache_length` positions and are prefilled with the
  decoder prompts int32 [B, L] (if any) below each row's prompt length,
  initial_index int32 [B] (`prefilled_target_cache`, `draft.prefill`; None
  without prompts, whose decoder prompt is then zeros [B, max_decode_len]).
  Arguments as `speculative_decode`'s.
  """
  # A draft that reads the target's features gets the prompt's, and for an
  # encoder-decoder target the encoder output, computed once for both.
  feature_layers = draft.feature_layers or None
  encoder_args = {}
  if feature_layers is not None and not network.is_decoder_only(target_config):
    encoder_args['encoded'] = network.encode(target_config, target_params, input_tokens)
  cache, initial_index, *prompt_features = prefilled_target_cache(
    target_config,
    target_params,
    input_tokens,
    cache_length,
    decoder_prompt,
    prefill_width=prefill_width,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
    feature_layers=feature_layers,
    **encoder_args,
  )
  draft_cache = draft.init_cache(input_tokens, cache_length, **encoder_args)
  if decoder_prompt is None:
    decoder_prompt = jnp.zeros((input_tokens.shape[0], max_decode_len), jnp.int32)
  else:
    width = max_decode_len if prefill_width is None else prefill_width
    features = prompt_features[0] if prompt_features else None
    draft_cache = draft.prefill(draft_cache, decoder_prompt[:, :width], initial_index, features)
  return cache, initial_index, draft_cache, decoder_prompt


def _score_block(
  target_config, target_params, block_tokens, start_positions, cache, tree=None, feature_layers=None
):
  """The target's `decoding.ScoreBlock` (`network.apply_decode_block`)."""
  return network.apply_decode_block(
    target_config,
    target_params,
    cache,
    block_tokens,
    start_positions,
    tree=tree,
    feature_layers=feature_layers,
  )


def baseline_decode(
  target_config: Any,
  target_params: PyTree,
  input_tokens: Array,
  max_decode_len: int,
  *,
  decoder_prompt: Optional[Array] = None,
  prefill_width: Optional[int] = None,
  inputs_bidirectional_attention: bool = False,
  **decode_args,
) -> Tuple[Array, Array]:
  """One baseline decode call (`decoding.temperature_sample`) on this project's networks.

  `speculative_decode`'s set-up without a draft: the target's cache
  (prefilled with the decoder prompts, if any) and its one-token scorer.
  Arguments as `speculative_decode`'s; `decode_args` are
  `temperature_sample`'s (`eos_id`, `decode_rng`, `num_decodes`,
  `temperature`, ...).

  Returns:
    `(decodes int32 [B, num_decodes, L], log_probs float32 [B, num_decodes])`,
    ascending log probability (T5X's order).
  """
  cache, initial_index = prefilled_target_cache(
    target_config,
    target_params,
    input_tokens,
    max_decode_len,
    decoder_prompt,
    prefill_width=prefill_width,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )

  def tokens_to_logits(state: decoding.DecodingState):
    logits, new_cache = network.apply_decode_block(
      target_config, target_params, state.cache, state.cur_token, state.cur_index
    )
    return logits[:, 0], new_cache

  if decoder_prompt is None:
    decoder_prompt = jnp.zeros((input_tokens.shape[0], max_decode_len), jnp.int32)
  return decoding.temperature_sample(
    decoder_prompt, cache, tokens_to_logits, initial_index=initial_index, **decode_args
  )


@functools.partial(
  jax.jit,
  static_argnames=(
    'target_config',
    'inputs_bidirectional_attention',
    'max_decode_len',
    'temperature',
    'topk',
    'topp',
    'eos_id',
    'settings',
    'judge',
  ),
)
def _generate(
  target_params,
  draft,
  input_tokens,
  decoder_prompts,
  rng,
  *,
  target_config: Any,
  inputs_bidirectional_attention: bool,
  max_decode_len: int,
  temperature: float,
  topk: int,
  topp: float,
  eos_id: int,
  settings: Optional[settings_lib.SpeculativeSettings],
  judge: Optional[judging.Judge],
):
  """The whole decode call, compiled once per static configuration and prompt width.

  `settings` is None for the baseline (`draft` None), which has no use for
  `judge`; a None judge is the exact one.
  """
  prompts = input_tokens if network.is_decoder_only(target_config) else decoder_prompts
  if prompts is None:
    decoder_prompt, prefill_width, length, max_decode_steps = None, None, max_decode_len, None
  else:
    # Room for max_decode_len tokens after the longest prompt; positions
    # 0..Lp (BOS and the prompt slots) are prefilled.
    decoder_prompt = layouts.decoder_prompt_layout(prompts, max_decode_len)
    prefill_width, length = prompts.shape[1] + 1, decoder_prompt.shape[1]
    max_decode_steps = max_decode_len
  prefill_args = dict(
    prefill_width=prefill_width, inputs_bidirectional_attention=inputs_bidirectional_attention
  )
  sample_args = dict(
    decode_rng=rng, temperature=temperature, topk=topk, topp=topp, max_decode_steps=max_decode_steps
  )
  if draft is None:
    decodes, scores = baseline_decode(
      target_config,
      target_params,
      input_tokens,
      length,
      decoder_prompt=decoder_prompt,
      **prefill_args,
      eos_id=eos_id,
      **sample_args,
    )
    decodes, scores, stats = decodes[:, -1], scores[:, -1], None
  else:
    decodes, scores, stats = speculative_decode(
      target_config,
      target_params,
      draft,
      input_tokens,
      length,
      decoder_prompt=decoder_prompt,
      **prefill_args,
      eos_id=eos_id,
      **sample_args,
      **settings.decode_kwargs(),
      judge=judge,
    )
  if prompts is not None:
    decodes = layouts.strip_prompts(
      decodes, decoding.prompt_lengths(decoder_prompt), max_decode_len
    )
  return GenerateOutput(
    tokens=decodes, scores=scores, stats=stats, gamma=0 if settings is None else settings.gamma
  )


def check_input_tokens(input_tokens, vocab_size: int, name: str = 'input_tokens') -> np.ndarray:
  """Host-side check of token ids: an integer [batch, length] array of ids < V.

  Out-of-vocabulary ids would otherwise decode silently to padding (the
  embedding gather fills NaN inside the compiled call). `name` is the
  argument's, for the message.
  """
  input_tokens = np.asarray(input_tokens)
  if input_tokens.ndim != 2 or not np.issubdtype(input_tokens.dtype, np.integer):
    raise ValueError(
      f'{name} must be an integer array [batch, length]; got dtype '
      f'{input_tokens.dtype} and shape {input_tokens.shape}.'
    )
  if input_tokens.size and (input_tokens.min() < 0 or input_tokens.max() >= vocab_size):
    raise ValueError(
      f'{name} must lie in [0, {vocab_size}) (the target vocabulary); '
      f'got min {input_tokens.min()}, max {input_tokens.max()}. Tokenize with the '
      "pair's vocabulary."
    )
  return input_tokens


def check_prompt_tokens(prompts, vocab_size: int, batch_size: int, name: str) -> np.ndarray:
  """Host-side check of prompts int [B, Lp]: ids < V, tokens first, then only 0-padding."""
  prompts = check_input_tokens(prompts, vocab_size, name)
  if prompts.shape[0] != batch_size:
    raise ValueError(
      f'{name} has {prompts.shape[0]} rows but the batch has {batch_size}; give one '
      'prompt row per input row (an all-zero row for no prompt).'
    )
  try:
    decoding.check_prompts(np.pad(prompts, ((0, 0), (1, 0))))
  except ValueError as error:
    raise ValueError(f'{name}: {error}') from None
  return prompts


@dataclasses.dataclass(frozen=True)
class Decoder:
  """A validated decoding configuration: `decoder(input_tokens, rng) -> GenerateOutput`.

  Calling it checks the input ids and prompts on the host
  (`check_input_tokens`, `check_prompt_tokens`), then runs the compiled
  decode call. `compile(...)` gives the call alone, for loops that time or
  stream batches already checked.
  """

  target: Model
  draft: Any
  static_args: Mapping[str, Any]

  def __call__(
    self, input_tokens: Array, rng: Array, decoder_prompts: Optional[Array] = None
  ) -> GenerateOutput:
    """Decodes a batch; see `generate` for `input_tokens` and `decoder_prompts`."""
    input_tokens, decoder_prompts = self.check_inputs(input_tokens, decoder_prompts)
    draft, static_args = self.for_batch(input_tokens.shape[0])
    return _generate(
      self.target.decode_params, draft, input_tokens, decoder_prompts, rng, **static_args
    )

  def for_batch(self, batch_size: int) -> Tuple[Any, Mapping[str, Any]]:
    """(draft, static arguments) that decode a batch of `batch_size` rows.

    With gamma='auto' the speculation profile chooses the batch's gamma
    (`settings.SpeculativeSettings.for_batch`); gamma 0 is the baseline,
    without the draft. Otherwise this decoder's own.
    """
    settings = self.static_args['settings']
    if settings is None or settings.gamma != settings_lib.AUTO:
      return self.draft, self.static_args
    args = self.static_args
    batch_settings = settings.for_batch(batch_size, args['temperature'], args['topk'], args['topp'])
    return (None if batch_settings is None else self.draft), dict(args, settings=batch_settings)

  def check_inputs(self, input_tokens, decoder_prompts=None):
    """(input_tokens, decoder_prompts) checked on the host, as int32 device arrays."""
    vocab_size = self.target.vocab_size
    if network.is_decoder_only(self.target.config):
      if decoder_prompts is not None:
        raise ValueError(
          'A decoder-only target takes its prompts as input_tokens; decoder_prompts '
          'is for encoder-decoder targets. Pass the prompts as input_tokens.'
        )
      input_tokens = check_prompt_tokens(
        input_tokens, vocab_size, np.shape(input_tokens)[0], 'input_tokens (the prompts)'
      )
    else:
      input_tokens = check_input_tokens(input_tokens, vocab_size)
      if decoder_prompts is not None:
        decoder_prompts = jnp.asarray(
          check_prompt_tokens(decoder_prompts, vocab_size, len(input_tokens), 'decoder_prompts'),
          jnp.int32,
        )
    return jnp.asarray(input_tokens, jnp.int32), decoder_prompts

  def compile(
    self, input_tokens: Array, rng: Array, decoder_prompts: Optional[Array] = None
  ) -> 'CompiledDecoder':
    """Compiles ahead of time for the shapes of these arguments."""
    draft, static_args = self.for_batch(np.shape(input_tokens)[0])
    compiled = _generate.lower(
      self.target.decode_params, draft, input_tokens, decoder_prompts, rng, **static_args
    ).compile()
    return CompiledDecoder(self, draft, compiled)


@dataclasses.dataclass(frozen=True)
class CompiledDecoder:
  """A `Decoder` compiled for one input shape: call it, or read its memory use."""

  decoder: Decoder
  draft: Any  # The decoder's, or None where gamma='auto' chose the baseline.
  compiled: Any  # jax.stages.Compiled

  def __call__(
    self, input_tokens: Array, rng: Array, decoder_prompts: Optional[Array] = None
  ) -> GenerateOutput:
    return self.compiled(
      self.decoder.target.decode_params, self.draft, input_tokens, decoder_prompts, rng
    )

  def memory_analysis(self):
    """XLA's memory analysis (argument, output, temporary sizes), or None."""
    return self.compiled.memory_analysis()


def architecture(model: Model) -> str:
  """'encoder-decoder', 'decoder-only' or 'decoder-only prefix LM': how a prompt reaches it."""
  if not network.is_decoder_only(model.config):
    return 'encoder-decoder'
  return 'decoder-only prefix LM' if model.inputs_bidirectional_attention else 'decoder-only'


def check_same_architecture(target: Model, draft: Any) -> None:
  """ValueError unless a network draft has its target's architecture.

  An encoder-decoder target needs an encoder-decoder draft and a decoder-only
  target a decoder-only one (n-gram and prompt-lookup drafts fit both): the
  prompt reaches the two networks the same way. A feature head must have been
  built for a target of this vocabulary, width, depth and architecture
  (`feature_head.check_target`).
  """
  if isinstance(draft, drafts.FeatureDraft):
    feature_head.check_target(draft.config, target.config)
    return
  if not isinstance(draft, (drafts.ModelDraft, parallel_draft.ParallelDraft)):
    return
  kind = lambda config: 'decoder-only' if network.is_decoder_only(config) else 'encoder-decoder'
  if kind(draft.config) != kind(target.config):
    raise ValueError(
      f'The target is {kind(target.config)} but the draft network is '
      f'{kind(draft.config)}; pair networks of one architecture (or use an n-gram or '
      'prompt-lookup draft).'
    )


def make_decoder(
  target: Model,
  draft: Optional[Draft],
  settings: Optional[settings_lib.SpeculativeSettings] = None,
  *,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  max_decode_len: int = 64,
  eos_id: int = EOS_ID,
  judge: Optional[judging.Judge] = None,
  **setting_fields: Any,
) -> Decoder:
  """Validates a decoding configuration once; returns `(input_tokens, rng) -> GenerateOutput`.

  The returned function does no host-side work beyond the compiled call, so
  benchmarks and inference loops time only decoding. Arguments as `generate`.
  """
  if np.ndim(temperature) != 0:
    raise ValueError(
      f'make_decoder and generate take one temperature for the batch (a number); got an '
      f'array of shape {np.shape(temperature)}. For per-row temperatures call '
      'decoding.temperature_sample or decoding.speculative_sample, which take float [B].'
    )
  sampling.validate_sampling_args(temperature=temperature, topk=topk, topp=topp)
  checks.check_positive_int('max_decode_len', max_decode_len)
  settings = settings_lib.SpeculativeSettings.of(settings, **setting_fields)
  if draft is not None:
    draft = as_draft(draft_for(target, draft))
    check_same_architecture(target, draft)
    settings.for_batch(1, temperature, topk, topp)  # A profile of another mode fails here.
    judge = judging.EXACT if judge is None else judge  # One program for None and EXACT.
    judge.check(settings)
  else:  # Unused by the baseline.
    settings, judge = None, None
  static_args = dict(
    target_config=target.config,
    inputs_bidirectional_attention=target.inputs_bidirectional_attention,
    max_decode_len=int(max_decode_len),
    temperature=float(temperature),
    topk=int(topk),
    topp=float(topp),
    eos_id=int(eos_id),
    settings=settings,
    judge=judge,
  )

  return Decoder(target, draft, static_args)


def generate(
  target: Model,
  draft: Optional[Draft],
  input_tokens,
  *,
  decoder_prompts=None,
  settings: Optional[settings_lib.SpeculativeSettings] = None,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  max_decode_len: int = 64,
  rng: Optional[Array] = None,
  eos_id: int = EOS_ID,
  judge: Optional[judging.Judge] = None,
  **setting_fields: Any,
) -> GenerateOutput:
  """Decodes `input_tokens` with the target, speculatively when a draft is given.

  Args:
    target: the target model.
    draft: a `Model` with the target's vocabulary, an n-gram, prompt-lookup or
      feature-head draft from `drafts` (`drafts.FeatureDraft.for_target`), or
      None for plain (baseline) decoding.
    input_tokens: int [B, Lin] encoder inputs, 0-padded, EOS-terminated; for a
      decoder-only target, the prompts: each row's tokens, then 0-padding (a
      prefix LM's inputs keep their EOS, as seqio writes them). B may be 0.
    decoder_prompts: optional int [B, Lp] decoder prompts of an
      encoder-decoder target (T5X's `prompt_with_targets`): each row's
      tokens, then 0-padding; decoding continues them. None starts from BOS.
    settings: a `settings.SpeculativeSettings` (gamma, lenience,
      verification, draft_threshold); ignored without a draft.
    temperature: 0 (the default) is greedy.
    topk: keep the k most likely tokens (0: off).
    topp: nucleus mass (0: off).
    max_decode_len: tokens generated after the prompt at most; decoding stops
      earlier at EOS.
    rng: PRNG key (default `PRNGKey(0)`).
    eos_id: end-of-sequence id.
    judge: what accepts the drafted tokens (`judging.Judge`); None (the
      default) is the exact rules, `judging.EXACT`. The one door of a timing
      experiment (defined in the lab) and of a record the library does not
      keep (`out.stats.record`); ignored without a draft.
    **setting_fields: instead of `settings`, its fields by name, e.g.
      `gamma=5, verification='block'` (the defaults are
      `SpeculativeSettings`'s).

  Returns:
    A `GenerateOutput`.
  """
  decode = make_decoder(
    target,
    draft,
    settings,
    temperature=temperature,
    topk=topk,
    topp=topp,
    max_decode_len=max_decode_len,
    eos_id=eos_id,
    judge=judge,
    **setting_fields,
  )
  return decode(input_tokens, jax.random.PRNGKey(0) if rng is None else rng, decoder_prompts)


def load_model(
  config: Any, checkpoint_path: str, dtype=None, *, inputs_bidirectional_attention: bool = False
) -> Model:
  """A `Model` from any checkpoint `checkpoints.load_params` reads.

  Args:
    config: the network's configuration; the checkpoint's shapes are checked
      against it, and a mismatch names the parameter.
    checkpoint_path: our orbax directory, a T5X checkpoint (legacy or orbax,
      a `checkpoint_<step>` directory or its parent), or a Hugging Face
      directory.
    dtype: optional parameter dtype to cast to (e.g. 'bfloat16').
    inputs_bidirectional_attention: a decoder-only prefix LM (see `Model`).
  """
  from speculative_t5x import checkpoints  # orbax/tensorstore only when loading.

  params = checkpoints.load_params(checkpoint_path, config=config, dtype=dtype)
  return Model(config, params, inputs_bidirectional_attention)


def load_trained(model_dir: str, dtype=None) -> Model:
  """The `Model` that `train.train` wrote to `model_dir`, from what the run recorded.

  The network (`T5Config` or `DecoderOnlyConfig`) and a prefix LM's
  `inputs_bidirectional_attention` come from its `TRAIN_SETTINGS_FILE`, the
  parameters from its latest checkpoint (`load_model`).

  Args:
    model_dir: a directory `train.train` (or the train gin main) wrote.
    dtype: optional parameter dtype to cast to (e.g. 'bfloat16').
  """
  path = os.path.join(model_dir, TRAIN_SETTINGS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f'{model_dir} holds no {TRAIN_SETTINGS_FILE}: it was not written by speculative_t5x.training.train. '
      'Load other checkpoints with load_model(config, path).'
    )
  with open(path) as f:
    settings = json.load(f)
  classes = {cls.__name__: cls for cls in (network.T5Config, network.DecoderOnlyConfig)}
  config = classes[settings['network']](**settings['config'])
  return load_model(
    config,
    model_dir,
    dtype,
    inputs_bidirectional_attention=bool(settings.get('inputs_bidirectional_attention')),
  )


def load_parallel_draft(
  model_dir: str, step: Optional[int] = None, *, packed: bool = False
) -> parallel_draft.ParallelDraft:
  """The `parallel_draft.ParallelDraft` that `training.parallel_distill` wrote to `model_dir`.

  The network and its config come from the run's
  `run_settings.PARALLEL_DRAFT_SETTINGS_FILE`, the network's parameters and
  the mask vector from its checkpoint (`step`; None: the latest), stored as
  {'network': ..., 'mask_embedding': ...}. `packed`: on the CPU kernel's
  packed parameters, as `Model.as_parallel_draft(packed=True)`.
  """
  from speculative_t5x import checkpoints  # orbax/tensorstore only when loading.

  settings = run_settings.read(os.path.join(model_dir, run_settings.PARALLEL_DRAFT_SETTINGS_FILE))
  if settings is None:
    raise ValueError(
      f'{model_dir} holds no {run_settings.PARALLEL_DRAFT_SETTINGS_FILE}: it was not written by '
      'speculative_t5x.training.parallel_distill. Make a parallel draft of an ordinary draft '
      'with load_model(config, path).as_parallel_draft().'
    )
  classes = {cls.__name__: cls for cls in (network.T5Config, network.DecoderOnlyConfig)}
  config = classes[settings['network']](**settings['config'])
  params = checkpoints.restore_params(model_dir, step=step)
  model = Model(config, params['network'])
  return model.as_parallel_draft(params['mask_embedding'], packed=packed)


@dataclasses.dataclass(frozen=True)
class FeatureHeadCheckpoint:
  """A feature head's model directory (`train_feature_head`'s), read as a draft for a target.

  A gin file binds the draft before the target is loaded: this names the
  head, and `draft_for` reads it with the target's own parameters (no
  second copy of the target), as `infer`, the benchmark and `make_decoder`
  do. The head's config comes from the directory's
  `run_settings.FEATURE_HEAD_SETTINGS_FILE`, its parameters from the
  checkpoint (`step`; None: the latest).
  """

  path: str
  step: Optional[int] = None

  def for_target(self, target: Model) -> drafts.FeatureDraft:
    """The `drafts.FeatureDraft` of this head on `target` (checked to be the head's target)."""
    from speculative_t5x import checkpoints  # orbax/tensorstore only when loading.

    settings = run_settings.read(os.path.join(self.path, run_settings.FEATURE_HEAD_SETTINGS_FILE))
    if settings is None:
      raise ValueError(
        f'{self.path} holds no {run_settings.FEATURE_HEAD_SETTINGS_FILE}: it was not written by '
        'speculative_t5x.training.train_feature_head. Train a head there first, or pass '
        'drafts.FeatureDraft.for_target(target, params, config) directly.'
      )
    config = feature_head.FeatureHeadConfig(**settings['head_config'])
    feature_head.check_target(config, target.config)
    params = checkpoints.restore_params(self.path, step=self.step)
    return drafts.FeatureDraft.for_target(target, params, config)


def draft_for(target: Model, draft: Any) -> Any:
  """`draft`, with a `FeatureHeadCheckpoint` read for `target`."""
  return draft.for_target(target) if isinstance(draft, FeatureHeadCheckpoint) else draft


def random_model(
  config: Any, seed: int = 0, dtype=None, *, inputs_bidirectional_attention: bool = False
) -> Model:
  """A `Model` with random parameters (T5X's initializer scales), for timing only.

  `dtype` (e.g. 'bfloat16') casts the parameters, as `load_model` does.
  """
  params, _ = network.random_params(config, seed=seed)
  if dtype is not None:
    params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype), copy=False), params)
  return Model(config, params, inputs_bidirectional_attention)
