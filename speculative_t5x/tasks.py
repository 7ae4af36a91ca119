"""seqio tasks, vocabularies and metrics: the data layer of speculative_t5x.

Three kinds of task, all text-to-text with T5's output features (`inputs` and
`targets`, each tokenized with one vocabulary and ended with EOS):

* TFDS tasks equivalent to the `t5` package's `wmt_t2t_ende_v003` and
  `cnn_dailymail_v002`: same TFDS datasets, prefixes, preprocessing chain
  (text map, `seqio.preprocessors.tokenize`, cache placeholder,
  `append_eos_after_trim`) and metrics. They are registered under the
  `speculative_t5x:` namespace so that they can live next to the `t5`
  package's own registrations (seqio raises on duplicate names; the colon is
  one of seqio's allowed task-name characters and becomes a sub-directory in
  seqio's cache).
* Tasks over local TSV files (`source<TAB>target` per line), for users who
  bring their own data.
* `speculative_t5x:gettext_ende`, over an English->German corpus built offline
  from the machine's gettext catalogs (`build_gettext_corpus`).

Importing this module registers the TFDS tasks with T5's vocabulary
(`gs://t5-data/vocabs/cc_all.32000/sentencepiece.model`, 100 extra ids). The
vocabulary is loaded lazily, on first use, so the import needs no network.
`register_tasks(vocabulary=..., tfds_data_dir=...)` re-registers them with
another vocabulary (a path, gs:// or local, or a `seqio.Vocabulary`) or TFDS
directory; every register function replaces an earlier registration of the
same name.

`train_sentencepiece` trains a vocabulary with T5's conventions (pad=0, eos=1,
unk=2, no bos) for local tasks.
"""

import collections
import dataclasses
import functools
import gettext
import glob
import hashlib
import os
import re
import struct
import unicodedata
from typing import (Callable, Iterable, Iterator, Mapping, Optional, Sequence,
                    Union)

from absl import logging
from rouge_score import rouge_scorer
import sacrebleu
import seqio
import sentencepiece as spm
import tensorflow as tf

# ---------------------------------------------------------------------------
# Names and defaults.
# ---------------------------------------------------------------------------

TASK_NAMESPACE = "speculative_t5x"
WMT_ENDE_TASK = f"{TASK_NAMESPACE}:wmt_t2t_ende_v003"
CNN_DAILYMAIL_TASK = f"{TASK_NAMESPACE}:cnn_dailymail_v002"
GETTEXT_ENDE_TASK = f"{TASK_NAMESPACE}:gettext_ende"

DEFAULT_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100

WMT_ENDE_TFDS_NAME = "wmt_t2t_translate/de-en:1.0.0"
CNN_DAILYMAIL_TFDS_NAME = "cnn_dailymail:3.4.0"
EN_DE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "

SPLITS = ("train", "validation", "test")
MetricFn = Callable[[Sequence[str], Sequence[str]], Mapping[str, float]]
VocabularyOrPath = Union[str, seqio.Vocabulary]

# ---------------------------------------------------------------------------
# Metrics (signature `(targets, predictions) -> {name: value}`, as seqio calls
# them).
# ---------------------------------------------------------------------------


def _check_metric_inputs(targets: Sequence[str], predictions: Sequence[str]):
  if len(targets) != len(predictions):
    raise ValueError(
        f"Got {len(targets)} targets but {len(predictions)} predictions; "
        "pass one prediction per target.")
  if not targets:
    raise ValueError("Got no targets and no predictions; pass at least one.")


def bleu(targets: Sequence[str],
         predictions: Sequence[str]) -> dict[str, float]:
  """Corpus BLEU on a 0-100 scale, with `t5.evaluation.metrics.bleu`'s settings.

  sacrebleu's corpus BLEU over all examples (one reference each) with
  exponential smoothing, the international tokenizer (`intl`), case-sensitive,
  no effective order.

  Args:
    targets: one reference string per example.
    predictions: one hypothesis string per example.

  Returns:
    {"bleu": score in [0, 100]}.
  """
  _check_metric_inputs(targets, predictions)
  score = sacrebleu.corpus_bleu(
      list(predictions), [list(targets)],
      smooth_method="exp", smooth_value=0.0, force=False, lowercase=False,
      tokenize="intl", use_effective_order=False)
  return {"bleu": score.score}


def _split_sentences_for_rouge_lsum(summary: str) -> str:
  # ROUGE-Lsum scores each newline-separated sentence; T5 marks a sentence end
  # as " . " in its (single-line) targets and predictions.
  return summary.replace(" . ", " .\n")


def rouge(targets: Sequence[str],
          predictions: Sequence[str]) -> dict[str, float]:
  """ROUGE-1, ROUGE-2 and ROUGE-Lsum F1 (x100), averaged over examples.

  Scored like `t5.evaluation.metrics.rouge`: rouge-score's `RougeScorer` with
  its defaults (no stemming), each text split into sentences at " . " for
  ROUGE-Lsum. One difference, for reproducibility: t5 reports the median of
  1000 unseeded bootstrap resamples of the mean F1 (a noisy estimate of the
  mean, different on every call); this returns the mean itself, which is what
  t5's `rouge_mean` computes.

  Args:
    targets: one reference summary per example.
    predictions: one predicted summary per example.

  Returns:
    {"rouge1": ..., "rouge2": ..., "rougeLsum": ...}, each in [0, 100].
  """
  _check_metric_inputs(targets, predictions)
  keys = ("rouge1", "rouge2", "rougeLsum")
  scorer = rouge_scorer.RougeScorer(list(keys))
  totals = collections.Counter()
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(
        target=_split_sentences_for_rouge_lsum(target),
        prediction=_split_sentences_for_rouge_lsum(prediction))
    for key in keys:
      totals[key] += scores[key].fmeasure
  return {key: 100 * totals[key] / len(targets) for key in keys}


# ---------------------------------------------------------------------------
# Vocabularies and output features.
# ---------------------------------------------------------------------------


def hide_gpus_from_tensorflow() -> None:
  """Keeps TensorFlow, which only feeds data here, off the GPUs that JAX uses.

  Left alone, TensorFlow reserves most of every GPU's memory when it starts.
  """
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # TensorFlow's devices are already initialized.
    pass


def get_vocabulary(vocabulary: VocabularyOrPath = DEFAULT_VOCAB_PATH,
                   extra_ids: int = DEFAULT_EXTRA_IDS) -> seqio.Vocabulary:
  """A `seqio.Vocabulary` from a SentencePiece model path, or `vocabulary`.

  Args:
    vocabulary: a `seqio.Vocabulary` (returned as is), or the path (gs:// or
      local) of a SentencePiece model. The model is read on first use, not
      here.
    extra_ids: sentinel ids appended by seqio to a model given by path (T5's
      cc_all.32000 is used with 100).

  Returns:
    The vocabulary.
  """
  if isinstance(vocabulary, seqio.Vocabulary):
    return vocabulary
  if not isinstance(vocabulary, (str, os.PathLike)):
    raise ValueError(
        f"vocabulary must be a seqio.Vocabulary or the path of a SentencePiece "
        f"model, got {vocabulary!r}.")
  return seqio.SentencePieceVocabulary(os.fspath(vocabulary), extra_ids)


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  """T5's text-to-text output features: EOS-terminated inputs and targets."""
  return {
      "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
      "targets": seqio.Feature(vocabulary, add_eos=True),
  }


# ---------------------------------------------------------------------------
# Registration.
# ---------------------------------------------------------------------------


@seqio.map_over_dataset
def _to_text2text(example, prefix: str, source_key: str, target_key: str):
  # Same strings as t5's `translate` ("translate English" + " to German: " +
  # text) and `summarize` ("summarize:" joined with the article by " ").
  return {"inputs": tf.strings.join([prefix, example[source_key]]),
          "targets": example[target_key]}


@seqio.map_over_dataset
def _parse_tsv_line(line):
  source, target = tf.io.decode_csv(
      line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False)
  return {"source": source, "target": target}


def _text2text_preprocessors(prefix: str, source_key: str, target_key: str):
  return [
      functools.partial(_to_text2text, prefix=prefix, source_key=source_key,
                        target_key=target_key),
      seqio.preprocessors.tokenize,
      seqio.CacheDatasetPlaceholder(),
      seqio.preprocessors.append_eos_after_trim,
  ]


def _register(name: str, **task_kwargs) -> seqio.Task:
  seqio.TaskRegistry.remove(name)  # A no-op for a new name.
  return seqio.TaskRegistry.add(name, **task_kwargs)


def register_tasks(vocabulary: VocabularyOrPath = DEFAULT_VOCAB_PATH,
                   *,
                   extra_ids: int = DEFAULT_EXTRA_IDS,
                   tfds_data_dir: Optional[str] = None) -> tuple[str, str]:
  """(Re)registers the TFDS tasks equivalent to T5's WMT EnDe and CNN/DM.

  `speculative_t5x:wmt_t2t_ende_v003`: TFDS `wmt_t2t_translate/de-en:1.0.0`,
  inputs "translate English to German: " + English, targets German, BLEU.
  `speculative_t5x:cnn_dailymail_v002`: TFDS `cnn_dailymail:3.4.0`, inputs
  "summarize: " + article, targets the highlights, ROUGE-1/2/Lsum.

  Args:
    vocabulary: a `seqio.Vocabulary`, or the path (gs:// or local) of a
      SentencePiece model (read lazily).
    extra_ids: extra ids for a vocabulary given by path.
    tfds_data_dir: the TFDS data directory holding the prepared datasets; None
      for TFDS's default.

  Returns:
    The two task names.
  """
  features = output_features(get_vocabulary(vocabulary, extra_ids))
  _register(
      WMT_ENDE_TASK,
      source=seqio.TfdsDataSource(WMT_ENDE_TFDS_NAME,
                                  tfds_data_dir=tfds_data_dir),
      preprocessors=_text2text_preprocessors(EN_DE_PREFIX, "en", "de"),
      output_features=features,
      metric_fns=[bleu])
  _register(
      CNN_DAILYMAIL_TASK,
      source=seqio.TfdsDataSource(CNN_DAILYMAIL_TFDS_NAME,
                                  tfds_data_dir=tfds_data_dir),
      preprocessors=_text2text_preprocessors(SUMMARIZE_PREFIX, "article",
                                             "highlights"),
      output_features=features,
      metric_fns=[rouge])
  return WMT_ENDE_TASK, CNN_DAILYMAIL_TASK


def register_tsv_task(name: str,
                      split_to_filepattern: Mapping[str, Union[str,
                                                               Sequence[str]]],
                      vocabulary: VocabularyOrPath = DEFAULT_VOCAB_PATH,
                      *,
                      extra_ids: int = DEFAULT_EXTRA_IDS,
                      prefix: str = EN_DE_PREFIX,
                      metric_fns: Sequence[MetricFn] = (bleu,)) -> seqio.Task:
  """(Re)registers a task over TSV files of `source<TAB>target` lines.

  Each line holds exactly two tab-separated fields, UTF-8, no header and no
  quoting (a field may not contain a tab or a newline). inputs = prefix +
  source, targets = target, then T5's tokenize / append-EOS chain.

  Args:
    name: the task name (letters, digits, `_`, `.`, `:` and `#`, as seqio
      allows).
    split_to_filepattern: split name -> file pattern(s), gs:// or local.
    vocabulary: a `seqio.Vocabulary` or the path of a SentencePiece model.
    extra_ids: extra ids for a vocabulary given by path.
    prefix: prepended to every source string.
    metric_fns: seqio metric functions `(targets, predictions) -> dict`.

  Returns:
    The registered task.
  """
  if not split_to_filepattern:
    raise ValueError("split_to_filepattern is empty; map at least one split "
                     "(e.g. 'train') to a TSV file pattern.")
  return _register(
      name,
      source=seqio.TextLineDataSource(dict(split_to_filepattern)),
      preprocessors=[_parse_tsv_line,
                     *_text2text_preprocessors(prefix, "source", "target")],
      output_features=output_features(get_vocabulary(vocabulary, extra_ids)),
      metric_fns=list(metric_fns))


def register_gettext_task(corpus_dir: str,
                          vocabulary: VocabularyOrPath = DEFAULT_VOCAB_PATH,
                          *,
                          extra_ids: int = DEFAULT_EXTRA_IDS,
                          name: str = GETTEXT_ENDE_TASK) -> seqio.Task:
  """(Re)registers the EnDe task over a `build_gettext_corpus` directory.

  Args:
    corpus_dir: the directory holding train.tsv, validation.tsv and test.tsv.
    vocabulary: a `seqio.Vocabulary` or the path of a SentencePiece model.
    extra_ids: extra ids for a vocabulary given by path.
    name: the task name.

  Returns:
    The registered task (inputs "translate English to German: " + English,
    BLEU).
  """
  return register_tsv_task(
      name, {split: os.path.join(corpus_dir, f"{split}.tsv")
             for split in SPLITS},
      vocabulary, extra_ids=extra_ids, prefix=EN_DE_PREFIX, metric_fns=[bleu])


# ---------------------------------------------------------------------------
# The offline English->German corpus from gettext catalogs.
# ---------------------------------------------------------------------------

_MO_MAGIC = 0x950412de
_CONTEXT_SEPARATOR = "\x04"
# Entries that carry translator names rather than a translation.
_TRANSLATOR_CREDIT_IDS = frozenset({"translator-credits", "translator_credits"})
_TRANSLATOR_CREDIT_CONTEXTS = frozenset(
    {"NAME OF TRANSLATORS", "EMAIL OF TRANSLATORS"})
# Unicode categories that are never wanted in a UI string pair: controls
# (tab, newline, escape, ...), format characters (zero-width, bidi marks) and
# line/paragraph separators (which some readers treat as line breaks).
_UNWANTED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

# printf directives (C, glibc and Python %-formatting): optional `n$` argument
# index or Python `(name)`; flags (not ' ', so that "50% done" is no
# directive); width; precision; length; conversion. `%%` is removed first.
_PRINTF_DIRECTIVE = re.compile(
    r"%(?:(?P<index>\d+)\$|\((?P<name>\w+)\))?[-+#0'I]*"
    r"(?P<width>\d+|\*(?:\d+\$)?)?(?:\.(?P<precision>\d+|\*(?:\d+\$)?))?"
    r"(?P<length>hh|h|ll|l|L|q|j|z|Z|t)?"
    r"(?P<conversion>[diouxXeEfFgGaAcCsSpnm])")
# str.format / brace fields; `{{` and `}}` are removed first.
_BRACE_FIELD = re.compile(r"\{([^{}]*)\}")
# A mnemonic marker: `_` (GTK) or `&` (Qt/KDE) before a letter or digit; `&`
# not starting an HTML/XML entity.
_MNEMONIC = {"_": re.compile(r"_(?=[^\W_])"),
             "&": re.compile(r"&(?![#\w]+;)(?=[^\W_])")}


@dataclasses.dataclass(frozen=True)
class _MoEntry:
  context: Optional[str]
  msgid: str
  msgid_plural: Optional[str]
  msgstrs: tuple[str, ...]


def _read_mo(path: str) -> list[_MoEntry]:
  """Reads the static entries of a GNU .mo catalog.

  Layout (GNU gettext manual, "The Format of GNU MO Files"): a header of
  uint32 words (magic, revision, count N, offset of the original-string
  table, offset of the translation table, ...), then two tables of N
  (length, offset) pairs. An original is `[context \\x04] msgid [\\0
  msgid_plural]`; a translation is its forms joined by `\\0`. Strings are
  decoded with the charset of the header entry (msgid ""). System-dependent
  strings (revision 1) are skipped, as Python's `gettext` skips them.

  Args:
    path: the .mo file.

  Returns:
    The entries, header entry included, in file order.
  """
  with open(path, "rb") as f:
    data = f.read()
  if len(data) < 20:
    raise ValueError(f"{path} is too short to be a .mo catalog.")
  for byte_order in ("<", ">"):
    if struct.unpack_from(byte_order + "I", data)[0] == _MO_MAGIC:
      break
  else:
    raise ValueError(f"{path} is not a .mo catalog (bad magic number).")
  revision, count, originals_at, translations_at = struct.unpack_from(
      byte_order + "4I", data, 4)
  if revision >> 16 not in (0, 1):
    raise ValueError(f"{path} has unsupported .mo revision {revision >> 16}.")
  if max(originals_at, translations_at) + 8 * count > len(data):
    raise ValueError(f"{path} is truncated: its string tables end past the "
                     "end of the file.")

  def raw_string(table_at: int, index: int) -> bytes:
    length, offset = struct.unpack_from(byte_order + "2I", data,
                                        table_at + 8 * index)
    return data[offset:offset + length]

  raw = [(raw_string(originals_at, i), raw_string(translations_at, i))
         for i in range(count)]
  charset = "utf-8"
  for original, translation in raw:
    if not original:
      match = re.search(rb"charset=([\w.:-]+)", translation)
      if match and match.group(1).lower() != b"charset":
        charset = match.group(1).decode("ascii")
  try:
    "".encode(charset)
  except LookupError:
    logging.warning("Skipping %s: unknown charset %r.", path, charset)
    return []

  entries = []
  for original, translation in raw:
    try:
      original_text = original.decode(charset)
      translation_text = translation.decode(charset)
    except UnicodeDecodeError:
      continue
    context, _, ids = original_text.rpartition(_CONTEXT_SEPARATOR)
    msgid, _, msgid_plural = ids.partition("\0")
    entries.append(_MoEntry(
        context=context if _CONTEXT_SEPARATOR in original_text else None,
        msgid=msgid,
        msgid_plural=msgid_plural if "\0" in ids else None,
        msgstrs=tuple(translation_text.split("\0"))))
  return entries


def _plural_form_indices(entries: Sequence[_MoEntry]) -> tuple[int, int]:
  """The translation forms to pair with English singular and plural msgids.

  The singular goes with the form the catalog's Plural-Forms formula picks for
  n = 1; the English plural with the form it picks most often for n = 2..100
  (for German, as for English, forms 0 and 1).
  """
  expression = "n != 1"  # gettext's default, germanic plural.
  for entry in entries:
    if entry.msgid == "" and entry.context is None:
      match = re.search(r"plural=([^;\n]+)", entry.msgstrs[0])
      if match:
        expression = match.group(1)
  try:
    plural_form = gettext.c2py(expression)
  except ValueError:
    plural_form = gettext.c2py("n != 1")
  plural_counts = collections.Counter(plural_form(n) for n in range(2, 101))
  return plural_form(1), plural_counts.most_common(1)[0][0]


def _catalog_pairs(entries: Sequence[_MoEntry]) -> Iterator[tuple[str, str]]:
  """(English, translation) pairs of one catalog: header and credits dropped.

  msgctxt only disambiguates a msgid within one program; the pair keeps the
  msgid and translation, so entries that differ only in context compete in
  the majority vote of `build_gettext_corpus`.
  """
  singular_form, plural_form = _plural_form_indices(entries)
  for entry in entries:
    if (entry.msgid == "" or entry.msgid.lower() in _TRANSLATOR_CREDIT_IDS or
        entry.context in _TRANSLATOR_CREDIT_CONTEXTS):
      continue
    if entry.msgid_plural is None:
      yield entry.msgid, entry.msgstrs[0]
      continue
    for source, form in ((entry.msgid, singular_form),
                         (entry.msgid_plural, plural_form)):
      if form < len(entry.msgstrs):
        yield source, entry.msgstrs[form]


def _printf_signature(text: str) -> list[tuple[str, str]]:
  """Sorted (argument, conversion) pairs of the printf directives in text.

  Arguments are numbered like C does (`n$` explicitly, else in order) or
  named (`%(name)s`), so a translation may reorder positional arguments;
  flags, width and precision may change (alignment), conversions may not.
  """
  signature = []
  next_index = 1
  for match in _PRINTF_DIRECTIVE.finditer(text.replace("%%", "")):
    stars = sum(
        1 for part in (match["width"], match["precision"])
        if part and part.startswith("*"))
    conversion = "*" * stars + (match["length"] or "") + match["conversion"]
    if match["index"]:
      argument = match["index"]
    elif match["name"]:
      argument = match["name"]
    else:
      argument = str(next_index)
      next_index += 1 + stars
    signature.append((argument, conversion))
  return sorted(signature)


def _brace_signature(text: str) -> list[str]:
  """Sorted field names of `{}`-style fields (auto-numbered fields by order)."""
  fields = []
  auto_index = 0
  for match in _BRACE_FIELD.finditer(text.replace("{{", "").replace("}}", "")):
    field = re.split(r"[!:]", match.group(1), maxsplit=1)[0]
    if not field:
      field = str(auto_index)
      auto_index += 1
    fields.append(field)
  return sorted(fields)


def _word_around(text: str, at: int) -> str:
  """The letters and digits around the marker at position `at`, lowercased."""
  return (re.search(r"[^\W_]*$", text[:at]).group(0) + text[at] +
          re.match(r"[^\W_]*", text[at + 1:]).group(0)).lower()


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
        for text, match in ((source, source_match), (target, target_match)))
    if not starts_word or (_word_around(source, source_match.start()) ==
                           _word_around(target, target_match.start())):
      continue
    source = source[:source_match.start()] + source[source_match.end():]
    target = target[:target_match.start()] + target[target_match.end():]
  return source, target


def _clean_pair(source: str, target: str,
                max_chars: int) -> tuple[Optional[tuple[str, str]], str]:
  """Applies the cleaning rules; returns (pair or None, the rule applied)."""
  source, target = source.strip(), target.strip()
  if not source or not target:
    return None, "empty"
  if any(unicodedata.category(ch) in _UNWANTED_CATEGORIES
         for ch in source + target):
    return None, "control character"
  source, target = _strip_mnemonics(source, target)
  if len(source) > max_chars or len(target) > max_chars:
    return None, "too long"
  if source == target:
    return None, "identical"
  if (_printf_signature(source) != _printf_signature(target) or
      _brace_signature(source) != _brace_signature(target)):
    return None, "placeholder mismatch"
  return (source, target), "kept"


def _split_of(source: str) -> str:
  """train / validation / test (90/5/5) by a hash of the English string."""
  bucket = int.from_bytes(
      hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") % 20
  return SPLITS[0] if bucket < 18 else SPLITS[1] if bucket == 18 else SPLITS[2]


def build_gettext_corpus(output_dir: str,
                         catalog_dir: str = "/usr/share/locale",
                         language: str = "de",
                         *,
                         max_chars: int = 200) -> dict[str, int]:
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
  catalog_glob = os.path.join(catalog_dir, language, "LC_MESSAGES", "*.mo")
  catalog_paths = sorted(glob.glob(catalog_glob))
  if not catalog_paths:
    raise FileNotFoundError(
        f"No gettext catalogs match {catalog_glob}. Install translated "
        f"packages (on Debian/Ubuntu the {language} catalogs ship with the "
        f"programs, or with language packs: `apt-get install locales "
        f"language-pack-{language}` on Ubuntu), pass another catalog_dir, or "
        f"use the TFDS task {WMT_ENDE_TASK!r} instead.")

  votes = collections.defaultdict(collections.Counter)
  rule_counts = collections.Counter()
  for path in catalog_paths:
    # A pair counts once per catalog, however many contexts repeat it.
    try:
      entries = _read_mo(path)
    except ValueError as e:
      logging.warning("Skipping a catalog that cannot be read: %s", e)
      continue
    catalog_pairs = set()
    for source, target in _catalog_pairs(entries):
      pair, rule = _clean_pair(source, target, max_chars)
      rule_counts[rule] += 1
      if pair:
        catalog_pairs.add(pair)
    for source, target in catalog_pairs:
      votes[source][target] += 1

  by_split = {split: [] for split in SPLITS}
  for source, targets in votes.items():
    target = min(targets, key=lambda t: (-targets[t], t))
    by_split[_split_of(source)].append((source, target))
  os.makedirs(output_dir, exist_ok=True)
  for split, pairs in by_split.items():
    pairs.sort(key=lambda pair: (hashlib.sha256(pair[0].encode()).digest(),
                                 pair[0]))
    with open(os.path.join(output_dir, f"{split}.tsv"), "w",
              encoding="utf-8", newline="\n") as f:
      f.writelines(f"{source}\t{target}\n" for source, target in pairs)
  counts = {split: len(pairs) for split, pairs in by_split.items()}
  logging.info("Gettext corpus from %d catalogs: %s; per cleaning rule: %s.",
               len(catalog_paths), counts, dict(rule_counts))
  return counts


# ---------------------------------------------------------------------------
# SentencePiece vocabularies.
# ---------------------------------------------------------------------------


def tsv_texts(filepatterns: Union[str, Sequence[str]]) -> Iterator[str]:
  """Yields both fields of every line of the matching TSV files, in order."""
  patterns = [filepatterns] if isinstance(filepatterns, str) else filepatterns
  paths = [path for pattern in patterns
           for path in sorted(tf.io.gfile.glob(pattern))]
  if not paths:
    raise ValueError(f"No file matches {filepatterns!r}.")
  for path in paths:
    with tf.io.gfile.GFile(path, "r") as f:
      for line in f:
        yield from line.rstrip("\n").split("\t")


def train_sentencepiece(texts: Iterable[str],
                        model_prefix: str,
                        vocab_size: int,
                        *,
                        extra_ids: int = 0,
                        model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        num_threads: int = 1) -> seqio.SentencePieceVocabulary:
  """Trains a SentencePiece model with T5's special ids; returns it for seqio.

  Ids: pad=0, eos=1, unk=2, no bos, as in T5's cc_all.32000, so seqio treats
  0 as PAD and 1 as EOS. Training reads every text in order (no sampling),
  so the model is a function of texts and the arguments (with the default
  num_threads=1; more threads are faster and may reorder floating-point
  sums).

  Args:
    texts: the training sentences (e.g. `tsv_texts(corpus/"train.tsv")`).
    model_prefix: writes `{model_prefix}.model` and `{model_prefix}.vocab`.
    vocab_size: the number of pieces, special ids included (extra ids not).
    extra_ids: sentinel ids seqio appends after the pieces (T5 uses 100).
    model_type: "unigram" (T5's) or "bpe", "char", "word".
    character_coverage: the fraction of characters covered by single-character
      pieces; rarer characters map to unk.
    num_threads: training threads.

  Returns:
    `seqio.SentencePieceVocabulary(f"{model_prefix}.model", extra_ids)`.
  """
  if vocab_size <= 3:
    raise ValueError(f"vocab_size must exceed the 3 special ids, got "
                     f"{vocab_size}.")
  if extra_ids < 0:
    raise ValueError(f"extra_ids must be >= 0, got {extra_ids}.")
  directory = os.path.dirname(model_prefix)
  if directory:
    os.makedirs(directory, exist_ok=True)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=num_threads,
        minloglevel=2)
  except RuntimeError as e:
    if "Vocabulary size too high" not in str(e):
      raise
    raise ValueError(f"The texts are too few for vocab_size={vocab_size}: "
                     f"{e}") from e
  return seqio.SentencePieceVocabulary(f"{model_prefix}.model", extra_ids)


register_tasks()
