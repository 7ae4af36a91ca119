"""Algorithm 1's verification step (Leviathan et al., 2023), with lenience.

Given γ draft tokens x_1..x_γ drawn from draft distributions q_1..q_γ and the
target distributions p_1..p_{γ+1} computed in one target call, `verify` accepts
a prefix of the draft and draws one more token, so that the emitted tokens are
distributed exactly as tokens drawn from the target one by one.

The rule, with lenience l in (0, 1] (paper, Appendix A.5; l = 1 is the exact
method): accept x ~ q with probability min(1, p(x) / (l·q(x))); after the first
rejection, draw the next token from the residual norm(max(0, p − l·q)); if all
γ are accepted, draw a bonus token from p_{γ+1}.

Why it is exact for l = 1, and why no token exceeds p(x)/l for l < 1: the
probability of accepting x is q(x)·min(1, p(x)/(l·q(x))) = min(q(x), p(x)/l).
The rejection probability is Σ_x max(0, q − p/l) = D/l with
D = Σ max(0, l·q − p), and the residual mass is R = Σ max(0, p − l·q).
Since Σ (p − l·q) = 1 − l, R − D = 1 − l ≥ 0, so
  P(x) = min(q, p/l) + (D/l) · max(0, p − l·q) / R.
If p(x) ≤ l·q(x), P(x) = p(x)/l. Otherwise P(x) = q + (p − l·q)·D/(l·R)
≤ q + (p − l·q)/l = p(x)/l, with equality for all x iff D = R, i.e. l = 1;
then P = p. For l < 1 the residual is never empty (R ≥ 1 − l).

The distribution of the next token after a rejection at position i depends on
nothing but p_i and q_i, so by induction over positions the whole emitted
sequence is distributed as under the target (l = 1).

Block verification (Algorithm 2 of Sun et al., "Block Verification
Accelerates Speculative Decoding", ICLR 2025; `verify(...,
verification='block')`, lenience 1): with the running weight w_0 = 1,
w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), prefix i < γ is accepted with
probability h_i = r_i / (r_i + 1 - w_i), where
r_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)), and prefix γ with h_γ = w_γ;
the emitted prefix is the longest accepted one, τ (not the first rejection),
followed by a sample of norm(max(0, w_τ p_{τ+1} - q_{τ+1})) for τ < γ or of
p_{γ+1}. The output distribution is the same, and the expected number of
tokens never lower.

An adaptive draft length (`num_drafted`): a row may draft n ≤ γ tokens, n
chosen by the draft from its own tokens (`drafts.rollout_loop` stops after a
token the draft is unsure of). Only x_1..x_n are judged; an undrafted position
acts as a rejection point whose next token comes from the target's own p_i,
not a residual: the row emits between 1 and n + 1 tokens, and if all n are
accepted the next one is drawn from p_{n+1}. Exact because whether x_{i+1} is
drafted is decided by the draft from the context and x_1..x_i before any
acceptance coin is drawn: given that it is drafted, x_{i+1} ~ q_{i+1} as
before (accept, or the residual: p_{i+1} overall); given that it is not, the
token is drawn from p_{i+1} directly. Either way the token at position i + 1
is distributed as p_{i+1} given what was emitted. For block verification an
undrafted position n + 1 is a draft with q_{n+1} ≡ 0: h_n = w_n and the
residual norm(max(0, w_n p_{n+1})) is p_{n+1}, which is the rule of the
block's last position; Sun et al.'s argument is local to each draft prefix
(it uses the next q where the draft goes on and this rule where it stops),
so it holds for a block length that is any function of the draft's own
tokens. tests/test_block_verification.py enumerates both rules with such a
stopping rule in float64.

The rule lives in small pure functions (`acceptance_probability`,
`residual_distribution`, `residual_distribution_for_token`,
`lenient_acceptance_rate`); `verify` is these applied to a batch, and tests
enumerate the emitted distribution from the same functions in float64.
"""

import functools
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import sampling

# A residual mass below this many float eps is rounding noise (p and q agree to
# float precision; the rejection that leads here has probability of the same
# order), so the next token is drawn from p, the residual's limit as q → p.
_RESIDUAL_MASS_FLOOR_IN_EPS = 8

VERIFICATIONS = ('token', 'block')


def check_lenience(lenience):
  """Returns a concrete lenience as a float; ValueError unless it is a scalar in (0, 1].

  A traced lenience (a caller jitting over it) is returned unchecked.
  """
  if isinstance(lenience, jax.core.Tracer):
    return lenience
  if isinstance(lenience, (bool, np.bool_)):
    value = None
  else:
    try:
      value = np.asarray(lenience, dtype=np.float64)
    except (TypeError, ValueError):
      value = None
  if value is None or value.ndim != 0 or not 0.0 < float(value) <= 1.0:
    raise ValueError(
      f'lenience must be a scalar in (0, 1] (1 is exact speculative sampling), got {lenience!r}.'
    )
  return float(value)


def check_verification(verification: str, lenience=1.0) -> str:
  """Returns `verification`; ValueError unless it is a known rule that fits `lenience`."""
  if verification not in VERIFICATIONS:
    raise ValueError(f"verification must be 'token' or 'block'; got {verification!r}.")
  if verification == 'block' and (isinstance(lenience, jax.core.Tracer) or float(lenience) != 1.0):
    raise ValueError(
      f"verification='block' is exact only: it needs lenience 1, got "
      f"{lenience!r}. Use verification='token' for lenient acceptance."
    )
  return verification


def acceptance_probability(
  target_prob: jax.Array, draft_prob: jax.Array, lenience: Union[float, jax.Array] = 1.0
) -> jax.Array:
  """Probability of accepting a drafted token x: min(1, p(x) / (l·q(x))).

  Args:
    target_prob: float [...], p(x) at the drafted token.
    draft_prob: float [...], q(x) at the drafted token (same shape).
    lenience: l in (0, 1].

  Returns:
    float [...] in [0, 1], in the inputs' dtype. A token with p(x) = 0 is never
    accepted; one with q(x) = 0 < p(x) is always accepted.
  """
  scaled_draft = lenience * draft_prob
  covered = target_prob >= scaled_draft
  ratio = target_prob / jnp.where(covered, 1, scaled_draft)
  return jnp.where(covered, (target_prob > 0).astype(ratio.dtype), ratio)


def _normalize_or_target(excess: jax.Array, target_probs: jax.Array) -> jax.Array:
  mass = jnp.sum(excess, axis=-1, keepdims=True)
  usable = mass > _RESIDUAL_MASS_FLOOR_IN_EPS * jnp.finfo(excess.dtype).eps
  return jnp.where(usable, excess / jnp.where(usable, mass, 1), target_probs)


def residual_distribution(
  target_probs: jax.Array, draft_probs: jax.Array, lenience: Union[float, jax.Array] = 1.0
) -> jax.Array:
  """The distribution sampled after a rejection: norm(max(0, p − l·q)).

  Args:
    target_probs: float [..., V], p.
    draft_probs: float [..., V], q.
    lenience: l in (0, 1].

  Returns:
    float [..., V] in the inputs' dtype; p itself where the residual mass is
    ~0 (only possible for l = 1 and q ≈ p).
  """
  excess = jnp.maximum(target_probs - lenience * draft_probs, 0)
  return _normalize_or_target(excess, target_probs)


def residual_distribution_for_token(
  target_probs: jax.Array, draft_token: jax.Array, lenience: Union[float, jax.Array] = 1.0
) -> jax.Array:
  """`residual_distribution` for a deterministic draft (q one-hot at a token).

  Args:
    target_probs: float [..., V], p.
    draft_token: int [...], the token q puts all its mass on.
    lenience: l in (0, 1].

  Returns:
    float [..., V], equal to `residual_distribution(p, one_hot(token), l)`
    without building the one-hot q.
  """
  is_draft = jnp.arange(target_probs.shape[-1]) == draft_token[..., None]
  excess = jnp.where(is_draft, jnp.maximum(target_probs - lenience, 0), target_probs)
  return _normalize_or_target(excess, target_probs)


def lenient_acceptance_rate(
  target_probs: jax.Array, draft_probs: jax.Array, lenience: Union[float, jax.Array] = 1.0
) -> jax.Array:
  """β = Σ_x min(q(x), p(x)/l): the probability that a draft token is accepted.

  For l = 1 this is the paper's β = Σ_x min(p, q) = 1 − D_LK(p, q).

  Args:
    target_probs: float [..., V], p.
    draft_probs: float [..., V], q.
    lenience: l in (0, 1].

  Returns:
    float [...].
  """
  return jnp.sum(jnp.minimum(draft_probs, target_probs / lenience), axis=-1)


def _row_keys(rng: jax.Array, batch_size: int) -> jax.Array:
  """One key per row: `rng` split B ways, or `rng` itself if it holds B keys."""
  rng = jnp.asarray(rng)
  key_ndim = 0 if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) else 1
  if rng.ndim == key_ndim:
    return jax.random.split(rng, batch_size)
  if rng.ndim == key_ndim + 1 and rng.shape[0] == batch_size:
    return rng
  raise ValueError(
    f'rng must be one PRNG key or a batch of {batch_size} keys (one per '
    f'row); got an array of shape {rng.shape}.'
  )


def _at_tokens(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  """float32 [γ]: probs [γ, V] at each position's token, tokens int [γ]."""
  return jnp.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0].astype(jnp.float32)


def _verify_row(
  key: jax.Array,
  draft_tokens: jax.Array,
  draft_probs: Optional[jax.Array],
  target_probs: jax.Array,
  num_drafted: jax.Array,
  lenience,
  one_hot_target: bool,
) -> Tuple[jax.Array, jax.Array]:
  """`verify` for one row: draft_tokens [γ], draft_probs [γ, V] or None,
  target_probs [γ+1, V], num_drafted int32 scalar."""
  gamma = draft_tokens.shape[0]
  accept_key, next_key = jax.random.split(key)

  target_at_drafted = _at_tokens(target_probs[:gamma], draft_tokens)
  draft_at_drafted = (
    jnp.ones((gamma,), jnp.float32)
    if draft_probs is None
    else _at_tokens(draft_probs, draft_tokens)
  )
  accepted = jax.random.uniform(accept_key, (gamma,)) < acceptance_probability(
    target_at_drafted, draft_at_drafted, lenience
  )
  accepted &= jnp.arange(gamma) < num_drafted  # Undrafted positions stop the prefix.
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))

  # p at the first rejected position, or p_{n+1} after all n drafted tokens.
  target_next = target_probs[num_accepted].astype(jnp.float32)
  rejected_at = jnp.minimum(num_accepted, gamma - 1)
  if draft_probs is None:
    residual = residual_distribution_for_token(target_next, draft_tokens[rejected_at], lenience)
  else:
    residual = residual_distribution(
      target_next, draft_probs[rejected_at].astype(jnp.float32), lenience
    )
  next_probs = jnp.where(num_accepted < num_drafted, residual, target_next)
  # A one-hot p makes the residual one-hot at p's token too (or p itself).
  return num_accepted, sampling.sample(next_key, next_probs, one_hot=one_hot_target)


def verify(
  rng: jax.Array,
  draft_tokens: jax.Array,
  draft_probs: Optional[jax.Array],
  target_probs: jax.Array,
  lenience: Union[float, jax.Array] = 1.0,
  return_beta: bool = False,
  one_hot_target: bool = False,
  verification: str = 'token',
  num_drafted: Optional[jax.Array] = None,
):
  """Accepts a prefix of each row's draft and draws the token that follows it.

  Batched and jittable; no sort, O(B·γ·V) work, float32 arithmetic whatever
  the input dtype.

  Args:
    rng: one PRNG key, or B keys (one per row, e.g. `jax.random.split(k, B)`).
      Row b's result depends only on its own key, so a batch gives the same
      rows as B separate calls with `rng[b:b+1]`. One key is split B ways.
    draft_tokens: int32 [B, γ], the drafted tokens x_1..x_γ (ids < V).
    draft_probs: float [B, γ, V], the standardized distributions the draft
      tokens were sampled from; or None for a deterministic draft (prompt
      lookup, argmax), whose q is one-hot at the drafted token.
    target_probs: float [B, γ+1, V], the standardized target distributions
      p_1..p_{γ+1}, p_i conditioned on the prefix and x_1..x_{i-1}.
    lenience: l in (0, 1]; 1 is exact. With l < 1 acceptance is more likely
      and no token is emitted with probability above p(x)/l (Appendix A.5).
    return_beta: also return the per-position acceptance probability β.
    one_hot_target: static; every target distribution is one-hot (greedy
      decoding), so the next token is drawn by argmax, without random
      numbers (`sampling.sample(..., one_hot=True)`).
    verification: static; 'token' (Algorithm 1 of Leviathan et al.: accept
      x_i with probability min(1, p_i(x_i)/q_i(x_i)), stop at the first
      rejection) or 'block' (Algorithm 2 of Sun et al., "Block Verification
      Accelerates Speculative Decoding", ICLR 2025; the rule is in the module
      docstring): the same output distribution, never fewer tokens in
      expectation. Needs lenience 1.
    num_drafted: int32 [B] in [0, γ], the tokens each row drafted (an
      adaptive draft length); None: all γ. Only x_1..x_n are judged: the
      rules above run with γ = n per row (n + 1 is a rejection point whose
      next token is drawn from p_{n+1}; see the module docstring).

  Returns:
    num_accepted: int32 [B] in [0, num_drafted].
    next_token: int32 [B]. Row b emits `draft_tokens[b, :num_accepted[b]]`
      then `next_token[b]`: the residual sample after a rejection, or the
      bonus sample from `target_probs[b, n]` when all n drafted tokens are
      accepted.
    beta (only if return_beta): float32 [B, γ], β_i = Σ_x min(q_i, p_i/l),
      the probability that position i's draft is accepted given its prefix.
      For l = 1 this is Σ_x min(p_i, q_i), the paper's α measured on the fly;
      for l < 1 it is the lenient acceptance rate (the α that governs
      speedup under lenience). Positions after the first rejection are
      computed on draft prefixes that were not emitted, and positions past
      num_drafted on no draft at all.

  Raises:
    ValueError: on inconsistent shapes, γ < 1, lenience outside (0, 1]
      (concrete values only), or an rng that is neither one key nor B keys.
  """
  check_lenience(lenience)
  batch_size, gamma = _check_shapes(draft_tokens, draft_probs, target_probs)
  check_verification(verification, lenience)
  num_drafted = _num_drafted(num_drafted, batch_size, gamma)
  if verification == 'token':
    verify_row = functools.partial(_verify_row, lenience=lenience, one_hot_target=one_hot_target)
  else:
    verify_row = functools.partial(_block_verify_row, one_hot_target=one_hot_target)
  num_accepted, next_token = jax.vmap(verify_row)(
    _row_keys(rng, batch_size), draft_tokens, draft_probs, target_probs, num_drafted
  )
  if not return_beta:
    return num_accepted, next_token
  return (
    num_accepted,
    next_token,
    _position_betas(draft_tokens, draft_probs, target_probs, lenience),
  )


def _check_shapes(
  draft_tokens: jax.Array, draft_probs: Optional[jax.Array], target_probs: jax.Array
) -> Tuple[int, int]:
  """(B, γ) of `verify`'s arguments; ValueError unless their shapes agree (see `verify`)."""
  if draft_tokens.ndim != 2 or draft_tokens.shape[1] < 1:
    raise ValueError(f'draft_tokens must have shape [B, γ] with γ >= 1; got {draft_tokens.shape}.')
  batch_size, gamma = draft_tokens.shape
  if target_probs.ndim != 3 or target_probs.shape[:2] != (batch_size, gamma + 1):
    raise ValueError(
      f'target_probs must have shape [B, γ+1, V] = [{batch_size}, '
      f'{gamma + 1}, V]; got {target_probs.shape}.'
    )
  if draft_probs is not None and draft_probs.shape != (batch_size, gamma, target_probs.shape[-1]):
    raise ValueError(
      f'draft_probs must have shape [B, γ, V] = [{batch_size}, {gamma}, '
      f"{target_probs.shape[-1]}] (the target's vocabulary); got "
      f'{draft_probs.shape}.'
    )
  return batch_size, gamma


def _position_betas(
  draft_tokens: jax.Array,
  draft_probs: Optional[jax.Array],
  target_probs: jax.Array,
  lenience: Union[float, jax.Array],
) -> jax.Array:
  """float32 [B, γ]: `verify`'s beta, β_i = Σ_x min(q_i, p_i/l) at each draft position.

  draft_tokens int32 [B, γ]; draft_probs float [B, γ, V], or None for a
  one-hot q (β_i = min(1, p_i(x_i)/l)); target_probs float [B, γ+1, V].
  """
  target_probs = target_probs[:, : draft_tokens.shape[1]].astype(jnp.float32)
  if draft_probs is None:
    target_at_drafted = jnp.take_along_axis(target_probs, draft_tokens[..., None], axis=-1)[..., 0]
    return jnp.minimum(target_at_drafted / lenience, 1.0)
  return lenient_acceptance_rate(target_probs, draft_probs.astype(jnp.float32), lenience)


def _num_drafted(num_drafted: Optional[jax.Array], batch_size: int, gamma: int) -> jax.Array:
  """int32 [B]: each row's drafted tokens, γ for all when None; checks the shape."""
  if num_drafted is None:
    return jnp.full((batch_size,), gamma, jnp.int32)
  if jnp.shape(num_drafted) != (batch_size,):
    raise ValueError(
      f'num_drafted must have shape [B] = [{batch_size}] (one count per row); got '
      f'{jnp.shape(num_drafted)}.'
    )
  return jnp.asarray(num_drafted, jnp.int32)


def _block_verify_row(
  key: jax.Array,
  draft_tokens: jax.Array,
  draft_probs: Optional[jax.Array],
  target_probs: jax.Array,
  num_drafted: jax.Array,
  one_hot_target: bool,
) -> Tuple[jax.Array, jax.Array]:
  """`block_verify` for one row: draft_tokens [γ], draft_probs [γ, V] or None,
  target_probs [γ+1, V], num_drafted int32 scalar n."""
  gamma, vocab_size = draft_tokens.shape[0], target_probs.shape[-1]
  accept_key, next_key = jax.random.split(key)
  p = target_probs.astype(jnp.float32)
  q = (
    jax.nn.one_hot(draft_tokens, vocab_size, dtype=jnp.float32)
    if draft_probs is None
    else draft_probs.astype(jnp.float32)
  )
  target_at, draft_at = _at_tokens(p[:gamma], draft_tokens), _at_tokens(q, draft_tokens)
  # p_i(x_i) / q_i(x_i); q_i(x_i) > 0 for a token drawn from q (inf otherwise).
  ratio = jnp.where(
    draft_at > 0,
    target_at / jnp.where(draft_at > 0, draft_at, 1),
    jnp.where(target_at > 0, jnp.inf, 0.0),
  )
  # w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), w_0 = 1: [γ + 1].
  weights = [jnp.ones((), jnp.float32)]
  for i in range(gamma):
    weights.append(jnp.minimum(jnp.where(weights[-1] > 0, weights[-1] * ratio[i], 0.0), 1.0))
  weights = jnp.stack(weights)
  # Excess mass of w_i p_{i+1} over q_{i+1}, the next position's residual.
  excess = jnp.maximum(weights[1:gamma, None] * p[1:gamma] - q[1:gamma], 0)  # [γ-1, V]
  excess_mass = jnp.sum(excess, axis=-1)
  denominator = excess_mass + 1 - weights[1:gamma]
  stop_here = jnp.where(
    denominator > 0, excess_mass / jnp.where(denominator > 0, denominator, 1), 0.0
  )
  # h_1..h_γ: h_i for i < n, h_n = w_n (the last drafted position), 0 past n.
  lengths = jnp.arange(1, gamma + 1)
  h = jnp.where(
    lengths < num_drafted,
    jnp.pad(stop_here, (0, 1)),
    jnp.where(lengths == num_drafted, weights[1:], 0.0),
  )
  accepted = jax.random.uniform(accept_key, (gamma,)) < h
  # τ: the longest accepted prefix, not the first rejection.
  num_accepted = jnp.max(jnp.where(accepted, lengths, 0))
  target_next = p[num_accepted]
  draft_next = q[jnp.minimum(num_accepted, gamma - 1)]
  residual = _normalize_or_target(
    jnp.maximum(weights[num_accepted] * target_next - draft_next, 0), target_next
  )
  next_probs = jnp.where(num_accepted < num_drafted, residual, target_next)
  return num_accepted, sampling.sample(next_key, next_probs, one_hot=one_hot_target)
