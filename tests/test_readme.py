"""README.md as a newcomer reads it: its two commands first, and its Python example runs.

The README starts with `make demo` and `make test`, which must be targets of
the Makefile, and its "In Python" section holds one complete example (a
fenced `python` block) that runs as written: executed here, its own asserts
(greedy speculative decoding equals the baseline token for token) are the
checks. The T5X commands, which moved to docs/t5x.md, run in
tests/test_t5x_commands.py.
"""

import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
  with open(os.path.join(REPO_ROOT, path), encoding='utf-8') as f:
    return f.read()


def python_example():
  """The one fenced `python` block of README.md's "In Python" section."""
  section = read('README.md').split('\n## In Python\n', 1)[1].split('\n## ', 1)[0]
  blocks = re.findall(r'^```python\n(.*?)^```', section, flags=re.M | re.S)
  assert len(blocks) == 1, f'README "In Python" should hold one python block, found {len(blocks)}'
  return blocks[0]


def test_readme_starts_with_the_two_commands():
  first_lines = read('README.md').splitlines()[:2]
  commands = [line.split('#', 1)[0].strip() for line in first_lines]
  assert commands == ['make demo', 'make test'], first_lines
  makefile = read('Makefile')
  for target in ('demo', 'test'):
    assert re.search(rf'^{target}:', makefile, flags=re.M), f'Makefile has no {target} target'


def test_readme_python_example_runs_as_written(capsys):
  code = python_example()
  exec(compile(code, 'README.md (In Python)', 'exec'), {'__name__': '__readme__'})
  printed = capsys.readouterr().out
  # The example prints the target calls of the model draft and of the bigram draft.
  calls = re.search(r'target calls: (\d+) and (\d+)', printed)
  assert calls, printed
  assert 1 <= int(calls.group(2)) <= int(calls.group(1)) <= 16
