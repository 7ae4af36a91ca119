"""Tests for speculative_t5x.data.tasks_core and corpora: no TensorFlow, the TSV reader, unreadable catalogs.

The metrics and the gettext corpus are tested in test_tasks.py, beside the
seqio tasks that use them.
"""

import pytest

from speculative_t5x_lab import corpora
from speculative_t5x.data import tasks_core
from testing_utils import python_output, write_mo


def test_importing_the_core_imports_no_tensorflow():
  assert (
    python_output(
      'import sys; from speculative_t5x_lab import corpora; from speculative_t5x.data import tasks_core; '
      'print(sorted({"tensorflow", "seqio", "tensorflow_datasets"} & set(sys.modules)))'
    )
    == '[]'
  )


def test_read_tsv_reads_pairs_in_order_and_names_a_bad_line(tmp_path):
  path = tmp_path / 'pairs.tsv'
  path.write_text('Open\tÖffnen\nClose the file\tDie Datei schließen\n\tleer\n', encoding='utf-8')
  assert tasks_core.read_tsv(path) == [
    ('Open', 'Öffnen'),
    ('Close the file', 'Die Datei schließen'),
    ('', 'leer'),
  ]
  assert tasks_core.read_tsv(str(path), num_examples=1) == [('Open', 'Öffnen')]
  path.write_text('Open\tÖffnen\nno tab here\n', encoding='utf-8')
  with pytest.raises(ValueError, match=r'Line 2 of .*pairs\.tsv has 1 tab-separated fields'):
    tasks_core.read_tsv(path)


def test_unreadable_catalogs_are_skipped(tmp_path):
  messages_dir = tmp_path / 'de' / 'LC_MESSAGES'
  messages_dir.mkdir(parents=True)
  write_mo(messages_dir / 'good.mo', {'Open file': 'Datei öffnen'})
  (messages_dir / 'not_a_catalog.mo').write_bytes(b'\x00' * 40)
  (messages_dir / 'truncated.mo').write_bytes((messages_dir / 'good.mo').read_bytes()[:10])
  counts = corpora.build_gettext_corpus(str(tmp_path / 'corpus'), str(tmp_path))
  assert sum(counts.values()) == 1
