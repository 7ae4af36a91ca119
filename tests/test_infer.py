"""Tests for speculative_t5x.infer: outputs, exactness, resumption, errors, sharding.

The fixture pair is two T5 1.1 'tiny' networks (configs/models/tiny.gin, a
pair through configs/pairs/pair.gin): a target with random weights, its EOS
logit scaled up so that decodes end at various lengths, and as the draft a
perturbed copy of it (alpha ~ 0.5: iterations accept some tokens and reject
others), both saved as checkpoints. The task is a TSV task
(configs/tasks/tsv.gin) with a SentencePiece vocabulary trained here. The
command-line tests run `python -m speculative_t5x.infer` with those gin files.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from speculative_t5x import checkpoints
from speculative_t5x import gin_utils
from speculative_t5x import infer
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import output_lock
from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core
import testing_utils
from testing_utils import NOUNS, PAIRS as PHRASE_PAIRS, VERBS, decoded_lengths

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# testing_utils' phrases, 30 of its 36: batches of 4 leave a partial one.
PAIRS = PHRASE_PAIRS[:30]
PREFIX = 'translate English to German: '
VOCAB_SIZE = 64
TASK_NAME = 'speculative_t5x:infer_test_fixture'
FEATURE_LENGTHS = {'inputs': 40, 'targets': 16}
BATCH_SIZE = 4
EOS_ID = 1


@pytest.fixture(scope='module')
def fixture(tmp_path_factory):
  """Paths of the task files and checkpoints, the registered task and the models."""
  directory = tmp_path_factory.mktemp('infer')
  test_tsv = str(directory / 'test.tsv')
  with open(test_tsv, 'w', encoding='utf-8') as f:
    f.writelines(f'{source}\t{target}\n' for source, target in PAIRS)
  texts = [text for pair in PAIRS for text in pair] + [PREFIX] * 4
  vocabulary = tasks.train_sentencepiece(
    texts, str(directory / 'spm'), VOCAB_SIZE, character_coverage=1.0
  )
  task = tasks.register_tsv_task(
    TASK_NAME, {'test': test_tsv}, vocabulary, extra_ids=0, prefix=PREFIX
  )
  config = gin_utils.model_config('tiny', VOCAB_SIZE)  # configs/models/tiny.gin.
  params = jax.tree_util.tree_map(np.array, models.random_model(config, seed=1).params)
  params['decoder']['logits_dense']['kernel'][:, EOS_ID] *= 1.3
  target = models.Model(config, params)
  rng = np.random.default_rng(2)
  draft = models.Model(
    config,
    jax.tree_util.tree_map(
      lambda x: x + 0.15 * x.std() * rng.standard_normal(x.shape).astype(np.float32), target.params
    ),
  )
  checkpoints.save_params(directory / 'target', target.params)
  checkpoints.save_params(directory / 'draft', draft.params)
  return dict(
    directory=directory,
    test_tsv=test_tsv,
    vocabulary=str(directory / 'spm.model'),
    task=task,
    target=target,
    draft=draft,
  )


def _infer(fixture, output_dir, **overrides):
  kwargs = dict(
    target=fixture['target'],
    draft=fixture['draft'],
    task=fixture['task'],
    feature_lengths=FEATURE_LENGTHS,
    output_dir=str(output_dir),
    batch_size=BATCH_SIZE,
    gamma=3,
    progress=False,
  )
  kwargs.update(overrides)
  return infer.infer(**kwargs)


def _records_path(output_dir):
  return os.path.join(str(output_dir), f'{TASK_NAME}-test.jsonl')


def _read(output_dir):
  with open(_records_path(output_dir), 'rb') as f:
    return f.read()


@pytest.fixture(scope='module')
def greedy_runs(fixture):
  """Uninterrupted greedy runs: {'speculative': summary, 'baseline': summary, ..._dir}."""
  directory = fixture['directory']
  speculative = _infer(fixture, directory / 'speculative')
  baseline = _infer(fixture, directory / 'baseline', draft=None)
  return dict(
    speculative=speculative,
    baseline=baseline,
    speculative_dir=directory / 'speculative',
    baseline_dir=directory / 'baseline',
  )


def _cli(fixture, output_dir, *extra):
  return [
    sys.executable,
    '-m',
    'speculative_t5x.infer',
    '--gin_file=configs/models/tiny.gin',
    '--gin_file=configs/pairs/pair.gin',
    '--gin_file=configs/tasks/tsv.gin',
    '--gin_file=configs/runs/infer.gin',
    f"--gin.CHECKPOINT_PATH='{fixture['directory'] / 'target'}'",
    f"--gin.DRAFT_CHECKPOINT_PATH='{fixture['directory'] / 'draft'}'",
    f'--gin.VOCAB_SIZE={VOCAB_SIZE}',
    f"--gin.TSV_FILES={{'test': '{fixture['test_tsv']}'}}",
    f"--gin.VOCABULARY='{fixture['vocabulary']}'",
    f"--gin.TASK_NAME='{TASK_NAME}'",
    f"--gin.PREFIX='{PREFIX}'",
    f'--gin.TASK_FEATURE_LENGTHS={FEATURE_LENGTHS}',
    f"--gin.INFER_OUTPUT_DIR='{output_dir}'",
    f'--gin.BATCH_SIZE={BATCH_SIZE}',
    '--gin.GAMMA=3',
    *extra,
  ]


def _run_main_in_process(command):
  """Runs a `_cli` command's main in this process (gin parsed from its flags)."""
  args = gin_utils.rewrite_gin_args(command[3:])
  files = [a.split('=', 1)[1] for a in args if a.startswith('--gin_file=')]
  bindings = [a.split('=', 1)[1] for a in args if a.startswith('--gin_bindings=')]
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags([], files, bindings)
    infer.main(['infer'])
  finally:
    gin.clear_config()


def _records(output_dir):
  return [json.loads(line) for line in _read(output_dir).decode().splitlines()]


def _tokens(text, vocabulary):
  return vocabulary.encode(text) + [EOS_ID]


def test_outputs_are_complete_and_greedy_speculative_equals_baseline(fixture, greedy_runs):
  speculative, baseline = (
    _records(greedy_runs['speculative_dir']),
    _records(greedy_runs['baseline_dir']),
  )
  assert [r['index'] for r in speculative] == [r['index'] for r in baseline] == list(range(30))
  assert [r['inputs'] for r in speculative] == [PREFIX + source for source, _ in PAIRS]
  assert [r['targets'] for r in speculative] == [target for _, target in PAIRS]
  assert [r['prediction'] for r in speculative] == [r['prediction'] for r in baseline]
  assert [r['emitted'] for r in speculative] == [r['emitted'] for r in baseline]

  # The baseline, decoded here directly from the tokenized inputs, in order.
  vocabulary = fixture['task'].output_features['targets'].vocabulary
  inputs = np.zeros((len(PAIRS), FEATURE_LENGTHS['inputs']), np.int32)
  for row, (source, _) in enumerate(PAIRS):
    tokens = _tokens(PREFIX + source, vocabulary)
    inputs[row, : len(tokens)] = tokens
  direct = models.generate(
    fixture['target'], None, inputs, max_decode_len=FEATURE_LENGTHS['targets']
  ).tokens
  assert [r['prediction'] for r in baseline] == [vocabulary.decode(row.tolist()) for row in direct]
  assert [r['emitted'] for r in baseline] == decoded_lengths(direct, EOS_ID).tolist()
  assert [r['truncated'] for r in baseline] == [EOS_ID not in row for row in direct]
  assert 0 < sum(r['truncated'] for r in baseline) < len(PAIRS)  # Both kinds are covered.

  for record in baseline:
    assert (record['iterations'], record['accepted'], record['score']) == (
      record['emitted'],
      0,
      0.0,
    )
  for record in speculative:
    assert record['score'] == 0.0
    assert (
      1 <= record['iterations'] <= record['emitted'] <= record['accepted'] + record['iterations']
    )
  assert sum(r['accepted'] for r in speculative) > 0

  summary = greedy_runs['speculative']
  with open(_records_path(greedy_runs['speculative_dir'])[: -len('.jsonl')] + '.summary.json') as f:
    assert json.load(f) == summary
  tokens = sum(r['emitted'] for r in speculative)
  batches = {
    r['index'] // BATCH_SIZE: (r['batch_beta_sum'], r['batch_beta_count']) for r in speculative
  }
  assert len(batches) == 8  # 7 full batches and a padded one.
  assert summary['examples'] == summary['decoded_examples'] == 30
  assert summary['tokens'] == summary['decoded_tokens'] == tokens
  assert summary['alpha'] == pytest.approx(
    sum(s for s, _ in batches.values()) / sum(c for _, c in batches.values())
  )
  assert 0.3 < summary['alpha'] < 0.95
  assert summary['tokens_per_target_call'] == pytest.approx(
    tokens / sum(r['iterations'] for r in speculative)
  )
  assert summary['tokens_per_target_call'] > 1.2
  assert summary['tokens_per_second'] > 0 and summary['mesh'] == {'data': 1, 'model': 1}
  bleu = tasks_core.bleu([t for _, t in PAIRS], [r['prediction'] for r in speculative])['bleu']
  assert summary['metrics'] == {'bleu': pytest.approx(bleu)}
  assert greedy_runs['baseline']['metrics'] == summary['metrics']
  assert (greedy_runs['baseline']['alpha'], greedy_runs['baseline']['gamma']) == (None, None)
  assert greedy_runs['baseline']['tokens_per_target_call'] == 1.0


def test_a_finished_run_reruns_to_nothing(fixture, greedy_runs):
  before = _read(greedy_runs['speculative_dir'])
  summary = _infer(fixture, greedy_runs['speculative_dir'])
  assert _read(greedy_runs['speculative_dir']) == before
  assert summary['decoded_examples'] == 0 and summary['examples'] == 30
  assert summary['metrics'] == greedy_runs['speculative']['metrics']


@pytest.mark.slow  # Resuming runs fast in test_a_longer_run_continues_a_shorter_one.
def test_sampled_run_resumed_inside_a_batch_equals_the_uninterrupted_run(fixture, tmp_path):
  sampling = dict(temperature=1.0, seed=3)
  _infer(fixture, tmp_path / 'whole', **sampling)
  whole = _read(tmp_path / 'whole')
  assert any(record['score'] < 0 for record in _records(tmp_path / 'whole'))
  # A run stopped after 10 examples, inside the third batch: the resumed run
  # decodes that batch again with its own key and writes only its last two rows.
  os.makedirs(tmp_path / 'resumed')
  for suffix in ('.jsonl', '.settings.json'):
    with open(_records_path(tmp_path / 'whole')[: -len('.jsonl')] + suffix, 'rb') as f:
      data = f.read()
    if suffix == '.jsonl':
      data = b''.join(data.splitlines(keepends=True)[:10])
    with open(_records_path(tmp_path / 'resumed')[: -len('.jsonl')] + suffix, 'wb') as f:
      f.write(data)
  assert _infer(fixture, tmp_path / 'resumed', **sampling)['decoded_examples'] == 20
  assert _read(tmp_path / 'resumed') == whole


def test_a_longer_run_continues_a_shorter_one(fixture, greedy_runs, tmp_path):
  assert _infer(fixture, tmp_path, num_examples=10)['examples'] == 10
  assert _infer(fixture, tmp_path)['decoded_examples'] == 20
  # The rows of the shorter run's last, padded batch keep that batch's beta
  # statistics; everything else equals the uninterrupted run.
  records, reference = _records(tmp_path), _records(greedy_runs['speculative_dir'])
  for record in records[8:10] + reference[8:10]:
    del record['batch_beta_sum'], record['batch_beta_count']
  assert records == reference


@pytest.mark.slow
def test_killed_run_resumes_without_losing_or_repeating_examples(fixture, greedy_runs, tmp_path):
  output_dir = tmp_path / 'killed'
  command = _cli(fixture, output_dir)
  # Killed once its first batch is written: mid-run by construction.
  killed = testing_utils.main_killed_at('speculative_t5x.infer', 'infer', 'after_batch', at=1)
  with open(tmp_path / 'stderr', 'wb') as stderr:  # A file: a full pipe would block it.
    process = subprocess.run(
      killed + command[3:], cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr
    )
  assert process.returncode == -signal.SIGKILL, (tmp_path / 'stderr').read_text()[-3000:]
  records_path = _records_path(output_dir)
  written = _read(output_dir)
  assert 0 < written.count(b'\n') < len(PAIRS), 'the run was not killed mid-way'
  # A write cut short by the kill: half a record at the end of the file.
  complete = written[: written.rfind(b'\n') + 1]
  next_record = _read(greedy_runs['speculative_dir']).split(b'\n')[complete.count(b'\n')]
  with open(records_path, 'wb') as f:
    f.write(complete + next_record[: len(next_record) // 2])

  # The killed run's writer lock is left behind; the next run takes it over.
  lock_file = output_dir / output_lock.LOCK_FILE
  left = json.loads(lock_file.read_text())
  assert left['job'] == 'speculative_t5x.infer' and left['pid'] != os.getpid()
  _run_main_in_process(command)
  assert _read(output_dir) == _read(greedy_runs['speculative_dir'])
  settings = lambda d: open(_records_path(d)[: -len('.jsonl')] + '.settings.json').read()
  assert settings(output_dir) == settings(greedy_runs['speculative_dir'])
  assert not lock_file.exists()


def test_a_second_writer_is_refused_before_any_computation(fixture, tmp_path, monkeypatch):
  output_dir = tmp_path / 'out'

  def compute(*args, **kwargs):
    raise AssertionError('a refused run computed')

  with testing_utils.lock_held_elsewhere(output_dir) as holder:
    with monkeypatch.context() as patch:
      patch.setattr(infer, '_check_arguments', compute)
      with pytest.raises(output_lock.OutputLockedError) as error:
        _infer(fixture, output_dir)
    message = str(error.value)
    assert f'{output_dir} is being written by another job: test holder, process {holder} ' in (
      message
    )
    assert 'writing since' in message and f'kill {holder}' in message
    # The command line is refused before gin loads the checkpoints (a missing one here).
    missing = f"--gin.CHECKPOINT_PATH='{tmp_path / 'missing'}'"
    with pytest.raises(output_lock.OutputLockedError, match=f'process {holder} '):
      _run_main_in_process(_cli(fixture, output_dir, missing))
  assert os.listdir(output_dir) == []
  # Once it ends, the run proceeds.
  assert _infer(fixture, output_dir, num_examples=BATCH_SIZE)['decoded_examples'] == BATCH_SIZE


def test_records_two_writers_interleaved_keep_their_consistent_prefix(
  fixture, greedy_runs, tmp_path, caplog
):
  """Two runs started together before the writer lock: each appended batch by batch."""
  reference = _read(greedy_runs['speculative_dir'])
  lines = reference.splitlines(keepends=True)
  # The first run's two batches, the second run's first, the first run's third, ...
  interleaved = lines[:8] + lines[:4] + lines[8:12] + lines[4:8] + [lines[12][:9]]
  output_dir = tmp_path / 'interleaved'
  os.makedirs(output_dir)
  with open(_records_path(output_dir), 'wb') as f:
    f.write(b''.join(interleaved))
  settings_file = _records_path(greedy_runs['speculative_dir'])[: -len('.jsonl')] + '.settings.json'
  shutil.copy(settings_file, output_dir)

  assert (
    infer.read_records(_records_path(output_dir)) == _records(greedy_runs['speculative_dir'])[:8]
  )
  with caplog.at_level('WARNING'):
    summary = _infer(fixture, output_dir)
  assert summary['decoded_examples'] == len(PAIRS) - 8
  assert _read(output_dir) == reference
  (aside,) = [name for name in os.listdir(output_dir) if '.jsonl.dropped-' in name]
  assert (output_dir / aside).read_bytes() == b''.join(interleaved[8:])
  assert (
    f'{_records_path(output_dir)} is damaged: line 9 holds example 0, expected 8. Keeping its '
    'first 8 records (examples 0-7, lines 1-8) and dropping lines 9-21 (13 lines, '
  ) in caplog.text


@pytest.mark.slow
def test_two_runs_started_together_on_one_output_one_proceeds(fixture, greedy_runs, tmp_path):
  output_dir = tmp_path / 'out'
  results = testing_utils.run_writers_together(
    'speculative_t5x.infer', _cli(fixture, output_dir)[3:], tmp_path
  )
  finished = [result for result in results if result[1] == 0]
  assert len(finished) == 1, [result[2][-3000:] for result in results]
  ((winner, _, _),) = finished
  ((loser, code, stderr),) = [result for result in results if result[1] != 0]
  assert 'OutputLockedError' in stderr, stderr[-3000:]
  assert (
    f'{output_dir} is being written by another job: speculative_t5x.infer, process {winner} '
    in (stderr)
  )
  # The survivor's output is a lone run's.
  assert _read(output_dir) == _read(greedy_runs['speculative_dir'])
  assert sorted(os.listdir(output_dir)) == sorted(os.listdir(greedy_runs['speculative_dir']))


_SHARDED_SCRIPT = """
import json, sys
import jax
from jax.sharding import PartitionSpec as P
from speculative_t5x import gin_utils, infer, models, network, partitioning
import gin

assert jax.device_count() == 8, jax.devices()
args = gin_utils.rewrite_gin_args(sys.argv[1:])
gin_utils.parse_gin_flags([], [a.split('=', 1)[1] for a in args if a.startswith('--gin_file=')],
                          [a.split('=', 1)[1] for a in args if a.startswith('--gin_bindings=')])
infer.main(['infer'])
# Where the target's parameters went on the 2 x 4 mesh.
target = gin.get_configurable(models.load_model)(
    gin.get_configurable(network.T5Config)(), gin.query_parameter('%CHECKPOINT_PATH'))
placed = infer.place_on_mesh(target, partitioning.make_mesh(2, 4))
print(json.dumps({
    'logits': list(placed.params['decoder']['logits_dense']['kernel'].sharding.spec),
    'query': list(placed.params['encoder']['layers_0']['attention']['query']['kernel'].sharding.spec),
}))
"""


@pytest.mark.slow
def test_sharded_inference_on_a_2x4_mesh_equals_unsharded(fixture, greedy_runs, tmp_path):
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=' '.join(
      [os.environ.get('XLA_FLAGS', ''), '--xla_force_host_platform_device_count=8']
    ),
  )
  command = _cli(
    fixture,
    tmp_path / 'sharded',
    '--gin.infer.infer.num_partitions=4',
    '--gin.infer.infer.num_examples=12',
  )
  result = subprocess.run(
    [sys.executable, '-c', _SHARDED_SCRIPT, *command[3:]],
    cwd=REPO,
    env=env,
    capture_output=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr.decode()[-5000:]
  placement = json.loads(result.stdout.decode().splitlines()[-1])
  assert placement == {'logits': [None, 'model'], 'query': [None, 'model']}
  with open(_records_path(tmp_path / 'sharded')[: -len('.jsonl')] + '.summary.json') as f:
    assert json.load(f)['mesh'] == {'data': 2, 'model': 4}
  sharded = _records(tmp_path / 'sharded')
  unsharded = _records(greedy_runs['speculative_dir'])[: len(sharded)]
  assert len(sharded) == 12
  beta = lambda records: [r.pop('batch_beta_sum') for r in records]
  assert beta(sharded) == pytest.approx(beta(unsharded), rel=1e-5)
  assert sharded == unsharded


def test_bad_configurations_name_the_problem(fixture, greedy_runs, tmp_path):
  with pytest.raises(FileNotFoundError, match='No checkpoint at .*missing_draft'):
    _run_main_in_process(
      _cli(fixture, tmp_path / 'a', f"--gin.DRAFT_CHECKPOINT_PATH='{tmp_path / 'missing_draft'}'")
    )
  other_vocabulary = models.random_model(
    network.T5Config(**{**fixture['target'].config.__dict__, 'vocab_size': 2 * VOCAB_SIZE})
  )
  with pytest.raises(ValueError, match='one shared vocabulary'):
    _infer(fixture, tmp_path / 'b', draft=other_vocabulary)
  too_small = models.random_model(
    network.T5Config(**{**fixture['target'].config.__dict__, 'vocab_size': VOCAB_SIZE // 2})
  )
  with pytest.raises(ValueError, match='vocabulary of 64 ids but the target has vocab_size=32'):
    _infer(fixture, tmp_path / 'c', target=too_small, draft=None)
  with pytest.raises(
    ValueError,
    match=r"30 of the 30 examples .* than TASK_FEATURE_LENGTHS\['inputs'\] "
    r'= 8: example 0 has \d+ .*Raise TASK_FEATURE_LENGTHS',
  ):
    _infer(fixture, tmp_path / 'd', feature_lengths={'inputs': 8, 'targets': 16})
  with pytest.raises(ValueError, match=r'gamma \(or a tree\) is required'):
    _infer(fixture, tmp_path / 'e', gamma=None)
  with pytest.raises(ValueError, match=r"other settings \(differing: \['seed'\]"):
    _infer(fixture, greedy_runs['speculative_dir'], seed=1)
  # A damaged file reads as its consistent prefix, unchanged (a reader does not cut it).
  damaged = tmp_path / 'damaged.jsonl'
  damaged.write_text('{"index": 0}\nnot json\n{"index": 2}\n')
  assert infer.read_records(str(damaged)) == [{'index': 0}]
  assert damaged.read_text() == '{"index": 0}\nnot json\n{"index": 2}\n'
  assert os.listdir(tmp_path / 'd') == []  # A run that fails its checks writes nothing.


def test_a_damaged_checkpoint_file_is_named_as_the_target_or_the_draft(fixture, tmp_path):
  for model, macro in (('target', 'CHECKPOINT_PATH'), ('draft', 'DRAFT_CHECKPOINT_PATH')):
    damaged_dir = tmp_path / model
    shutil.copytree(fixture['directory'] / model, damaged_dir)
    metadata = damaged_dir / '0' / 'params' / '_METADATA'
    metadata.write_bytes(metadata.read_bytes()[:20])
    with pytest.raises(
      checkpoints.CorruptCheckpointError,
      match=f"The {model} checkpoint \\({macro} = '{damaged_dir}'\\) is damaged: "
      f'{metadata} cannot be read as orbax checkpoint metadata',
    ):
      _run_main_in_process(_cli(fixture, tmp_path / 'output', f"--gin.{macro}='{damaged_dir}'"))


def test_benchmark_reads_a_task_split_as_the_tsv_reader_does(fixture):
  """tasks.task_inputs (seqio, for TFDS tasks) == benchmark.tsv_inputs (no TensorFlow)."""
  from speculative_t5x_lab import benchmark

  task_rows, task_references = tasks.task_inputs(fixture['task'], 'test')
  tsv_rows, tsv_references = benchmark.tsv_inputs(
    fixture['test_tsv'], fixture['vocabulary'], prefix=PREFIX
  )
  assert task_rows.shape == (len(PAIRS), tsv_rows.shape[1])
  np.testing.assert_array_equal(task_rows, tsv_rows)
  assert task_references == tsv_references == [target for _, target in PAIRS]
  with pytest.raises(ValueError, match='more than the input length 3'):
    tasks.task_inputs(fixture['task'], 'test', input_length=3)


# ------------------------------------------------------------------------------
# Decoder-only pairs: prefix-LM tasks, the prompt prefilled, the targets generated.
# ------------------------------------------------------------------------------
LM_TASK_NAME = 'speculative_t5x:infer_test_english_lm'
LM_TSV_TASK_NAME = 'speculative_t5x:infer_test_prompts_with_eos'
LM_SENTENCES = [
  f'{verb} {noun} and then {noun_de}.' for (verb, _), (noun, noun_de) in zip(VERBS, NOUNS)
]
LM_FEATURE_LENGTHS = {'inputs': 16, 'targets': 10}


def _decoder_only_config(**overrides):
  """A tiny configs/pairs/gpt_like.gin network (single-GELU MLP, untied logits), float32."""
  fields = dict(
    vocab_size=VOCAB_SIZE,
    dtype='float32',
    emb_dim=32,
    num_heads=2,
    num_layers=2,
    head_dim=16,
    mlp_dim=64,
    mlp_activations=('gelu',),
    dropout_rate=0.0,
    logits_via_embedding=False,
  )
  return network.DecoderOnlyConfig(**{**fields, **overrides})


@pytest.fixture(scope='module')
def lm_fixture(fixture):
  """An English-LM prefix task (prompts without EOS), a TSV task (prompts with EOS), a pair."""
  directory = fixture['directory'] / 'lm'
  directory.mkdir()
  for split in ('train', 'validation', 'test'):
    (directory / f'{split}.txt').write_text(''.join(s + '\n' for s in LM_SENTENCES))
  lm_task = tasks.register_english_lm_task(
    str(directory), fixture['vocabulary'], prompt_words=2, name=LM_TASK_NAME
  )
  tsv_task = tasks.register_tsv_task(
    LM_TSV_TASK_NAME, {'test': fixture['test_tsv']}, fixture['vocabulary'], extra_ids=0, prefix=''
  )
  config = _decoder_only_config()
  params = jax.tree_util.tree_map(np.array, models.random_model(config, seed=3).params)
  params['decoder']['logits_dense']['kernel'][:, EOS_ID] *= 1.3
  rng = np.random.default_rng(4)
  draft_params = jax.tree_util.tree_map(
    lambda x: x + 0.15 * x.std() * rng.standard_normal(x.shape).astype(np.float32), params
  )
  checkpoints.save_params(directory / 'target', params)
  checkpoints.save_params(directory / 'draft', draft_params)
  return dict(
    directory=directory,
    lm_task=lm_task,
    tsv_task=tsv_task,
    params=params,
    draft_params=draft_params,
    config=config,
  )


def _prompts(texts, vocabulary, eos):
  """int32 [N, Lin]: each text tokenized (with EOS if `eos`), 0-padded."""
  rows = np.zeros((len(texts), LM_FEATURE_LENGTHS['inputs']), np.int32)
  for row, text in enumerate(texts):
    tokens = vocabulary.encode(text) + ([EOS_ID] if eos else [])
    rows[row, : len(tokens)] = tokens
  return rows


def test_decoder_only_prefix_lm_outputs_equal_generate(lm_fixture, tmp_path):
  config = lm_fixture['config']
  target = models.Model(config, lm_fixture['params'], inputs_bidirectional_attention=True)
  draft = models.Model(config, lm_fixture['draft_params'], inputs_bidirectional_attention=True)
  task = lm_fixture['lm_task']
  run = lambda name, draft: infer.infer(
    target=target,
    draft=draft,
    task=task,
    feature_lengths=LM_FEATURE_LENGTHS,
    output_dir=str(tmp_path / name),
    batch_size=BATCH_SIZE,
    gamma=3,
    progress=False,
  )
  speculative, baseline = run('speculative', draft), run('baseline', None)
  records = lambda name: [
    json.loads(line) for line in open(tmp_path / name / f'{LM_TASK_NAME}-test.jsonl')
  ]
  vocabulary = task.output_features['targets'].vocabulary
  prompts = [' '.join(sentence.split()[:2]) for sentence in LM_SENTENCES]
  assert [r['inputs'] for r in records('speculative')] == prompts
  assert [r['targets'] for r in records('speculative')] == [
    ' '.join(sentence.split()[2:]) for sentence in LM_SENTENCES
  ]
  # The task's prompts have no EOS (inputs then targets is the sentence).
  direct = models.generate(
    target,
    None,
    _prompts(prompts, vocabulary, eos=False),
    max_decode_len=LM_FEATURE_LENGTHS['targets'],
  ).tokens
  expected = [vocabulary.decode(row.tolist()) for row in direct]
  assert [r['prediction'] for r in records('baseline')] == expected
  assert [r['prediction'] for r in records('speculative')] == expected
  assert [r['emitted'] for r in records('baseline')] == decoded_lengths(direct, EOS_ID).tolist()
  assert speculative['architecture'] == baseline['architecture'] == 'decoder-only prefix LM'
  assert speculative['examples'] == len(LM_SENTENCES) and 0 < speculative['alpha'] < 1
  assert speculative['tokens_per_target_call'] > 1 and baseline['alpha'] is None
  with open(tmp_path / 'speculative' / f'{LM_TASK_NAME}-test.settings.json') as f:
    settings = json.load(f)
  assert settings['target']['config']['num_layers'] == 2
  assert settings['target']['inputs_bidirectional_attention'] is True


@pytest.mark.slow  # The decoder-only infer path runs fast in the test above.
def test_the_gpt_like_pair_file_runs_infer_on_a_prefix_task(fixture, lm_fixture, tmp_path):
  """configs/pairs/gpt_like.gin at a tiny size: the task's inputs (with EOS) are the prompts."""
  directory = lm_fixture['directory']
  dims = ['emb_dim=32', 'num_heads=2', 'head_dim=16', 'mlp_dim=64', 'num_layers=2']
  command = [
    sys.executable,
    '-m',
    'speculative_t5x.infer',
    '--gin_file=configs/pairs/gpt_like.gin',
    '--gin_file=configs/tasks/tsv.gin',
    '--gin_file=configs/runs/infer.gin',
    f"--gin.CHECKPOINT_PATH='{directory / 'target'}'",
    f"--gin.DRAFT_CHECKPOINT_PATH='{directory / 'draft'}'",
    f'--gin.VOCAB_SIZE={VOCAB_SIZE}',
    *[f'--gin.network.DecoderOnlyConfig.{dim}' for dim in dims],
    *[f'--gin.draft/network.DecoderOnlyConfig.{dim}' for dim in dims],
    f"--gin.TSV_FILES={{'test': '{fixture['test_tsv']}'}}",
    f"--gin.VOCABULARY='{fixture['vocabulary']}'",
    f"--gin.TASK_NAME='{LM_TSV_TASK_NAME}'",
    "--gin.PREFIX=''",
    f'--gin.TASK_FEATURE_LENGTHS={LM_FEATURE_LENGTHS}',
    f"--gin.INFER_OUTPUT_DIR='{tmp_path}'",
    f'--gin.BATCH_SIZE={BATCH_SIZE}',
    '--gin.GAMMA=3',
    '--gin.infer.infer.num_examples=8',
  ]
  _run_main_in_process(command)
  records = [json.loads(line) for line in open(tmp_path / f'{LM_TSV_TASK_NAME}-test.jsonl')]
  vocabulary = lm_fixture['tsv_task'].output_features['targets'].vocabulary
  sources = [source for source, _ in PAIRS[:8]]
  # A causal LM (INPUTS_BIDIRECTIONAL_ATTENTION = False); a TSV task's inputs keep their EOS.
  target = models.Model(lm_fixture['config'], lm_fixture['params'])
  direct = models.generate(
    target, None, _prompts(sources, vocabulary, eos=True), max_decode_len=10
  ).tokens
  assert [r['inputs'] for r in records] == sources
  assert [r['prediction'] for r in records] == [vocabulary.decode(row.tolist()) for row in direct]
  assert sum(r['accepted'] for r in records) > 0


def test_mismatched_decoder_only_pairs_name_the_problem(fixture, lm_fixture, tmp_path):
  target = models.Model(lm_fixture['config'], lm_fixture['params'])
  with pytest.raises(
    ValueError, match='The target is decoder-only but the draft network is encoder-decoder'
  ):
    infer.infer(
      target=target,
      draft=fixture['draft'],
      task=lm_fixture['lm_task'],
      feature_lengths=LM_FEATURE_LENGTHS,
      output_dir=str(tmp_path),
      gamma=3,
      progress=False,
    )
  other_vocabulary = models.random_model(_decoder_only_config(vocab_size=2 * VOCAB_SIZE))
  with pytest.raises(ValueError, match='one shared vocabulary'):
    infer.infer(
      target=target,
      draft=other_vocabulary,
      task=lm_fixture['lm_task'],
      feature_lengths=LM_FEATURE_LENGTHS,
      output_dir=str(tmp_path),
      gamma=3,
      progress=False,
    )
  assert os.listdir(tmp_path) == []  # Checked before anything is written.
