"""The result cache: deterministic benchmark results kept in the workdir between runs.

A second run of the demo (or of the gin benchmark) on the same checkpoints
should re-measure every *timing* (that is what a second run is for) but need
not recompute what the checkpoints determine: alpha of each draft on the
target's samples (Table 3) and the BLEU and length of sampled decodes over
fixed keys. Those are computed once and stored here, keyed by a content
fingerprint of everything they depend on:

  * the inputs of the computation, given by the caller: the parameters of every
    model involved, the input tokens, the references, every setting (temperature,
    lengths, seeds, gamma, ...), the vocabulary file's bytes;
  * the environment: the jax and jaxlib versions, XLA_FLAGS, the platform and
    device kind, and the CPU kind (model name and family, as `measure.machine`
    reports them), since XLA's float results can differ between CPU kinds;
  * the code that computes them: the source of the package's numerical
    modules (`CODE_MODULES`), so that a change to the network or the decode
    loop recomputes.

Any change gives a new fingerprint, so a stale entry is never read; it is
recomputed and written beside the old one. Each entry is one JSON file,
`<directory>/<name>-<fingerprint[:16]>.json`, holding the full fingerprint,
the date of the run that computed it (`computed`), a readable description of
its key, and the value. A file that cannot be read (corrupt, truncated, or
of another format) is recomputed with a warning, never trusted.

  cache = result_cache.ResultCache('runs/demo/result_cache')
  value = cache.get_or_compute('alpha', key, lambda: measure_it())
  cache.computed_at(value)  # The earlier run's date, or None if computed now.

`ResultCache(None)` keeps entries in memory only (one run shares a result
between its callers, nothing persists); `remeasure=True` recomputes every
entry and overwrites the files. The demo's `--remeasure` flag and the gin
benchmark's `benchmark_pair(result_cache_dir=..., remeasure=...)` set these;
reports say which figures came from the cache and from which run
(`CACHED_FROM`).

One writer per directory. A cache that must compute an entry first takes its
directory's writer lock (`speculative_t5x.output_lock`), before computing, and
holds it until `close()` (or the end of its `with` block): a second run that
would write the same directory stops there with `OutputLockedError`, naming
the running one. A run whose every entry is stored only reads: it takes no
lock and runs beside a writer (entries are written whole, then renamed).
"""

import contextlib
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import os
import tempfile
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from speculative_t5x import output_lock

# The record field (a dict: {'computed': ISO date of the run that computed it,
# 'fingerprint': ...}) that marks a figure read from the cache; absent when
# the figure was computed in this run.
CACHED_FROM = 'cached_from'

# The modules whose source a cached result depends on: the networks, the decode
# loops, sampling and verification, drafts, the CPU kernel, the alpha and
# quality measurements. A package stands for every source file under it.
CODE_MODULES = (
  'speculative_t5x.acceptance',
  'speculative_t5x_lab.benchmark',
  'speculative_t5x.data.tasks_core',
  'speculative_t5x.decoding',
  'speculative_t5x.drafts',
  'speculative_t5x.feature_head',
  'speculative_t5x.kernels',
  'speculative_t5x.layouts',
  'speculative_t5x.models',
  'speculative_t5x.network',
  'speculative_t5x.sampling',
  'speculative_t5x.settings',
  'speculative_t5x.speculative_sampling',
  'speculative_t5x.tree',
)
SOURCE_SUFFIXES = ('.py', '.cc')
FORMAT_VERSION = 1


def _cpu_kind() -> Dict[str, Optional[str]]:
  """The CPU's model name and family (from /proc/cpuinfo; None where absent)."""
  cpu: Dict[str, Optional[str]] = {'model name': None, 'cpu family': None}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        key = key.strip()
        if key in cpu and cpu[key] is None:
          cpu[key] = value.strip()
  except OSError:
    pass
  return cpu


def environment() -> Dict[str, Any]:
  """What a cached float result depends on beyond its inputs: versions, flags, device, CPU."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  return dict(
    jax=jax.__version__,
    jaxlib=jaxlib.__version__,
    xla_flags=os.environ.get('XLA_FLAGS', ''),
    platform=jax.default_backend(),
    device_kind=str(jax.devices()[0].device_kind),
    cpu=_cpu_kind(),
  )


def _source_files(module: str) -> List[str]:
  """The source files of `module` (a dotted name): its file, or every source file of a package."""
  spec = importlib.util.find_spec(module)
  if spec is None or spec.origin is None:
    raise ValueError(f'result_cache.CODE_MODULES names {module!r}, which does not import.')
  if spec.submodule_search_locations is None:
    return [spec.origin]
  return sorted(
    os.path.join(directory, name)
    for directory, _, names in os.walk(os.path.dirname(spec.origin))
    for name in names
    if name.endswith(SOURCE_SUFFIXES)
  )


def code_fingerprint(modules=CODE_MODULES) -> str:
  """sha256 of the source of `modules`, each file named by its path within the package."""
  package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for module in modules:
    for path in _source_files(module):
      digest.update(os.path.relpath(path, package_root).encode())
      with open(path, 'rb') as f:
        digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()


def file_digest(path: Optional[str]) -> Optional[str]:
  """sha256 of a file's bytes (e.g. a vocabulary), None for None."""
  if path is None:
    return None
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


class Fingerprinter:
  """sha256 of a key built from plain values, arrays, mappings, sequences and dataclasses.

  Dataclasses (configs, `models.Model`, drafts, settings) are fingerprinted
  field by field with their class name, arrays (numpy or jax) by dtype, shape
  and bytes. An array's digest is kept while it lives, so a model's parameters
  are read once per run however many keys name them.
  """

  def __init__(self):
    self._arrays: Dict[int, tuple] = {}

  def _array(self, value) -> bytes:
    memo = self._arrays.get(id(value))
    if memo is not None and memo[0] is value:
      return memo[1]
    array = np.ascontiguousarray(np.asarray(value))
    digest = hashlib.sha256(f'{array.dtype.str}{array.shape}'.encode())
    digest.update(array.view(np.uint8).reshape(-1) if array.size else b'')
    self._arrays[id(value)] = (value, digest.digest())
    return self._arrays[id(value)][1]

  def _update(self, digest, value) -> None:
    if value is None or isinstance(value, (bool, int, float, str)):
      digest.update(f'{type(value).__name__}:{value!r};'.encode())
    elif isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith(
      ('jax', 'jaxlib')
    ):
      digest.update(b'array:' + self._array(value))
    elif isinstance(value, Mapping):
      digest.update(f'map{len(value)}{{'.encode())
      for key in sorted(value, key=repr):
        self._update(digest, key)
        self._update(digest, value[key])
      digest.update(b'}')
    elif isinstance(value, (list, tuple)):
      digest.update(f'seq{len(value)}['.encode())
      for item in value:
        self._update(digest, item)
      digest.update(b']')
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
      digest.update(f'{type(value).__module__}.{type(value).__qualname__}('.encode())
      for field in dataclasses.fields(value):
        digest.update(field.name.encode())
        self._update(digest, getattr(value, field.name))
      digest.update(b')')
    else:
      raise TypeError(
        f'The result cache cannot fingerprint a {type(value).__name__}; key it by its '
        'contents (arrays, numbers, strings, dataclasses, mappings, sequences).'
      )

  def __call__(self, value) -> str:
    digest = hashlib.sha256()
    self._update(digest, value)
    return digest.hexdigest()


@dataclasses.dataclass
class Entry:
  """One result: its value and where it came from."""

  name: str
  value: Any
  computed: str  # ISO date of the run that computed it.
  fingerprint: str
  from_cache: bool


class ResultCache:
  """Deterministic results keyed by a content fingerprint (see the module docstring).

  A cache that computes an entry holds the directory's writer lock from then
  until `close()`; `with ResultCache(...) as cache:` closes it.

  Args:
    directory: where the entries persist (created when the first is written);
      None: in memory only, for this run.
    remeasure: recompute every entry, ignoring (and overwriting) stored ones.
    job: what writes, for the writer lock's record (`output_lock`; default
      the command line's program).
  """

  def __init__(
    self, directory: Optional[str], *, remeasure: bool = False, job: Optional[str] = None
  ):
    self.directory = directory
    self.remeasure = remeasure
    self.job = job
    self._lock = contextlib.ExitStack()  # The writer lock, once taken (`_hold`).
    self._locked = False
    self.entries: List[Entry] = []  # Every entry this run used, in order.
    self._memory: Dict[str, Entry] = {}
    self._fingerprint = Fingerprinter()
    self._context = None

  def __enter__(self) -> 'ResultCache':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def close(self) -> None:
    """Releases the directory's writer lock, if this cache took it; it takes it again if
    it computes another entry."""
    self._lock.close()
    self._locked = False

  def _hold(self) -> None:
    """Takes the directory's writer lock unless this cache holds it (until `close()`).

    Raises `output_lock.OutputLockedError` if another job writes the directory.
    """
    if not self._locked:
      self._lock.enter_context(output_lock.hold(self.directory, self.job))
      self._locked = True

  def context(self) -> Dict[str, Any]:
    """The environment and the code's fingerprint, part of every key."""
    if self._context is None:
      self._context = dict(
        format=FORMAT_VERSION, environment=environment(), code=code_fingerprint()
      )
    return self._context

  def fingerprint(self, name: str, key: Any) -> str:
    return self._fingerprint(dict(name=name, key=key, context=self.context()))

  def path(self, name: str, fingerprint: str) -> Optional[str]:
    if self.directory is None:
      return None
    return os.path.join(self.directory, f'{name}-{fingerprint[:16]}.json')

  def _read(self, path: str, fingerprint: str) -> Optional[Dict[str, Any]]:
    """The stored entry, or None (missing; unreadable, with a warning)."""
    if not os.path.exists(path):
      return None
    try:
      with open(path) as f:
        stored = json.load(f)
      if stored['fingerprint'] != fingerprint or stored['format'] != FORMAT_VERSION:
        raise ValueError('its fingerprint or format is not the one asked for')
      stored['value'], stored['computed']  # pylint: disable=pointless-statement
      return stored
    except (OSError, ValueError, KeyError, TypeError) as error:
      warnings.warn(
        f'The result cache file {path} cannot be used ({type(error).__name__}: {error}); '
        'recomputing it.',
        RuntimeWarning,
        stacklevel=3,
      )
      return None

  def _write(self, path: str, entry: Entry, description: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stored = dict(
      format=FORMAT_VERSION,
      name=entry.name,
      fingerprint=entry.fingerprint,
      computed=entry.computed,
      key=description,
      value=entry.value,
    )
    # Written whole, then renamed: an interrupted run leaves no half-written entry.
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.tmp')
    with os.fdopen(handle, 'w') as f:
      json.dump(stored, f, indent=1, default=float)
    os.replace(temporary, path)

  def get_or_compute(
    self, name: str, key: Any, compute: Callable[[], Any], *, description: Any = None
  ) -> Entry:
    """The entry for (name, key): this run's, the stored one, or `compute()`'s (then stored).

    Before computing an entry that persists, takes the directory's writer lock
    (held until `close()`); raises `output_lock.OutputLockedError` if another
    job holds it.

    Args:
      name: what the result is (a file-name-safe word, e.g. 'alpha').
      key: everything the result depends on beyond `context()`: arrays,
        numbers, strings, dataclasses (models, configs, settings), mappings,
        sequences.
      compute: returns the result, JSON-serializable (numbers, strings,
        lists, dicts).
      description: a JSON-ready summary of the key, stored for a reader of
        the file (the fingerprint is what is compared).
    """
    fingerprint = self.fingerprint(name, key)
    entry = self._memory.get(fingerprint)
    path = self.path(name, fingerprint)
    if entry is None and path is not None and not self.remeasure:
      stored = self._read(path, fingerprint)
      if stored is not None:
        entry = Entry(name, stored['value'], stored['computed'], fingerprint, from_cache=True)
    if entry is None and path is not None:
      self._hold()  # One writer per directory, from before the computation.
    if entry is None:
      # Round-trip through JSON so a computed value looks exactly like a stored one.
      value = json.loads(json.dumps(compute(), default=float))
      computed = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
      entry = Entry(name, value, computed, fingerprint, from_cache=False)
      if path is not None:
        self._write(path, entry, description)
    self._memory[fingerprint] = entry
    self.entries.append(entry)
    return entry


def cached_from(entry: Entry) -> Optional[Dict[str, str]]:
  """A record's `CACHED_FROM` value for `entry`: None when it was computed in this run."""
  if not entry.from_cache:
    return None
  return dict(computed=entry.computed, fingerprint=entry.fingerprint[:16])
