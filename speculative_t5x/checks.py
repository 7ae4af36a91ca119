"""Small checks of arguments that every layer may use: the leaf of the package.

It imports nothing of the package, so the network and the kernels (the lowest
layers) can check their arguments without loading the decode path.
"""

import numpy as np


def check_positive_int(name: str, value) -> int:
  """Returns `value` as an int; ValueError unless it is an integer >= 1 (bools are not).

  The one check of gamma, lengths and counts at every API edge, so that
  `gamma=True` or `max_decode_len=2.5` is an error, never 1 or 2.
  """
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(
      f'{name} must be an integer >= 1; got {value!r} '
      f'({type(value).__name__}). Pass a whole number, e.g. {name}=4.'
    )
  return int(value)
