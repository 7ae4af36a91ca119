"""Emulated acceptance: the benchmarks' timing mode for random weights, as a draft wrapper.

Random weights (e.g. T5-XXL beside T5-small, never trained as a pair) give
no meaningful acceptance, yet their timings are what a speedup on such a pair
would cost. `EmulatedDraft(draft, rates)` is `draft` in every respect except
how its tokens are judged: the decode loop (`decoding.emulated_acceptance`,
its one door) draws each acceptance i.i.d. at `rates`
(`speculative_sampling.emulated_verify`; a tree's rates by sibling rank,
`tree.emulation_rates`) instead of comparing the two distributions. The
outputs are not the target's distribution; the records say `emulated`.

  decode = models.make_decoder(target, EmulatedDraft.of(draft, 0.7), gamma=4, eos_id=-1)

Only the benchmarks build one; the library's decode functions take no
emulation argument.
"""

from typing import Any, Tuple, Union

import flax
import numpy as np

from speculative_t5x import models

Rates = Union[float, Tuple[float, ...]]


@flax.struct.dataclass
class EmulatedDraft:
  """`draft`, judged by i.i.d. acceptance at `emulated_acceptance`.

  Attributes:
    draft: the wrapped draft (any `drafts.Draft`); every other attribute and
      method is its own.
    emulated_acceptance: one rate (a chain) or rates by sibling rank (a tree);
      static, so a float or a tuple of floats.
  """

  draft: Any
  emulated_acceptance: Rates = flax.struct.field(pytree_node=False)

  @classmethod
  def of(cls, draft, rates) -> 'EmulatedDraft':
    """`draft` (a `models.Model` becomes its draft) with `rates` (a number, or a sequence by
    rank) as a static float or tuple."""
    draft = models.as_draft(draft)
    if np.ndim(rates) == 0:
      return cls(draft, float(rates))
    return cls(draft, tuple(float(rate) for rate in np.ravel(rates)))

  def __getattr__(self, name: str) -> Any:
    # Called only for attributes the wrapper lacks; dunders and the field itself are not
    # forwarded (copying and unflattening look them up before `draft` is set).
    if name.startswith('__') or name == 'draft':
      raise AttributeError(name)
    return getattr(self.draft, name)


def emulated(draft, rates):
  """`draft` judged at `rates` (see the module docstring); `draft` itself for None rates."""
  return draft if rates is None or draft is None else EmulatedDraft.of(draft, rates)
