"""Import stub: T5X's optimizers.py refers to `state_partition_rule` only for Amos states."""


def state_partition_rule(*args, **kwargs):
  raise NotImplementedError('jestimator stub: the Amos optimizer is not available')
