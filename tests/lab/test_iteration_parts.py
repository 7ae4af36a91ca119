"""`measure.iteration_parts` times the parts of the decode its settings describe."""

import pytest

from speculative_t5x_lab import measure
from speculative_t5x import settings
from speculative_t5x import speculative_sampling
from testing_utils import tiny_model

TARGET = tiny_model(seed=0)
DRAFT = tiny_model(seed=1)


# 'block' runs in `make test`: the old bug timed the token rule for every record, which
# only the 'block' case can catch.
@pytest.mark.parametrize('verification', ['block', pytest.param('token', marks=pytest.mark.slow)])
def test_the_judge_part_runs_the_settings_verification_rule(monkeypatch, verification):
  """A verification='block' record's breakdown timed the token rule before (issue 20)."""
  rules = []
  verify = speculative_sampling.verify

  def recording_verify(*args, **kwargs):
    rules.append(kwargs['verification'])
    return verify(*args, **kwargs)

  monkeypatch.setattr(speculative_sampling, 'verify', recording_verify)
  parts = measure.iteration_parts(
    TARGET.config,
    TARGET.params,
    DRAFT.as_draft(),
    settings.SpeculativeSettings(gamma=2, verification=verification),
    batch_size=1,
    input_length=4,
    max_decode_len=8,
    repetitions=1,
  )
  assert parts.gamma == 2 and parts.verification == verification
  assert rules and set(rules) == {verification}
