"""alpha (the paper's Table 3): a draft's acceptance rate, measured by teacher forcing.

alpha = E[beta], beta = sum_x min(p(x), q(x)) of the target's and the draft's
standardized next-token distributions (`sampling.standardize` at the decoding
temperature, top-k or top-p), averaged over the positions speculative decoding
judges. `measure_alpha` samples continuations from the target and
teacher-forces target and drafts along them (`continuation_logits`,
`draft_logits`): every position in one forward pass per network rather than
one decode step per token. Either architecture; an encoder-decoder's decoder
prompts and a decoder-only target's prompts are continued as the decode call
continues them (`layouts.continuation_layout`).

`teacher_forced_logits` is the jitted forward pass of either network on
decoder inputs (`network.compute_logits`, the same dispatch as training's
loss); `standard_error` is the one standard error of the project's reported
means (alpha over sequences here, held-out alpha in `distill`, the
acceptance sweep's gains).

Imports jax/flax/numpy only, like the benchmark that reports it.
"""

import dataclasses
import functools
from typing import Any, Dict, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import kernels
from speculative_t5x import layouts
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative_sampling


def standard_error(values: Sequence[float]) -> float:
  """The standard error of the mean of `values` [n]: s / sqrt(n), s with ddof=1.

  s is the sample standard deviation (the square root of the unbiased
  variance estimate, ddof=1), because the values are a sample of independent
  units (sequences, inputs) from a larger population whose mean we report; the
  population's own standard deviation (ddof=0) would understate the error,
  most for few values. float('nan') for n < 2, where no spread is measured.
  """
  values = np.asarray(values, np.float64).reshape(-1)
  if values.size < 2:
    return float('nan')
  return float(values.std(ddof=1) / np.sqrt(values.size))


def _teacher_forced(
  config, params, input_tokens, decoder_input_tokens, prefix_lengths, feature_layers=None
):
  """`teacher_forced_logits`, unjitted: the features of either architecture, one forward pass.

  With `feature_layers`, (logits, the target's features of those layers)
  (`network.compute_logits`).
  """
  features = {
    'encoder_input_tokens': input_tokens,  # Unused by a decoder-only network.
    'decoder_input_tokens': decoder_input_tokens,
    'decoder_target_tokens': jnp.ones_like(decoder_input_tokens),  # Every position is real.
  }
  if prefix_lengths is not None:
    if not network.is_decoder_only(config):
      raise ValueError(
        "prefix_lengths is for decoder-only prefix LMs; an encoder-decoder's decoder "
        'attends causally. Pass prefix_lengths=None.'
      )
    width = decoder_input_tokens.shape[1]
    features['decoder_causal_attention'] = (
      jnp.arange(width)[None] <= prefix_lengths[:, None]
    ).astype(jnp.int32)
  return network.compute_logits(config, params, features, feature_layers=feature_layers)


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced_logits(
  config: network.NetworkConfig,
  params,
  input_tokens,
  decoder_input_tokens,
  prefix_lengths=None,
) -> jax.Array:
  """float32 [N, L, V]: next-token logits at every decoder position, all valid.

  Args:
    config: the network's configuration, either architecture.
    params: its parameters.
    input_tokens: int [N, Lin] encoder inputs (unused by a decoder-only
      network).
    decoder_input_tokens: int [N, L], e.g. `layouts.shift_right(outputs)` or
      `continuation_layout`'s.
    prefix_lengths: for a decoder-only prefix LM, int [N] prompt lengths P:
      positions 0..P attend to each other (T5X's
      `decoder_causal_attention`); None: causal.
  """
  return _teacher_forced(config, params, input_tokens, decoder_input_tokens, prefix_lengths)


@functools.partial(jax.jit, static_argnums=(0, 6))
def _logits_at(
  config, params, input_tokens, decoder_input_tokens, positions, prefix_lengths, feature_layers=None
):
  """Next-token logits at `positions` [N, L'] (and, with `feature_layers`, the features [N, L, Df] at every position)."""
  outputs = _teacher_forced(
    config, params, input_tokens, decoder_input_tokens, prefix_lengths, feature_layers
  )
  logits, features = outputs if feature_layers is not None else (outputs, None)
  at_positions = jnp.take_along_axis(logits, positions[..., None], axis=1)
  return at_positions if feature_layers is None else (at_positions, features)


def continuation_logits(
  model: models.Model,
  input_tokens: np.ndarray,
  output_tokens: np.ndarray,
  prompts: Optional[np.ndarray] = None,
) -> jax.Array:
  """float32 [N, L, V]: a network's next-token logits along outputs [N, L] after the prompts.

  Teacher forcing on BOS, the prompt and the outputs (`continuation_layout`);
  a prefix LM's prompt attends to itself, as when it is prefilled.

  Args:
    model: the network (target or draft).
    input_tokens: int [N, Lin] encoder inputs (a decoder-only network's:
      its prompts, unused here beyond `prompts`).
    output_tokens: int [N, L], what follows each prompt.
    prompts: int [N, Lp] prompts (tokens, then 0-padding), or None.
  """
  decoder_inputs, positions = layouts.continuation_layout(prompts, output_tokens)
  prefix_lengths = positions[:, 0] if model.inputs_bidirectional_attention else None
  return _logits_at(
    model.config, model.params, input_tokens, decoder_inputs, positions, prefix_lengths
  )


@jax.jit
def _prompt_lookup_logits(draft, input_tokens, decoder_inputs, positions):
  """float32 [N, L, V]: 0 at the draft's first guess at each position, NEG_INF elsewhere."""
  num_rows, length = positions.shape
  cache = draft.init_cache(jnp.repeat(input_tokens, length, axis=0), 0)
  tokens, _, _, _ = draft.propose(
    cache,
    jnp.repeat(decoder_inputs, length, axis=0),
    positions.reshape(-1),
    jax.random.PRNGKey(0),  # Unused: prompt lookup is deterministic.
    gamma=1,
    draft_threshold=0.0,
    temperature=0.0,
    topk=0,
    topp=0.0,
  )
  guess = jax.nn.one_hot(tokens[:, 0], draft.vocab_size, dtype=bool)
  return jnp.where(guess, 0.0, network.NEG_INF).reshape(num_rows, length, draft.vocab_size)


@jax.jit
def _feature_head_logits(draft, input_tokens, decoder_inputs, positions, features=None):
  """float32 [N, L, V]: a feature head's first draft token's logits, from the true features.

  The head's entry at position i reads the target's feature there and the
  embedding of the token at i + 1, and gives the logits of the token at
  i + 2 (`feature_head`): the draft's logits for the token after position i
  are its entry at i - 1. Position 0 has none: there, as a row without a
  prompt in `drafts.FeatureDraft`, the head drafts from its start state.
  `features` [N, L, Df]: the target's, if the caller's pass computed them
  (`measure_alpha`); else one more target pass here.
  """
  config, target_config = draft.config, draft.target_config
  if features is None:
    _, features = _teacher_forced(
      target_config, draft.target_params, input_tokens, decoder_inputs, None, config.feature_layers
    )
  next_tokens = jnp.pad(decoder_inputs[:, 1:], ((0, 0), (0, 1)))
  next_embedded = network.embed_tokens(target_config, draft.target_params, next_tokens)
  encoded = encoder_mask = None
  if config.cross_attention:
    encoded = network.encode(target_config, draft.target_params, input_tokens)
    encoder_mask = input_tokens > 0
  # Teacher-forced over whole rows: XLA's dot on the plain tree (a decode call's
  # head may carry a packed copy for the few-row CPU kernel).
  params = kernels.plain_params(draft.params)
  start, [(predicted, hidden)] = feature_head.unrolled(
    config, params, features.astype(jnp.float32), next_embedded, encoded, encoder_mask
  )
  head_logits = lambda outputs: feature_head.logits(
    config, params, target_config, draft.target_params, *outputs
  )
  logits = head_logits((predicted, hidden))
  logits = jnp.concatenate([head_logits(start)[:, None], logits[:, :-1]], axis=1)
  return jnp.take_along_axis(logits, positions[..., None], axis=1)


def draft_logits(
  draft,
  input_tokens: np.ndarray,
  output_tokens: np.ndarray,
  prompts: Optional[np.ndarray] = None,
  target_features: Optional[jax.Array] = None,
) -> jax.Array:
  """float32 [N, L, V]: a draft's next-token logits along target outputs after the prompts.

  A model draft by teacher forcing (`continuation_logits`), an n-gram draft
  from each output's previous token (the prompt's last for the first
  output), a prompt-lookup draft one-hot (as logits) at the token it would
  propose first from that context: its acceptance there is p(guess). The
  tokens after the first of a drafted block continue the same match, so
  prompt lookup's beta in the loop (`alpha_loop`) can differ from this. A
  feature head (`drafts.FeatureDraft`) from the target's true features
  along the outputs (`_feature_head_logits`): its first draft token's
  distribution; later ones read its own predicted features, so its beta in
  the loop is lower.

  Args:
    draft: a `models.Model`, `drafts.NgramDraft`, `drafts.PromptLookupDraft`
      or `drafts.FeatureDraft`.
    input_tokens: int [N, Lin] encoder inputs (a decoder-only pair's: its
      prompts), as the decode call's.
    output_tokens: int [N, L] target outputs.
    prompts: int [N, Lp] prompts, or None.
    target_features: a feature head's target features [N, L', Df] along
      the same rows (`continuation_layout`), if already computed; None: the
      head runs its target.
  """
  if isinstance(draft, models.Model):
    return continuation_logits(draft, input_tokens, output_tokens, prompts)
  decoder_inputs, positions = layouts.continuation_layout(prompts, output_tokens)
  if isinstance(draft, drafts.NgramDraft):
    previous = np.take_along_axis(decoder_inputs, positions, axis=1)
    logits = draft.log_probs(jnp.asarray(previous.reshape(-1)))
    return logits.reshape(previous.shape + (draft.vocab_size,))
  if isinstance(draft, drafts.PromptLookupDraft):
    return _prompt_lookup_logits(
      draft, jnp.asarray(input_tokens, jnp.int32), decoder_inputs, positions
    )
  if isinstance(draft, drafts.FeatureDraft):
    return _feature_head_logits(
      draft, jnp.asarray(input_tokens, jnp.int32), decoder_inputs, positions, target_features
    )
  raise ValueError(
    f'alpha by teacher forcing takes a models.Model, drafts.NgramDraft, '
    f'drafts.PromptLookupDraft or drafts.FeatureDraft draft; got a {type(draft).__name__}. Measure its '
    "acceptance in the decode loop (the walltime records' alpha_loop)."
  )


@functools.partial(jax.jit, static_argnames=('temperature', 'topk', 'topp'))
def _beta(target_logits, draft_logits, *, temperature, topk, topp):
  standardize = functools.partial(
    sampling.standardize, temperature=temperature, topk=topk, topp=topp
  )
  return speculative_sampling.lenient_acceptance_rate(
    standardize(target_logits), standardize(draft_logits)
  )


def _reads_target_features(draft, target: models.Model) -> bool:
  """Whether `draft` is a feature head on `target`'s own parameters, whose features its pass can give.

  Only a causal target's: a prefix LM's bidirectional prompt would change them.
  """
  return (
    isinstance(draft, drafts.FeatureDraft)
    and draft.target_params is target.params
    and not target.inputs_bidirectional_attention
  )


@dataclasses.dataclass
class AlphaResult:
  """alpha measured on target samples.

  Attributes:
    alpha: mean beta over the tokens.
    stderr: standard error, from per-sequence means (tokens of one sequence
      are not independent).
    num_tokens: tokens averaged over.
    beta_by_token: {token id: (count, mean beta)} over the tokens the target
      emitted (where the draft's guesses fail).
    cut_share: the share of those tokens in samples cut at `max_decode_len`
      without EOS: a weak target's greedy outputs often repeat a phrase
      until cut, and a draft that copies the loop scores high on them.
    alpha_cut, alpha_ended: mean beta over the tokens of the cut samples and
      of the samples that end with EOS (None where there are none).
  """

  alpha: float
  stderr: float
  num_tokens: int
  beta_by_token: Dict[int, tuple]
  cut_share: float
  alpha_cut: Optional[float]
  alpha_ended: Optional[float]


def measure_alpha(
  target: models.Model,
  candidates: Mapping[str, Any],
  inputs: np.ndarray,
  *,
  decoder_prompts: Optional[np.ndarray] = None,
  temperature: float,
  topk: int = 0,
  topp: float = 0.0,
  max_decode_len: int,
  min_tokens: int = 10_000,
  batch_size: int = 64,
  seed: int = 0,
) -> Dict[str, AlphaResult]:
  """alpha of each draft: beta averaged over the same >= `min_tokens` target samples.

  The target samples continuations of the inputs (after the prompts, if
  any); target and drafts are teacher-forced along them (`continuation_logits`,
  `draft_logits`), and beta = sum_x min(p, q) of their standardized
  distributions is averaged over the continuations' tokens. A feature head
  on the target's own parameters reads its features from the target's pass
  (one pass gives p and them).

  Args:
    target: the target (encoder-decoder or decoder-only).
    candidates: name -> a `models.Model`, `drafts.NgramDraft`,
      `drafts.PromptLookupDraft` or `drafts.FeatureDraft` draft.
    inputs: int32 [N, Lin] encoder inputs, or a decoder-only target's
      prompts [N, Lp] (tokens, then 0-padding), cycled through in batches.
    decoder_prompts: optional int32 [N, Lp] decoder prompts of an
      encoder-decoder target.
    temperature, topk, topp: the sampling mode (of the target's samples and
      of both standardized distributions).
    max_decode_len: tokens sampled after each prompt at most.
    min_tokens: sample batches until this many target tokens (EOS included).
    batch_size: rows per sampled batch.
    seed: PRNG seed of the target's samples.

  Returns:
    name -> `AlphaResult`.
  """
  decode = models.make_decoder(
    target, None, temperature=temperature, topk=topk, topp=topp, max_decode_len=max_decode_len
  )
  sample_args = dict(temperature=temperature, topk=topk, topp=topp)
  heads = {name: d for name, d in candidates.items() if _reads_target_features(d, target)}
  # The first head's layers come from the target's pass; a head reading others runs its own.
  shared_layers = next(iter(heads.values())).feature_layers if heads else None
  reads_shared = {name for name, d in heads.items() if d.feature_layers == shared_layers}
  betas = {name: [] for name in candidates}
  sequence_means = {name: [] for name in candidates}
  tokens, cut = [], []
  num_tokens, start, key = 0, 0, jax.random.PRNGKey(seed)
  while num_tokens < min_tokens:
    rows = np.arange(start, start + batch_size)
    take = lambda x: layouts.trim_padding(np.take(x, rows, axis=0, mode='wrap'), multiple=16)
    batch = take(inputs)
    batch_prompts = None if decoder_prompts is None else take(decoder_prompts)
    start += batch_size
    key, step_key = jax.random.split(key)
    outputs = np.asarray(decode(batch, step_key, batch_prompts).tokens)
    prompts = layouts.prompts_of(target, batch, batch_prompts)
    if shared_layers is None:
      target_logits, shared = continuation_logits(target, batch, outputs, prompts), None
    else:  # One target pass gives p and the heads' features.
      decoder_inputs, positions = layouts.continuation_layout(prompts, outputs)
      target_logits, shared = _logits_at(
        target.config, target.params, batch, decoder_inputs, positions, None, shared_layers
      )
    valid = np.arange(outputs.shape[1])[None] < layouts.output_lengths(outputs)[:, None]
    for name, draft in candidates.items():
      q_logits = draft_logits(
        draft, batch, outputs, prompts, shared if name in reads_shared else None
      )
      beta = np.asarray(_beta(target_logits, q_logits, **sample_args))
      betas[name].append(beta[valid])
      sequence_means[name].extend((beta * valid).sum(1) / valid.sum(1))
    tokens.append(outputs[valid])
    ended = (outputs == layouts.EOS_ID).any(axis=1)
    cut.append(np.broadcast_to(~ended[:, None], valid.shape)[valid])
    num_tokens += int(valid.sum())
  tokens, cut = np.concatenate(tokens), np.concatenate(cut)
  mean_or_none = lambda x: float(x.mean()) if x.size else None
  results = {}
  for name in candidates:
    all_betas = np.concatenate(betas[name])
    by_token = {}
    for token in np.unique(tokens):
      selected = all_betas[tokens == token]
      by_token[int(token)] = (int(selected.size), float(selected.mean()))
    results[name] = AlphaResult(
      alpha=float(all_betas.mean()),
      stderr=standard_error(sequence_means[name]),
      num_tokens=int(all_betas.size),
      beta_by_token=by_token,
      cut_share=float(cut.mean()),
      alpha_cut=mean_or_none(all_betas[cut]),
      alpha_ended=mean_or_none(all_betas[~cut]),
    )
  return results
