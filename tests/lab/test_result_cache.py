"""result_cache: deterministic benchmark figures kept between runs, keyed by their contents."""

import dataclasses
import json
import os

import numpy as np
import pytest

from speculative_t5x import output_lock
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import result_cache
import testing_utils
from testing_utils import padded_inputs, tiny_model


@dataclasses.dataclass(frozen=True)
class Settings:
  gamma: int
  name: str


def test_the_fingerprint_follows_every_part_of_the_key():
  fingerprint = result_cache.Fingerprinter()
  array = np.arange(6, dtype=np.float32).reshape(2, 3)
  key = dict(params={'w': array}, settings=Settings(3, 'a'), lengths=[1, 2])
  base = fingerprint(key)
  assert fingerprint(dict(key)) == base  # Same contents, same fingerprint.
  changed = array.copy()
  changed[1, 2] += 1e-6
  variants = [
    dict(key, params={'w': changed}),  # One element.
    dict(key, params={'w': array.astype(np.float64)}),  # The dtype.
    dict(key, params={'w': array.reshape(3, 2)}),  # The shape.
    dict(key, settings=Settings(4, 'a')),  # A dataclass field.
    dict(key, lengths=[2, 1]),  # The order of a sequence.
    dict(key, extra=None),  # One more key.
  ]
  assert len({base, *(fingerprint(v) for v in variants)}) == len(variants) + 1
  with pytest.raises(TypeError, match='cannot fingerprint a function'):
    fingerprint(dict(callback=lambda: None))


def test_a_result_is_computed_once_and_read_back_by_a_later_run(tmp_path):
  calls = []

  def compute():
    calls.append(1)
    return {'alpha': 0.75, 'per_key': [1.0, 2.0]}

  key = dict(inputs=np.arange(4), temperature=1.0)
  with result_cache.ResultCache(str(tmp_path)) as cache:
    first = cache.get_or_compute('alpha', key, compute)
  assert not first.from_cache and result_cache.cached_from(first) is None
  with result_cache.ResultCache(str(tmp_path)) as later:  # Another run, same folder.
    second = later.get_or_compute('alpha', key, compute)
    assert len(calls) == 1 and second.from_cache and second.value == first.value
    assert result_cache.cached_from(second)['computed'] == first.computed
    # Another key, or remeasure, computes again (and remeasure overwrites the file).
    later.get_or_compute('alpha', dict(key, temperature=0.0), compute)
    assert len(calls) == 2
  with result_cache.ResultCache(str(tmp_path), remeasure=True) as cache:
    again = cache.get_or_compute('alpha', key, compute)
  assert len(calls) == 3 and not again.from_cache
  # In memory only: nothing is written, but one run computes a key once.
  memory = result_cache.ResultCache(None)
  memory.get_or_compute('alpha', key, compute)
  memory.get_or_compute('alpha', key, compute)
  assert len(calls) == 4 and len(os.listdir(tmp_path)) == 2


def test_another_machine_kind_or_code_recomputes(tmp_path, monkeypatch):
  calls = []
  compute = lambda: calls.append(1) or 1.0

  def run():
    with result_cache.ResultCache(str(tmp_path)) as cache:
      cache.get_or_compute('alpha', 'key', compute)

  run()
  environment = result_cache.environment()
  monkeypatch.setattr(
    result_cache,
    'environment',
    # Another kind than this machine's, whichever it is (the pool has families 25 and 26).
    lambda: dict(environment, cpu=dict(environment['cpu'], **{'cpu family': 'another family'})),
  )
  run()
  monkeypatch.setattr(result_cache, 'code_fingerprint', lambda: 'another version of the code')
  run()
  assert len(calls) == 3


def test_a_second_writer_is_refused_before_computing_with_the_holder_named(tmp_path):
  """A cache takes its directory's writer lock before computing an entry and holds it until
  closed: while another process holds it, computing is refused, naming the holder."""

  def compute():
    raise AssertionError('a refused cache computed')

  lock_file = tmp_path / output_lock.LOCK_FILE
  with testing_utils.lock_held_elsewhere(tmp_path) as holder:
    with result_cache.ResultCache(str(tmp_path), job='a benchmark') as cache:
      with pytest.raises(output_lock.OutputLockedError) as error:
        cache.get_or_compute('alpha', 'key', compute)
    message = str(error.value)
    assert f'{tmp_path} is being written by another job: test holder, process {holder} ' in (
      message
    )
    assert error.value.holder['pid'] == holder and lock_file.exists()
    # --remeasure writes every entry: refused the same.
    with result_cache.ResultCache(str(tmp_path), remeasure=True) as cache:
      with pytest.raises(output_lock.OutputLockedError, match=f'process {holder} '):
        cache.get_or_compute('alpha', 'key', compute)
  assert os.listdir(tmp_path) == []

  # Once it ends, the cache computes, holding the lock until it is closed.
  with result_cache.ResultCache(str(tmp_path), job='a benchmark') as cache:
    cache.get_or_compute('alpha', 'key', lambda: 0.5)
    holder = output_lock.read_holder(tmp_path)
    assert holder['job'] == 'a benchmark' and holder['pid'] == os.getpid()
    other = testing_utils.start_lock_holder(tmp_path)
    refusal = other.stdout.readline()
    testing_utils.let_go(other)
    assert refusal.startswith('refused') and f'a benchmark, process {os.getpid()} ' in refusal
    cache.get_or_compute('alpha', 'another key', lambda: 0.25)  # Still held, not taken again.
  assert not lock_file.exists()


def test_a_cache_that_only_reads_takes_no_lock_and_reads_beside_a_writer(tmp_path):
  key = dict(inputs=np.arange(4))
  with result_cache.ResultCache(str(tmp_path)) as cache:
    first = cache.get_or_compute('alpha', key, lambda: 0.75)

  def compute():
    raise AssertionError('a stored entry was computed again')

  with testing_utils.lock_held_elsewhere(tmp_path) as holder:
    with result_cache.ResultCache(str(tmp_path)) as cache:
      entry = cache.get_or_compute('alpha', key, compute)
      assert entry.from_cache and entry.value == first.value
      assert output_lock.read_holder(tmp_path)['pid'] == holder  # The writer's lock, not ours.


def test_a_damaged_file_is_recomputed_with_a_warning(tmp_path):
  with result_cache.ResultCache(str(tmp_path)) as cache:
    entry = cache.get_or_compute('alpha', 'key', lambda: 0.5)
  (path,) = tmp_path.iterdir()
  path.write_text(path.read_text()[:20])  # A run killed while another wrote? Truncated.
  with pytest.warns(RuntimeWarning, match='cannot be used .* recomputing it'):
    with result_cache.ResultCache(str(tmp_path)) as cache:
      again = cache.get_or_compute('alpha', 'key', lambda: 0.25)
  assert again.value == 0.25 and not again.from_cache
  assert json.loads(path.read_text())['fingerprint'] == entry.fingerprint


TARGET = tiny_model(seed=0, vocab_size=24, layers=2, scale=1.5)
DRAFT = tiny_model(seed=1, vocab_size=24, scale=1.5)


@pytest.mark.slow  # Two whole benchmarks; the cache's keys and files are tested fast here.
def test_a_second_benchmark_reads_alpha_and_sampled_quality_back(tmp_path, monkeypatch):
  """The figures a second run on the same models and inputs does not compute again."""
  sampled_calls = []
  corpus_bleu = benchmark.corpus_bleu
  monkeypatch.setattr(
    benchmark, 'corpus_bleu', lambda *args: sampled_calls.append(1) or corpus_bleu(*args)
  )
  run = lambda: benchmark.run_benchmark(
    TARGET,
    DRAFT,
    padded_inputs(0, 6, 5, TARGET.vocab_size),
    sweep=benchmark.Sweep(temperatures=(1.0,), gammas=(2,)),
    measurement=benchmark.Measurement(
      num_walltime_examples=2, repetitions=1, max_decode_len=6, alpha_tokens=200
    ),
    report=benchmark.Report(
      result_cache=result_cache.ResultCache(str(tmp_path)), progress=lambda line: None
    ),
  )
  first = run()
  assert len(sampled_calls) == benchmark.QUALITY_KEYS * 2  # Baseline and speculative.

  def measure_again(*args, **kwargs):
    raise AssertionError('alpha was measured again')

  monkeypatch.setattr(benchmark, '_alpha_records', measure_again)
  second = run()
  assert len(sampled_calls) == benchmark.QUALITY_KEYS * 2

  def figures(records, kind):
    return [r for r in records if r['kind'] == kind]

  (alpha_first,), (alpha_second,) = figures(first, 'alpha'), figures(second, 'alpha')
  assert alpha_first['cached_from'] is None and alpha_second['cached_from'] is not None
  assert alpha_second['alpha'] == alpha_first['alpha'] and alpha_second['alpha'] > 0
  (then,), (now,) = figures(first, 'walltime'), figures(second, 'walltime')
  assert now['alpha'] == then['alpha']
  assert now['ms_per_token_speculative'] != then['ms_per_token_speculative']  # Timed again.
  for name in ('baseline', 'speculative'):
    assert now['sampled_quality'][name]['length'] == then['sampled_quality'][name]['length']
    assert then['sampled_quality'][name]['cached_from'] is None
    assert now['sampled_quality'][name]['cached_from'] is not None
  assert 'Read from the result cache (computed in the run of' in (
    benchmark.reports.markdown_report(second)
  )


def test_code_fingerprint_reads_every_listed_module_and_package():
  # Every listed module resolves (a moved module is an error, not a silent skip), and a
  # package counts with all its files: the network package's and the kernel's C++ source.
  files = [
    path for module in result_cache.CODE_MODULES for path in result_cache._source_files(module)
  ]
  names = {os.path.basename(path) for path in files}
  assert {'decoding.py', 'benchmark.py', 'cache.py', 'attention.py', 'small_m_matmul.cc'} <= names
  with pytest.raises(ValueError, match='speculative_t5x.no_such_module'):
    result_cache.code_fingerprint(('speculative_t5x.no_such_module',))
  assert result_cache.code_fingerprint() == result_cache.code_fingerprint()
