"""scripts/gpt_like_row.py on a workdir laid out as scripts/gpt_like_models.py writes one.

A tiny English corpus, its vocabulary, and a decoder-only target and draft
trained a few steps by `train.train` on the English LM task; the script finds
them, measures alpha and the walltime sweep, and writes the row (its timings
mean nothing at this size).
"""

import importlib.util
import json
import os

import pytest

from speculative_t5x_lab import corpora
from speculative_t5x import network
from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core
from speculative_t5x.training import train
from testing_utils import NOUNS, VERBS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PATH = os.path.join(REPO, 'scripts', 'gpt_like_row.py')
_SPEC = importlib.util.spec_from_file_location('gpt_like_row', _PATH)
gpt_like_row = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpt_like_row)

SENTENCES = [
  f'Please {verb.lower()} {noun} and then {other.lower()} {noun}.'
  for verb, _ in VERBS
  for noun, _ in NOUNS
  for other, _ in VERBS[:2]
]
VOCAB_SIZE = 64  # The networks'; the SentencePiece model has fewer pieces.
PIECES = 40


def _config(num_layers):
  return network.DecoderOnlyConfig(
    vocab_size=VOCAB_SIZE,
    dtype='float32',
    emb_dim=32,
    num_heads=2,
    num_layers=num_layers,
    head_dim=16,
    mlp_dim=64,
    mlp_activations=('gelu',),
    dropout_rate=0.0,
  )


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('gpt_like')
  corpus = workdir / 'corpus'
  corpus.mkdir()
  for split in tasks_core.SPLITS:
    (corpus / f'{split}.txt').write_text(''.join(s + '\n' for s in SENTENCES))
  (corpus / corpora.ENGLISH_CORPUS_INFO_FILE).write_text('{}')
  (workdir / 'vocabulary').mkdir()
  vocabulary = tasks.train_sentencepiece(
    SENTENCES, str(workdir / 'vocabulary' / 'spm'), PIECES, character_coverage=1.0
  )
  task = tasks.register_english_lm_task(
    str(corpus), vocabulary, prompt_words=2, name='speculative_t5x:gpt_like_row_test'
  )
  for name, layers in (('gpt_like_target', 2), ('gpt_like_draft', 1)):
    train.train(
      str(workdir / name),
      _config(layers),
      task,
      feature_lengths={'inputs': 8, 'targets': 16},
      batch_size=4,
      num_steps=2,
      eval_every=None,
      progress=False,
    )
  return workdir


@pytest.mark.slow  # Trains a pair and runs the whole script; about 2 minutes.
def test_the_row_of_a_trained_workdir(workdir):
  row = gpt_like_row.main(
    [
      f'--workdir={workdir}',
      '--prompt_words=2',
      '--gammas',
      '2',
      '3',
      '--alpha_tokens=200',
      '--num_walltime_examples=2',
      '--max_decode_len=8',
      '--repetitions=1',
    ]
  )
  assert row['architecture'] == 'decoder-only'
  assert row['target_parameters'] > row['draft_parameters']  # The larger is the target.
  model_alpha = {r['temperature']: r for r in row['alpha'] if r['draft'] == 'GPT-like draft'}
  assert {t: r['paper_alpha'] for t, r in model_alpha.items()} == {0.0: 0.88, 1.0: 0.89}
  for r in row['alpha']:
    assert 0 <= r['alpha'] <= 1 and r['stderr'] >= 0 and r['num_tokens'] >= 200
  assert {r['draft'] for r in row['alpha']} == {
    'GPT-like draft',
    'prompt lookup',
    '1-gram',
    '2-gram',
  }
  assert [(r['temperature'], r['gamma']) for r in row['walltime']] == [
    (0.0, 2),
    (0.0, 3),
    (1.0, 2),
    (1.0, 3),
  ]
  for r in row['walltime']:
    assert r['speedup']['median'] > 0 and r['predicted_speedup'] > 0
    assert r['c'] >= 0 and r['verify_cost'] > 0
  assert row['walltime'][0]['identical_outputs'] == 1.0  # Greedy.
  whole_run = row['machine']['whole_run']
  assert whole_run['samples'] >= 1 and whole_run['load_average_1min']['max'] > 0
  assert row['machine']['walltime']['samples'] <= whole_run['samples']
  assert [e['line'] for e in row['log']][0].startswith('Measuring the parts')
  for r in row['walltime']:
    assert r['predicted_speedup_measured_tokens'] == pytest.approx(
      r['tokens_per_call'] / (r['gamma'] * r['c'] + r['verify_cost'])
    )
  report = workdir / 'report'
  assert json.loads((report / 'gpt_like_row.json').read_text()) == json.loads(
    json.dumps(row, default=float)
  )
  markdown = (report / 'gpt_like_row.md').read_text()
  assert '| GPT-like draft | 0 |' in markdown and '| 0.88 |' in markdown
  assert '## The machine while it ran' in markdown
  assert (report / 'gpt_like_benchmark' / 'benchmark.md').exists()


def test_a_workdir_without_a_pair_is_an_error(tmp_path):
  with pytest.raises(ValueError, match='Found 0 decoder-only models trained under'):
    gpt_like_row.main([f'--workdir={tmp_path}'])
