"""The settings of one speculative decode, checked once: `SpeculativeSettings`.

Every layer that decodes speculatively (`models.generate`/`make_decoder`,
`infer.infer`, the T5X models, the benchmark) builds one of these from its own
arguments (gin binds them at the edges) or takes one; the decode functions
(`decoding.speculative_sample`) keep T5X's keyword convention and build it
from their keywords. The defaults live here and only here.

    settings = SpeculativeSettings(gamma=5, verification='block')
    models.generate(target, draft, inputs, settings=settings)
    models.generate(target, draft, inputs, gamma=5, verification='block')  # the same
    models.generate(target, draft, inputs, tree=(3, 2, 1, 1))  # a token tree per call
"""

import dataclasses
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np

from speculative_t5x import checks
from speculative_t5x import profiles
from speculative_t5x import speculative_sampling
from speculative_t5x import tree as tree_lib

AUTO = 'auto'  # gamma chosen per batch size from a speculation profile.
DEFAULT_GAMMA = 4  # A chain's gamma when none is given.


def check_draft_threshold(value) -> float:
  """Returns `value` as a float; ValueError unless it is a number in [0, 1).

  The adaptive draft length's threshold (see `decoding.speculative_sample`):
  0 turns it off, and a threshold of 1 or more would stop after every token
  (use gamma=1 for that).
  """
  if (
    isinstance(value, (bool, np.bool_))
    or not isinstance(value, (int, float, np.integer, np.floating))
    or not 0.0 <= float(value) < 1.0
  ):
    raise ValueError(
      f'draft_threshold must be a number in [0, 1); got {value!r}. It is the draft '
      'probability below which a row stops drafting (0: off, always gamma tokens; '
      "Hugging Face's assistant_confidence_threshold defaults to 0.4)."
    )
  return float(value)


@dataclasses.dataclass(frozen=True)
class SpeculativeSettings:
  """How a speculative decode drafts and judges; validated at construction.

  Frozen and hashable: it is a static argument of the compiled decode call,
  so one program is compiled per distinct settings (and shapes).

  Attributes:
    gamma: draft tokens per iteration, >= 1 (static: it sizes the target's
      block and both caches); or 'auto': per batch, the gamma that `profile`
      gives for its size, 0 meaning the baseline (see `profiles`). None (the
      default): 4, or with a tree its depth (the most tokens a call accepts).
    lenience: in (0, 1]; 1 is exact speculative sampling, below 1 trades
      exactness for acceptance (Appendix A.5 of Leviathan et al.; see
      `speculative_sampling.verify`).
    verification: 'token' (the paper's Algorithm 1) or 'block' (Sun et al.'s
      block verification: the same output distribution, never fewer tokens
      per target call in expectation; lenience 1 only).
    draft_threshold: an adaptive draft length, in [0, 1): a row stops
      drafting after a token its draft gave probability below this, so gamma
      is then the most it drafts (Hugging Face's
      `assistant_confidence_threshold`); 0 is off. Model and n-gram drafts.
    profile: with gamma='auto', the path of a speculation profile (JSON,
      written by the benchmark's profile sweep); read and checked here.
    tree: None (a chain of gamma tokens per call), or a static token tree
      (`tree.Tree`, or what `tree.Tree.parse` takes: branching per depth such
      as (3, 2, 1, 1), or parents): the draft proposes every node, the target
      scores them in one call and recursive rejection sampling without
      replacement judges them, still exactly (`decoding.speculative_sample`).
      Token verification at lenience 1 with a fixed length only.
  """

  gamma: Union[int, str, None] = None
  lenience: float = 1.0
  verification: str = 'token'
  draft_threshold: float = 0.0
  profile: Optional[str] = None
  tree: Optional[tree_lib.Tree] = None

  def __post_init__(self):
    if self.tree is not None:
      object.__setattr__(self, 'tree', tree_lib.Tree.parse(self.tree))
    normalized = dict(
      gamma=self._checked_gamma(),
      lenience=speculative_sampling.check_lenience(self.lenience),
      draft_threshold=check_draft_threshold(self.draft_threshold),
    )
    normalized['verification'] = speculative_sampling.check_verification(
      self.verification, normalized['lenience']
    )
    for name, value in normalized.items():
      object.__setattr__(self, name, value)
    if self.tree is not None:
      self._check_tree_fits()

  def _check_tree_fits(self):
    """ValueError unless the other settings are ones a tree is judged with."""
    conflicts = {
      'lenience': (self.lenience, 1.0),
      'verification': (self.verification, 'token'),
      'draft_threshold': (self.draft_threshold, 0.0),
    }
    for name, (value, needed) in conflicts.items():
      if value != needed:
        raise ValueError(
          f'A token tree ({self.tree}) is judged by exact recursive rejection sampling with '
          f'every node drafted: it needs {name}={needed!r}, got {name}={value!r}. Drop '
          f'{name}, or decode a chain (tree=None).'
        )

  def _checked_gamma(self):
    if self.tree is not None:
      if self.gamma not in (None, self.tree.max_depth):
        raise ValueError(
          f'With a tree, gamma is its depth ({self.tree.max_depth} for {self.tree}); got '
          f'gamma={self.gamma!r}. Leave gamma unset (None), or pass gamma='
          f'{self.tree.max_depth}.'
        )
      return self.tree.max_depth
    if self.gamma is None:
      return DEFAULT_GAMMA
    if self.gamma != AUTO:
      if self.profile is not None:
        raise ValueError(
          f'A speculation profile ({self.profile!r}) is for gamma={AUTO!r}; with a fixed '
          f'gamma={self.gamma!r} it would be unused. Pass one or the other.'
        )
      return checks.check_positive_int('gamma', self.gamma)
    if self.profile is None:
      raise ValueError(
        f"gamma='auto' chooses gamma per batch size from a speculation profile, and none was "
        f'given: pass profile=<its JSON path> (gin: SPECULATION_PROFILE). '
        f'{profiles.HOW_TO_MAKE_ONE}'
      )
    profiles.load_profile(self.profile)  # Fails here, not at the first batch.
    return AUTO

  def for_batch(
    self, batch_size: int, temperature: float, topk: int, topp: float
  ) -> Optional['SpeculativeSettings']:
    """The settings a batch of `batch_size` rows decodes with; None: the baseline.

    A fixed gamma is itself; 'auto' takes the profile's gamma for the size
    (after checking that the profile was measured in this sampling mode).
    """
    if self.gamma != AUTO:
      return self
    profile = profiles.load_profile(self.profile)
    profile.check_mode(temperature, topk, topp)
    gamma = profile.gamma_for(batch_size)
    return self.replace(gamma=gamma, profile=None) if gamma else None

  def decode_kwargs(self) -> Dict[str, Any]:
    """The keyword arguments of `decoding.speculative_sample` (a fixed gamma only)."""
    if self.gamma == AUTO:
      raise ValueError("gamma='auto' is resolved per batch first (`for_batch`).")
    return dict(
      gamma=self.gamma,
      lenience=self.lenience,
      verification=self.verification,
      draft_threshold=self.draft_threshold,
      tree=self.tree,
    )

  @classmethod
  def field_names(cls):
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def of(cls, settings: Optional['SpeculativeSettings'] = None, **fields: Any):
    """`settings`, or new settings from keyword fields (not both); unknown names are errors.

    The shorthand `generate(..., gamma=5)` for `generate(...,
    settings=SpeculativeSettings(gamma=5))`.
    """
    unknown = sorted(set(fields) - set(cls.field_names()))
    if unknown:
      raise TypeError(
        f'Unknown speculative setting(s) {unknown}; the settings are {list(cls.field_names())} '
        '(sampling is set by temperature, topk and topp).'
      )
    if settings is None:
      return cls(**fields)
    if not isinstance(settings, cls):
      raise TypeError(
        f'settings must be a SpeculativeSettings; got {type(settings).__name__}: {settings!r}.'
      )
    if fields:
      raise ValueError(
        f'Pass speculative settings either as settings= or as keywords, not both; got '
        f'settings={settings} and {fields}. Use settings.replace(...) to change some.'
      )
    return settings

  def replace(self, **changes: Any) -> 'SpeculativeSettings':
    """A copy with `changes`, validated again."""
    return dataclasses.replace(self, **changes)

  def overridden(self, overrides: Mapping[str, Any]) -> 'SpeculativeSettings':
    """A copy with the settings among `overrides` (e.g. T5X's decoder_params) applied."""
    return self.replace(**{k: v for k, v in overrides.items() if k in self.field_names()})

  def as_dict(self) -> Dict[str, Any]:
    """The fields, for a record (JSON-ready: the tree as {"parents": [...]}, which `tree.Tree.parse` reads back)."""
    fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
    fields['tree'] = None if self.tree is None else {'parents': list(self.tree.parents)}
    return fields


# The defaults, for the keyword arguments of the decode functions and the
# gin-configured edges (infer, the benchmark, the T5X models).
DEFAULTS = SpeculativeSettings()
