"""`settings.SpeculativeSettings`: the one place the speculative settings are checked."""

import dataclasses

import pytest

from speculative_t5x import settings


def test_defaults_and_normalized_types():
  spec = settings.SpeculativeSettings()
  assert spec.as_dict() == dict(
    gamma=4, lenience=1.0, verification='token', draft_threshold=0.0, profile=None, tree=None
  )
  spec = settings.SpeculativeSettings(gamma=5, lenience=1, draft_threshold=0)
  assert type(spec.lenience) is float and type(spec.draft_threshold) is float


def test_frozen_hashable_and_replace_validates_again():
  spec = settings.SpeculativeSettings(gamma=3)
  assert hash(spec) == hash(settings.SpeculativeSettings(gamma=3))  # A static jit argument.
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.gamma = 5
  assert spec.replace(gamma=7).gamma == 7
  with pytest.raises(ValueError, match='gamma must be an integer >= 1; got 0'):
    spec.replace(gamma=0)


@pytest.mark.parametrize(
  'fields, message',
  [
    (dict(gamma=0), 'gamma must be an integer >= 1; got 0'),
    (dict(gamma=True), 'gamma must be an integer >= 1; got True'),
    (dict(gamma=2.0), 'gamma must be an integer >= 1; got 2.0'),
    (dict(lenience=0.0), r'lenience must be a scalar in \(0, 1\]'),
    (dict(lenience=1.5), r'lenience must be a scalar in \(0, 1\]'),
    (dict(lenience='high'), r'lenience must be a scalar in \(0, 1\]'),
    (dict(verification='tree'), "verification must be 'token' or 'block'; got 'tree'"),
    (dict(verification='block', lenience=0.9), "verification='block' is exact only"),
    (dict(draft_threshold=1.0), r'draft_threshold must be a number in \[0, 1\); got 1.0'),
    (dict(draft_threshold=None), r'draft_threshold must be a number in \[0, 1\); got None'),
  ],
)
def test_bad_settings_are_named_errors(fields, message):
  with pytest.raises(ValueError, match=message):
    settings.SpeculativeSettings(**fields)


def test_overridden_takes_only_the_settings_fields():
  spec = settings.SpeculativeSettings(gamma=3)
  assert spec.overridden({'gamma': 5, 'temperature': 0.7}) == settings.SpeculativeSettings(gamma=5)
  with pytest.raises(ValueError, match='draft_threshold'):
    spec.overridden({'draft_threshold': 1.5})
