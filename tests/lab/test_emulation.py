"""The benchmarks' emulated acceptance reaches the loop through the draft alone."""

import jax
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import models
from speculative_t5x_lab import emulation
from testing_utils import tiny_model

DRAFT = tiny_model(seed=1)


def test_the_wrapper_is_its_draft_but_for_the_rates_the_loop_reads():
  wrapped = emulation.EmulatedDraft.of(DRAFT, np.float64(0.7))
  assert isinstance(wrapped.draft, drafts.ModelDraft)  # A model becomes its (packed) draft.
  assert wrapped.vocab_size == DRAFT.vocab_size and wrapped.config == DRAFT.config
  assert decoding.emulated_acceptance(wrapped) == 0.7 and type(wrapped.emulated_acceptance) is float
  assert decoding.emulated_acceptance(DRAFT.as_draft()) is None
  by_rank = emulation.EmulatedDraft.of(DRAFT, np.array([0.9, 0.5]))
  assert by_rank.emulated_acceptance == (0.9, 0.5)
  # A pytree whose rates are static: the same rates compile once, others apart.
  leaves, treedef = jax.tree_util.tree_flatten(wrapped)
  assert len(leaves) == len(jax.tree_util.tree_leaves(models.as_draft(DRAFT)))
  assert jax.tree_util.tree_unflatten(treedef, leaves).emulated_acceptance == 0.7
  assert treedef != jax.tree_util.tree_structure(by_rank)
  assert emulation.emulated(DRAFT, None) is DRAFT
