"""Judges: how the decode loop accepts drafted tokens, and the one door for any other rule.

Each iteration of `decoding.speculative_sample` drafts, scores the block in
one target call, and then hands the target's logits and the draft to its
judge, which decides per row how many drafted tokens are accepted and draws
the token after them (a `Judgement`). The library has one judge, the exact
one (`ExactJudge`, `EXACT`, the default): Algorithm 1 of Leviathan et al.
(2023) for a chain (`speculative_sampling.verify`, token or block
verification, with lenience) and recursive rejection sampling without
replacement for a token tree (`tree.verify_tree`). No other rule lives in the
library.

`judge=` (`decoding.speculative_sample`, `models.make_decoder`,
`models.generate`, `models.speculative_decode`) is the one argument through
which anything else enters the loop: a timing experiment that accepts at
given rates on random weights (defined in the lab, `speculative_t5x_lab`;
its outputs are not the target's distribution), or statistics the library
does not keep (the lab's acceptance counts). A judge is static
configuration: hashable and compared by value (a frozen dataclass), so that
one compiled program serves every call with an equal judge.

The record slot. A judge may also carry a record across iterations: the
loop starts it with `judge.init_record(flat_size, spec)`, calls
`judge.record(record, judgement, active)` once per iteration, after the
judgement, and returns the final record as `SpeculativeStats.record`. The
exact judge records nothing (the empty pytree `()`: no arrays in the loop's
state, no work). A judge that counts wraps another and delegates the
judging to it.

  decode = models.make_decoder(target, draft, gamma=4, judge=my_judge)
"""

import dataclasses
from typing import Any, Mapping, Optional, Protocol, Tuple

import flax
import jax
import jax.numpy as jnp

from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x import speculative_sampling
from speculative_t5x import tree as tree_lib

PyTree = Any
Array = jax.Array


@flax.struct.dataclass
class Judgement:
  """What a judge decided for one block, per row (BN rows, a block of gamma draft tokens).

  A tree's is its accepted path's, as a chain of gamma = D positions.

  Attributes:
    num_drafted: int32 [BN], draft tokens judged (1..gamma for active rows;
      a tree's: the depths at which some child was judged).
    num_accepted: int32 [BN], draft tokens accepted (0..num_drafted).
    next_token: int32 [BN], the residual (or bonus) token after them.
    beta: float32 [BN, gamma], beta_i = sum_x min(p_i, q_i) per position.
    target_probs: float32 [BN, gamma + 1, V], the standardized target
      distributions p_1..p_{gamma+1} (a tree's: along the accepted path).
    score_logits: float [BN, gamma + 1, V], the target's logits (after any
      logit callback) that score the emitted tokens when they are scored
      unscaled (`rescale_log_probs=False`); None: scored by `target_probs`.
    verdict: a tree's `tree.TreeJudgement` (the accepted path, which
      compacts the caches, and what was judged at each depth); None for a
      chain.
  """

  num_drafted: Array
  num_accepted: Array
  next_token: Array
  beta: Array
  target_probs: Array
  score_logits: Optional[Array] = None
  verdict: Optional[tree_lib.TreeJudgement] = None


def tree_judgement(
  verdict: tree_lib.TreeJudgement, target_logits: Array, rescale_log_probs: bool = True
) -> Judgement:
  """A tree's `Judgement`: the accepted path of `verdict` as a chain of D positions.

  Args:
    verdict: the `tree.TreeJudgement` of BN rows (depth D).
    target_logits: float [BN, N, V], the target's logits at every node.
    rescale_log_probs: False keeps the logits along the path to score the
      emitted tokens unscaled (see `decoding.speculative_sample`).
  """
  return Judgement(
    num_drafted=jnp.sum(verdict.judged, axis=1).astype(jnp.int32),
    num_accepted=verdict.num_accepted,
    next_token=verdict.next_token,
    beta=verdict.beta,
    target_probs=verdict.path_target_probs,
    score_logits=None
    if rescale_log_probs
    else jnp.take_along_axis(target_logits, verdict.path[:, :, None], axis=1),
    verdict=verdict,
  )


class Judge(Protocol):
  """What the decode loop asks of a judge (`ExactJudge` is the library's, and the default).

  Hashable and compared by value. `check` runs once per decode call, on the
  host; the others are traced into the loop.
  """

  def check(self, spec: settings_lib.SpeculativeSettings) -> None:
    """ValueError unless this judge can judge decodes with these settings."""

  def judge_chain(
    self,
    rng: Array,
    draft_tokens: Array,
    draft_probs: Optional[Array],
    target_logits: Array,
    sample_args: Mapping[str, Any],
    spec: settings_lib.SpeculativeSettings,
    *,
    num_drafted: Optional[Array] = None,
    rescale_log_probs: bool = True,
  ) -> Judgement:
    """One chain's block (shapes: `ExactJudge.judge_chain`)."""

  def judge_tree(
    self,
    rng: Array,
    node_tokens: Array,
    node_valid: Array,
    draft_probs: Optional[Array],
    target_logits: Array,
    sample_args: Mapping[str, Any],
    spec: settings_lib.SpeculativeSettings,
    *,
    rescale_log_probs: bool = True,
  ) -> Judgement:
    """One token tree's block, with its `verdict` (shapes: `ExactJudge.judge_tree`)."""

  def init_record(self, flat_size: int, spec: settings_lib.SpeculativeSettings) -> PyTree:
    """The record before the first iteration, for BN = flat_size rows."""

  def record(self, record: PyTree, judgement: Judgement, active: Array) -> PyTree:
    """The record after one iteration's `judgement`; active bool [BN]: rows still decoding."""


@dataclasses.dataclass(frozen=True)
class ExactJudge:
  """The exact rules (the default judge): `speculative_sampling.verify`, `tree.verify_tree`.

  It records nothing. A judge that only adds a record can subclass it or
  wrap it.
  """

  def check(self, spec: settings_lib.SpeculativeSettings) -> None:
    """Nothing to check: `settings.SpeculativeSettings` refuses what the rules cannot judge."""

  def judge_chain(
    self,
    rng: Array,
    draft_tokens: Array,
    draft_probs: Optional[Array],
    target_logits: Array,
    sample_args: Mapping[str, Any],
    spec: settings_lib.SpeculativeSettings,
    *,
    num_drafted: Optional[Array] = None,
    rescale_log_probs: bool = True,
  ) -> Judgement:
    """Standardizes the target's block logits and verifies the draft tokens.

    Args:
      rng: PRNG key.
      draft_tokens: int32 [BN, gamma].
      draft_probs: float32 [BN, gamma, V] standardized q, or None (one-hot).
      target_logits: float [BN, gamma + 1, V] for the block [last, x_1..x_gamma].
      sample_args: `temperature`, `topk`, `topp` (as `sampling.standardize`).
      spec: the decode's settings; its `lenience` and `verification` apply
        (see `speculative_sampling.verify`).
      num_drafted: int32 [BN] tokens each row drafted, or None for gamma.
      rescale_log_probs: False keeps `target_logits` to score the emitted
        tokens unscaled (see `decoding.speculative_sample`).
    """
    target_probs = sampling.standardize(target_logits, **sample_args)
    one_hot_target = sampling.is_greedy(sample_args['temperature'], sample_args['topk'])
    if num_drafted is None:
      num_drafted = jnp.full(draft_tokens.shape[:1], draft_tokens.shape[1], jnp.int32)
    num_accepted, next_token, beta = self.verify_chain(
      rng,
      draft_tokens,
      draft_probs,
      target_probs,
      spec,
      one_hot_target=one_hot_target,
      num_drafted=num_drafted,
    )
    return Judgement(
      num_drafted,
      num_accepted,
      next_token,
      beta,
      target_probs,
      score_logits=None if rescale_log_probs else target_logits,
    )

  def judge_tree(
    self,
    rng: Array,
    node_tokens: Array,
    node_valid: Array,
    draft_probs: Optional[Array],
    target_logits: Array,
    sample_args: Mapping[str, Any],
    spec: settings_lib.SpeculativeSettings,
    *,
    rescale_log_probs: bool = True,
  ) -> Judgement:
    """Standardizes the target's logits at every node and verifies `spec.tree`.

    Args:
      rng: PRNG key.
      node_tokens: int32 [BN, N], node 0 the row's last token (N nodes, depth D).
      node_valid: bool [BN, N], drafted nodes with q > 0 (see `tree.draw_children`).
      draft_probs: float32 [BN, N, V], the q each node's children were drawn
        from, or None for a greedy target.
      target_logits: float [BN, N, V], the target's logits at every node.
      sample_args: `temperature`, `topk`, `topp` (as `sampling.standardize`).
      spec: the decode's settings; `spec.tree` is the static tree.
      rescale_log_probs: False keeps the logits along the accepted path to
        score the emitted tokens unscaled (see `decoding.speculative_sample`).

    Returns:
      The accepted path as a chain's `Judgement` of D positions
      (`tree_judgement`), its `verdict` the `tree.TreeJudgement`.
    """
    target_probs = sampling.standardize(target_logits, **sample_args)
    one_hot_target = sampling.is_greedy(sample_args['temperature'], sample_args['topk'])
    verdict = self.verify_tree(
      rng,
      spec.tree,
      node_tokens,
      node_valid,
      draft_probs,
      target_probs,
      one_hot_target=one_hot_target,
    )
    return tree_judgement(verdict, target_logits, rescale_log_probs)

  def verify_chain(
    self, rng, draft_tokens, draft_probs, target_probs, spec, *, one_hot_target, num_drafted
  ) -> Tuple[Array, Array, Array]:
    """The chain's rule on standardized p: (num_accepted, next_token [BN], beta [BN, gamma]).

    Algorithm 1, or block verification, at `spec.lenience`
    (`speculative_sampling.verify`). A judge that differs only in its rule
    (the lab's emulated acceptance) subclasses this one and overrides it.
    """
    return speculative_sampling.verify(
      rng,
      draft_tokens,
      draft_probs,
      target_probs,
      spec.lenience,
      return_beta=True,
      one_hot_target=one_hot_target,
      verification=spec.verification,
      num_drafted=num_drafted,
    )

  def verify_tree(
    self, rng, tree, node_tokens, node_valid, draft_probs, target_probs, *, one_hot_target
  ) -> tree_lib.TreeJudgement:
    """The tree's rule on standardized p: recursive rejection sampling (`tree.verify_tree`)."""
    return tree_lib.verify_tree(
      rng, tree, node_tokens, node_valid, draft_probs, target_probs, one_hot_target=one_hot_target
    )

  def init_record(self, flat_size: int, spec: settings_lib.SpeculativeSettings) -> PyTree:
    """(): nothing is recorded."""
    return ()

  def record(self, record: PyTree, judgement: Judgement, active: Array) -> PyTree:
    """`record` unchanged."""
    return record


EXACT = ExactJudge()
