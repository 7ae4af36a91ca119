"""The package's import graph has no cycles (`python -m pytest tests/test_import_graph.py`).

Edges are the `from speculative_t5x... import ...` statements of every module,
at any depth (a function-level import is still a dependency). A main that
imports itself under its module name (so that gin registers its configurables
there) is not a cycle.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'speculative_t5x'


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _is_module(name: str) -> bool:
  path = PACKAGE.parent.joinpath(*name.split('.'))
  return path.with_suffix('.py').is_file() or (path / '__init__.py').is_file()


def import_graph() -> dict:
  """{module: {modules it imports}} over the package's own modules."""
  graph = {}
  for path in sorted(PACKAGE.rglob('*.py')):
    name = _module_name(path)
    edges = graph.setdefault(name, set())
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
      if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('speculative_t5x'):
        for alias in node.names:
          imported = f'{node.module}.{alias.name}'
          edges.add(imported if _is_module(imported) else node.module)
    edges.discard(name)
  return graph


def find_cycle(graph: dict):
  """One cycle as a list of modules (first == last), or None."""
  done, on_stack = set(), []

  def visit(module):
    on_stack.append(module)
    for other in sorted(graph.get(module, ())):
      if other in on_stack:
        return on_stack[on_stack.index(other) :] + [other]
      if other not in done:
        cycle = visit(other)
        if cycle:
          return cycle
    done.add(on_stack.pop())
    return None

  for module in sorted(graph):
    if module not in done:
      cycle = visit(module)
      if cycle:
        return cycle
  return None


def test_find_cycle_finds_a_cycle_and_accepts_a_tree():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert find_cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) is None


def test_the_package_has_no_import_cycles():
  graph = import_graph()
  # Modules of subpackages are nodes too (the network's concern modules among them).
  for module in ('decoding', 'bench.benchmark', 'network', 'network.stacks', 'network.cache'):
    assert f'speculative_t5x.{module}' in graph
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))
