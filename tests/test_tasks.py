"""Tests for speculative_t5x.data.tasks: seqio tasks, gettext corpus, metrics, vocab.

Everything runs offline on fixtures written here: a SentencePiece model trained
on a few sentences, tiny datasets in TFDS format, and .mo catalogs written
with a small writer of the GNU .mo format (cross-checked against Python's
`gettext`), so nothing depends on this machine's locale files or on gs://.
"""

import filecmp
import gettext
import hashlib
import os

import numpy as np
import pytest
from rouge_score import rouge_scorer
from rouge_score import scoring
import sacrebleu
import seqio
import tensorflow_datasets as tfds

from speculative_t5x_lab import corpora
from speculative_t5x.data import tasks
from speculative_t5x.data import tasks_core
from testing_utils import python_output, write_mo

# English/German UI strings: the vocabulary's training text and the TSV data.
PAIRS = [
  ('Open file', 'Datei öffnen'),
  ('Save the document', 'Das Dokument speichern'),
  ('Close the window', 'Das Fenster schließen'),
  ('The file could not be opened.', 'Die Datei konnte nicht geöffnet werden.'),
  ('Delete all files?', 'Alle Dateien löschen?'),
  ('Print the current page', 'Die aktuelle Seite drucken'),
  ('Search in all documents', 'In allen Dokumenten suchen'),
  ('Show hidden files', 'Versteckte Dateien anzeigen'),
  ('The network is not available.', 'Das Netzwerk ist nicht verfügbar.'),
  ('Enter your password', 'Geben Sie Ihr Passwort ein'),
  ('Cancel the download', 'Den Download abbrechen'),
  ('Settings were saved.', 'Die Einstellungen wurden gespeichert.'),
]
VOCAB_SIZE = 100


# ---------------------------------------------------------------------------
# Shared fixtures (module scope: TF and SentencePiece work is done once).
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def vocabulary(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp('spm') / 'ende')
  texts = [text for pair in PAIRS for text in pair] * 4
  return tasks.train_sentencepiece(texts, prefix, VOCAB_SIZE, character_coverage=1.0)


def _write_tfds(data_dir, tfds_name, split_examples):
  builder = tfds.builder(tfds_name, data_dir=data_dir)
  os.makedirs(builder.data_dir)
  writer = tfds.core.SequentialWriter(ds_info=builder.info, max_examples_per_shard=100)
  writer.initialize_splits(list(split_examples))
  writer.add_examples(split_examples)
  writer.close_all()


WMT_VALIDATION = [
  {'en': 'Open file', 'de': 'Datei öffnen'},
  {'en': 'Print the current page', 'de': 'Die aktuelle Seite drucken'},
]
CNN_VALIDATION = [
  {
    'article': 'The network is not available. Settings were saved.',
    'highlights': 'Settings were saved .\nThe network is down .',
    'id': 'a1',
    'publisher': 'cnn',
  },
]


@pytest.fixture(scope='module')
def tfds_data_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  _write_tfds(
    data_dir,
    tasks_core.WMT_ENDE_TFDS_NAME,
    {'train': [{'en': 'Close', 'de': 'Schließen'}], 'validation': WMT_VALIDATION},
  )
  _write_tfds(data_dir, tasks_core.CNN_DAILYMAIL_TFDS_NAME, {'validation': CNN_VALIDATION})
  return data_dir


def _examples(task_name, split, sequence_length=None):
  dataset = seqio.get_mixture_or_task(task_name).get_dataset(
    sequence_length, split=split, shuffle=False
  )
  return list(dataset.as_numpy_iterator())


# ---------------------------------------------------------------------------
# TFDS tasks.
# ---------------------------------------------------------------------------


def test_wmt_task_matches_t5_preprocessing(vocabulary, tfds_data_dir):
  tasks.register_tasks(vocabulary, tfds_data_dir=tfds_data_dir)
  examples = _examples(tasks_core.WMT_ENDE_TASK, 'validation')
  assert len(examples) == len(WMT_VALIDATION)
  for example, raw in zip(examples, WMT_VALIDATION):
    inputs = 'translate English to German: ' + raw['en']
    assert example['inputs_pretokenized'].decode() == inputs
    assert example['targets_pretokenized'].decode() == raw['de']
    assert example['inputs'].tolist() == vocabulary.encode(inputs) + [1]
    assert example['targets'].tolist() == vocabulary.encode(raw['de']) + [1]


def test_cnn_dailymail_task_matches_t5_preprocessing(vocabulary, tfds_data_dir):
  tasks.register_tasks(vocabulary, tfds_data_dir=tfds_data_dir)
  [example] = _examples(tasks_core.CNN_DAILYMAIL_TASK, 'validation')
  raw = CNN_VALIDATION[0]
  inputs = 'summarize: ' + raw['article']
  assert set(example) == {'inputs', 'inputs_pretokenized', 'targets', 'targets_pretokenized'}
  assert example['inputs_pretokenized'].decode() == inputs
  assert example['inputs'].tolist() == vocabulary.encode(inputs) + [1]
  assert example['targets'].tolist() == (vocabulary.encode(raw['highlights']) + [1])


def test_tfds_task_trims_then_appends_eos(vocabulary, tfds_data_dir):
  tasks.register_tasks(vocabulary, tfds_data_dir=tfds_data_dir)
  [example, _] = _examples(tasks_core.WMT_ENDE_TASK, 'validation', {'inputs': 5, 'targets': 3})
  inputs = vocabulary.encode('translate English to German: Open file')
  assert len(inputs) > 5
  assert example['inputs'].tolist() == inputs[:4] + [1]
  assert example['targets'].tolist() == (vocabulary.encode('Datei öffnen')[:2] + [1])


def test_tfds_tasks_features_metrics_and_namespace(vocabulary, tfds_data_dir):
  names = tasks.register_tasks(vocabulary, tfds_data_dir=tfds_data_dir)
  # Registering again replaces, rather than colliding with, the tasks.
  assert tasks.register_tasks(vocabulary, tfds_data_dir=tfds_data_dir) == names
  assert names == ('speculative_t5x:wmt_t2t_ende_v003', 'speculative_t5x:cnn_dailymail_v002')
  for name, metric in zip(names, (tasks_core.bleu, tasks_core.rouge)):
    task = seqio.get_mixture_or_task(name)
    assert task.metric_fns == [metric]
    assert task.output_features['inputs'].add_eos
    assert not task.output_features['inputs'].required
    assert task.output_features['targets'].add_eos
    assert task.output_features['targets'].vocabulary is vocabulary
  # The `t5` package's names stay free.
  assert 'wmt_t2t_ende_v003' not in seqio.TaskRegistry.names()


def test_default_vocabulary_is_t5s_and_loaded_lazily(vocabulary):
  # No network here: registering with the gs:// path must not read it.
  tasks.register_tasks()
  task = seqio.get_mixture_or_task(tasks_core.WMT_ENDE_TASK)
  default = task.output_features['targets'].vocabulary
  assert default.sentencepiece_model_file == (
    'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
  )
  assert default.extra_ids == 100
  # A local path works the same way, with T5's 100 extra ids by default.
  tasks.register_tasks(vocabulary.sentencepiece_model_file)
  local = (
    seqio.get_mixture_or_task(tasks_core.CNN_DAILYMAIL_TASK).output_features['targets'].vocabulary
  )
  assert local.vocab_size == VOCAB_SIZE + 100
  with pytest.raises(ValueError, match='seqio.Vocabulary or the path'):
    tasks.register_tasks(vocabulary=32000)


# ---------------------------------------------------------------------------
# Metrics, hand-checked and against the libraries.
# ---------------------------------------------------------------------------


def test_bleu_hand_checked():
  # 1-4-gram precisions 5/6, 3/5, 2/4, 1/3; no brevity penalty.
  assert tasks_core.bleu(['the cat sat on the mat'], ['the cat sat on a mat'])[
    'bleu'
  ] == pytest.approx(100 * (1 / 12) ** 0.25)
  # No 4-gram match: exp smoothing counts it as 1 / (2 * 1).
  assert tasks_core.bleu(['a b c d'], ['a b c e'])['bleu'] == pytest.approx(
    100 * (3 / 4 * 2 / 3 * 1 / 2 * 1 / 2) ** 0.25
  )
  # The international tokenizer splits Unicode punctuation off words
  # ("»Bericht«" is 3 tokens, 1 for sacrebleu's default 13a): precisions
  # 7/8, 5/7, 4/6, 3/5.
  assert tasks_core.bleu(
    ['Die Datei »Bericht« wurde gespeichert'], ['Die Datei »Bericht« wurde nicht gespeichert']
  )['bleu'] == pytest.approx(100 * (1 / 4) ** 0.25)
  # Corpus-level and case-sensitive, as sacrebleu computes it.
  targets = ['Hallo, Welt!', 'Die Datei wurde gespeichert.']
  predictions = ['hallo, Welt!', 'Die Datei wurde nicht gespeichert.']
  expected = sacrebleu.corpus_bleu(
    predictions, [targets], smooth_method='exp', tokenize='intl'
  ).score
  assert tasks_core.bleu(targets, predictions)['bleu'] == pytest.approx(expected)
  assert tasks_core.bleu(targets, targets)['bleu'] == pytest.approx(100.0)
  with pytest.raises(ValueError, match='one prediction per target'):
    tasks_core.bleu(targets, predictions[:1])


def test_rouge_hand_checked():
  scores = tasks_core.rouge(['the cat sat'], ['the cat'])
  # ROUGE-1: P = 1, R = 2/3; ROUGE-2: P = 1, R = 1/2; LCS = 2 tokens.
  assert scores == pytest.approx({'rouge1': 80.0, 'rouge2': 200 / 3, 'rougeLsum': 80.0})
  # Lsum splits sentences at " . ": two swapped sentences match fully, while
  # the unsplit LCS would be half the tokens.
  assert tasks_core.rouge(['a b . c d'], ['c d . a b'])['rougeLsum'] == (pytest.approx(100.0))
  unsplit = rouge_scorer.RougeScorer(['rougeLsum']).score('a b . c d', 'c d . a b')
  assert unsplit['rougeLsum'].fmeasure == pytest.approx(0.5)


def test_rouge_matches_rouge_score_and_t5s_bootstrap():
  targets = ['Settings were saved . The network is down .', 'The file could not be opened .']
  predictions = ['The network is down . Settings saved .', 'The file was opened .']
  scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeLsum'])
  aggregator = scoring.BootstrapAggregator()
  per_example = []
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(target.replace(' . ', ' .\n'), prediction.replace(' . ', ' .\n'))
    per_example.append(scores)
    aggregator.add_scores(scores)
  ours = tasks_core.rouge(targets, predictions)
  for key, value in ours.items():
    mean = 100 * np.mean([scores[key].fmeasure for scores in per_example])
    assert value == pytest.approx(mean)
  # t5's figure is the bootstrap median of the mean: within its spread.
  bootstrap = aggregator.aggregate()
  for key, value in ours.items():
    assert 100 * bootstrap[key].low.fmeasure <= value
    assert value <= 100 * bootstrap[key].high.fmeasure


# ---------------------------------------------------------------------------
# The .mo writer of the fixtures (testing_utils.write_mo).
# ---------------------------------------------------------------------------


def test_mo_writer_agrees_with_python_gettext(tmp_path):
  path = tmp_path / 'x.mo'
  write_mo(
    path,
    {'Open': 'Öffnen', 'menu\x04Quit': 'Beenden', '%d file\0%d files': '%d Datei\0%d Dateien'},
    byte_order='>',
  )
  with open(path, 'rb') as f:
    catalog = gettext.GNUTranslations(f)
  assert catalog.gettext('Open') == 'Öffnen'
  assert catalog.pgettext('menu', 'Quit') == 'Beenden'
  assert catalog.ngettext('%d file', '%d files', 1) == '%d Datei'
  assert catalog.ngettext('%d file', '%d files', 7) == '%d Dateien'


# One catalog exercising every extraction and cleaning rule, as
# {original: translation} -> the pairs expected from it.
MAIN_CATALOG = {
  'Open file': 'Datei öffnen',
  '%d file\0%d files': '%d Datei\0%d Dateien',  # plural: 2 pairs
  'menu\x04Quit': 'Beenden',  # msgctxt dropped
  '  Padded message\n': ' Aufgefüllte Meldung\n',  # stripped
  'OK': 'OK',  # identical
  'Two\nlines': 'Zwei\nZeilen',  # newline
  'A\ttab': 'Ein\tTab',  # tab
  'Bold \x1b[1m': 'Fett \x1b[1m',  # control character
  'Zero\u200bwidth': 'Null\u200bbreite',  # format character
  'Untranslated': '   ',  # empty
  'translator-credits': 'Hans Muster <hans@example.org>',
  'a' * 200: 'b' * 200,  # at the limit
  'c' * 201: 'd' * 200,  # over the limit
  'Copy %s to %s': '%s nach %s kopieren',
  'Move %s to %d': '%d nach %s verschieben',  # types reordered
  'Rename %s to %s': '%2$s aus %1$s umbenennen',  # positional: fine
  '%d%% done': '%d %% fertig',
  '50% done': '50 % erledigt',  # not a directive
  'Missing %s': 'Fehlt',  # lost placeholder
  '{name} saved': '{name} gespeichert',
  '{count} items': '{anzahl} Elemente',  # renamed field
  '_File': '_Datei',  # GTK mnemonic
  '_Open': 'Ö_ffnen',
  'Save _As': 'Speichern _unter',
  '&Edit': '&Bearbeiten',  # Qt mnemonic
  'LC_ALL is set': 'LC_ALL ist gesetzt',  # identifier
  'new_target': 'neues_Ziel',  # identifier
  'Cancel': 'Abbrechen',
  'Close': 'Schließen',
  'ctx1\x04Print': 'Drucken',
  'ctx2\x04Print': 'Drucken',
}
MAIN_PAIRS = {
  ('Open file', 'Datei öffnen'),
  ('%d file', '%d Datei'),
  ('%d files', '%d Dateien'),
  ('Quit', 'Beenden'),
  ('Padded message', 'Aufgefüllte Meldung'),
  ('a' * 200, 'b' * 200),
  ('Copy %s to %s', '%s nach %s kopieren'),
  ('Rename %s to %s', '%2$s aus %1$s umbenennen'),
  ('%d%% done', '%d %% fertig'),
  ('50% done', '50 % erledigt'),
  ('{name} saved', '{name} gespeichert'),
  ('File', 'Datei'),
  ('Open', 'Öffnen'),
  ('Save As', 'Speichern unter'),
  ('Edit', 'Bearbeiten'),
  ('LC_ALL is set', 'LC_ALL ist gesetzt'),
  ('new_target', 'neues_Ziel'),
}
# (messages, charset, byte order). Majority votes across catalogs: Cancel
# 2:1; Close 1:1 (tie: the smallest string); Print 1:1 although the main
# catalog has it in two contexts.
OTHER_CATALOGS = {
  'other.mo': ({'Cancel': 'Abbrechen', 'Close': 'Zumachen', 'Size': 'Größe'}, 'ISO-8859-1', '<'),
  'third.mo': ({'Cancel': 'Stornieren', 'Print': 'Ausdrucken'}, 'UTF-8', '>'),
}
OTHER_PAIRS = {
  ('Cancel', 'Abbrechen'),
  ('Close', 'Schließen'),
  ('Print', 'Ausdrucken'),
  ('Size', 'Größe'),
}


def _write_catalogs(locale_dir, file_names):
  messages_dir = locale_dir / 'de' / 'LC_MESSAGES'
  messages_dir.mkdir(parents=True)
  write_mo(messages_dir / file_names[0], MAIN_CATALOG)
  for file_name, (messages, charset, byte_order) in zip(file_names[1:], OTHER_CATALOGS.values()):
    write_mo(messages_dir / file_name, messages, charset, byte_order)


def _read_corpus(corpus_dir):
  rows = {}
  for split in tasks_core.SPLITS:
    with open(os.path.join(corpus_dir, f'{split}.tsv'), encoding='utf-8') as f:
      rows[split] = [tuple(line.rstrip('\n').split('\t')) for line in f]
  return rows


def _expected_split(source):
  bucket = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], 'big') % 20
  return 'train' if bucket < 18 else 'validation' if bucket == 18 else 'test'


@pytest.fixture(scope='module')
def gettext_corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp('gettext')
  _write_catalogs(root / 'locale', ['main.mo', *OTHER_CATALOGS])
  counts = corpora.build_gettext_corpus(str(root / 'corpus'), str(root / 'locale'))
  return root, counts


def test_gettext_corpus_extracts_and_cleans(gettext_corpus):
  root, counts = gettext_corpus
  rows = _read_corpus(root / 'corpus')
  assert counts == {split: len(rows[split]) for split in tasks_core.SPLITS}
  written = [pair for split in tasks_core.SPLITS for pair in rows[split]]
  assert all(len(pair) == 2 for pair in written)
  assert len(written) == len(set(written))
  assert set(written) == MAIN_PAIRS | OTHER_PAIRS
  for split in tasks_core.SPLITS:
    assert all(_expected_split(source) == split for source, _ in rows[split])


def test_gettext_corpus_is_independent_of_file_order(gettext_corpus, tmp_path):
  root, counts = gettext_corpus
  # Reversed names reverse the order in which catalogs are read.
  _write_catalogs(tmp_path / 'locale', ['z.mo', 'y.mo', 'x.mo'])
  assert corpora.build_gettext_corpus(str(tmp_path / 'corpus'), str(tmp_path / 'locale')) == counts
  for split in tasks_core.SPLITS:
    assert filecmp.cmp(
      root / 'corpus' / f'{split}.tsv', tmp_path / 'corpus' / f'{split}.tsv', shallow=False
    )


def test_gettext_split_is_about_90_5_5(tmp_path):
  messages_dir = tmp_path / 'de' / 'LC_MESSAGES'
  messages_dir.mkdir(parents=True)
  write_mo(
    messages_dir / 'many.mo', {f'Message number {i}': f'Meldung Nummer {i}' for i in range(4000)}
  )
  counts = corpora.build_gettext_corpus(str(tmp_path / 'corpus'), str(tmp_path))
  assert sum(counts.values()) == 4000
  # Binomial standard deviations: 19 (train), 14 (validation, test).
  assert abs(counts['train'] - 3600) < 80
  assert abs(counts['validation'] - 200) < 60
  assert abs(counts['test'] - 200) < 60


def test_gettext_corpus_without_catalogs_points_to_tfds(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'de/LC_MESSAGES/\*\.mo.*wmt_t2t_ende_v003'):
    corpora.build_gettext_corpus(str(tmp_path / 'corpus'), str(tmp_path))


# ---------------------------------------------------------------------------
# TSV tasks end to end through seqio.
# ---------------------------------------------------------------------------


def test_gettext_task_end_to_end(gettext_corpus, vocabulary):
  root, counts = gettext_corpus
  task = tasks.register_gettext_task(str(root / 'corpus'), vocabulary)
  assert task.name == 'speculative_t5x:gettext_ende'
  rows = _read_corpus(root / 'corpus')['train']
  lengths = {'inputs': 12, 'targets': 6}
  examples = _examples(task.name, 'train', lengths)
  assert len(examples) == counts['train']
  for example, (source, target) in zip(examples, rows):
    inputs = 'translate English to German: ' + source
    assert example['inputs_pretokenized'].decode() == inputs
    assert example['targets_pretokenized'].decode() == target
    assert example['inputs'].tolist() == vocabulary.encode(inputs)[:11] + [1]
    assert example['targets'].tolist() == vocabulary.encode(target)[:5] + [1]
  # What T5X feeds the model: padded encoder/decoder arrays.
  converted = seqio.EncDecFeatureConverter(pack=False)(
    seqio.get_mixture_or_task(task.name).get_dataset(lengths, split='train', shuffle=False), lengths
  )
  first = next(converted.as_numpy_iterator())
  assert first['encoder_input_tokens'].shape == (12,)
  assert first['decoder_target_tokens'].shape == (6,)
  assert first['decoder_input_tokens'][0] == 0
  assert task.metric_fns == [tasks_core.bleu]


def test_tsv_task_with_own_prefix_and_metric(tmp_path, vocabulary):
  path = tmp_path / 'eval.tsv'
  path.write_text(''.join(f'{en}\t{de}\n' for en, de in PAIRS[:3]), encoding='utf-8')
  task = tasks.register_tsv_task(
    'speculative_t5x:test_tsv',
    {'validation': str(path)},
    vocabulary,
    prefix='en2de: ',
    metric_fns=[tasks_core.rouge],
  )
  examples = _examples(task.name, 'validation')
  assert [e['inputs'].tolist() for e in examples] == [
    vocabulary.encode('en2de: ' + en) + [1] for en, _ in PAIRS[:3]
  ]
  assert [e['targets'].tolist() for e in examples] == [
    vocabulary.encode(de) + [1] for _, de in PAIRS[:3]
  ]
  assert task.metric_fns == [tasks_core.rouge]
  with pytest.raises(ValueError, match='split_to_filepattern is empty'):
    tasks.register_tsv_task('speculative_t5x:test_tsv', {}, vocabulary)


# ---------------------------------------------------------------------------
# SentencePiece training.
# ---------------------------------------------------------------------------


def test_sentencepiece_has_t5_ids_and_round_trips(vocabulary):
  assert isinstance(vocabulary, seqio.SentencePieceVocabulary)
  tokenizer = vocabulary.tokenizer
  assert (tokenizer.pad_id(), tokenizer.eos_id(), tokenizer.unk_id(), tokenizer.bos_id()) == (
    0,
    1,
    2,
    -1,
  )
  assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
  assert vocabulary.vocab_size == VOCAB_SIZE
  for en, de in PAIRS:
    for text in (en, de):
      ids = vocabulary.encode(text)
      assert 2 not in ids and min(ids) > 2
      assert vocabulary.decode(ids) == text
  # seqio's decode stops at EOS, as for T5's vocabulary.
  assert vocabulary.decode(vocabulary.encode('Open file') + [1, 5, 6]) == ('Open file')


def test_sentencepiece_is_deterministic_with_extra_ids(tmp_path, vocabulary):
  corpus = tmp_path / 'train.tsv'
  corpus.write_text(''.join(f'{en}\t{de}\n' for en, de in PAIRS) * 4, encoding='utf-8')
  again = tasks.train_sentencepiece(
    tasks.tsv_texts(str(corpus)),
    str(tmp_path / 'again'),
    VOCAB_SIZE,
    extra_ids=10,
    character_coverage=1.0,
  )
  # Same pieces and scores as the fixture, trained on the same texts.
  assert filecmp.cmp(
    vocabulary.sentencepiece_model_file[: -len('.model')] + '.vocab',
    tmp_path / 'again.vocab',
    shallow=False,
  )
  assert again.vocab_size == VOCAB_SIZE + 10
  # Extra ids count down from the top, as seqio (and T5) number sentinels.
  assert again.encode('<extra_id_0>') == [VOCAB_SIZE + 9]
  assert again.encode('<extra_id_9>') == [VOCAB_SIZE]
  with pytest.raises(ValueError, match='vocab_size must exceed'):
    tasks.train_sentencepiece(['a'], str(tmp_path / 'tiny'), 3)
  with pytest.raises(ValueError, match='too few for vocab_size=500'):
    tasks.train_sentencepiece(['a b c'], str(tmp_path / 'tiny'), 500)


def test_importing_the_tasks_registers_no_gin_configurable():
  """T5X imports a task module (MIXTURE_OR_TASK_MODULE) after parsing gin, and refuses one that
  registers a configurable then: the modules such a task module imports must register none."""
  registered = python_output(
    'from gin import config; '
    'before = {name for name, _ in config._REGISTRY.items()}; '
    'from speculative_t5x.data import tasks; '
    'print(sorted({name for name, _ in config._REGISTRY.items()} - before))'
  )
  assert registered == '[]'
