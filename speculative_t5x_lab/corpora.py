"""The offline corpora: English->German pairs and English sentences from this machine.

Both are built from files every Debian/Ubuntu machine (and every Python
installation) carries, so that training and benchmarks run without the
internet; `tasks` registers seqio tasks over the directories they write.
TensorFlow-free, like `tasks_core`.

* `build_gettext_corpus`: an English->German corpus (`train.tsv`,
  `validation.tsv`, `test.tsv`) from the human translations in the
  machine's gettext catalogs (a stand-in for WMT EnDe);
* `build_english_corpus`: English sentences for a language model
  (`train.txt`, ...) from the standard library's docstrings and comments and
  the English messages of every catalog (a stand-in for LM1B), with
  `english_sentences`, its sentence filter, and `read_lines` for its files.
"""

import ast
import collections
import gettext
import glob
import hashlib
import io
import json
import os
import re
import struct
import sysconfig
import tokenize
import unicodedata
from typing import Iterable, Iterator, Optional, Sequence

from absl import logging
from etils import epath
import polib

from speculative_t5x.data import tasks_core

# ---------------------------------------------------------------------------
# The offline English->German corpus from gettext catalogs.
# ---------------------------------------------------------------------------

# Entries that carry translator names rather than a translation.
_TRANSLATOR_CREDIT_IDS = frozenset({'translator-credits', 'translator_credits'})
_TRANSLATOR_CREDIT_CONTEXTS = frozenset({'NAME OF TRANSLATORS', 'EMAIL OF TRANSLATORS'})
# Unicode categories that are never wanted in a UI string pair: controls
# (tab, newline, escape, ...), format characters (zero-width, bidi marks) and
# line/paragraph separators (which some readers treat as line breaks).
_UNWANTED_CATEGORIES = frozenset({'Cc', 'Cf', 'Zl', 'Zp'})

# printf directives (C, glibc and Python %-formatting): optional `n$` argument
# index or Python `(name)`; flags (not ' ', so that "50% done" is no
# directive); width; precision; length; conversion. `%%` is removed first.
_PRINTF_DIRECTIVE = re.compile(
  r"%(?:(?P<index>\d+)\$|\((?P<name>\w+)\))?[-+#0'I]*"
  r'(?P<width>\d+|\*(?:\d+\$)?)?(?:\.(?P<precision>\d+|\*(?:\d+\$)?))?'
  r'(?P<length>hh|h|ll|l|L|q|j|z|Z|t)?'
  r'(?P<conversion>[diouxXeEfFgGaAcCsSpnm])'
)
# str.format / brace fields; `{{` and `}}` are removed first.
_BRACE_FIELD = re.compile(r'\{([^{}]*)\}')
# A mnemonic marker: `_` (GTK) or `&` (Qt/KDE) before a letter or digit; `&`
# not starting an HTML/XML entity.
_MNEMONIC = {'_': re.compile(r'_(?=[^\W_])'), '&': re.compile(r'&(?![#\w]+;)(?=[^\W_])')}


def _read_catalog(path: str) -> polib.MOFile:
  """The entries of a GNU .mo catalog, read by polib (the header is its `metadata`).

  Strings are decoded with the charset the header names (UTF-8 if it names
  none or an unknown one).

  Raises:
    ValueError: the file is not a .mo catalog, is truncated, or holds
      strings its charset does not decode.
  """
  try:
    return polib.mofile(path)
  except (OSError, struct.error, UnicodeDecodeError) as error:
    raise ValueError(f'{path} cannot be read as a GNU .mo catalog: {error}') from error


def _plural_form_indices(catalog: polib.MOFile) -> tuple[int, int]:
  """The translation forms to pair with English singular and plural msgids.

  The singular goes with the form the catalog's Plural-Forms formula picks for
  n = 1; the English plural with the form it picks most often for n = 2..100
  (for German, as for English, forms 0 and 1).
  """
  expression = 'n != 1'  # gettext's default, germanic plural.
  match = re.search(r'plural=([^;\n]+)', catalog.metadata.get('Plural-Forms', ''))
  if match:
    expression = match.group(1)
  try:
    plural_form = gettext.c2py(expression)
  except ValueError:
    plural_form = gettext.c2py('n != 1')
  plural_counts = collections.Counter(plural_form(n) for n in range(2, 101))
  return plural_form(1), plural_counts.most_common(1)[0][0]


def _catalog_pairs(catalog: polib.MOFile) -> Iterator[tuple[str, str]]:
  """(English, translation) pairs of one catalog: translator credits dropped.

  msgctxt only disambiguates a msgid within one program; the pair keeps the
  msgid and translation, so entries that differ only in context compete in
  the majority vote of `build_gettext_corpus`.
  """
  singular_form, plural_form = _plural_form_indices(catalog)
  for entry in catalog:
    if (
      entry.msgid == ''
      or entry.msgid.lower() in _TRANSLATOR_CREDIT_IDS
      or entry.msgctxt in _TRANSLATOR_CREDIT_CONTEXTS
    ):
      continue
    if not entry.msgid_plural:
      yield entry.msgid, entry.msgstr
      continue
    for source, form in ((entry.msgid, singular_form), (entry.msgid_plural, plural_form)):
      if form in entry.msgstr_plural:
        yield source, entry.msgstr_plural[form]


def _printf_signature(text: str) -> list[tuple[str, str]]:
  """Sorted (argument, conversion) pairs of the printf directives in text.

  Arguments are numbered like C does (`n$` explicitly, else in order) or
  named (`%(name)s`), so a translation may reorder positional arguments;
  flags, width and precision may change (alignment), conversions may not.
  """
  signature = []
  next_index = 1
  for match in _PRINTF_DIRECTIVE.finditer(text.replace('%%', '')):
    stars = sum(1 for part in (match['width'], match['precision']) if part and part.startswith('*'))
    conversion = '*' * stars + (match['length'] or '') + match['conversion']
    if match['index']:
      argument = match['index']
    elif match['name']:
      argument = match['name']
    else:
      argument = str(next_index)
      next_index += 1 + stars
    signature.append((argument, conversion))
  return sorted(signature)


def _brace_signature(text: str) -> list[str]:
  """Sorted field names of `{}`-style fields (auto-numbered fields by order)."""
  fields = []
  auto_index = 0
  for match in _BRACE_FIELD.finditer(text.replace('{{', '').replace('}}', '')):
    field = re.split(r'[!:]', match.group(1), maxsplit=1)[0]
    if not field:
      field = str(auto_index)
      auto_index += 1
    fields.append(field)
  return sorted(fields)


def _word_around(text: str, at: int) -> str:
  """The letters and digits around the marker at position `at`, lowercased."""
  return (
    re.search(r'[^\W_]*$', text[:at]).group(0)
    + text[at]
    + re.match(r'[^\W_]*', text[at + 1 :]).group(0)
  ).lower()


def _strip_mnemonics(source: str, target: str) -> tuple[str, str]:
  """Removes a menu mnemonic marker (`_File` / `&File`) present on both sides.

  Toolkits mark the access key of a label with `_` (GTK) or `&` (Qt/KDE), and
  a translator places it anew (`_Open` / `Ö_ffnen`). Identifiers contain the
  same characters (`LC_ALL`, `new_target` / `neues_Ziel`, `AT&T`), so a
  marker is removed only when each side contains exactly one such
  character, before a letter or digit; on at least one side it starts a
  word; and the marked words differ (ignoring case). Otherwise both strings
  are kept verbatim.
  """
  for marker, pattern in _MNEMONIC.items():
    if source.count(marker) != 1 or target.count(marker) != 1:
      continue
    source_match, target_match = pattern.search(source), pattern.search(target)
    if not source_match or not target_match:
      continue
    starts_word = any(
      match.start() == 0 or not text[match.start() - 1].isalnum()
      for text, match in ((source, source_match), (target, target_match))
    )
    if not starts_word or (
      _word_around(source, source_match.start()) == _word_around(target, target_match.start())
    ):
      continue
    source = source[: source_match.start()] + source[source_match.end() :]
    target = target[: target_match.start()] + target[target_match.end() :]
  return source, target


def _clean_pair(source: str, target: str, max_chars: int) -> tuple[Optional[tuple[str, str]], str]:
  """Applies the cleaning rules; returns (pair or None, the rule applied)."""
  source, target = source.strip(), target.strip()
  if not source or not target:
    return None, 'empty'
  if any(unicodedata.category(ch) in _UNWANTED_CATEGORIES for ch in source + target):
    return None, 'control character'
  source, target = _strip_mnemonics(source, target)
  if len(source) > max_chars or len(target) > max_chars:
    return None, 'too long'
  if source == target:
    return None, 'identical'
  if _printf_signature(source) != _printf_signature(target) or _brace_signature(
    source
  ) != _brace_signature(target):
    return None, 'placeholder mismatch'
  return (source, target), 'kept'


def _split_of(source: str) -> str:
  """train / validation / test (90/5/5) by a hash of the English string."""
  bucket = int.from_bytes(hashlib.sha256(source.encode('utf-8')).digest()[:8], 'big') % 20
  return tasks_core.SPLITS[0 if bucket < 18 else 1 if bucket == 18 else 2]


def _splits_in_hash_order(keys: Iterable[str]) -> dict[str, list[str]]:
  """{split: its keys}, each key in `_split_of`'s split, ordered by the SHA-256 of the key.

  The order of a split's file then depends on its content alone, not on the
  order the sources were read in.
  """
  by_split = {split: [] for split in tasks_core.SPLITS}
  for key in keys:
    by_split[_split_of(key)].append(key)
  for split_keys in by_split.values():
    split_keys.sort(key=lambda key: (hashlib.sha256(key.encode()).digest(), key))
  return by_split


def _write_lines(path: str, lines: Iterable[str]) -> None:
  """Writes `lines` to `path` in UTF-8, one a line, with Unix newlines on every platform."""
  with open(path, 'w', encoding='utf-8', newline='\n') as f:
    f.writelines(line + '\n' for line in lines)


def _catalog_votes(
  catalog_paths: Sequence[str], max_chars: int
) -> tuple[dict[str, collections.Counter], collections.Counter]:
  """The cleaned pairs of the catalogs: ({English: {translation: catalogs}}, pairs per rule).

  A pair counts once per catalog, however many contexts repeat it; an
  unreadable catalog is skipped with a warning.
  """
  votes = collections.defaultdict(collections.Counter)
  rule_counts = collections.Counter()
  for path in catalog_paths:
    try:
      catalog = _read_catalog(path)
    except ValueError as e:
      logging.warning('Skipping a catalog that cannot be read: %s', e)
      continue
    catalog_pairs = set()
    for source, target in _catalog_pairs(catalog):
      pair, rule = _clean_pair(source, target, max_chars)
      rule_counts[rule] += 1
      if pair:
        catalog_pairs.add(pair)
    for source, target in catalog_pairs:
      votes[source][target] += 1
  return votes, rule_counts


def build_gettext_corpus(
  output_dir: str,
  catalog_dir: str = '/usr/share/locale',
  language: str = 'de',
  *,
  max_chars: int = 200,
) -> dict[str, int]:
  """Builds an English->`language` corpus from gettext .mo catalogs.

  Reads `{catalog_dir}/{language}/LC_MESSAGES/*.mo` (on Debian/Ubuntu, the
  human translations of installed programs' messages) and writes
  `train.tsv`, `validation.tsv` and `test.tsv` (`english<TAB>translation`
  per line, UTF-8) into output_dir, ready for `register_gettext_task`.

  Extraction: every translated entry except the header (msgid "") and
  translator-credit entries. A plural entry gives two pairs: the English
  singular with the form for n = 1, the English plural with the form most
  numbers n >= 2 use (German's forms 0 and 1). msgctxt is dropped (see
  `_catalog_pairs`).
  Cleaning, in order: surrounding whitespace is stripped (trailing newlines
  of command-line messages); a pair is dropped if either side is empty or
  contains a control, format or line-separator character (this includes tab
  and newline, so no field can break the TSV, and multi-line help texts are
  dropped rather than escaped); a menu mnemonic on both sides (`_File` /
  `_Datei`, `&File` / `&Datei`) is removed (see `_strip_mnemonics`); a pair
  is dropped if either side is longer than max_chars characters, if source
  and translation are identical (untranslated or untranslatable), or if
  their printf or `{}` placeholders differ (see `_printf_signature`).
  Deduplication: one translation per English string, the one most catalogs
  agree on (ties: the lexicographically smallest), so no English string has
  two references.
  Split: by a SHA-256 hash of the English string (90% train, 5% validation,
  5% test), so the split does not depend on file order and a string never
  crosses splits. Within a file, lines are ordered by that hash.

  Args:
    output_dir: where to write the three TSV files (created if missing).
    catalog_dir: the locale directory.
    language: the locale sub-directory (exactly; `de` does not include
      `de_AT`).
    max_chars: the longest source or translation kept, in characters. 200
      keeps UI labels, messages and one-sentence descriptions and drops
      paragraphs of help text.

  Returns:
    The number of pairs written per split.

  Raises:
    FileNotFoundError: no .mo file under catalog_dir for language.
  """
  catalog_glob = os.path.join(catalog_dir, language, 'LC_MESSAGES', '*.mo')
  catalog_paths = sorted(glob.glob(catalog_glob))
  if not catalog_paths:
    raise FileNotFoundError(
      f'No gettext catalogs match {catalog_glob}. Install translated '
      f'packages (on Debian/Ubuntu the {language} catalogs ship with the '
      f'programs, or with language packs: `apt-get install locales '
      f'language-pack-{language}` on Ubuntu), pass another catalog_dir, or '
      f'use the TFDS task {tasks_core.WMT_ENDE_TASK!r} instead.'
    )

  votes, rule_counts = _catalog_votes(catalog_paths, max_chars)
  # One translation per English string: the one most catalogs agree on (ties: the smallest).
  best = lambda source: min(votes[source], key=lambda t: (-votes[source][t], t))
  by_split = _splits_in_hash_order(votes)
  os.makedirs(output_dir, exist_ok=True)
  for split, sources in by_split.items():
    _write_lines(
      os.path.join(output_dir, f'{split}.tsv'), (f'{source}\t{best(source)}' for source in sources)
    )
  counts = {split: len(sources) for split, sources in by_split.items()}
  logging.info(
    'Gettext corpus from %d catalogs: %s; per cleaning rule: %s.',
    len(catalog_paths),
    counts,
    dict(rule_counts),
  )
  return counts


# ---------------------------------------------------------------------------
# The offline English corpus for language models.
# ---------------------------------------------------------------------------

ENGLISH_CORPUS_INFO_FILE = 'corpus_info.json'
# The sources of `build_english_corpus`, in the order that attributes a
# sentence found in several of them.
ENGLISH_SOURCES = ('docstring', 'comment', 'gettext')

# A sentence ends at ., ! or ? followed by whitespace and an upper-case letter,
# unless the word before is one of these abbreviations.
_SENTENCE_BOUNDARY = re.compile(r'(?<=[.!?])\s+(?=[A-Z])')
_ABBREVIATIONS = ('e.g.', 'i.e.', 'etc.', 'vs.', 'cf.', 'Mr.', 'Dr.', 'No.')
# reST roles (`:func:`, `:py:class:`) before a backquoted name.
_REST_ROLE = re.compile(r':[\w.+-]+(?::[\w.+-]+)*:(?=`)')
# Characters of code, markup and format strings rather than prose.
_NON_PROSE_CHARACTERS = frozenset('=<>{}[]|\\#$@^~*_`%')
# A prose word: letters (capitalized, lower case, or all capitals as in
# "HTTP"), optionally hyphenated or with an apostrophe, in quotes or
# parentheses, with trailing punctuation.
_PROSE_WORD = re.compile(
  r"""^[("']?(?:[A-Z]?[a-z]+|[A-Z]+)(?:[-'][A-Za-z]+)*[)"']?[,.;:!?]?[)"']?$"""
)
# The least fraction of a sentence's words that must be prose words.
_MIN_PROSE_FRACTION = 0.8
# Directories of third-party packages inside a Python installation.
_THIRD_PARTY_DIRS = frozenset({'site-packages', 'dist-packages'})


def _split_sentences(text: str) -> list[str]:
  sentences = []
  for part in _SENTENCE_BOUNDARY.split(text):
    if sentences and sentences[-1].endswith(_ABBREVIATIONS):
      sentences[-1] += ' ' + part
    else:
      sentences.append(part)
  return sentences


def _is_prose_sentence(sentence: str, min_words: int, max_words: int) -> bool:
  words = sentence.split()
  return (
    min_words <= len(words) <= max_words
    and sentence.isascii()
    and sentence.isprintable()
    and sentence[0].isupper()
    and sentence[-1] in '.!?'
    and not _NON_PROSE_CHARACTERS.intersection(sentence)
    and sum(bool(_PROSE_WORD.match(word)) for word in words) >= _MIN_PROSE_FRACTION * len(words)
  )


def english_sentences(text: str, min_words: int = 6, max_words: int = 40) -> list[str]:
  r"""The English prose sentences of a paragraph, cleaned, in order.

  Cleaning: reST roles are dropped and backquotes removed (":func:`len`" and
  "``len``" become "len"); runs of whitespace, newlines included, become one
  space. The text is split into sentences at ., ! or ? followed by an
  upper-case letter (not after "e.g.", "i.e.", "etc.", ...). A sentence is
  kept if it has min_words to max_words words, is printable ASCII, starts with
  an upper-case letter and ends with ., ! or ?, contains none of
  ``=<>{}[]|\#$@^~*_`%`` (code, markup, format strings), and at least 80% of
  its words are words of letters (not identifiers, numbers or paths).

  Args:
    text: a paragraph (a docstring paragraph, a comment block, a message).
    min_words: the fewest whitespace-separated words of a kept sentence.
    max_words: the most.

  Returns:
    The kept sentences.
  """
  text = ' '.join(_REST_ROLE.sub('', text).replace('`', '').split())
  return [s for s in _split_sentences(text) if _is_prose_sentence(s, min_words, max_words)]


def _docstring_paragraphs(docstring: str) -> Iterator[str]:
  """The prose paragraphs of a cleaned docstring (`ast.get_docstring`'s).

  Paragraphs are separated by blank lines. Paragraphs with an indented line
  (literal blocks, code, "Args:" sections and other lists with hanging
  indents) or a doctest (`>>>`, `...`) or reST directive (`.. `) line are
  skipped.
  """
  paragraph = []
  for line in [*docstring.splitlines(), '']:
    if line.strip():
      paragraph.append(line)
      continue
    if paragraph and not any(
      ln[:1].isspace() or ln.startswith(('>>>', '...', '.. ')) for ln in paragraph
    ):
      yield ' '.join(paragraph)
    paragraph = []


def _comment_blocks(source: bytes) -> Iterator[str]:
  """The comments of Python source, consecutive comment lines joined into one block."""
  block, last_line = [], -1
  for token in tokenize.tokenize(io.BytesIO(source).readline):
    if token.type != tokenize.COMMENT:
      continue
    line = token.start[0]
    if block and line != last_line + 1:
      yield ' '.join(block)
      block = []
    block.append(token.string.lstrip('#').strip())
    last_line = line
  if block:
    yield ' '.join(block)


def _python_texts(path: str) -> Iterator[tuple[str, str]]:
  """(source, text) of a Python file: its docstring paragraphs, then its comments.

  A file that does not parse (Python 2, templates, bad encodings) gives
  nothing.
  """
  with open(path, 'rb') as f:
    source = f.read()
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node)
      if docstring:
        yield from (('docstring', p) for p in _docstring_paragraphs(docstring))
  try:
    yield from (('comment', block) for block in _comment_blocks(source))
  except (tokenize.TokenError, SyntaxError):
    return


def _python_files(directory: str) -> list[str]:
  """The .py files under directory, sorted, without third-party package directories."""
  paths = []
  for path in glob.glob(os.path.join(glob.escape(directory), '**', '*.py'), recursive=True):
    parts = os.path.relpath(path, directory).split(os.sep)
    if not _THIRD_PARTY_DIRS.intersection(parts[:-1]):
      paths.append(path)
  return sorted(paths)


def _catalog_texts(path: str) -> Iterator[tuple[str, str]]:
  """('gettext', English message) of a .mo catalog: msgids and plural msgids.

  The header and translator credits are skipped; an unreadable catalog gives
  nothing.
  """
  try:
    catalog = _read_catalog(path)
  except ValueError as e:
    logging.warning('Skipping a catalog that cannot be read: %s', e)
    return
  for entry in catalog:
    if entry.msgid and entry.msgid.lower() not in _TRANSLATOR_CREDIT_IDS:
      yield 'gettext', entry.msgid
      if entry.msgid_plural:
        yield 'gettext', entry.msgid_plural


def _english_source_files(
  python_dirs: Sequence[str], catalog_dir: Optional[str]
) -> tuple[list[str], list[str]]:
  """(.py files under `python_dirs`, .mo catalogs of every language under `catalog_dir`).

  FileNotFoundError naming both places when neither has a file.
  """
  python_paths = [path for directory in python_dirs for path in _python_files(directory)]
  catalog_paths = []
  if catalog_dir is not None:
    catalog_glob = os.path.join(glob.escape(catalog_dir), '*', 'LC_MESSAGES', '*.mo')
    catalog_paths = sorted(glob.glob(catalog_glob))
  if not python_paths and not catalog_paths:
    raise FileNotFoundError(
      f'No .py file under {list(python_dirs)} and no .mo catalog under {catalog_dir}/*/'
      'LC_MESSAGES: pass python_dirs (e.g. a Python installation) or catalog_dir.'
    )
  return python_paths, catalog_paths


def _english_sentences_of(
  python_paths: Sequence[str], catalog_paths: Sequence[str], min_words: int, max_words: int
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
  """The files' English sentences: ({lower-cased: its spellings}, {lower-cased: its sources}).

  ValueError when no sentence passes `english_sentences`' filters.
  """
  spellings = collections.defaultdict(set)
  sources = collections.defaultdict(set)
  texts = [(_python_texts, path) for path in python_paths]
  texts += [(_catalog_texts, path) for path in catalog_paths]
  for read, path in texts:
    for source, text in read(path):
      for sentence in english_sentences(text, min_words, max_words):
        spellings[sentence.lower()].add(sentence)
        sources[sentence.lower()].add(source)
  if not spellings:
    raise ValueError(
      f'No English sentence of {min_words} to {max_words} words in {len(python_paths)} Python '
      f'files and {len(catalog_paths)} catalogs; lower min_words or add sources.'
    )
  return spellings, sources


def build_english_corpus(
  output_dir: str,
  python_dirs: Optional[Sequence[str]] = None,
  catalog_dir: Optional[str] = '/usr/share/locale',
  *,
  min_words: int = 6,
  max_words: int = 40,
) -> dict[str, int]:
  """Builds an English sentence corpus from this machine's Python sources and catalogs.

  An offline stand-in for LM1B (the paper's GPT-like pair was trained on it;
  TFDS cannot download it without the internet): English prose written by
  people, one sentence a line, from
    * 'docstring': the docstrings of every module, class and function of the
      .py files under `python_dirs` (default: the running Python's standard
      library), paragraph by paragraph (see `_docstring_paragraphs`);
    * 'comment': their comments, consecutive comment lines joined;
    * 'gettext': the English messages (msgid, and msgid_plural) of every .mo
      catalog of every language under `catalog_dir` (`*/LC_MESSAGES/*.mo`):
      the English side of the gettext corpus, from all translated programs.
  Third-party packages (site-packages, dist-packages) are not read: the
  corpus then depends only on the Python version and the installed
  programs. On this project's development machine (Python 3.11, Debian's
  catalogs) it holds ~24k sentences, ~0.3M words (`corpus_info.json`).

  Cleaning and filtering: `english_sentences` (prose sentences of min_words
  to max_words words, ASCII, no code or markup). Deduplication: one sentence
  per case-insensitive text, the lexicographically smallest spelling.
  Split: by a SHA-256 hash of the lower-cased sentence (90% train, 5%
  validation, 5% test), so it does not depend on file order; within a file
  sentences are ordered by that hash.

  Writes `train.txt`, `validation.txt` and `test.txt` (UTF-8, one sentence a
  line) and `ENGLISH_CORPUS_INFO_FILE` (the sources read and, per split, the
  sentences, words and characters, and sentences per source) into
  output_dir, ready for `tasks.register_english_lm_task`.

  Args:
    output_dir: where to write the files (created if missing).
    python_dirs: directories searched recursively for .py files; None for the
      standard library (`sysconfig`'s 'stdlib'); () for none.
    catalog_dir: the locale directory; None for no catalogs.
    min_words: the fewest words of a sentence.
    max_words: the most (longer ones are rarely single sentences).

  Returns:
    The number of sentences written per split.

  Raises:
    FileNotFoundError: no .py file and no catalog was found.
    ValueError: no sentence passed the filters.
  """
  if not 1 <= min_words <= max_words:
    raise ValueError(
      f'Need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}.'
    )
  if python_dirs is None:
    python_dirs = [sysconfig.get_paths()['stdlib']]
  python_paths, catalog_paths = _english_source_files(python_dirs, catalog_dir)

  spellings, sources = _english_sentences_of(python_paths, catalog_paths, min_words, max_words)
  by_split = _splits_in_hash_order(spellings)
  os.makedirs(output_dir, exist_ok=True)
  info = {
    'sources': {'python_dirs': list(python_dirs), 'catalog_dir': catalog_dir},
    'python_files': len(python_paths),
    'catalogs': len(catalog_paths),
    'min_words': min_words,
    'max_words': max_words,
    'splits': _write_english_splits(output_dir, spellings, sources, by_split),
  }
  with open(os.path.join(output_dir, ENGLISH_CORPUS_INFO_FILE), 'w') as f:
    json.dump(info, f, indent=1)
  counts = {split: len(keys) for split, keys in by_split.items()}
  logging.info(
    'English corpus from %d Python files and %d catalogs: %s.',
    len(python_paths),
    len(catalog_paths),
    counts,
  )
  return counts


def _write_english_splits(
  output_dir: str,
  spellings: dict[str, set[str]],
  sources: dict[str, set[str]],
  by_split: dict[str, list[str]],
) -> dict[str, dict]:
  """Writes `<split>.txt` per split (each key's smallest spelling, in `by_split`'s order);
  returns per split its sentences, words, characters and sentences per source (a
  sentence found in several sources counts for the first of `ENGLISH_SOURCES`)."""
  first_source = lambda key: next(s for s in ENGLISH_SOURCES if s in sources[key])
  splits = {}
  for split, keys in by_split.items():
    sentences = [min(spellings[key]) for key in keys]
    _write_lines(os.path.join(output_dir, f'{split}.txt'), sentences)
    splits[split] = {
      'sentences': len(sentences),
      'words': sum(len(sentence.split()) for sentence in sentences),
      'characters': sum(len(sentence) for sentence in sentences),
      'by_source': dict(collections.Counter(first_source(key) for key in keys)),
    }
  return splits


def read_lines(path: str) -> list[str]:
  """The lines of a UTF-8 text file (e.g. a `build_english_corpus` split), newlines removed."""
  with epath.Path(path).open('rb') as f:
    return [line.decode('utf-8').rstrip('\n') for line in f]
