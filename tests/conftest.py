"""Settings for the whole test suite.

Compilation dominates the suite on a CPU: hundreds of small programs, each run
a few times. Unoptimized XLA:CPU code compiles about twice as fast; the
numerics the tests check do not depend on LLVM's optimization (greedy
equality compares two programs compiled alike; the statistical tests compare
with exact probabilities). Subprocesses started by tests inherit the flags.
"""

import os

os.environ['XLA_FLAGS'] = ' '.join(
  [
    os.environ.get('XLA_FLAGS', ''),
    '--xla_backend_optimization_level=0',
    '--xla_llvm_disable_expensive_passes=true',
  ]
).strip()


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
