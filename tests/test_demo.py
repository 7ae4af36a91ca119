"""speculative_t5x.demo as a library: importing it leaves the command line to the importer
(absl's own flags, which `absl.app` defines, aside)."""

from testing_utils import python_output


def test_importing_the_demo_defines_no_flags():
  assert (
    python_output(
      'from absl import app, flags, logging; before = set(flags.FLAGS); '
      'from speculative_t5x import demo; print(sorted(set(flags.FLAGS) - before))'
    )
    == '[]'
  )
