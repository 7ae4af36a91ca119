"""The mains' XLA flags: by the target's size, set before JAX starts, never over the user's."""

import pytest

from speculative_t5x import network
from speculative_t5x_lab import xla_flags
from testing_utils import python_output

SET_FLAGS = (
  'from speculative_t5x_lab import xla_flags\nadded = xla_flags.set_decode_flags({bytes})\n'
)


def test_a_memory_bound_target_gets_the_flag_in_a_fresh_process():
  big = 3 * xla_flags.MEMORY_BOUND_FACTOR * xla_flags.last_level_cache_bytes()
  printed = python_output(
    'import os; os.environ.pop("XLA_FLAGS", None)\n'
    + SET_FLAGS.format(bytes=big)
    + 'import jax; jax.numpy.zeros(1).block_until_ready()\n'
    'print(added == list(xla_flags.MEMORY_BOUND_FLAGS), os.environ["XLA_FLAGS"])'
  )
  assert printed == 'True ' + ' '.join(xla_flags.MEMORY_BOUND_FLAGS)


def test_a_cache_resident_target_gets_none():
  printed = python_output(
    'import os; os.environ.pop("XLA_FLAGS", None)\n'
    + SET_FLAGS.format(bytes=2**20)
    + 'print(added, "XLA_FLAGS" in os.environ)'
  )
  assert printed == '[] False'


def test_keeps_the_users_own_value_of_the_flag():
  printed = python_output(
    'import os; os.environ["XLA_FLAGS"] = "--xla_cpu_experimental_ynn_fusion_type= --foo=1"\n'
    + SET_FLAGS.format(bytes=2**40)
    + 'print(added, os.environ["XLA_FLAGS"])'
  )
  assert printed == '[] --xla_cpu_experimental_ynn_fusion_type= --foo=1'


def test_does_nothing_once_a_backend_has_started():
  printed = python_output(
    'import os; os.environ.pop("XLA_FLAGS", None)\n'
    'import jax; jax.numpy.zeros(1).block_until_ready()\n'
    + SET_FLAGS.format(bytes=2**40)
    + 'print(added, "XLA_FLAGS" in os.environ)'
  )
  assert printed == '[] False'


@pytest.mark.parametrize('size', ['tiny', 'small', 'base'])
def test_decoder_weight_bytes_counts_the_decoder_and_the_logits(size):
  config = network.t5_1_1_config(size)
  shapes, _ = network.abstract_params(config)
  assert network.decoder_weight_bytes(config) == 4 * network.parameter_count(shapes['decoder'])
