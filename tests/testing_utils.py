"""Helpers that several test modules use: fixtures' models and inputs, output lengths,
chi-square tests, T5X legacy and orbax checkpoints written as T5X writes them, tree comparison,
GNU .mo catalogs written as msgfmt writes them, the output of code run in a fresh process,
a phrase task a tiny network learns in a few dozen steps.

Test modules import these from here, not from each other.
"""

import collections
import contextlib
import os
import struct
import subprocess
import sys
import time

from flax import serialization
from flax import traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp
from scipy import stats
import tensorstore as ts

from speculative_t5x import models
from speculative_t5x import network

EOS = models.EOS_ID
# T5X's legacy writer stores arrays of fewer elements than this inline in the
# msgpack (layer norm scales, small relative position tables), the others as
# zarr arrays.
INLINE_BELOW = 100


def python_output(code):
  """What `code` prints, run by this interpreter in a fresh process (for import side effects)."""
  return subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=True
  ).stdout.strip()


_KILLED_MAIN = """
import os, signal, time
import gin
from speculative_t5x import gin_utils
import {module} as module

def kill(value):
  if value >= {at}:
    # The kill waits for a save to be complete, never for a time.
    while {wait_for!r} is not None and not os.path.exists({wait_for!r}):
      time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)

gin_utils.run(lambda argv: gin.get_configurable(module.{function})({hook}=kill))
"""


def main_killed_at(module, function, hook, at, wait_for=None):
  """The command of a gin main that SIGKILLs itself at a step, not after a wait.

  Runs `module.function` from the gin flags appended to the command (as the
  module's `main` does) with its step hook `hook` (train's `after_step`,
  infer's `after_batch`), which kills the process the first time it is called
  with a value >= `at`, once the file `wait_for` (a checkpoint's
  commit_success.txt) exists if given.
  """
  code = _KILLED_MAIN.format(module=module, function=function, hook=hook, at=at, wait_for=wait_for)
  return [sys.executable, '-c', code]


# ------------------------------------------------------------------------------
# Writers of one output directory (speculative_t5x.output_lock).
# ------------------------------------------------------------------------------
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Holds the lock of argv[1] and prints 'held', then waits for a line on stdin; or
# prints 'refused' and the error if another holds it. Imports no JAX.
_HOLDER = """
import sys
from speculative_t5x import output_lock
try:
  with output_lock.hold(sys.argv[1], job='test holder'):
    print('held', flush=True)
    sys.stdin.readline()
except output_lock.OutputLockedError as error:
  print('refused', error, flush=True)
"""


def start_lock_holder(directory):
  """A process that tries to hold `directory`'s writer lock, holding it until `let_go`.

  Its first line of stdout says how it went: 'held', or 'refused <the error>'.
  """
  return subprocess.Popen(
    [sys.executable, '-c', _HOLDER, str(directory)],
    cwd=_REPOSITORY,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )


def let_go(holder):
  """Ends a `start_lock_holder` process, which releases the lock it holds."""
  holder.stdin.close()
  assert holder.wait() == 0


@contextlib.contextmanager
def lock_held_elsewhere(directory):
  """`with lock_held_elsewhere(directory) as pid:` another process holds its writer lock."""
  holder = start_lock_holder(directory)
  assert holder.stdout.readline().strip() == 'held'
  try:
    yield holder.pid
  finally:
    let_go(holder)


# The main of `module` whose first writer lock, once taken, is held until the
# file `go` exists: every other writer started with it tries while it holds.
_PAUSED_MAIN = """
import contextlib, os, time
from speculative_t5x import gin_utils, output_lock
import {module} as module

hold = output_lock.hold

@contextlib.contextmanager
def paused_hold(*args, **kwargs):
  with hold(*args, **kwargs) as record:
    while not os.path.exists({go!r}):
      time.sleep(0.01)
    yield record

output_lock.hold = paused_hold
gin_utils.run(module.main)
"""


def run_writers_together(module, args, directory, count=2):
  """Starts `count` runs of `python -m module args` on one output at once; returns their results.

  Each run's first writer lock, once taken, is held until every other run has
  ended (`_PAUSED_MAIN`), so the lock alone decides who proceeds, not how
  fast each process starts. `directory` is a scratch directory for the runs'
  logs.

  Returns:
    [(pid, return code, stderr text)] in the order started.
  """
  go = os.path.join(str(directory), 'go')
  code = _PAUSED_MAIN.format(module=module, go=go)
  logs = [open(os.path.join(str(directory), f'stderr_{i}'), 'w+') for i in range(count)]
  processes = [
    subprocess.Popen(
      [sys.executable, '-c', code, *args],
      cwd=_REPOSITORY,
      stdout=subprocess.DEVNULL,
      stderr=log,
    )
    for log in logs
  ]
  # One run holds the lock until `go` exists; the others end (refused, or in error).
  while sum(process.poll() is None for process in processes) > 1:
    time.sleep(0.05)
  with open(go, 'w'):
    pass
  results = []
  for process, log in zip(processes, logs):
    process.wait()
    log.seek(0)
    results.append((process.pid, process.returncode, log.read()))
    log.close()
  return results


# ------------------------------------------------------------------------------
# Models and inputs.
# ------------------------------------------------------------------------------
def needs_cpu_kernel():
  """Skips a test of the CPU kernel where it cannot be built.

  Its C++ compiler is an optional dependency (without one, decoding runs
  XLA's dot and the fallback tests cover that), as is an AVX2/FMA CPU.
  """
  import pytest  # pylint: disable=g-import-not-at-top

  from speculative_t5x import kernels  # pylint: disable=g-import-not-at-top

  if not kernels.available():
    pytest.skip(
      'optional dependency absent: no C++ compiler (or no AVX2/FMA CPU) to build the CPU kernel'
    )


def tiny_model(seed, vocab_size=32, emb_dim=32, layers=1, scale=1.0):
  """A float32 T5 1.1 'tiny'-shaped `models.Model` with random parameters.

  `scale` multiplies the output layer: sharper logits than the unit-scale
  default make greedy outputs non-trivial.
  """
  config = network.t5_1_1_config(
    'tiny',
    vocab_size=vocab_size,
    emb_dim=emb_dim,
    num_heads=2,
    head_dim=16,
    mlp_dim=2 * emb_dim,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    dtype='float32',
  )
  params, _ = network.random_params(config, seed=seed)
  params['decoder']['logits_dense']['kernel'] *= scale
  return models.Model(config, params)


def tiny_decoder_only_model(
  seed, vocab_size=32, emb_dim=32, layers=2, scale=1.0, inputs_bidirectional_attention=False
):
  """A float32 tiny `network.DecoderOnlyConfig` `models.Model` with random parameters.

  `scale` multiplies the output layer, as in `tiny_model`.
  """
  config = network.DecoderOnlyConfig(
    vocab_size=vocab_size,
    emb_dim=emb_dim,
    num_heads=2,
    num_layers=layers,
    head_dim=16,
    mlp_dim=2 * emb_dim,
    dtype='float32',
  )
  params, _ = network.random_params(config, seed=seed)
  params['decoder']['logits_dense']['kernel'] *= scale
  return models.Model(config, params, inputs_bidirectional_attention)


def padded_inputs(seed, batch, length, vocab_size):
  """int32 [batch, length] random inputs, each EOS-terminated and 0-padded after it."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, vocab_size, size=(batch, length))
  lengths = rng.integers(1, length + 1, size=batch)
  tokens[np.arange(length)[None] >= lengths[:, None]] = 0
  tokens[np.arange(batch), lengths - 1] = EOS
  return tokens.astype(np.int32)


# ------------------------------------------------------------------------------
# Outputs.
# ------------------------------------------------------------------------------
def decoded_lengths(tokens, eos_id=EOS):
  """int [...]: tokens up to and including the first EOS of each row, else the row's length.

  Args:
    tokens: int [..., L] decodes.
    eos_id: the EOS id.
  """
  tokens = np.asarray(tokens)
  is_eos = tokens == eos_id
  return np.where(is_eos.any(-1), np.argmax(is_eos, -1) + 1, tokens.shape[-1])


def outputs_as_tuples(decodes, eos_id=EOS):
  """Each row of int [..., L] decodes up to and including its first EOS, as a tuple."""
  decodes = np.asarray(decodes).reshape(-1, np.shape(decodes)[-1])
  return [
    tuple(row[:length].tolist()) for row, length in zip(decodes, decoded_lengths(decodes, eos_id))
  ]


# ------------------------------------------------------------------------------
# Chi-square tests against exact probabilities.
# ------------------------------------------------------------------------------
def chi_square_test(counts, probs, min_expected=5.0):
  """Pearson's chi-square test of observed counts against exact probabilities.

  Outcomes of probability 0 must never be observed: that is asserted, not
  tested. The cells of smallest expected count are merged into one until it
  and every other cell expect at least `min_expected`.

  Args:
    counts: int [K], how often each outcome was observed.
    probs: float [K], each outcome's exact probability (normalized here).
    min_expected: the smallest expected count of a cell.

  Returns:
    (statistic, degrees of freedom, p-value).
  """
  counts, probs = np.asarray(counts), np.asarray(probs, np.float64)
  assert counts[probs == 0].sum() == 0, 'an outcome of probability 0 was observed'
  counts, probs = counts[probs > 0], probs[probs > 0]
  expected = counts.sum() * probs / probs.sum()
  order = np.argsort(expected)
  counts, expected = counts[order], expected[order]
  num_merged = max(
    int(np.searchsorted(np.cumsum(expected), min_expected)) + 1,
    int(np.sum(expected < min_expected)),
  )
  if num_merged > 1:
    counts = np.concatenate([[counts[:num_merged].sum()], counts[num_merged:]])
    expected = np.concatenate([[expected[:num_merged].sum()], expected[num_merged:]])
  result = stats.chisquare(counts, expected)
  return result.statistic, len(counts) - 1, result.pvalue


def sequence_chi_square_p_value(samples, exact):
  """`chi_square_test`'s p-value of sampled outputs against their exact distribution.

  Args:
    samples: the sampled outputs (hashable, e.g. `outputs_as_tuples`).
    exact: {output: probability}, every output of non-zero probability.
  """
  counts = collections.Counter(samples)
  unknown = counts.keys() - exact.keys()
  assert not unknown, f'sampled outputs of probability 0: {sorted(unknown)[:5]}'
  outputs = list(exact)
  return chi_square_test(
    [counts[output] for output in outputs], [exact[output] for output in outputs]
  )[2]


# ------------------------------------------------------------------------------
# Checkpoints and parameter trees.
# ------------------------------------------------------------------------------
def write_t5x_legacy(model_dir, step, params, dtype=np.float32, kvstore_driver='file'):
  """Writes a legacy T5X checkpoint as `t5x.checkpoints.Checkpointer.save` does.

  Large arrays go to zarr directories named by their dotted path
  (`target.encoder.layers_0.attention.query.kernel/`, gzip, chunked along the
  first axis); the msgpack stores the JSON of their tensorstore spec with the
  path relative to the step directory (on GCS T5X writes a `gcs` kvstore with a
  placeholder bucket). Arrays of fewer than INLINE_BELOW elements are stored
  inline. Everything is in `dtype` (T5X's `save_dtype`).

  Args:
    model_dir: a `pathlib.Path`; `checkpoint_<step>` is created in it.
    step: the training step.
    params: the T5X parameter tree.
    dtype: the stored dtype.
    kvstore_driver: 'file', or 'gcs' for a checkpoint as T5X writes it to GCS.

  Returns:
    The `checkpoint_<step>` directory.
  """
  step_dir = model_dir / f'checkpoint_{step}'
  step_dir.mkdir(parents=True)

  def write(path, value):
    value = np.asarray(value).astype(dtype)
    if value.size < INLINE_BELOW:
      return value
    name = '.'.join(('target',) + path)
    kvstore = (
      {'driver': 'file', 'path': name}
      if kvstore_driver == 'file'
      else {'driver': 'gcs', 'bucket': 't5x-dummy-bucket', 'path': name}
    )
    chunks = (max(1, value.shape[0] // 2),) + value.shape[1:]
    spec = ts.Spec(
      {
        'driver': 'zarr',
        'dtype': np.dtype(dtype).name,
        'kvstore': kvstore,
        'metadata': {'compressor': {'id': 'gzip'}, 'shape': value.shape, 'chunks': chunks},
      }
    ).to_json()
    local = {**spec, 'kvstore': {'driver': 'file', 'path': str(step_dir / name)}}
    ts.open(local, create=True).result().write(value).result()
    return spec

  flat = traverse_util.flatten_dict(params)
  target = traverse_util.unflatten_dict({path: write(path, value) for path, value in flat.items()})
  # Adafactor's factored second moments: tiny placeholders per parameter.
  param_states = jax.tree.map(lambda _: {'v_row': np.zeros((1,), np.float32)}, params)
  contents = {
    'version': 3,
    'optimizer': {
      'target': target,
      'state': {'step': np.int32(step), 'param_states': param_states},
    },
  }
  (step_dir / 'checkpoint').write_bytes(serialization.msgpack_serialize(contents))
  return step_dir


def write_t5x_orbax(model_dir, step, params, dtype=np.float32):
  """Writes an orbax T5X checkpoint as `OrbaxCheckpointManagerInterface.save` does.

  `checkpoint_<step>/state/`, an OCDBT PyTree item holding `{'target': params,
  'state': {'step', 'param_states'}}`, everything in `dtype`.

  Returns:
    The `checkpoint_<step>` directory.
  """
  state = {
    'target': jax.tree.map(lambda x: np.asarray(x).astype(dtype), params),
    'state': {'step': np.int32(step), 'param_states': jax.tree.map(np.zeros_like, params)},
  }
  with ocp.CheckpointManager(
    model_dir,
    item_handlers={'state': ocp.PyTreeCheckpointHandler(use_ocdbt=True)},
    options=ocp.CheckpointManagerOptions(step_prefix='checkpoint'),
  ) as manager:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)))
  return model_dir / f'checkpoint_{step}'


def assert_trees_equal(actual, expected, dtype=None, *, numpy_leaves=False):
  """Asserts equal paths and, leaf by leaf, equal dtypes and values.

  Args:
    actual: a nested dict of arrays.
    expected: a nested dict of arrays.
    dtype: if given, `actual` must equal `expected` cast to this dtype.
    numpy_leaves: also assert that every leaf of `actual` is a numpy array
      (what the checkpoint readers return), not a jax array.
  """
  actual, expected = traverse_util.flatten_dict(actual), traverse_util.flatten_dict(expected)
  assert actual.keys() == expected.keys()
  for path, value in expected.items():
    want = np.asarray(value) if dtype is None else np.asarray(value).astype(dtype)
    assert not numpy_leaves or isinstance(actual[path], np.ndarray), path
    assert np.asarray(actual[path]).dtype == want.dtype, path
    np.testing.assert_array_equal(np.asarray(actual[path]), want, err_msg='/'.join(path))


# ------------------------------------------------------------------------------
# gettext catalogs.
# ------------------------------------------------------------------------------
MO_HEADER = (
  'Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n'
)


def write_mo(path, messages, charset='UTF-8', byte_order='<'):
  """Writes a GNU .mo catalog of {original: translation}, as msgfmt does (sorted originals).

  An original is `msgid`, `context\\x04msgid` or `msgid\\0msgid_plural`; a
  plural translation joins its forms with `\\0`. The header entry (msgid "")
  names `charset` and German's plural forms.
  """
  messages = {'': MO_HEADER.format(charset=charset), **messages}
  originals = sorted(key.encode(charset) for key in messages)
  translations = [messages[key.decode(charset)].encode(charset) for key in originals]
  count = len(originals)
  originals_at = 28
  translations_at = originals_at + 8 * count
  strings_at = translations_at + 8 * count
  tables, strings = [], b''
  for string in originals + translations:
    tables.append(struct.pack(byte_order + '2I', len(string), strings_at + len(strings)))
    strings += string + b'\0'
  header = struct.pack(
    byte_order + '7I', 0x950412DE, 0, count, originals_at, translations_at, 0, strings_at
  )
  with open(path, 'wb') as f:
    f.write(header + b''.join(tables) + strings)


# ------------------------------------------------------------------------------
# A TSV task a tiny network learns in a few dozen steps.
# ------------------------------------------------------------------------------
VERBS = [
  ('Open', 'öffnen'),
  ('Close', 'schließen'),
  ('Delete', 'löschen'),
  ('Save', 'speichern'),
  ('Print', 'drucken'),
  ('Copy', 'kopieren'),
]
NOUNS = [
  ('the file', 'Die Datei'),
  ('the window', 'Das Fenster'),
  ('the folder', 'Den Ordner'),
  ('the page', 'Die Seite'),
  ('the document', 'Das Dokument'),
  ('the picture', 'Das Bild'),
]
PAIRS = [
  (f'{verb} {noun}', f'{nomen} {verb_de}') for verb, verb_de in VERBS for noun, nomen in NOUNS
]


def phrase_task(directory, name, prefix):
  """(task name, directory, vocabulary path): 36 systematic English/German phrases.

  Writes train.tsv (all pairs) and validation.tsv (every fifth) into
  `directory`, trains a 64-piece SentencePiece vocabulary on them and
  registers the seqio TSV task `name` with the input prefix `prefix`.
  """
  from speculative_t5x.data import tasks  # seqio and TensorFlow only where a task is needed.

  for split, pairs in (('train', PAIRS), ('validation', PAIRS[::5])):
    with open(os.path.join(directory, f'{split}.tsv'), 'w', encoding='utf-8') as f:
      f.writelines(f'{source}\t{target}\n' for source, target in pairs)
  vocabulary_prefix = os.path.join(directory, 'spm')
  texts = [text for pair in PAIRS for text in pair] + [prefix] * 4
  vocabulary = tasks.train_sentencepiece(texts, vocabulary_prefix, 64, character_coverage=1.0)
  task = tasks.register_tsv_task(
    name,
    {split: os.path.join(directory, f'{split}.tsv') for split in ('train', 'validation')},
    vocabulary,
    extra_ids=0,
    prefix=prefix,
  )
  return task.name, directory, vocabulary_prefix + '.model'


# ------------------------------------------------------------------------------
# The real T5X: optional here, required under `make test-t5x`.
# ------------------------------------------------------------------------------
# `make test-t5x` sets this to 1: there a t5x that does not import is an error
# and a t5x-marked test may not skip (tests/conftest.py).
T5X_REQUIRED = 'SPECULATIVE_T5X_REQUIRE_T5X'
T5X_REASON = (
  't5x is not installed: it is an optional integration (not on PyPI); `make test-t5x` '
  'installs it in a side venv and runs these tests'
)


def t5x_required():
  return os.environ.get(T5X_REQUIRED) == '1'


def import_t5x():
  """The t5x package; without it the test skips (T5X_REASON), or fails under `make test-t5x`."""
  import pytest  # pylint: disable=g-import-not-at-top

  if t5x_required():
    import t5x  # pylint: disable=g-import-not-at-top

    return t5x
  return pytest.importorskip('t5x', reason=T5X_REASON)


def speculative_t5x_models():
  """`speculative_t5x.t5x_models` (our T5X model classes), which imports t5x: see `import_t5x`."""
  import_t5x()
  from speculative_t5x import t5x_models  # pylint: disable=g-import-not-at-top

  return t5x_models
