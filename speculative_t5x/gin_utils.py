"""T5X-style command lines for the gin-configured mains (train, infer, benchmark).

Every main takes T5X's flags:

  --gin_file=PATH            gin files, parsed in order (repeatable)
  --gin.NAME=VALUE           the binding `NAME = VALUE`, applied after the files
                             (repeatable; `--gin_bindings='NAME = VALUE'` is the
                             same in gin's own spelling)
  --gin_search_paths=DIR     where relative gin files and `include`s are looked
                             up after the working directory (repeatable)

In a source checkout the repository root is searched last, so
`--gin_file=configs/runs/infer.gin` and the `include 'configs/...'` lines of
the gin files work from any directory.

A main is `def main(argv): ...` run by `gin_utils.run(main)`; by the time it is
called the gin files and bindings are parsed. Library code calls a configured
function on its own gin files with `call_configured` (e.g. `model_config`, the
network of a configs/models file).
"""

import contextlib
import os
import signal
import sys
from typing import Any, Callable, Iterator, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import gin

from speculative_t5x import network
from speculative_t5x import output_lock

# The checkout holding this package, if it carries the gin files (a source
# checkout or an editable install).
_REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
  """Rewrites T5X's `--gin.NAME=VALUE` flags to `--gin_bindings=NAME = VALUE`.

  Other arguments pass through unchanged.
  """
  rewritten = []
  for arg in argv:
    if arg.startswith('--gin.'):
      name, separator, value = arg[len('--gin.') :].partition('=')
      if not separator or not name:
        raise ValueError(f'A gin flag must look like --gin.NAME=VALUE, got {arg!r}.')
      arg = f'--gin_bindings={name} = {value}'
    rewritten.append(arg)
  return rewritten


def default_search_paths() -> List[str]:
  """The repository root if it holds configs/ (gin searches the working directory first)."""
  return [_REPOSITORY_ROOT] if os.path.isdir(os.path.join(_REPOSITORY_ROOT, 'configs')) else []


def parse_gin_flags(
  gin_search_paths: Sequence[str], gin_files: Sequence[str], gin_bindings: Sequence[str]
) -> None:
  """Parses gin files, then bindings, resolving relative paths on the search paths.

  Args:
    gin_search_paths: directories searched in order for relative gin files and
      includes, after the working directory and before `default_search_paths()`.
    gin_files: gin files, parsed in order.
    gin_bindings: `NAME = VALUE` bindings, applied after the files.
  """
  for path in [*gin_search_paths, *default_search_paths()]:
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings))


def _find_gin_file(path: str) -> str:
  """Where gin reads `path` from: as given, else on `default_search_paths()`."""
  if os.path.isabs(path) or os.path.exists(path):
    return path
  for root in default_search_paths():
    if os.path.exists(os.path.join(root, path)):
      return os.path.join(root, path)
  raise FileNotFoundError(
    f'No gin file {path!r} in the working directory or on {default_search_paths()}.'
  )


def file_bindings(gin_files: Sequence[str]) -> List[str]:
  """The bindings of gin files and the files they include, in parse order, one line each.

  Read by gin's parser alone (nothing is imported or configured), so comments,
  layout and block syntax do not show: two lists are equal when the files bind
  the same values. A line is 'scope/selector.argument = value' (the parts a
  binding has).
  """
  lines = []
  for path in gin_files:
    with open(_find_gin_file(path)) as f:
      parser = gin.config_parser.ConfigParser(f, gin.config.ParserDelegate(skip_unknown=True))
      for statement in parser:
        if isinstance(statement, gin.config_parser.IncludeStatement):
          lines.extend(file_bindings([statement.filename]))
        elif isinstance(statement, gin.config_parser.BindingStatement):
          scope = f'{statement.scope}/' if statement.scope else ''
          argument = f'.{statement.arg_name}' if statement.arg_name else ''
          lines.append(f'{scope}{statement.selector}{argument} = {_value_text(statement.value)}')
  return lines


def _value_text(value: Any) -> str:
  """A parsed binding's value as text that does not depend on what this process registered.

  gin parses `@name()` as a reference whose repr changes once `name` is
  registered (a scope appears); here it is always `@name()` (or `@name`).
  Macros and constants (`%NAME`) keep gin's spelling.
  """
  if isinstance(value, (list, tuple)):
    items = ', '.join(_value_text(item) for item in value)
    return f'[{items}]' if isinstance(value, list) else f'({items}{"," if len(value) == 1 else ""})'
  if isinstance(value, dict):
    return '{' + ', '.join(f'{key!r}: {_value_text(item)}' for key, item in value.items()) + '}'
  if hasattr(value, 'selector') and hasattr(value, 'evaluate'):  # A configurable reference.
    if value.selector in ('gin.macro', 'gin.constant'):
      return repr(value)
    return f'@{value.selector}{"()" if value.evaluate else ""}'
  return repr(value)


def call_configured(
  fn: Callable[..., Any], gin_files: Sequence[str], gin_bindings: Sequence[str] = ()
) -> Any:
  """`fn()` with the arguments that the gin files and bindings bind, in a fresh configuration.

  gin's configuration is global: it is cleared before the files are parsed
  and again after the call, so a configuration parsed earlier is lost.

  Args:
    fn: a function or class the gin files configure (e.g. `train.train`).
    gin_files: gin files, parsed in order (relative ones as `parse_gin_flags`
      finds them).
    gin_bindings: `NAME = VALUE` bindings, applied after the files.

  Returns:
    What `fn` returns.
  """
  gin.clear_config()
  try:
    parse_gin_flags([], gin_files, gin_bindings)
    return gin.get_configurable(fn)()
  finally:
    gin.clear_config()


def model_config(name: str, vocab_size: int) -> network.T5Config:
  """The network of configs/models/<name>.gin with this vocabulary size and no dropout.

  Clears gin's configuration (see `call_configured`).
  """
  return call_configured(
    network.T5Config,
    [f'configs/models/{name}.gin'],
    [f'VOCAB_SIZE = {vocab_size}', 'DROPOUT_RATE = 0.0'],
  )


# The macros of configs/pairs/pair.gin that hold the checkpoint paths, by model.
CHECKPOINT_MACROS = (('target', 'CHECKPOINT_PATH'), ('draft', 'DRAFT_CHECKPOINT_PATH'))


def _within(path: str, directory: str) -> bool:
  """Whether `path` is `directory` or lies below it (local paths or URLs such as gs://)."""
  path, directory = (p if '://' in p else os.path.abspath(p) for p in (path, directory))
  return path == directory or path.startswith(directory.rstrip('/') + '/')


def checkpoint_owner(path: str) -> Optional[str]:
  """Whose checkpoint `path` belongs to, by the bound CHECKPOINT_MACROS; None if no one's.

  Args:
    path: a checkpoint directory or a file inside one.

  Returns:
    E.g. "the draft checkpoint (DRAFT_CHECKPOINT_PATH = '/ckpt/small')"; both
    models are named when both macros hold the path.
  """
  owners = []
  for model, macro in CHECKPOINT_MACROS:
    try:
      directory = gin.query_parameter(f'%{macro}')
    except ValueError:  # Not bound.
      continue
    if isinstance(directory, (str, os.PathLike)) and _within(os.fspath(path), os.fspath(directory)):
      owners.append(f'the {model} checkpoint ({macro} = {os.fspath(directory)!r})')
  return ' and '.join(owners) or None


@contextlib.contextmanager
def naming_checkpoint_owners() -> Iterator[None]:
  """Re-raises a `checkpoints.CorruptCheckpointError` saying whose checkpoint it is.

  For the mains, around the gin call that loads the pair: the message then
  names the model and its binding (see `checkpoint_owner`).
  """
  from speculative_t5x import checkpoints  # pylint: disable=g-import-not-at-top

  try:
    yield
  except checkpoints.CorruptCheckpointError as error:
    owner = checkpoint_owner(error.path)
    if owner is None:
      raise
    raise error.with_owner(owner) from error


def bound_path(function: Callable[..., Any], argument: str) -> Optional[str]:
  """The path gin binds to `function`'s `argument`, following macros; None if none is bound.

  Reads the bindings without calling anything: an argument bound to a
  configurable's call (`@f()`) reads None, as one bound to a non-path.
  """
  try:
    value = gin.query_parameter(f'{function.__module__}.{function.__name__}.{argument}')
    while isinstance(value, gin.config.ConfigurableReference):
      if value.selector != 'gin.macro':
        return None
      value = gin.query_parameter(f'%{"/".join(value.scopes)}')
  except ValueError:  # Not bound.
    return None
  return os.fspath(value) if isinstance(value, (str, os.PathLike)) else None


def holding_bound_output(
  function: Callable[..., Any], argument: str, job: str
) -> contextlib.AbstractContextManager:
  """`output_lock.hold` of the directory gin binds to `function`'s `argument` (`bound_path`).

  For the mains of writing jobs, around the gin call: gin builds the
  arguments (loading checkpoints) before the function runs and takes the lock
  itself, so a second writer is refused before that work. Without a bound
  path, nothing is held here (the function still takes the lock).
  """
  path = bound_path(function, argument)
  return contextlib.nullcontext() if path is None else output_lock.hold(path, job)


def run_configured(
  argv: Sequence[str], function: Callable[..., Any], writes: Optional[str] = None
) -> Any:
  """The body of a training-like main: calls the gin-configured `function`.

  Rejects positional arguments, logs the gin config, and turns SIGTERM (a
  preemption or a `kill`) into an exception that unwinds, so the function
  finishes the checkpoint saves it started before the process exits. Pass
  the function as imported from its module (`from speculative_t5x import
  train as train_lib; train_lib.train`): run as `python -m`, the module's own
  functions belong to `__main__`, which the gin files do not configure.
  """
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}.')
  logging.info('Gin config:\n%s', gin.config_str())
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  return gin.get_configurable(function)()


def run(main: Callable[[Sequence[str]], Any]) -> None:
  """Runs `main(argv)` after parsing T5X-style gin flags (see the module docstring)."""
  flags.DEFINE_multi_string('gin_file', [], 'Gin files, parsed in order.')
  flags.DEFINE_multi_string(
    'gin_bindings', [], 'Gin bindings (also --gin.NAME=VALUE), applied after the files.'
  )
  flags.DEFINE_multi_string(
    'gin_search_paths',
    [],
    'Directories searched for relative gin files and includes, after '
    'the working directory and before the repository root.',
  )

  def parse_then_main(argv: Sequence[str]) -> None:
    parse_gin_flags(flags.FLAGS.gin_search_paths, flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
    main(argv)

  app.run(
    parse_then_main, flags_parser=lambda argv: app.parse_flags_with_usage(rewrite_gin_args(argv))
  )
