"""speculative_t5x_lab.demo as a library: importing it leaves the command line to the importer
(absl's own flags, which `absl.app` defines, aside); a stale workdir gets a clear error."""

import functools

import jax
import numpy as np
import pytest

from speculative_t5x import run_settings
from testing_utils import python_output


def test_importing_the_demo_defines_no_flags():
  assert (
    python_output(
      'from absl import app, flags, logging; before = set(flags.FLAGS); '
      'from speculative_t5x_lab import demo; print(sorted(set(flags.FLAGS) - before))'
    )
    == '[]'
  )


def test_a_workdir_of_another_configuration_names_the_way_out(tmp_path):
  from speculative_t5x import checkpoints
  from speculative_t5x_lab import demo
  from speculative_t5x import network

  small = network.t5_1_1_config('tiny', vocab_size=64, emb_dim=32, num_heads=2, head_dim=16)
  checkpoints.save_params(tmp_path / 'model', network.random_params(small)[0], step=400)
  other = network.t5_1_1_config('tiny', vocab_size=64)
  with pytest.raises(ValueError, match='trained with another configuration.*new --workdir'):
    demo._restore_cached(str(tmp_path / 'model'), 400, other)


def _walltime_record(temperature, quality=None, **bleu):
  summary = dict(median=1.0, min=1.0, max=1.0)
  record = dict(
    kind='walltime',
    pair='p',
    task='t',
    emulated=False,
    temperature=temperature,
    gamma=3,
    batch_size=1,
    alpha=0.6,
    alpha_loop=0.6,
    c=0.05,
    verify_cost=1.5,
    tokens_per_call=2.5,
    ms_per_token_baseline=summary,
    ms_per_token_speculative=summary,
    speedup=summary,
    memory={},
    acceptance_by_position=[0.6, 0.5, 0.4],
    **bleu,
  )
  if quality:
    record['sampled_quality'] = quality
  return record


def test_sampled_quality_is_reported_as_mean_and_standard_error(capsys):
  """At T > 0 the report and the demo's table give BLEU and length as mean +- stderr over
  keys, with their difference in standard errors; greedy rows keep one BLEU each."""
  from speculative_t5x_lab import demo
  from speculative_t5x_lab import reports

  stats = lambda mean, stderr: dict(mean=mean, stderr=stderr, per_key=[mean] * 4)
  quality = dict(
    num_keys=4,
    num_examples=16,
    baseline=dict(bleu=stats(10.8, 0.5), length=stats(20.1, 0.3)),
    speculative=dict(bleu=stats(10.1, 0.6), length=stats(19.8, 0.4)),
    bleu_difference_in_stderr=-0.9,
  )
  records = [
    _walltime_record(0.0, bleu_baseline=6.9, bleu_speculative=6.9),
    _walltime_record(1.0, quality),
    dict(
      kind='machine',
      emulated=False,
      cpu='AMD EPYC',
      cpu_family='26',
      cores=2,
      bandwidth_gb_per_s=48.0,
      training_step_s=0.8,
      training_step_rows=16,
    ),
  ]
  markdown = reports.markdown_report(records)
  assert '| 6.9 / 6.9 |' in markdown and '| 10.8 ± 0.5 / 10.1 ± 0.6 |' in markdown
  assert '## Sampled quality (T > 0): samples of one distribution' in markdown
  assert '| 1.0 | 3 | 4 x 16 | 10.8 ± 0.5 | 10.1 ± 0.6 | -0.9 | 20.1 ± 0.3 | 19.8 ± 0.4 |' in (
    markdown
  )
  assert 'Machine: AMD EPYC (CPU family 26), 2 cores, 48.0 GB/s' in markdown
  demo.print_table(records)
  printed = capsys.readouterr().out
  assert '10.8+-0.5' in printed and 'diff -0.9 SE' in printed


def test_the_breakdown_says_which_part_is_mis_timed():
  """Rows whose parts miss the measured iteration by more than 10% name the suspect: the
  target's timing when the baseline's step misses too, else the speculative-only parts."""
  from speculative_t5x_lab import reports

  def row(gamma, measured, baseline_measured):
    parts = dict(draft_catch_up=0.1, draft_rollout=1.0, target_block=5.0, judge=0.1, emit=0.05)
    parts.update(encode=0.75)
    breakdown = dict(
      parts,
      parts_sum=7.0,
      measured=measured,
      unexplained=measured - 7.0,
      catch_up_rate=0.3,
      baseline_parts=4.0,
      baseline_measured=baseline_measured,
      baseline_unexplained=baseline_measured - 4.0,
    )
    return dict(
      _walltime_record(0.0, bleu_baseline=1.0, bleu_speculative=1.0),
      gamma=gamma,
      breakdown=breakdown,
    )

  markdown = reports.markdown_report([row(3, 7.2, 4.1), row(5, 10.0, 5.0), row(7, 10.0, 4.0)])
  assert 'within ±10% in 1 of 3 rows' in markdown
  assert (
    "gamma = 5: the measured iteration exceeds the parts by +30%; the baseline's one-token"
    in (markdown)
  )
  assert "gamma = 7: the measured iteration exceeds the parts by +30%; the baseline's step is" in (
    markdown
  )


def test_the_training_step_is_timed():
  from speculative_t5x_lab import demo
  from speculative_t5x import network

  config = network.t5_1_1_config('tiny', vocab_size=64, emb_dim=32, num_heads=2, head_dim=16)
  assert demo.training_step_seconds(config, batch_size=2, length=8, repetitions=2) > 0


def test_the_head_is_reported_beside_the_distilled_draft(capsys):
  """The demo's table sorts the head's rows beside the distilled draft's, at each
  temperature and gamma, with the share of outputs identical to the baseline's (greedy);
  the report names the head's training, its time and its held-out alpha."""
  from speculative_t5x_lab import demo
  from speculative_t5x_lab import reports

  def walltime(temperature, gamma, draft, tokens_per_call):
    return dict(
      _walltime_record(temperature, bleu_baseline=6.9, bleu_speculative=6.9),
      pair=f'target (47.9M) / {draft} (0.9M)',
      gamma=gamma,
      tokens_per_call=tokens_per_call,
      identical_outputs=1.0,
    )

  records = [
    walltime(0.0, 3, 'draft distilled for T=0', 2.7),
    walltime(0.0, 5, 'draft distilled for T=0', 3.3),
    walltime(0.0, 3, demo.HEAD_NAME, 1.8),
    walltime(0.0, 5, demo.HEAD_NAME, 2.1),
    dict(
      kind='head_training',
      pair=f'target / {demo.HEAD_NAME}',
      task='t',
      emulated=False,
      architecture='encoder-decoder',
      steps=100,
      training_seconds=321.0,
      curve=[dict(step=0, alpha=0.15, loss=8.8), dict(step=100, alpha=0.52, loss=4.7)],
    ),
  ]
  demo.print_table(records)
  rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
  assert [(row[1], row[2], row[6], row[-1]) for row in rows] == [
    ('3', 'distilled', '2.700', '1.000'),
    ('3', 'head', '1.800', '1.000'),
    ('5', 'distilled', '3.300', '1.000'),
    ('5', 'head', '2.100', '1.000'),
  ]
  markdown = reports.markdown_report(records)
  assert '## Feature head training (100 steps, 321 s)' in markdown
  assert 'T = 1: 0.150 at step 0, 0.520 at step 100.' in markdown


def _tiny_head_training(tmp_path):
  """(target, head config, `train_feature_head` bound to a tiny target and <tmp>/feature_head)."""
  from speculative_t5x import feature_head
  from speculative_t5x.training import train_feature_head
  from testing_utils import padded_inputs, tiny_model

  target = tiny_model(seed=0, vocab_size=24, layers=2)
  config = feature_head.config_for(target.config, emb_dim=16, head_dim=8, mlp_dim=32)
  inputs = padded_inputs(0, 8, 6, target.vocab_size)
  train = functools.partial(
    train_feature_head.train_feature_head,
    str(tmp_path / 'feature_head'),
    target,
    config,
    inputs,
    max_decode_len=4,
    batch_size=4,
  )
  return target, config, functools.partial(train, eval_inputs=inputs)


def test_a_trained_head_in_the_workdir_is_read_back_with_its_record(tmp_path):
  """`feature_head_draft` finds a head trained to the asked step (nothing retrained): the
  draft for the target and the record of its training from the model directory."""
  from speculative_t5x_lab import demo

  target, config, train = _tiny_head_training(tmp_path)
  trained = train(num_steps=2, eval_every=2, log_every=1)
  draft, record = demo.feature_head_draft(str(tmp_path), target, 2, 'unused', 'unused', 24)
  jax.tree.map(np.testing.assert_array_equal, draft.params, trained.params)
  assert draft.config == config
  assert record['steps'] == 2 and record['training_seconds'] > 0
  assert [r['step'] for r in record['curve']] == [0, 2]


def test_a_head_of_other_settings_in_the_workdir_names_the_way_out(tmp_path, monkeypatch):
  """A workdir's head trained with other settings (an earlier demo) is refused by
  `feature_head_draft` with the setting named and the way out: a new --workdir."""
  from speculative_t5x_lab import demo

  target, _, train = _tiny_head_training(tmp_path)
  train(num_steps=2)
  # The demo's gin call, here on the tiny target, resuming with another setting.
  monkeypatch.setattr(
    demo.gin_utils, 'call_configured', lambda *args: train(num_steps=4, data_passes=2)
  )
  with pytest.raises(ValueError, match='data_passes.*new --workdir'):
    demo.feature_head_draft(str(tmp_path), target, 4, 'unused', 'unused', 24)


def test_a_finished_head_of_another_recipe_is_refused_and_a_moved_workdir_is_not(
  tmp_path, monkeypatch, capsys
):
  """A finished run is not retrained, so the demo compares its recorded recipe (the gin
  files' bindings and its own settings) with the current one: the head of an earlier demo
  (here: its gin file bound EMBEDDING_INIT = False) is refused with the binding named and
  the way out; the same run in a moved workdir, or one from before recipes, is reused."""
  import json
  import shutil

  from speculative_t5x_lab import demo

  target, _, train = _tiny_head_training(tmp_path / 'a')
  monkeypatch.setattr(demo.gin_utils, 'call_configured', lambda *args: train(num_steps=2))
  head = lambda workdir: demo.feature_head_draft(str(workdir), target, 2, 'x', 'x', 24)
  head(tmp_path / 'a')
  recipe_file = tmp_path / 'a' / 'feature_head' / demo.RECIPE_FILE
  recipe = json.loads(recipe_file.read_text())
  assert 'EMBEDDING_INIT = True' in recipe['bindings'] and recipe['settings'] == {
    'VOCAB_SIZE': '24'
  }

  shutil.copytree(tmp_path / 'a', tmp_path / 'moved')
  jax.tree.map(
    np.testing.assert_array_equal,
    head(tmp_path / 'moved')[0].params,
    head(tmp_path / 'a')[0].params,
  )

  recipe['bindings'][recipe['bindings'].index('EMBEDDING_INIT = True')] = 'EMBEDDING_INIT = False'
  recipe_file.write_text(json.dumps(recipe))
  with pytest.raises(
    ValueError,
    match=r"another recipe.*\['EMBEDDING_INIT = False'\] then, \['EMBEDDING_INIT = True'\] now.*"
    r'new --workdir, or delete .*feature_head to train it again',
  ):
    head(tmp_path / 'a')

  recipe_file.unlink()
  capsys.readouterr()
  head(tmp_path / 'a')
  assert 'before the demo recorded recipes' in capsys.readouterr().out


def test_an_unfinished_distillation_of_other_settings_names_the_way_out(tmp_path, monkeypatch):
  """A workdir's unfinished distillation that `distill` refuses to resume (its settings differ,
  as the data passes of an earlier demo) gets the way out; without a run there, the error is
  `distill`'s own."""
  from speculative_t5x_lab import demo

  configured = demo.gin_utils.call_configured

  def refused(fn, *args):
    if fn.__name__ != 'distill':  # The draft's network config.
      return configured(fn, *args)
    raise ValueError('Refusing to resume: data_passes=(not recorded) (this run: 2).')

  monkeypatch.setattr(demo.gin_utils, 'call_configured', refused)
  distilled = lambda: demo.distilled_model(str(tmp_path), 150, 'forward_kl', 0.0, 'x', 'x', 24)
  with pytest.raises(ValueError, match=r'this run: 2\)\.$'):
    distilled()
  model_dir = tmp_path / 'gettext_draft_forward_kl_T0'
  run_settings.write(str(model_dir / run_settings.DISTILL_SETTINGS_FILE), {'data_passes': 1})
  with pytest.raises(ValueError, match='data_passes.*new --workdir.*delete'):
    distilled()


def test_the_table_says_where_greedy_alpha_is_in_outputs_cut_at_the_decode_length(capsys):
  """Where a quarter or more of a temperature's alpha tokens are in outputs cut without EOS,
  the table is followed by that share and alpha on each part, for the pair's draft and the
  head; below the share, nothing."""
  from speculative_t5x_lab import demo
  from speculative_t5x_lab import benchmark

  def alpha(temperature, draft, cut_share, alpha_cut, alpha_ended):
    return dict(
      kind='alpha',
      pair='target (47.9M) / draft distilled for T=0 (2.9M)',
      task='t',
      emulated=False,
      architecture='encoder-decoder',
      temperature=temperature,
      draft=draft,
      alpha=0.5,
      alpha_stderr=0.01,
      num_tokens=10_000,
      worst_tokens=[],
      cut_share=cut_share,
      alpha_cut=alpha_cut,
      alpha_ended=alpha_ended,
    )

  head = f'target / {demo.HEAD_NAME} (2.4M)'
  demo.print_table(
    [
      alpha(0.0, benchmark.PAIR_DRAFT, 0.88, 0.825, 0.607),
      alpha(0.0, head, 0.88, 0.542, 0.586),
      alpha(0.0, '2-gram', 0.88, 0.131, 0.362),
      alpha(1.0, benchmark.PAIR_DRAFT, 0.11, 0.732, 0.718),
    ]
  )
  notes = capsys.readouterr().out.splitlines()[1:]
  assert notes == [
    'T=0: 88% of the alpha tokens are in target outputs cut at the decode length without EOS '
    '(the target repeating itself); alpha on those / on the outputs that end: distilled '
    '0.825 / 0.607, head 0.542 / 0.586.'
  ]


def test_step_headers_say_when_each_step_began(monkeypatch, capsys):
  """Each header carries the seconds since the demo began, so a first run's log shows where
  its time went (training stages have no progress lines of their own)."""
  import time

  from speculative_t5x_lab import demo

  monkeypatch.setattr(demo, '_started', time.perf_counter() - 125.2)
  demo._step('Training gettext_target')
  assert capsys.readouterr().out == '\n== [ 125 s] Training gettext_target\n'


def test_a_finished_stage_is_read_beside_its_writer_and_one_to_train_is_refused(tmp_path):
  """One writer per stage: training a workdir's run and writing its recipe hold the model
  directory's writer lock; checking a finished run takes none, so it works while another
  process holds the lock, and a run that must train is refused with the holder named."""
  import json
  import os

  from speculative_t5x import output_lock
  from speculative_t5x_lab import demo
  import testing_utils

  model_dir = tmp_path / 'gettext_draft'
  gin_files = ['configs/runs/train.gin']
  held_while_training = []

  def train(bindings):
    held_while_training.append(output_lock.read_holder(model_dir))
    (model_dir / '4').mkdir()  # The checkpoint of step 4.

  def check(steps, run=train):
    demo._train_or_check(str(model_dir), steps, gin_files, {'VOCAB_SIZE': 24}, {}, run)

  check(4)
  (holder,) = held_while_training
  assert holder['job'] == demo.JOB and holder['pid'] == os.getpid()
  assert sorted(os.listdir(model_dir)) == ['4', demo.RECIPE_FILE]  # The lock is released.
  recipe = (model_dir / demo.RECIPE_FILE).read_text()

  def must_not_train(bindings):
    raise AssertionError('the demo trained while another process held the lock')

  with testing_utils.lock_held_elsewhere(model_dir) as other:
    check(4, must_not_train)  # Finished: its recipe is checked, without the lock.
    with pytest.raises(output_lock.OutputLockedError) as error:
      check(8, must_not_train)  # Not trained to 8 steps: this demo would write.
  assert f'{model_dir} is being written by another job: test holder, process {other} ' in str(
    error.value
  )
  assert (model_dir / demo.RECIPE_FILE).read_text() == recipe
  assert json.loads(recipe)['settings'] == {'VOCAB_SIZE': '24'}


def test_the_corpus_and_vocabulary_are_built_holding_their_locks_and_read_without(
  tmp_path, monkeypatch
):
  import os

  from speculative_t5x import output_lock
  from speculative_t5x.data import tasks_core
  from speculative_t5x_lab import demo
  import testing_utils

  corpus_dir, vocabulary_dir = tmp_path / 'corpus', tmp_path / 'vocabulary'
  holders = {}

  def build_corpus(output_dir):
    holders['corpus'] = output_lock.read_holder(output_dir)
    for split in ('train', 'validation', 'test'):
      (corpus_dir / f'{split}.tsv').write_text('a\tb\n')
    return 'built'

  def train_vocabulary(texts, prefix, size):
    holders['vocabulary'] = output_lock.read_holder(os.path.dirname(prefix))
    with open(prefix + '.model', 'w') as f:
      f.write(' '.join(texts))

  monkeypatch.setattr(demo.corpora, 'build_gettext_corpus', build_corpus)
  monkeypatch.setattr(tasks_core, 'train_sentencepiece_model', train_vocabulary)
  # Another job builds the corpus: this demo stops before building anything.
  with testing_utils.lock_held_elsewhere(corpus_dir) as other:
    with pytest.raises(output_lock.OutputLockedError, match=f'process {other} '):
      demo.prepare_data(str(tmp_path), 24)
  assert not holders

  paths = demo.prepare_data(str(tmp_path), 24)
  assert paths == (str(corpus_dir), str(vocabulary_dir / 'spm_24.model'))
  assert {stage: (r['job'], r['pid']) for stage, r in holders.items()} == {
    'corpus': (demo.JOB, os.getpid()),
    'vocabulary': (demo.JOB, os.getpid()),
  }
  assert not (corpus_dir / output_lock.LOCK_FILE).exists()
  assert not (vocabulary_dir / output_lock.LOCK_FILE).exists()
  # Built: read while other processes hold both locks.
  holders.clear()
  with testing_utils.lock_held_elsewhere(corpus_dir):
    with testing_utils.lock_held_elsewhere(vocabulary_dir):
      assert demo.prepare_data(str(tmp_path), 24) == paths
  assert not holders


def _demo_args(**overrides):
  """The demo's flags at their defaults, as `stage_estimates` reads them."""
  import types

  from speculative_t5x_lab import demo

  args = dict(
    vocab_size=4000,
    target_steps=demo.TARGET_STEPS,
    draft_steps=demo.DRAFT_STEPS,
    distill_steps=[str(steps) for steps in demo.DISTILL_STEPS],
    distill_divergence='forward_kl',
    extras=False,
    head_steps=demo.HEAD_STEPS,
    gammas=None,
    batch_sizes=None,
    full_sweep=False,
    repetitions=3,
    num_examples=16,
    remeasure=False,
    peers=True,
  )
  return types.SimpleNamespace(**{**args, **overrides})


def test_a_first_run_is_estimated_stage_by_stage_and_a_cached_stage_is_skipped(tmp_path):
  from speculative_t5x_lab import demo

  distillations = ['distillation for T=0', 'distillation for T=1']
  stages = ['data', 'gettext_target', 'gettext_draft', *distillations, 'benchmark', 'peers']
  first = demo.stage_estimates(_demo_args(), str(tmp_path), step_s=2.0)
  assert list(first) == stages and all(seconds > 0 for seconds in first.values())
  # Twice the training step, twice every estimate.
  slower = demo.stage_estimates(_demo_args(), str(tmp_path), step_s=4.0)
  assert slower == pytest.approx({stage: 2 * seconds for stage, seconds in first.items()})

  extras = demo.stage_estimates(_demo_args(extras=True), str(tmp_path), step_s=2.0)
  assert list(extras) == stages[:5] + ['feature head'] + stages[5:]
  assert extras['benchmark'] > first['benchmark']  # The head's passes, its alpha.

  (tmp_path / 'corpus').mkdir()
  (tmp_path / 'corpus' / 'test.tsv').write_text('')
  (tmp_path / 'vocabulary').mkdir()
  (tmp_path / 'vocabulary' / 'spm_4000.model').write_text('')
  for directory, steps in [
    ('gettext_target', demo.TARGET_STEPS),
    ('gettext_draft', demo.DRAFT_STEPS),
    ('gettext_draft_forward_kl_T0', demo.DISTILL_STEPS[0]),
    ('gettext_draft_forward_kl_T1', demo.DISTILL_STEPS[1]),
  ]:
    (tmp_path / directory / str(steps)).mkdir(parents=True)
  second = demo.stage_estimates(_demo_args(), str(tmp_path), step_s=2.0)
  assert list(second) == ['benchmark', 'peers']
  assert second['benchmark'] < first['benchmark']  # alpha and quality from the result cache.
  longer = demo.stage_estimates(
    _demo_args(distill_steps=['300', str(demo.DISTILL_STEPS[1])]), str(tmp_path), step_s=2.0
  )
  assert list(longer) == ['distillation for T=0', 'benchmark', 'peers']


@pytest.mark.parametrize('step_s', [0.8, 2.3])
def test_a_run_estimated_beyond_its_budget_says_so_at_the_start(tmp_path, capsys, step_s):
  """The budget scales with the machine's training step as the estimates do, so a short run
  fits it on any machine and a long one (--extras with a long head) does not, and says by
  how much."""
  from speculative_t5x_lab import demo

  short = _demo_args(target_steps=10, draft_steps=10, distill_steps=['10', '10'])
  demo._start_schedule(short, str(tmp_path), step_s)
  printed = capsys.readouterr().out
  assert printed.startswith('Estimate on this machine: ') and 'a first run' in printed
  assert 'longer than the budget' not in printed

  demo._start_schedule(_demo_args(extras=True, head_steps=2000), str(tmp_path), step_s)
  assert 'This run will take longer than the budget by about' in capsys.readouterr().out


def test_each_stage_header_says_how_long_the_run_has_left(monkeypatch, capsys):
  from speculative_t5x_lab import demo

  monkeypatch.setattr(demo, '_schedule', {'gettext_target': 300.0, 'benchmark': 120.0})
  demo._step('Training gettext_target', stage='gettext_target')
  demo._step('Benchmarking', stage='benchmark')
  lines = [line for line in capsys.readouterr().out.splitlines() if line]
  assert lines[0].endswith('Training gettext_target (about 7.0 min left)')
  assert lines[1].endswith('Benchmarking (about 2.0 min left)')
