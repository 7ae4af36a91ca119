r"""The distillation loss: divergences between target and draft, and beta.

One implementation for both trainers of a draft against its frozen target:
`training.distill`'s single-device loop and the T5X model class
`t5x_models.DraftDistillationEncoderDecoderModel` (and its decoder-only
sibling), which `t5x/train.py` trains sharded. This module imports neither
t5x nor TensorFlow.

At every real position of a sequence (up to and including EOS: the tokens
speculative decoding judges), a divergence between the target's and the
draft's next-token distributions, both *standardized* as the decoder
standardizes them (`sampling.standardize` at the decoding temperature, top-k
or top-p):
  'forward_kl':  KL(p || q) = sum_x p log(p / q);
  'reverse_kl':  KL(q || p);
  'jsd':         beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q
                 (DistillSpec's JSD[beta]; beta = 0.5 is the Jensen-Shannon divergence);
  'tvd':         the total variation 1/2 sum_x |p - q| = 1 - sum_x min(p, q): one minus the
                 acceptance probability beta, so its mean is 1 - alpha on these prefixes.
Logarithms floor their argument at `LOG_FLOOR`, so mass on a token outside the
other distribution's support (top-k, top-p, argmax) costs a finite
-log(LOG_FLOOR) = 23 nats. Greedy decoding (temperature 0) standardizes the
target to the one-hot argmax, but a one-hot draft has no gradient: the draft's
side is then its softmax at temperature 1, whose argmax is its greedy token
(forward KL becomes the cross entropy of the target's argmax, TVD 1 - q(argmax
p)). The target's side is always under `stop_gradient`.

Beta, the metric both trainers report, is sum_x min(p, q) of the standardized
distributions (the draft's standardized as it decodes, also at temperature 0):
the probability that speculative decoding accepts the draft's token there, so
its mean over positions is the alpha of the training sequences.
"""

from typing import Dict, Tuple

import jax
import jax.numpy as jnp

from speculative_t5x import sampling
from speculative_t5x import speculative_sampling

DIVERGENCES = ('forward_kl', 'reverse_kl', 'jsd', 'tvd')
LOG_FLOOR = 1e-10


def _log(x: jax.Array) -> jax.Array:
  return jnp.log(jnp.maximum(x, LOG_FLOOR))


def _kl(a: jax.Array, b: jax.Array) -> jax.Array:
  # 0 log 0 = 0: a zero `a` contributes nothing whatever `b` is.
  return jnp.sum(a * (_log(a) - _log(b)), axis=-1)


def divergence(p: jax.Array, q: jax.Array, kind: str, beta: float = 0.5) -> jax.Array:
  """A divergence between target and draft distributions, per position.

  Args:
    p: float [..., V], the target's distribution.
    q: float [..., V], the draft's distribution.
    kind: one of `DIVERGENCES` (see the module docstring).
    beta: the JSD's weight of p, in (0, 1); only for 'jsd'.

  Returns:
    float32 [...].
  """
  p, q = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  if kind == 'forward_kl':
    return _kl(p, q)
  if kind == 'reverse_kl':
    return _kl(q, p)
  if kind == 'jsd':
    mixture = beta * p + (1.0 - beta) * q
    return beta * _kl(p, mixture) + (1.0 - beta) * _kl(q, mixture)
  if kind == 'tvd':
    return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  raise ValueError(f'Unknown divergence {kind!r}; use one of {DIVERGENCES}.')


def validate_divergence(kind: str, beta: float) -> None:
  """ValueError unless `kind` is one of `DIVERGENCES` (and 0 < beta < 1 for 'jsd')."""
  if kind not in DIVERGENCES:
    raise ValueError(f'Unknown divergence {kind!r}; use one of {DIVERGENCES}.')
  if kind == 'jsd' and not 0.0 < beta < 1.0:
    raise ValueError(f"The 'jsd' divergence needs 0 < beta < 1, got beta={beta}.")


def loss_distributions(
  target_logits: jax.Array, draft_logits: jax.Array, *, temperature: float, topk: int, topp: float
) -> Tuple[jax.Array, jax.Array]:
  """(p, q): the distributions the loss compares, float32 [..., V] each.

  p is the target's standardized distribution (no gradient); q the draft's,
  except at temperature 0, where it is the draft's softmax at temperature 1
  (a one-hot argmax has no gradient; see the module docstring).
  """
  p = jax.lax.stop_gradient(sampling.standardize(target_logits, temperature, topk, topp))
  if sampling.is_greedy(temperature):
    return p, jax.nn.softmax(draft_logits.astype(jnp.float32), axis=-1)
  return p, sampling.standardize(draft_logits, temperature, topk, topp)


def acceptance_rates(
  target_logits: jax.Array, draft_logits: jax.Array, *, temperature: float, topk: int, topp: float
) -> jax.Array:
  """float32 [...]: beta = sum_x min(p, q) at each position, no gradient (the module docstring's).

  p and q are the target's and the draft's standardized distributions of
  logits [..., V] at the decoding mode (the draft's as it decodes, one-hot at
  temperature 0).
  """
  mode = dict(temperature=temperature, topk=topk, topp=topp)
  return speculative_sampling.lenient_acceptance_rate(
    sampling.standardize(jax.lax.stop_gradient(target_logits), **mode),
    sampling.standardize(jax.lax.stop_gradient(draft_logits), **mode),
  )


def distillation_sums(
  target_logits: jax.Array,
  draft_logits: jax.Array,
  weights: jax.Array,
  *,
  divergence_name: str,
  beta: float,
  temperature: float,
  topk: int,
  topp: float,
) -> Dict[str, jax.Array]:
  """The loss and beta of a batch, summed over its weighted positions.

  Args:
    target_logits: float [B, L, V], the frozen target's (no gradient flows
      into them).
    draft_logits: float [B, L, V], the draft's; the loss is differentiable
      in them.
    weights: float [B, L], each position's weight (1 at real tokens, 0 at
      padding).
    divergence_name: one of `DIVERGENCES`.
    beta: the JSD's weight of p.
    temperature, topk, topp: the decoding mode of the standardized
      distributions.

  Returns:
    {'loss': float32 scalar, sum over positions of weight * divergence(p, q);
     'beta': float32 scalar (no gradient), sum of weight * sum_x min(p, q)}.
  """
  mode = dict(temperature=temperature, topk=topk, topp=topp)
  p, q = loss_distributions(target_logits, draft_logits, **mode)
  per_token = divergence(p, q, divergence_name, beta)
  acceptance = acceptance_rates(target_logits, draft_logits, **mode)
  weights = weights.astype(jnp.float32)
  return {'loss': jnp.sum(per_token * weights), 'beta': jnp.sum(acceptance * weights)}
