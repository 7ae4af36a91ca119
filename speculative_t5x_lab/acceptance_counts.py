"""Acceptance counts: the benchmarks' statistics of each judgement, as a judge's record.

The library's loop keeps only what it reports (`decoding.SpeculativeStats`:
per-row iterations, accepted, emitted and drafted tokens, target calls,
draft steps and the mean beta). What the benchmarks report besides (the
accepted histogram, acceptance by draft position and by sibling rank, how
often a whole block was accepted) is counted here, in the record of
`AcceptanceCounts`, a judge that wraps another (the exact one by default,
or `emulation.EmulatedJudge`), delegates the judging to it and counts what
it decided, once per iteration, through the loop's record slot
(`speculative_t5x.judging`):

  out = models.generate(target, draft, inputs, gamma=4, judge=AcceptanceCounts())
  out.stats.record.accepted_histogram  # int32 [5]

The counts are over the flat batch's active (row, iteration) pairs, as the
loop's aggregate statistics.
"""

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from speculative_t5x import judging
from speculative_t5x import settings as settings_lib

Array = jax.Array


@flax.struct.dataclass
class Counts:
  """What `AcceptanceCounts` records, over active (row, iteration) pairs.

  Attributes:
    fully_accepted: int32 scalar, the pairs that accepted every drafted
      token (the draft then catches up one token).
    accepted_histogram: int32 [gamma + 1], how often 0..gamma were accepted.
    position_reached: int32 [gamma], how often draft position i was judged
      (drafted, and all earlier ones accepted).
    position_accepted: int32 [gamma], how often draft position i was accepted.
    rank_judged: int32 [gamma, K], how often a draft token of sibling rank r
      (its draw order among a node's children; K = 1 for a chain) at depth
      i + 1 was judged.
    rank_accepted: int32 [gamma, K], how often it was accepted.
  """

  fully_accepted: Array
  accepted_histogram: Array
  position_reached: Array
  position_accepted: Array
  rank_judged: Array
  rank_accepted: Array

  @classmethod
  def zeros(cls, gamma: int, max_children: int = 1) -> 'Counts':
    """Nothing counted yet, for blocks of gamma draft tokens (a tree's depth) and K ranks."""
    return cls(
      fully_accepted=jnp.zeros((), jnp.int32),
      accepted_histogram=jnp.zeros((gamma + 1,), jnp.int32),
      position_reached=jnp.zeros((gamma,), jnp.int32),
      position_accepted=jnp.zeros((gamma,), jnp.int32),
      rank_judged=jnp.zeros((gamma, max_children), jnp.int32),
      rank_accepted=jnp.zeros((gamma, max_children), jnp.int32),
    )

  def add(self, judgement: judging.Judgement, active: Array) -> 'Counts':
    """These counts and one iteration's `judgement` of the rows `active` (bool [BN])."""
    gamma = judgement.beta.shape[1]
    num_accepted = judgement.num_accepted
    offsets = jnp.arange(gamma, dtype=jnp.int32)[None]
    drafted = jnp.where(active, judgement.num_drafted, 0)
    judged = (offsets <= num_accepted[:, None]) & (offsets < drafted[:, None])
    accepted = offsets < num_accepted[:, None]
    if judgement.verdict is None:  # A chain: one rank per depth.
      rank_judged, rank_accepted = judged[..., None], accepted[..., None]
    else:  # At each depth of the path the valid children up to the accepted one were judged.
      ranks = jnp.arange(self.rank_judged.shape[1])
      rank_judged = judgement.verdict.children_judged[..., None] > ranks
      rank_accepted = judgement.verdict.accepted_rank[..., None] == ranks
    return Counts(
      fully_accepted=self.fully_accepted + jnp.sum(active & (num_accepted == drafted)),
      accepted_histogram=self.accepted_histogram
      + jnp.sum(jax.nn.one_hot(num_accepted, gamma + 1, dtype=jnp.int32) * active[:, None], axis=0),
      position_reached=self.position_reached + jnp.sum(judged, axis=0),
      position_accepted=self.position_accepted + _count_rows(accepted, active),
      rank_judged=self.rank_judged + _count_rows(rank_judged, active),
      rank_accepted=self.rank_accepted + _count_rows(rank_accepted, active),
    )

  @property
  def acceptance_by_position(self) -> Array:
    """float [gamma]: P(draft position i accepted | judged)."""
    return self.position_accepted / jnp.maximum(self.position_reached, 1)

  @property
  def acceptance_by_rank(self) -> Array:
    """float [gamma, K]: P(the rank-r child at depth i + 1 accepted | judged)."""
    return self.rank_accepted / jnp.maximum(self.rank_judged, 1)


def _count_rows(flags: Array, active: Array) -> Array:
  """int32 [...]: how many active rows (active bool [BN]) have each flag (bool [BN, ...])."""
  return jnp.sum(flags & active.reshape(active.shape + (1,) * (flags.ndim - 1)), axis=0)


@dataclasses.dataclass(frozen=True)
class AcceptanceCounts:
  """A `judging.Judge` that judges as `judge` does and records its `Counts`.

  Attributes:
    judge: the judge whose decisions are counted (one that records nothing:
      `judging.EXACT`, the default, or `emulation.EmulatedJudge`); None is
      the exact one.
  """

  judge: Any = judging.EXACT

  def __post_init__(self):
    if self.judge is None:
      object.__setattr__(self, 'judge', judging.EXACT)

  def check(self, spec: settings_lib.SpeculativeSettings) -> None:
    self.judge.check(spec)

  def judge_chain(self, *args, **kwargs) -> judging.Judgement:
    return self.judge.judge_chain(*args, **kwargs)

  def judge_tree(self, *args, **kwargs) -> judging.Judgement:
    return self.judge.judge_tree(*args, **kwargs)

  def init_record(self, flat_size: int, spec: settings_lib.SpeculativeSettings) -> Counts:
    """`Counts` of nothing, shaped for `spec`'s gamma and its tree's ranks (1 for a chain)."""
    return Counts.zeros(spec.gamma, 1 if spec.tree is None else spec.tree.max_children)

  def record(self, record: Counts, judgement: judging.Judgement, active: Array) -> Counts:
    return record.add(judgement, active)


def counts(stats) -> Counts:
  """The `Counts` of a decode's `decoding.SpeculativeStats` (TypeError if none were kept)."""
  record = stats.record
  if not isinstance(record, Counts):
    raise TypeError(
      f'These statistics carry no acceptance counts (their record is {record!r}): decode '
      'with judge=acceptance_counts.AcceptanceCounts(...).'
    )
  return record
