"""Tests for the offline English LM corpus (corpora) and its seqio task (tasks).

Everything runs on sources the tests write: a small Python package and .mo
catalogs (testing_utils.write_mo), so nothing depends on this machine's
standard library or locale files.
"""

import filecmp
import hashlib
import json
import os

import gin
import pytest
import seqio

from speculative_t5x_lab import corpora
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core
from speculative_t5x.training import train
from testing_utils import write_mo

# ------------------------------------------------------------------------------
# Sentences.
# ------------------------------------------------------------------------------


def test_english_sentences_clean_split_and_filter():
  text = (
    'Return the :func:`len` of the ``sequence``,\n   as an integer. '
    'Raise an error, e.g. ValueError, if it is not a sequence! '
    'Too short to keep. '
    'Calls os.path.join(a, b) with x == 3 here. '
    'lower case start is not a sentence here. '
    'Größe is not an ASCII word in this sentence. '
    'The arguments are foo_bar, baz_qux, spam_ham and eggs_xyz here. '
    'Does it end with a question mark, then?'
  )
  assert corpora.english_sentences(text) == [
    'Return the len of the sequence, as an integer.',
    'Raise an error, e.g. ValueError, if it is not a sequence!',
    'Does it end with a question mark, then?',
  ]
  assert corpora.english_sentences('Too short to keep.', min_words=4) == ['Too short to keep.']
  assert corpora.english_sentences('One two three four five six seven.', max_words=6) == []
  # Mostly numbers and identifiers: fewer than 80% prose words.
  assert corpora.english_sentences('Version 3 of Tk 8 6 and 2 more x11 libs.') == []


# ------------------------------------------------------------------------------
# The corpus builder, on a package and catalogs written here.
# ------------------------------------------------------------------------------
MODULE = '''"""Tools that read configuration files for the examples.

This paragraph holds two sentences of prose. The second one is kept too.

>>> this_doctest_is_skipped()
Doctest output is skipped as well, because it follows a prompt.

Example::

    An indented literal block is never read as prose.
"""

# Consecutive comment lines are joined
# into one block before they are split into sentences.
VALUE = 3  # A trailing comment is a block of its own here.


def read(path):
  """Read the file at path and return its lines.

  Args:
    path: the file to read, which must exist.
  """


class Reader:
  """A reader that keeps every line it has read so far."""
'''
# Expected from MODULE, in any order.
MODULE_SENTENCES = {
  'Tools that read configuration files for the examples.',
  'This paragraph holds two sentences of prose.',
  'Consecutive comment lines are joined into one block before they are split into sentences.',
  'A trailing comment is a block of its own here.',
  'Read the file at path and return its lines.',
  'A reader that keeps every line it has read so far.',
}
CATALOGS = {
  'de': {
    'The file could not be opened for writing.': 'Die Datei konnte nicht geöffnet werden.',
    'Open file': 'Datei öffnen',  # Not a sentence.
    'translator-credits': 'Jemand',
    'One file was removed from the list.\0%d files were removed from the list.': 'x\0y',
  },
  'fr': {
    # The same English message in another language's catalog, differently cased.
    'The file could not be opened for WRITING.': "Le fichier n'a pas pu être ouvert.",
    'Choose a printer from the list below.': 'Choisissez une imprimante.',
  },
}
CATALOG_SENTENCES = {
  'The file could not be opened for WRITING.',  # The smaller spelling of the two.
  'One file was removed from the list.',
  'Choose a printer from the list below.',
}


def _write_sources(root, module_name='tools.py'):
  package = root / 'python' / 'pkg'
  package.mkdir(parents=True)
  (package / module_name).write_text(MODULE)
  (package / 'broken.py').write_text('def f(:\n  """This file does not parse at all, so no."""\n')
  third_party = root / 'python' / 'site-packages'
  third_party.mkdir()
  (third_party / 'other.py').write_text('"""A third-party module that must never be read."""\n')
  for language, messages in CATALOGS.items():
    messages_dir = root / 'locale' / language / 'LC_MESSAGES'
    messages_dir.mkdir(parents=True)
    write_mo(messages_dir / 'program.mo', messages)
  return str(root / 'python'), str(root / 'locale')


def _read_corpus(corpus_dir):
  return {
    split: corpora.read_lines(os.path.join(corpus_dir, f'{split}.txt'))
    for split in tasks_core.SPLITS
  }


@pytest.fixture(scope='module')
def english_corpus(tmp_path_factory):
  """(corpus directory, counts, python directory, catalog directory)."""
  root = tmp_path_factory.mktemp('english')
  python_dir, catalog_dir = _write_sources(root)
  corpus_dir = str(root / 'corpus')
  counts = corpora.build_english_corpus(corpus_dir, [python_dir], catalog_dir)
  return corpus_dir, counts, python_dir, catalog_dir


def test_english_corpus_extracts_cleans_dedupes_and_splits(english_corpus):
  corpus_dir, counts, python_dir, catalog_dir = english_corpus
  rows = _read_corpus(corpus_dir)
  assert counts == {split: len(rows[split]) for split in tasks_core.SPLITS}
  written = [sentence for split in tasks_core.SPLITS for sentence in rows[split]]
  assert len(written) == len(set(written))
  assert set(written) == MODULE_SENTENCES | CATALOG_SENTENCES | {'The second one is kept too.'}
  for split, sentences in rows.items():
    for sentence in sentences:
      bucket = int.from_bytes(hashlib.sha256(sentence.lower().encode()).digest()[:8], 'big') % 20
      assert split == ('train' if bucket < 18 else 'validation' if bucket == 18 else 'test')
  with open(os.path.join(corpus_dir, corpora.ENGLISH_CORPUS_INFO_FILE)) as f:
    info = json.load(f)
  assert info['sources'] == {'python_dirs': [python_dir], 'catalog_dir': catalog_dir}
  assert (info['python_files'], info['catalogs']) == (2, 2)  # site-packages is not read.
  by_source = {'docstring': 0, 'comment': 0, 'gettext': 0}
  for split, sentences in rows.items():
    record = info['splits'][split]
    assert record['sentences'] == len(sentences)
    assert record['words'] == sum(len(s.split()) for s in sentences)
    assert record['characters'] == sum(len(s) for s in sentences)
    for source, count in record['by_source'].items():
      by_source[source] += count
  assert by_source == {'docstring': 5, 'comment': 2, 'gettext': 3}


def test_english_corpus_is_independent_of_file_names(english_corpus, tmp_path):
  corpus_dir, counts, _, _ = english_corpus
  python_dir, catalog_dir = _write_sources(tmp_path, module_name='a_first_module.py')
  again = str(tmp_path / 'corpus')
  assert corpora.build_english_corpus(again, [python_dir], catalog_dir) == counts
  for split in tasks_core.SPLITS:
    assert filecmp.cmp(
      os.path.join(corpus_dir, f'{split}.txt'), os.path.join(again, f'{split}.txt'), shallow=False
    )


def test_english_corpus_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match='No .py file under .* and no .mo catalog'):
    corpora.build_english_corpus(str(tmp_path / 'out'), [str(tmp_path)], str(tmp_path))
  (tmp_path / 'code.py').write_text('x = 1  # no prose\n')
  with pytest.raises(ValueError, match='No English sentence of 6 to 40 words in 1 Python files'):
    corpora.build_english_corpus(str(tmp_path / 'out'), [str(tmp_path)], None)
  with pytest.raises(ValueError, match='min_words <= max_words'):
    corpora.build_english_corpus(str(tmp_path / 'out'), [str(tmp_path)], min_words=9, max_words=3)


# ------------------------------------------------------------------------------
# The seqio task.
# ------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def vocabulary(english_corpus, tmp_path_factory):
  corpus_dir, _, _, _ = english_corpus
  texts = [s for split in tasks_core.SPLITS for s in _read_corpus(corpus_dir)[split]]
  prefix = str(tmp_path_factory.mktemp('spm') / 'spm')
  return tasks.train_sentencepiece(texts, prefix, 96, character_coverage=1.0)


def _examples(task, split, lengths):
  dataset = seqio.get_mixture_or_task(task).get_dataset(lengths, split=split, shuffle=False)
  return list(dataset.as_numpy_iterator())


def test_english_lm_task_prompts_are_first_words(english_corpus, vocabulary):
  corpus_dir, counts, _, _ = english_corpus
  task = tasks.register_english_lm_task(corpus_dir, vocabulary)
  assert task.name == tasks_core.ENGLISH_LM_TASK
  assert sorted(task.splits) == ['test', 'train', 'validation']
  assert not task.output_features['inputs'].add_eos and task.output_features['targets'].add_eos
  sentences = _read_corpus(corpus_dir)['train']
  examples = _examples(task.name, 'train', {'inputs': 64, 'targets': 64})
  assert len(examples) == counts['train']
  for example, sentence in zip(examples, sentences):
    words = sentence.split()
    assert example['inputs_pretokenized'].decode() == ' '.join(words[:4])
    assert example['targets_pretokenized'].decode() == ' '.join(words[4:])
    # The prompt's pieces then the continuation's are the sentence's pieces.
    assert example['inputs'].tolist() + example['targets'].tolist() == (
      vocabulary.encode(sentence) + [1]
    )
  # A prefix LM's row is the sentence, EOS-terminated; the loss is on the continuation.
  lengths = {'inputs': 64, 'targets': 64}
  row = next(
    seqio.DecoderFeatureConverter(pack=False)(
      task.get_dataset(lengths, split='train', shuffle=False), lengths
    ).as_numpy_iterator()
  )
  prompt_length = len(examples[0]['inputs'])
  sentence_tokens = vocabulary.encode(sentences[0]) + [1]
  assert row['decoder_target_tokens'][: len(sentence_tokens)].tolist() == sentence_tokens
  assert row['decoder_loss_weights'].tolist() == (
    [0] * prompt_length
    + [1] * (len(sentence_tokens) - prompt_length)
    + [0] * (128 - len(sentence_tokens))
  )


def test_english_lm_task_without_prompts_and_with_long_prompts(english_corpus, vocabulary):
  corpus_dir, counts, _, _ = english_corpus
  task = tasks.register_english_lm_task(corpus_dir, vocabulary, prompt_words=0, name='x:lm')
  assert sorted(task.output_features) == ['targets']
  examples = _examples(task.name, 'train', {'targets': 64})
  assert [e['targets_pretokenized'].decode() for e in examples] == _read_corpus(corpus_dir)['train']
  # Sentences with no word after the prompt are skipped.
  task = tasks.register_english_lm_task(corpus_dir, vocabulary, prompt_words=8, name='x:lm8')
  longer = [s for s in _read_corpus(corpus_dir)['train'] if len(s.split()) > 8]
  examples = _examples(task.name, 'train', {'inputs': 64, 'targets': 64})
  assert [e['inputs_pretokenized'].decode() for e in examples] == [
    ' '.join(s.split()[:8]) for s in longer
  ]
  with pytest.raises(ValueError, match='prompt_words must be an int >= 0'):
    tasks.register_english_lm_task(corpus_dir, vocabulary, prompt_words=-1)


def test_english_lm_gin_trains_a_gpt_like_decoder_only_network(english_corpus, vocabulary):
  corpus_dir, _, _, _ = english_corpus
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags(
      [],
      [
        'configs/models/gpt_like_draft.gin',
        'configs/tasks/english_lm.gin',
        'configs/runs/train_decoder_only.gin',
      ],
      [
        f'CORPUS_DIR = {corpus_dir!r}',
        f'VOCABULARY = {vocabulary.sentencepiece_model_file!r}',
        "MODEL_DIR = '/model'",
        'TRAIN_STEPS = 10',
        'PROMPT_WORDS = 3',
      ],
    )
    config = gin.query_parameter('train.train.config').scoped_configurable_fn()
    task = gin.query_parameter('train.train.task').scoped_configurable_fn()
    bidirectional = gin.query_parameter('%INPUTS_BIDIRECTIONAL_ATTENTION')
  finally:
    gin.clear_config()
  assert isinstance(config, network.DecoderOnlyConfig) and config.num_layers == 2
  assert task.name == tasks_core.ENGLISH_LM_TASK and bidirectional is False
  assert train.feature_converter_cls(config) is seqio.DecoderFeatureConverter
  (example,) = _examples(task.name, 'train', {'inputs': 64, 'targets': 64})[:1]
  assert len(example['inputs_pretokenized'].decode().split()) == 3
