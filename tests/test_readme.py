"""README.md as a newcomer reads it, and the commands of the documentation.

The README starts with `make demo` and `make test`, which must be targets of
the Makefile, and its "In Python" section holds one complete example (a
fenced `python` block) that runs as written: executed here, its own asserts
(greedy speculative decoding equals the baseline token for token) are the
checks. Every `python -m speculative_t5x...` command of README.md and docs/
names a module that exists, and its gin files and bindings parse (they are
not run); every relative link names a file of the repository. The T5X commands of docs/t5x.md run in tests/test_t5x_commands.py.
"""

import glob
import importlib
import os
import re
import shlex

import gin
import pytest

from speculative_t5x import gin_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = [
  'README.md',
  *sorted(
    os.path.relpath(path, REPO_ROOT) for path in glob.glob(os.path.join(REPO_ROOT, 'docs', '*.md'))
  ),
]


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


def documented_commands():
  """(document, argv) of each `python -m speculative_t5x...` command in a fenced block."""
  commands = []
  for path in DOCUMENTS:
    for block in re.findall(r'^```[^\n]*\n(.*?)^```', read(path), flags=re.M | re.S):
      for line in block.replace('\\\n', ' ').splitlines():
        if line.startswith('python -m speculative_t5x'):
          commands.append((path, shlex.split(line)))
  return commands


COMMANDS = documented_commands()


def test_the_documentation_has_commands_for_every_main():
  modules = {argv[2] for _, argv in COMMANDS}
  assert modules >= {
    'speculative_t5x.infer',
    'speculative_t5x.training.train',
    'speculative_t5x.training.distill',
    'speculative_t5x_lab.benchmark',
    'speculative_t5x_lab.tree_benchmark',
  }


@pytest.mark.parametrize(
  'document, argv', COMMANDS, ids=[f'{doc}:{argv[2]}:{i}' for i, (doc, argv) in enumerate(COMMANDS)]
)
def test_documented_command_parses(document, argv):
  module = importlib.import_module(argv[2])
  assert hasattr(module, 'main'), f'{document}: {argv[2]} has no main'
  args = gin_utils.rewrite_gin_args(argv[3:])
  files = [arg.split('=', 1)[1] for arg in args if arg.startswith('--gin_file=')]
  bindings = [arg.split('=', 1)[1] for arg in args if arg.startswith('--gin_bindings=')]
  assert len(files) + len(bindings) == len(args), f'{document}: flags other than gin: {args}'
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags([], files, bindings)
  finally:
    gin.clear_config()


@pytest.mark.parametrize('document', DOCUMENTS)
def test_relative_links_name_files_of_the_repository(document):
  """Each relative Markdown link of the README and docs/ names a file in the repository."""
  directory = os.path.dirname(os.path.join(REPO_ROOT, document))
  for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', read(document)):
    if '://' in target:
      continue
    path = os.path.normpath(os.path.join(directory, target))
    assert path.startswith(REPO_ROOT + os.sep), f'{document}: {target} is outside the repository'
    assert os.path.exists(path), f'{document}: {target} does not exist'
