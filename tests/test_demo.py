"""speculative_t5x.demo as a library: importing it leaves the command line to the importer
(absl's own flags, which `absl.app` defines, aside); a stale workdir gets a clear error."""

import pytest

from testing_utils import python_output


def test_importing_the_demo_defines_no_flags():
  assert (
    python_output(
      'from absl import app, flags, logging; before = set(flags.FLAGS); '
      'from speculative_t5x import demo; print(sorted(set(flags.FLAGS) - before))'
    )
    == '[]'
  )


def test_a_workdir_of_another_configuration_names_the_way_out(tmp_path):
  from speculative_t5x import checkpoints
  from speculative_t5x import demo
  from speculative_t5x import network

  small = network.t5_1_1_config('tiny', vocab_size=64, emb_dim=32, num_heads=2, head_dim=16)
  checkpoints.save_params(tmp_path / 'model', network.random_params(small)[0], step=400)
  other = network.t5_1_1_config('tiny', vocab_size=64)
  with pytest.raises(ValueError, match='trained with another configuration.*new --workdir'):
    demo._restore_cached(str(tmp_path / 'model'), 400, other)
