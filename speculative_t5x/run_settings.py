"""The settings a run records beside its outputs, and the check that a continued run uses them.

`train`, `distill`, `train_feature_head` and `infer` write their settings as JSON when a run starts
in a directory and continue a directory's run only with the same settings:
a resumed training run must see the batches and the loss an uninterrupted
one sees, and continued inference must append outputs decoded the same way.
`differences` compares two settings trees (nested dicts by dotted names, so a
network's field reads 'config.emb_dim'); `describe` names each difference with
both values, for the error that refuses the run.
"""

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import jax.numpy as jnp

from speculative_t5x import network


# The files a run writes beside its outputs, named once here: `train` and
# `distill` write them, `models.load_trained` and the demo read them (the demo
# without importing train or distill, which load TensorFlow and seqio).
TRAIN_SETTINGS_FILE = 'train_settings.json'
DISTILL_SETTINGS_FILE = 'distill_settings.json'
FEATURE_HEAD_SETTINGS_FILE = (
  'feature_head_settings.json'  # train_feature_head's (the head's config)
)
# parallel_distill's (the parallel draft's network and config, and the run's settings).
PARALLEL_DRAFT_SETTINGS_FILE = 'parallel_draft_settings.json'
METRICS_FILE = 'metrics.jsonl'  # One JSON record per logged step, train's and distill's.


class _Missing:
  def __repr__(self) -> str:
    return '(not recorded)'


_MISSING = _Missing()  # A setting only one side has.


def jsonable_config(config: network.NetworkConfig) -> Dict[str, Any]:
  """A network config's fields as JSON values (the dtype by name, activations as a list)."""
  return dict(
    dataclasses.asdict(config),
    dtype=jnp.dtype(config.dtype).name,
    mlp_activations=list(config.mlp_activations),
  )


def as_json(settings: Mapping[str, Any]) -> Dict[str, Any]:
  """`settings` as they read back from JSON (tuples become lists, keys strings)."""
  return json.loads(json.dumps(settings))


def write(path: str, settings: Mapping[str, Any]) -> None:
  """Writes `settings` to `path` as indented JSON, creating its directory."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(settings, f, indent=1)


def read(path: str) -> Optional[Dict[str, Any]]:
  """The settings recorded at `path`, or None if there is no such file."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> Dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping) and value:
      flat.update(_flatten(value, name + '.'))
    else:
      flat[name] = value
  return flat


def differences(recorded: Mapping[str, Any], settings: Mapping[str, Any]) -> Dict[str, Tuple]:
  """{dotted name: (recorded value, this run's value)} of every setting that differs.

  `settings` is compared as it would read back from JSON (`as_json`); a
  setting only one side has differs, its missing value shown as
  (not recorded). Sorted by name.
  """
  old, new = _flatten(recorded), _flatten(as_json(settings))
  return {
    name: (old.get(name, _MISSING), new.get(name, _MISSING))
    for name in sorted(old.keys() | new.keys())
    if old.get(name, _MISSING) != new.get(name, _MISSING)
  }


def describe(differing: Mapping[str, Tuple]) -> str:
  """ "name=recorded (this run: value)" for each difference, joined by '; '."""
  return '; '.join(f'{name}={old!r} (this run: {new!r})' for name, (old, new) in differing.items())


def check_resumed(model_dir: str, settings_file: str, settings: Mapping[str, Any]) -> None:
  """ValueError naming each setting (and both values) of a resumed run that differs.

  A directory without `settings_file` (written by an earlier version) is not
  checked.
  """
  path = os.path.join(model_dir, settings_file)
  recorded = read(path)
  if recorded is None:
    return
  differing = differences(recorded, settings)
  if differing:
    raise ValueError(
      f'{model_dir} holds a run with other settings ({path}): {describe(differing)}. A resumed '
      'run must continue as it started: pass the recorded values, or start in a new model_dir.'
    )
