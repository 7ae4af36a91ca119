"""The notebook-level API: a network with its parameters, and one `generate` call.

  target = models.Model(config, params)
  draft = models.Model(draft_config, draft_params)        # or an n-gram draft
  out = models.generate(target, draft, input_tokens, gamma=5, temperature=0.0,
                        max_decode_len=64)
  out.tokens        # int32 [B, 64]: EOS, then zeros, as T5X
  out.stats         # acceptance statistics (None for draft=None)

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
from typing import Any, Callable, Mapping, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative_sampling

PyTree = Any
Array = jax.Array
# What `generate` and `make_decoder` take as a draft: a `Model` (used through
# `Model.as_draft()`) or any `drafts.Draft`.
Draft = Union['Model', drafts.Draft]

EOS_ID = 1  # T5's SentencePiece vocabularies: PAD = BOS = 0, EOS = 1.


@dataclasses.dataclass(frozen=True)
class Model:
  """A `network.Transformer` configuration and its parameter tree.

  Attributes:
    config: the network's `T5Config`.
    params: its parameters (T5X's tree: `token_embedder/embedding`, ...).
  """

  config: network.T5Config
  params: PyTree

  def __post_init__(self):
    # Host (numpy) leaves go to the device once, here: a jitted call given a
    # numpy array copies it on every call (for T5-small-size weights on CPU,
    # ~30 ms per decode call; the whole model per call on an accelerator).
    # Device arrays, sharded or not, are kept as they are.
    on_device = lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x
    object.__setattr__(self, 'params', jax.tree.map(on_device, self.params))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def as_draft(self) -> drafts.ModelDraft:
    """This model as the draft of a speculative pair."""
    return drafts.ModelDraft(params=self.params, config=self.config)


@flax.struct.dataclass
class GenerateOutput:
  """What `generate` returns.

  Attributes:
    tokens: int32 [B, max_decode_len], each row's decode: tokens, EOS, zeros.
    scores: float32 [B], log probability of each decode under the target's
      standardized distribution (0 for greedy decoding).
    stats: `decoding.SpeculativeStats` with per-row fields [B], or None for
      the baseline.
  """

  tokens: Array
  scores: Array
  stats: Optional[decoding.SpeculativeStats]


def _as_draft(draft: Draft):
  return draft.as_draft() if isinstance(draft, Model) else draft


def speculative_decode(
  target_config: network.T5Config,
  target_params: PyTree,
  draft: Any,
  input_tokens: Array,
  max_decode_len: int,
  *,
  gamma: int,
  decode_fn: Callable[..., Tuple[Array, Array, decoding.SpeculativeStats]] = (
    decoding.speculative_sample
  ),
  best_only: bool = True,
  **decode_args,
) -> Tuple[Array, Array, decoding.SpeculativeStats]:
  """One speculative decode call on this project's network: the set-up `generate` and T5X share.

  Builds the target's block cache and the draft's, both with room for the
  output plus one block (`decoding.speculative_cache_length`), the target's
  block scorer, and calls `decode_fn` from an all-zeros decoder prompt.

  Args:
    target_config: the target network's config.
    target_params: its parameters (without a draft subtree).
    draft: a `drafts.Draft` (e.g. `drafts.ModelDraft`) over the target's
      vocabulary (the callers check it: `drafts.check_shared_vocabulary`).
    input_tokens: int32 [B, Lin] encoder inputs, 0-padded.
    max_decode_len: the output length L.
    gamma: draft tokens per iteration (it sizes the caches).
    decode_fn: a decode function with `decoding.speculative_sample`'s
      signature.
    best_only: keep only the most likely decode of each row (the last, as
      T5X's decode functions sort ascending), with its per-row statistics.
    **decode_args: the rest of `decode_fn`'s keyword arguments (`eos_id`,
      `decode_rng`, `temperature`, `num_decodes`, `lenience`, ...).

  Returns:
    `(decodes, scores, stats)`: int32 [B, L], float32 [B] and per-row stats
    fields [B] with `best_only`; otherwise [B, num_decodes, L],
    [B, num_decodes] and [B, num_decodes] (ascending log probability).
    Aggregate stats fields are for the whole batch either way.
  """
  cache_length = decoding.speculative_cache_length(max_decode_len, gamma)
  cache = network.init_decoder_cache(target_config, target_params, input_tokens, cache_length)

  def score_block(block_tokens, start_positions, cache):
    return network.apply_decode_block(
      target_config, target_params, cache, block_tokens, start_positions
    )

  decodes, scores, stats = decode_fn(
    inputs=jnp.zeros((input_tokens.shape[0], max_decode_len), jnp.int32),
    cache=cache,
    score_block=score_block,
    draft=draft,
    draft_cache=draft.init_cache(input_tokens, cache_length),
    gamma=gamma,
    **decode_args,
  )
  if best_only:
    best = lambda x: x[:, -1]
    decodes, scores = best(decodes), best(scores)
    stats = stats.map_rows(best)
  return decodes, scores, stats


@functools.partial(
  jax.jit,
  static_argnames=(
    'target_config',
    'gamma',
    'max_decode_len',
    'temperature',
    'topk',
    'topp',
    'lenience',
    'eos_id',
    'emulate_alpha',
    'verification',
    'draft_threshold',
  ),
)
def _generate(
  target_params,
  draft,
  input_tokens,
  rng,
  *,
  target_config: network.T5Config,
  gamma: int,
  max_decode_len: int,
  temperature: float,
  topk: int,
  topp: float,
  lenience: float,
  eos_id: int,
  emulate_alpha: Optional[float],
  verification: str,
  draft_threshold: float,
):
  """The whole decode call, compiled once per static configuration."""
  batch_size = input_tokens.shape[0]
  decoder_prompt = jnp.zeros((batch_size, max_decode_len), jnp.int32)
  sample_args = dict(decode_rng=rng, temperature=temperature, topk=topk, topp=topp)
  if draft is None:
    cache = network.init_decoder_cache(target_config, target_params, input_tokens, max_decode_len)

    def tokens_to_logits(state: decoding.DecodingState):
      logits, new_cache = network.apply_decode_block(
        target_config, target_params, state.cache, state.cur_token, state.cur_index
      )
      return logits[:, 0], new_cache

    decodes, scores = decoding.temperature_sample(
      decoder_prompt, cache, tokens_to_logits, eos_id, **sample_args
    )
    return GenerateOutput(tokens=decodes[:, -1], scores=scores[:, -1], stats=None)

  decodes, scores, stats = speculative_decode(
    target_config,
    target_params,
    draft,
    input_tokens,
    max_decode_len,
    gamma=gamma,
    eos_id=eos_id,
    **sample_args,
    lenience=lenience,
    emulate_alpha=emulate_alpha,
    verification=verification,
    draft_threshold=draft_threshold,
  )
  return GenerateOutput(tokens=decodes, scores=scores, stats=stats)


def check_input_tokens(input_tokens, vocab_size: int) -> np.ndarray:
  """Host-side check of encoder inputs: an integer [batch, length] array of ids < V.

  Out-of-vocabulary ids would otherwise decode silently to padding (the
  embedding gather fills NaN inside the compiled call).
  """
  input_tokens = np.asarray(input_tokens)
  if input_tokens.ndim != 2 or not np.issubdtype(input_tokens.dtype, np.integer):
    raise ValueError(
      f'input_tokens must be an integer array [batch, length]; got dtype '
      f'{input_tokens.dtype} and shape {input_tokens.shape}.'
    )
  if input_tokens.size and (input_tokens.min() < 0 or input_tokens.max() >= vocab_size):
    raise ValueError(
      f'input_tokens must lie in [0, {vocab_size}) (the target vocabulary); '
      f'got min {input_tokens.min()}, max {input_tokens.max()}. Tokenize with the '
      "pair's vocabulary."
    )
  return input_tokens


@dataclasses.dataclass(frozen=True)
class Decoder:
  """A validated decoding configuration: `decoder(input_tokens, rng) -> GenerateOutput`.

  Calling it checks the input ids on the host (`check_input_tokens`), then runs
  the compiled decode call. `compile(...)` gives the call alone, for loops
  that time or stream batches already checked.
  """

  target: Model
  draft: Any
  static_args: Mapping[str, Any]

  def __call__(self, input_tokens: Array, rng: Array) -> GenerateOutput:
    """input_tokens: int [B, Lin] ids of the target's vocabulary; rng: a PRNG key."""
    input_tokens = check_input_tokens(input_tokens, self.target.vocab_size)
    return _generate(
      self.target.params, self.draft, jnp.asarray(input_tokens, jnp.int32), rng, **self.static_args
    )

  def compile(self, input_tokens: Array, rng: Array) -> 'CompiledDecoder':
    """Compiles ahead of time for the shapes of these arguments."""
    compiled = _generate.lower(
      self.target.params, self.draft, input_tokens, rng, **self.static_args
    ).compile()
    return CompiledDecoder(self, compiled)


@dataclasses.dataclass(frozen=True)
class CompiledDecoder:
  """A `Decoder` compiled for one input shape: call it, or read its memory use."""

  decoder: Decoder
  compiled: Any  # jax.stages.Compiled

  def __call__(self, input_tokens: Array, rng: Array) -> GenerateOutput:
    return self.compiled(self.decoder.target.params, self.decoder.draft, input_tokens, rng)

  def memory_analysis(self):
    """XLA's memory analysis (argument, output, temporary sizes), or None."""
    return self.compiled.memory_analysis()


def make_decoder(
  target: Model,
  draft: Optional[Draft],
  *,
  gamma: int = 4,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  max_decode_len: int = 64,
  lenience: float = 1.0,
  eos_id: int = EOS_ID,
  emulate_alpha: Optional[float] = None,
  verification: str = 'token',
  draft_threshold: float = 0.0,
) -> Decoder:
  """Validates a decoding configuration once; returns `(input_tokens, rng) -> GenerateOutput`.

  The returned function does no host-side work beyond the compiled call, so
  benchmarks and inference loops time only decoding. Arguments as `generate`,
  plus `emulate_alpha` (timing only, see `decoding.speculative_sample`).
  """
  if np.ndim(temperature) != 0:
    raise ValueError(
      f'make_decoder and generate take one temperature for the batch (a number); got an '
      f'array of shape {np.shape(temperature)}. For per-row temperatures call '
      'decoding.temperature_sample or decoding.speculative_sample, which take float [B].'
    )
  sampling.validate_sampling_args(temperature=temperature, topk=topk, topp=topp)
  decoding.check_positive_int('max_decode_len', max_decode_len)
  if draft is not None:
    draft = _as_draft(draft)
    drafts.check_shared_vocabulary(draft.vocab_size, target.vocab_size)
    decoding.check_positive_int('gamma', gamma)
    speculative_sampling.validate_lenience(lenience)
    speculative_sampling.validate_verification(verification, lenience)
    draft_threshold = decoding.check_draft_threshold(draft_threshold)
  else:  # Unused by the baseline.
    gamma, lenience, emulate_alpha, verification, draft_threshold = 0, 1.0, None, 'token', 0.0
  static_args = dict(
    target_config=target.config,
    gamma=int(gamma),
    max_decode_len=int(max_decode_len),
    temperature=float(temperature),
    topk=int(topk),
    topp=float(topp),
    lenience=float(lenience),
    eos_id=int(eos_id),
    emulate_alpha=None if emulate_alpha is None else float(emulate_alpha),
    verification=verification,
    draft_threshold=draft_threshold,
  )

  return Decoder(target, draft, static_args)


def generate(
  target: Model,
  draft: Optional[Draft],
  input_tokens,
  *,
  gamma: int = 4,
  temperature: float = 0.0,
  topk: int = 0,
  topp: float = 0.0,
  max_decode_len: int = 64,
  rng: Optional[Array] = None,
  lenience: float = 1.0,
  eos_id: int = EOS_ID,
  verification: str = 'token',
  draft_threshold: float = 0.0,
) -> GenerateOutput:
  """Decodes `input_tokens` with the target, speculatively when a draft is given.

  Args:
    target: the target model.
    draft: a `Model` with the target's vocabulary, an n-gram or prompt-lookup
      draft from `drafts`, or None for plain (baseline) decoding.
    input_tokens: int [B, Lin] encoder inputs, 0-padded, EOS-terminated.
    gamma: draft tokens per iteration (ignored without a draft).
    temperature: 0 (the default) is greedy.
    topk: keep the k most likely tokens (0: off).
    topp: nucleus mass (0: off).
    max_decode_len: output length; decoding stops earlier at EOS.
    rng: PRNG key (default `PRNGKey(0)`).
    lenience: 1 is exact; below 1 see `speculative_sampling.verify`.
    eos_id: end-of-sequence id.
    verification: 'token' (the paper's Algorithm 1) or 'block' (Sun et al.'s
      block verification: the same outputs' distribution, never fewer tokens
      per target call in expectation); see `speculative_sampling.verify`.
    draft_threshold: an adaptive draft length (0: off, gamma tokens every
      iteration): a row stops drafting after a token its draft gave
      probability below this, so gamma is then the most it drafts; exact
      (see `decoding.speculative_sample`). Model and n-gram drafts only.

  Returns:
    A `GenerateOutput`.
  """
  decode = make_decoder(
    target,
    draft,
    gamma=gamma,
    temperature=temperature,
    topk=topk,
    topp=topp,
    max_decode_len=max_decode_len,
    lenience=lenience,
    eos_id=eos_id,
    verification=verification,
    draft_threshold=draft_threshold,
  )
  return decode(input_tokens, jax.random.PRNGKey(0) if rng is None else rng)


def load_model(config: network.T5Config, checkpoint_path: str, dtype=None) -> Model:
  """A `Model` from any checkpoint `checkpoints.load_params` reads.

  Args:
    config: the network's configuration; the checkpoint's shapes are checked
      against it, and a mismatch names the parameter.
    checkpoint_path: our orbax directory, a T5X checkpoint (legacy or orbax,
      a `checkpoint_<step>` directory or its parent), or a Hugging Face
      directory.
    dtype: optional parameter dtype to cast to (e.g. 'bfloat16').
  """
  from speculative_t5x import checkpoints  # orbax/tensorstore only when loading.

  return Model(config, checkpoints.load_params(checkpoint_path, config=config, dtype=dtype))


def random_model(config: network.T5Config, seed: int = 0, dtype=None) -> Model:
  """A `Model` with random parameters (T5X's initializer scales), for timing only.

  `dtype` (e.g. 'bfloat16') casts the parameters, as `load_model` does.
  """
  params, _ = network.random_params(config, seed=seed)
  if dtype is not None:
    params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype), copy=False), params)
  return Model(config, params)
