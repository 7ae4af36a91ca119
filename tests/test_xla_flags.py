"""The mains' XLA flags: set before JAX starts, never over the user's own."""

from speculative_t5x import xla_flags
from testing_utils import python_output


def test_sets_the_flag_in_a_fresh_process():
  printed = python_output(
      'import os; os.environ.pop("XLA_FLAGS", None)\n'
      'from speculative_t5x import xla_flags\n'
      'added = xla_flags.set_decode_flags()\n'
      'import jax; jax.numpy.zeros(1).block_until_ready()\n'
      'print(added == list(xla_flags.DECODE_FLAGS), os.environ["XLA_FLAGS"])')
  assert printed == 'True ' + ' '.join(xla_flags.DECODE_FLAGS)


def test_keeps_the_users_own_value_of_the_flag():
  printed = python_output(
      'import os; os.environ["XLA_FLAGS"] = "--xla_cpu_experimental_ynn_fusion_type= --foo=1"\n'
      'from speculative_t5x import xla_flags\n'
      'print(xla_flags.set_decode_flags(), os.environ["XLA_FLAGS"])')
  assert printed == '[] --xla_cpu_experimental_ynn_fusion_type= --foo=1'


def test_does_nothing_once_a_backend_has_started():
  printed = python_output(
      'import os; os.environ.pop("XLA_FLAGS", None)\n'
      'import jax; jax.numpy.zeros(1).block_until_ready()\n'
      'from speculative_t5x import xla_flags\n'
      'print(xla_flags.set_decode_flags(), "XLA_FLAGS" in os.environ)')
  assert printed == '[] False'
