"""Settings for the whole test suite.

Compilation dominates the suite on a CPU: hundreds of small programs, each run
a few times. Two XLA:CPU settings cut it: unoptimized code (about twice as
fast to compile), and XLA's older loop emitters in place of its MLIR fusion
emitters (the suite's compile time, and `make test`, about 40 % shorter). The
numerics the tests check do not depend on either: greedy equality compares
two programs compiled alike, and the statistical tests compare with exact
probabilities. Subprocesses started by tests inherit the flags.
"""

import os
import subprocess
import sys

# XLA aborts on a flag it does not know, and a later XLA drops the older
# emitters: that flag is asked for only where a probe accepts it. The probe
# runs once, in the process that starts pytest; xdist's workers inherit the
# result with the environment.
_OLDER_EMITTERS = '--xla_cpu_use_fusion_emitters=false'
_PROBED = 'SPECULATIVE_T5X_TEST_XLA_FLAGS'


def _xla_accepts(flag):
  """Whether this jaxlib's CPU backend starts with `flag` in XLA_FLAGS."""
  probe = subprocess.run(
    [sys.executable, '-c', 'import jax; jax.devices()'],
    env={**os.environ, 'XLA_FLAGS': flag},
    capture_output=True,
    check=False,
  )
  return probe.returncode == 0


if _PROBED not in os.environ:
  flags = ['--xla_backend_optimization_level=0', '--xla_llvm_disable_expensive_passes=true']
  if _xla_accepts(_OLDER_EMITTERS):
    flags.append(_OLDER_EMITTERS)
  os.environ[_PROBED] = ' '.join(flags)
  os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), *flags]).strip()


import jax  # noqa: E402  (after XLA_FLAGS: JAX reads them when its backend starts)
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """Drops each test module's compiled programs when the module is done.

  Every XLA:CPU executable keeps its own memory mappings, and one process
  running the whole suite compiles thousands of programs: it passed the
  kernel's limit of 65,530 mappings per process (vm.max_map_count), where
  the next compilation dies with a segmentation fault.
  """
  yield
  jax.clear_caches()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Under `make test-t5x` (testing_utils.T5X_REQUIRED), a t5x-marked test that skips fails."""
  from testing_utils import t5x_required, T5X_REQUIRED  # pylint: disable=g-import-not-at-top

  outcome = yield
  report = outcome.get_result()
  if (
    report.skipped
    and not hasattr(report, 'wasxfail')
    and item.get_closest_marker('t5x')
    and t5x_required()
  ):
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = 'failed'
    report.longrepr = f'{T5X_REQUIRED}=1 (make test-t5x): a t5x test may not skip: {reason}'
