"""The import graph: no cycles, and layers that import only downward.

Edges are the `from speculative_t5x... import ...` statements of every module
of the library (`speculative_t5x`) and the lab (`speculative_t5x_lab`), at any
depth (a function-level import is still a dependency). A main that imports
itself under its module name (so that gin registers its configurables there)
is not a cycle.

The layers, bottom to top (`LAYERS`): each module may import its own layer
and those below it. So the network and the kernels never load the decode path;
the exact path (sampling, verification, trees, drafts, the feature head, the
loop, settings, layouts) loads no training, data, integration or lab module;
and no library module imports the lab.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('speculative_t5x', 'speculative_t5x_lab')

# Bottom to top: (layer, module name prefixes). A module belongs to the layer of
# the longest prefix that names it (a prefix names itself and its submodules).
LAYERS = (
  ('leaf', ('speculative_t5x.checks',)),
  ('kernels', ('speculative_t5x.kernels',)),
  ('network', ('speculative_t5x.network',)),
  (
    'exact path',
    tuple(
      f'speculative_t5x.{name}'
      for name in (
        'sampling',
        'speculative_sampling',
        'tree',
        'judging',
        'drafts',
        'parallel_draft',
        'feature_head',
        'decoding',
        'settings',
        'profiles',
        'layouts',
      )
    ),
  ),
  # Below the models: `models.load_model` reads any checkpoint.
  ('checkpoints', ('speculative_t5x.checkpoints',)),
  (
    'models',
    ('speculative_t5x.models', 'speculative_t5x.acceptance', 'speculative_t5x.run_settings'),
  ),
  ('data', ('speculative_t5x.data',)),
  (
    'mains',
    tuple(
      f'speculative_t5x.{name}'
      for name in (
        'infer',
        'output_lock',
        'training',
        'gin_utils',
        'partitioning',
        't5x_models',
        't5x_adapter',
        't5x_stubs',
      )
    ),
  ),
  ('lab', ('speculative_t5x_lab',)),
)


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _is_module(name: str) -> bool:
  path = ROOT.joinpath(*name.split('.'))
  return path.with_suffix('.py').is_file() or (path / '__init__.py').is_file()


def import_graph() -> dict:
  """{module: {modules it imports}} over the library's and the lab's own modules."""
  graph = {}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob('*.py')):
      name = _module_name(path)
      edges = graph.setdefault(name, set())
      for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(PACKAGES):
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


def layer_of(module: str) -> int:
  """The index in `LAYERS` of the module's layer; KeyError for a module of no layer."""
  best = None
  for index, (_, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if module == prefix or module.startswith(prefix + '.'):
        if best is None or len(prefix) > best[1]:
          best = (index, len(prefix))
  if best is None:
    raise KeyError(f'{module} belongs to no layer: add it to LAYERS in {__file__}.')
  return best[0]


def upward_imports(graph: dict) -> list:
  """['a (layer) imports b (higher layer)', ...] for every edge that points up."""
  found = []
  for module, imports in sorted(graph.items()):
    if module in PACKAGES:  # The packages' own __init__ files re-export nothing upward.
      continue
    for other in sorted(imports):
      if other in PACKAGES:
        continue
      if layer_of(other) > layer_of(module):
        found.append(
          f'{module} ({LAYERS[layer_of(module)][0]}) imports {other} ({LAYERS[layer_of(other)][0]})'
        )
  return found


def test_find_cycle_finds_a_cycle_and_accepts_a_tree():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert find_cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) is None


def test_the_packages_have_no_import_cycles():
  graph = import_graph()
  # Modules of subpackages are nodes too (the network's concern modules among them).
  for module in ('decoding', 'network', 'network.stacks', 'network.cache'):
    assert f'speculative_t5x.{module}' in graph
  assert 'speculative_t5x_lab.benchmark' in graph
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))


def test_every_module_has_a_layer():
  for module in import_graph():
    if module not in PACKAGES:
      layer_of(module)


def test_layers_import_only_downward():
  assert upward_imports(import_graph()) == []


@pytest.mark.parametrize(
  'module, imported',
  [
    ('speculative_t5x.network.config', 'speculative_t5x.settings'),  # network -> exact path
    ('speculative_t5x.decoding', 'speculative_t5x.training.train'),  # exact path -> mains
    ('speculative_t5x.tree', 'speculative_t5x.data.tasks'),  # exact path -> data
    ('speculative_t5x.models', 'speculative_t5x_lab.emulation'),  # library -> lab
    ('speculative_t5x.kernels.cpu_matmul', 'speculative_t5x.network'),  # kernels -> network
  ],
)
def test_a_wrong_import_is_caught(module, imported):
  graph = import_graph()
  graph[module] = graph[module] | {imported}
  assert any(line.startswith(f'{module} ') for line in upward_imports(graph))
