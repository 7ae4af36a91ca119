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
