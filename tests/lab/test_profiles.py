"""Speculation profiles: gamma (or the baseline) per batch size, and gamma='auto' everywhere."""

import functools
import json

import numpy as np
import pytest

from speculative_t5x_lab import benchmark
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import profiles
from speculative_t5x_lab import profile_sweep
from speculative_t5x_lab import reports
from speculative_t5x import settings
from speculative_t5x import t5x_adapter
from speculative_t5x_lab import theory
from testing_utils import tiny_model

TARGET = tiny_model(seed=0, layers=2, scale=3.0)
DRAFT = tiny_model(seed=1, scale=3.0)
INPUTS = np.array([[3, 4, 5, 1], [6, 7, 1, 0], [8, 9, 10, 1], [11, 1, 0, 0]], np.int32)


def write(path, gamma_by_batch_size, temperature=0.0, **fields):
  profile_sweep.write_profile(
    str(path),
    dict(
      mode=dict(temperature=temperature, topk=0, topp=0.0),
      gamma_by_batch_size=gamma_by_batch_size,
      **fields,
    ),
  )
  return str(path)


def test_the_nearest_measured_batch_size_at_or_below_decides(tmp_path):
  profile = profiles.load_profile(write(tmp_path / 'p.json', {1: 5, 4: 3, 16: 0}))
  assert [profile.gamma_for(b) for b in (1, 2, 3, 4, 15, 16, 64)] == [5, 5, 5, 3, 3, 0, 0]
  assert profiles.load_profile(write(tmp_path / 'q.json', {2: 3})).gamma_for(1) == 3


def test_the_choice_never_takes_a_measured_loss_and_prefers_the_measurement():
  predicted = {1: {3: 1.5, 5: 1.6}, 8: {3: 1.1, 5: 1.05}, 64: {3: 0.8}}
  measured = {1: {3: 1.45, 5: 1.4}, 8: {3: 0.96, 5: 0.93}}
  assert profile_sweep.choose_gammas(predicted, measured) == {1: 3, 8: 0, 64: 0}
  assert profile_sweep.choose_gammas(predicted) == {1: 5, 8: 3, 64: 0}


def test_greedy_predicts_from_replayed_rows_and_sampling_from_one_alpha():
  cell = dict(predicted_speedup_batched=1.4, predicted_speedup_rows=1.1)
  assert profile_sweep.best_prediction(cell, 0.0) == 1.1
  assert profile_sweep.best_prediction(cell, 1.0) == 1.4
  # No per-row prediction (an emulated acceptance): one alpha at every temperature.
  assert profile_sweep.best_prediction(dict(predicted_speedup_batched=1.4), 0.0) == 1.4
  assert profile_sweep.best_prediction({}, 0.0) is None


@pytest.mark.parametrize(
  'content, message',
  [
    ('{not json', 'is not a speculation profile'),
    ('{"version": 1}', 'no gamma_by_batch_size table'),
    ('{"version": 7, "gamma_by_batch_size": {"1": 3}}', 'version 7'),
    (
      '{"version": 1, "gamma_by_batch_size": {"0": 3}, "mode": {}}',
      'must map batch sizes >= 1 to gammas >= 0',
    ),
  ],
)
def test_a_broken_profile_is_a_named_error(tmp_path, content, message):
  path = tmp_path / 'bad.json'
  path.write_text(content)
  with pytest.raises(ValueError, match=message):
    profiles.load_profile(str(path))


def test_auto_needs_a_profile_and_a_profile_needs_auto(tmp_path):
  with pytest.raises(ValueError, match="gamma='auto'.*none was given.*profile sweep"):
    settings.SpeculativeSettings(gamma='auto')
  with pytest.raises(ValueError, match='No speculation profile at .*missing.json'):
    settings.SpeculativeSettings(gamma='auto', profile=str(tmp_path / 'missing.json'))
  with pytest.raises(ValueError, match="is for gamma='auto'"):
    settings.SpeculativeSettings(gamma=3, profile=write(tmp_path / 'p.json', {1: 3}))


def test_generate_decodes_each_batch_with_the_profiles_gamma(tmp_path):
  path = write(tmp_path / 'p.json', {1: 2, 4: 0})
  two = models.generate(TARGET, DRAFT, INPUTS[:2], gamma='auto', profile=path, max_decode_len=8)
  fixed = models.generate(TARGET, DRAFT, INPUTS[:2], gamma=2, max_decode_len=8)
  assert two.gamma == 2 and fixed.gamma == 2 and two.stats is not None
  np.testing.assert_array_equal(two.tokens, fixed.tokens)
  np.testing.assert_array_equal(two.stats.iterations, fixed.stats.iterations)
  four = models.generate(TARGET, DRAFT, INPUTS, gamma='auto', profile=path, max_decode_len=8)
  baseline = models.generate(TARGET, None, INPUTS, max_decode_len=8)
  assert four.gamma == 0 and four.stats is None
  np.testing.assert_array_equal(four.tokens, baseline.tokens)


def test_a_profile_of_another_sampling_mode_is_refused(tmp_path):
  greedy = write(tmp_path / 'greedy.json', {1: 3})
  with pytest.raises(ValueError, match="measured at {'greedy': True}.*temperature': 1.0"):
    models.make_decoder(TARGET, DRAFT, gamma='auto', profile=greedy, temperature=1.0)
  models.make_decoder(TARGET, DRAFT, gamma='auto', profile=greedy, temperature=0.0)


@pytest.mark.slow  # About 20 compiled programs; the choice and auto's decoding run fast here.
def test_the_benchmark_sweep_writes_a_profile_that_auto_follows(tmp_path):
  """Emulated acceptance on random weights: the sweep's mechanics, not its speedups."""
  records = benchmark.run_benchmark(
    TARGET,
    DRAFT,
    benchmark.random_inputs(4, 6, TARGET.vocab_size)[0],
    sweep=benchmark.Sweep(
      temperatures=(0.0,),
      gammas=(1, 2),
      batch_sizes=(1, 2),
      profile_dir=str(tmp_path / 'profiles'),
    ),
    measurement=benchmark.Measurement(
      num_walltime_examples=2, repetitions=1, max_decode_len=8, emulate_alpha=0.7
    ),
    report=benchmark.Report(output_dir=str(tmp_path / 'report'), progress=lambda line: None),
  )
  (profile,) = [r for r in records if r['kind'] == 'profile']
  written = json.loads((tmp_path / 'profiles' / 'profile_t0.json').read_text())
  assert {int(b): g for b, g in written['gamma_by_batch_size'].items()} == (
    profile['gamma_by_batch_size']
  )
  assert written['machine']['bandwidth_gb_per_s'] > 0 and written['mode']['temperature'] == 0.0
  walltime = {(r['batch_size'], r['gamma']): r for r in records if r['kind'] == 'walltime'}
  assert set(walltime) == {(b, g) for b in (1, 2) for g in (1, 2)}
  for b in (1, 2):
    measured = {g: walltime[b, g]['speedup']['median'] for g in (1, 2)}
    assert (
      profile['gamma_by_batch_size'][b]
      == profile_sweep.choose_gammas({b: measured}, {b: measured})[b]
    )
    assert 0.0 <= walltime[b, 2]['finished_row_share'] < 1.0
    # Batch 1 keeps each row's length and iterations. An emulated acceptance is i.i.d. at one
    # rate, so no per-row prediction is made and the profile chooses on the one-alpha one.
    assert len(walltime[1, 2]['row_iterations']) == len(walltime[1, 2]['row_lengths']) == 2
    assert 'predicted_speedup_rows' not in walltime[b, 2]
    # Emulated rows run to the full length, so no baseline row waits for another.
    assert walltime[b, 2]['baseline_finished_row_share'] == 0.0
    assert walltime[b, 2]['predicted_speedup_batched'] == pytest.approx(
      theory.batch_walltime_improvement(
        0.7, 2, walltime[b, 2]['c'], walltime[b, 2]['verify_cost'], [[8] * b] * (2 // b)
      )
    )
  auto = {r['batch_size']: r for r in records if r['kind'] == 'auto'}
  assert {b: r['gamma_ran'] for b, r in auto.items()} == profile['gamma_by_batch_size']
  for r in auto.values():  # Every fixed gamma timed beside auto, the best of them named.
    assert set(r['fixed_speedups']) == {'1', '2'}
    best = max([1.0] + [s['median'] for s in r['fixed_speedups'].values()])
    assert r['auto_over_best_fixed'] == pytest.approx(r['speedup']['median'] / best)
    chosen = r['fixed_speedups'][str(r['gamma_ran'])]['median'] if r['gamma_ran'] else 1.0
    assert r['chosen_over_best_fixed'] == pytest.approx(chosen / best)
  assert all(r['emulated'] and r['pair'] == 'pair' for r in records)  # Every record's labels.
  report = (tmp_path / 'report' / 'benchmark.md').read_text()
  assert '## Speculation profile, T = 0.0' in report
  # The report reads the records back from benchmark.json too (string keys).
  saved = json.loads((tmp_path / 'report' / 'benchmark.json').read_text())
  assert reports.markdown_report(saved) == report
  assert (tmp_path / 'report' / 'profile_t0.png').exists()


@pytest.mark.parametrize('num_decodes', [1, pytest.param(2, marks=pytest.mark.slow)])
def test_the_t5x_batch_decodes_with_the_profiles_gamma_or_the_baseline(tmp_path, num_decodes):
  """`speculative_predict_batch` (what both T5X models run): gamma 0 is T5X-style decoding."""
  module, draft_module = network.Transformer(TARGET.config), network.Transformer(DRAFT.config)
  params = {**TARGET.params, t5x_adapter.DRAFT_KEY: DRAFT.params}
  batch = {
    'encoder_input_tokens': INPUTS,
    'decoder_input_tokens': np.zeros((len(INPUTS), 8), np.int32),
  }
  predict = functools.partial(
    t5x_adapter.speculative_predict_batch,
    module,
    draft_module,
    params,
    batch,
    eos_id=1,
    decoder_params={'temperature': 0.0},
    num_decodes=num_decodes,
  )
  speculative = write(tmp_path / 'speculative.json', {1: 2})
  decodes, aux = predict(settings=settings.SpeculativeSettings(gamma='auto', profile=speculative))
  fixed, fixed_aux = predict(settings=settings.SpeculativeSettings(gamma=2))
  np.testing.assert_array_equal(decodes, fixed)
  np.testing.assert_array_equal(aux['batch_gamma'], [2] * len(INPUTS))
  np.testing.assert_array_equal(aux['iterations'], fixed_aux['iterations'])

  none = write(tmp_path / 'none.json', {1: 2, 4: 0})
  decodes, aux = predict(settings=settings.SpeculativeSettings(gamma='auto', profile=none))
  baseline = models.generate(TARGET, None, INPUTS, max_decode_len=8)
  np.testing.assert_array_equal(decodes, baseline.tokens)  # Greedy: the target's tokens.
  np.testing.assert_array_equal(aux['batch_gamma'], [0] * len(INPUTS))
  lengths = (np.asarray(baseline.tokens) != 0).sum(axis=1)
  np.testing.assert_array_equal(aux['emitted'], lengths)
  np.testing.assert_array_equal(aux['iterations'], lengths)
  np.testing.assert_array_equal(aux['drafted'], 0)
  with pytest.raises(ValueError, match="measured at {'greedy': True}"):
    predict(
      settings=settings.SpeculativeSettings(gamma='auto', profile=none),
      decoder_params={'temperature': 1.0, 'topk': 0},
    )
