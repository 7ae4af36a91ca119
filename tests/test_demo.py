"""speculative_t5x.demo as a library: importing it leaves the command line to the importer
(absl's own flags, which `absl.app` defines, aside)."""

import subprocess
import sys


def test_importing_the_demo_defines_no_flags():
  defined = subprocess.run(
      [sys.executable, '-c', 'from absl import app, flags, logging; before = set(flags.FLAGS); '
       'from speculative_t5x import demo; print(sorted(set(flags.FLAGS) - before))'],
      capture_output=True, text=True, check=True).stdout
  assert defined.strip() == '[]'
