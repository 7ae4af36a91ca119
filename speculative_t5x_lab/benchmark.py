"""Benchmarks: the paper's Tables 2-4 for any pair, and what the paper left out.

For a target/draft pair of either architecture and a set of inputs (an
encoder-decoder's encoder inputs, optionally with decoder prompts; a
decoder-only pair's prompts), measured in one run:

  * alpha (Table 3): the mean of beta = sum_x min(p, q) over >= `alpha_tokens`
    tokens sampled from the target after the prompts, teacher forcing the
    draft on them (a prefix LM's prompt attending to itself), per
    temperature; the same for unigram/bigram drafts fitted on a corpus and
    for prompt lookup (its first guess at each position); measured by
    `acceptance.measure_alpha`.
  * c (draft time per token / target step time) and the verify cost v(gamma)
    (a (gamma+1)-token target call / a one-token call), from compiled steps
    timed inside a loop, warmed up, median of repetitions, per temperature.
  * walltime (Table 2): ms/token of the baseline and of speculative decoding
    at batch 1, for a gamma sweep, repeated, median and range; predicted
    speedup (Table 4) = E[tokens per call] / (gamma c + v(gamma)) from the
    measured alpha, c and v (Theorem 3.8 with the verify cost measured rather
    than assumed free).
  * where each iteration's time goes (`measure`): every part of the loop body
    timed alone at the decode call's shapes, their sum against the measured
    iteration (the rest reported as unexplained), a prediction from the
    parts, and each one-token step against its memory floor (bytes read /
    bandwidth measured in the same run). Baseline and speculative passes
    alternate, so their ratio holds on a noisy machine.
  * what the paper left out: speedup vs batch size, memory vs gamma (XLA's
    analysis of the compiled decode call, and the device's peak where it
    reports one), acceptance by draft position and by token, the histogram of
    tokens per target call, and BLEU of both decodes (identical when greedy).
  * `emulate_alpha`: an explicitly labelled timing mode for models with random
    weights (e.g. T5-XXL/small) in which acceptances are drawn i.i.d. with
    probability alpha; no text is produced and no alpha is measured.

Everything here imports jax/flax/numpy only (sentencepiece or seqio only for
the input readers that need them), so the walltime benchmark runs on GPU/TPU
machines without TensorFlow. `run_benchmark` takes what it sweeps, how much
it measures, the drafts measured beside the pair's and the report's labels as
four small option classes (`Sweep`, `Measurement`, `OtherDrafts`, `Report`);
`python -m speculative_t5x_lab.benchmark --gin_file=configs/runs/benchmark.gin
...` runs it from gin (`benchmark_pair`, whose bindings name the options'
fields); `scripts/` wraps it. The records become benchmark.json, benchmark.md
and figures in `reports`.
"""

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import acceptance
from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import kernels
from speculative_t5x import layouts
from speculative_t5x_lab import acceptance_counts
from speculative_t5x_lab import emulation
from speculative_t5x_lab import measure
from speculative_t5x_lab import records as records_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x_lab import profile_sweep
from speculative_t5x_lab import reports
from speculative_t5x_lab import result_cache as result_cache_lib
from speculative_t5x import sampling
from speculative_t5x import settings as settings_lib
from speculative_t5x_lab import theory

EOS_ID = models.EOS_ID


# ------------------------------------------------------------------------------
# Inputs.
# ------------------------------------------------------------------------------


def tsv_inputs(
  path: str,
  vocabulary_path: str,
  *,
  prefix: str,
  input_length: Optional[int] = None,
  num_examples: Optional[int] = None,
):
  """Reads `source<TAB>target` lines and tokenizes with a SentencePiece model.

  Needs only sentencepiece (no TensorFlow), for accelerator machines.

  Args:
    path: the TSV file.
    vocabulary_path: a SentencePiece model.
    prefix: the task prefix, e.g. "translate English to German: ".
    input_length: pad to this length (None: the longest input).
    num_examples: read at most this many lines.

  Returns:
    (inputs int32 [N, input_length], targets: list of N reference strings).
  """
  import sentencepiece  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary_path)
  pairs = tasks_core.read_tsv(path, num_examples)
  sources = [processor.encode(prefix + source) + [EOS_ID] for source, _ in pairs]
  return layouts.pad_rows(sources, input_length), [target for _, target in pairs]


def reference_prompts(references: Sequence[str], vocabulary, prompt_length: int):
  """Decoder prompts from references: each one's first tokens, and the rest as its reference.

  Args:
    references: N target strings.
    vocabulary: encodes a string to ids and decodes ids to a string (a
      `seqio.Vocabulary` or a `sentencepiece.SentencePieceProcessor`).
    prompt_length: tokens per prompt; a reference keeps at least one token.

  Returns:
    (prompts int32 [N, prompt_length], tokens then 0-padding; the N
    remaining references).
  """
  rows, rest = [], []
  for reference in references:
    ids = list(vocabulary.encode(reference))
    cut = max(min(prompt_length, len(ids) - 1), 0)
    rows.append(ids[:cut])
    rest.append(vocabulary.decode(ids[cut:]))
  return layouts.pad_rows(rows, prompt_length), rest


def tsv_target_tokens(
  path: str, vocabulary_path: str, num_examples: Optional[int] = None
) -> List[np.ndarray]:
  """The target column of a `source<TAB>target` file as EOS-terminated id rows.

  The corpus for the n-gram drafts (`OtherDrafts.ngram_corpus`).
  """
  import sentencepiece  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary_path)
  return [
    np.asarray(processor.encode(target) + [EOS_ID])
    for _, target in tasks_core.read_tsv(path, num_examples)
  ]


def random_inputs(num_examples: int, input_length: int, vocab_size: int, seed: int = 0):
  """Random full-length inputs (for the emulation mode): ([N, Lin], no targets)."""
  tokens = np.array(measure.random_encoder_inputs(num_examples, input_length, vocab_size, seed))
  tokens[:, -1] = EOS_ID
  return tokens, None


# ------------------------------------------------------------------------------
# Walltime.
# ------------------------------------------------------------------------------


@dataclasses.dataclass
class DecodeRun:
  """A timed decoding pass over the inputs.

  Attributes:
    seconds: per repetition, the wall time of decoding every batch.
    tokens: tokens emitted per pass (EOS included).
    outputs: int32 [N, L] decodes of the first pass.
    stats: the first pass's speculative statistics, its batches' joined
      (`_join_stats`; None for the baseline).
    memory: XLA's memory analysis of the compiled call, in bytes
      (argument_bytes, temp_bytes, output_bytes; empty if unavailable).
    finished_row_share: of the rows the target calls scored, the share
      whose row had already finished (None for the baseline).
    gamma: the gamma that ran (0: the baseline; gamma='auto' chooses it).
  """

  seconds: List[float]
  tokens: int
  outputs: np.ndarray
  stats: Optional[decoding.SpeculativeStats]
  memory: Dict[str, int]
  finished_row_share: Optional[float] = None
  gamma: int = 0

  @property
  def ms_per_token(self) -> List[float]:
    return [1000.0 * s / self.tokens for s in self.seconds]


def _join_stats(stats: Sequence[decoding.SpeculativeStats]) -> decoding.SpeculativeStats:
  """The statistics of batches as those of one batch of all their rows (numpy arrays).

  Per-row fields ([B, ...] each) are concatenated to [sum B, ...]; aggregate
  fields, and every leaf of the judge's record (`acceptance_counts.Counts`:
  counts), are summed, so the properties (`mean_beta`,
  `tokens_per_target_call`, `acceptance_by_position`) hold over all batches.
  """
  per_row = decoding.SpeculativeStats.PER_ROW_FIELDS
  total = lambda values: np.sum([np.asarray(v) for v in values], axis=0)
  return decoding.SpeculativeStats(
    **{
      field.name: (np.concatenate if field.name in per_row else total)(
        [np.asarray(getattr(batch_stats, field.name)) for batch_stats in stats]
      )
      for field in dataclasses.fields(decoding.SpeculativeStats)
      if field.name != 'record'
    },
    record=jax.tree_util.tree_map(lambda *leaves: total(leaves), *[s.record for s in stats]),
  )


def time_decodings(
  decoders: Sequence[models.Decoder],
  inputs: np.ndarray,
  *,
  decoder_prompts: Optional[np.ndarray] = None,
  batch_size: int = 1,
  repetitions: int = 3,
  seed: int = 0,
) -> List[DecodeRun]:
  """Decodes all inputs in batches with each decoder, batches interleaved.

  Batch k of every decoder runs before batch k + 1 of any, each decoder first
  in turn (A B C, B C A, ...), so a ratio of two decoders' pass r compares
  times taken within a second of each other, batch by batch: on a shared,
  noisy machine the pairwise ratios hold when the machine's speed moves
  within a pass, not only between passes. A pass's seconds are the sum of its
  batches' calls, each timed to its end.
  `len(inputs)` must be a multiple of `batch_size` (no row is dropped). Each
  call is compiled ahead of time and warmed up; each run carries its compiled
  program's memory analysis.

  Args:
    decoders: from `models.make_decoder`, all for the same target.
    inputs: int32 [N, Lin] encoder inputs, or a decoder-only target's
      prompts [N, Lp].
    decoder_prompts: optional int32 [N, Lp] decoder prompts of an
      encoder-decoder target.
    batch_size: rows per decode call.
    repetitions: timed passes per decoder.
    seed: batch k decodes with the k-th of `seed`'s split keys.
  """
  if len(inputs) % batch_size:
    raise ValueError(
      f'{len(inputs)} inputs do not split into batches of {batch_size}; '
      'pass a multiple of the batch size.'
    )
  split = lambda x: [
    None if x is None else jnp.asarray(x[i : i + batch_size])
    for i in range(0, len(inputs), batch_size)
  ]
  batches = list(zip(split(inputs), split(decoder_prompts)))
  keys = list(jax.random.split(jax.random.PRNGKey(seed), len(batches)))
  first_batch, first_prompts = batches[0]
  compiled = [decode.compile(first_batch, keys[0], first_prompts) for decode in decoders]
  for call in compiled:
    jax.block_until_ready(call(first_batch, keys[0], first_prompts))  # Warm up.
  seconds = np.zeros((len(decoders), repetitions))
  first_pass = [[] for _ in decoders]
  for repetition in range(repetitions):
    for k, ((batch, prompts), key) in enumerate(zip(batches, keys)):
      for turn in range(len(compiled)):
        index = (k + turn) % len(compiled)
        start = time.perf_counter()
        result = jax.block_until_ready(compiled[index](batch, key, prompts))
        seconds[index, repetition] += time.perf_counter() - start
        if repetition == 0:
          first_pass[index].append(result)
  runs = []
  for decode, call, times, results in zip(decoders, compiled, seconds.tolist(), first_pass):
    outputs = np.concatenate([np.asarray(r.tokens) for r in results])
    stats, finished_share = None, None
    if results[0].stats is not None:
      stats = _join_stats([r.stats for r in results])
      # Batches are joined by rows: the finished share is summed per batch.
      finished = sum(int(r.stats.finished_row_calls) for r in results)
      finished_share = finished / max(batch_size * int(stats.target_calls), 1)
    tokens = int(layouts.output_lengths(outputs, decode.static_args['eos_id']).sum())
    runs.append(
      DecodeRun(
        seconds=times,
        tokens=tokens,
        outputs=outputs,
        stats=stats,
        memory=_memory_bytes(call),
        finished_row_share=finished_share,
        gamma=results[0].gamma,
      )
    )
  return runs


def time_decoding(decode: models.Decoder, inputs: np.ndarray, **kwargs) -> DecodeRun:
  """`time_decodings` of one decoder."""
  return time_decodings([decode], inputs, **kwargs)[0]


def _memory_bytes(compiled: models.CompiledDecoder) -> Dict[str, int]:
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  return {
    'argument_bytes': int(analysis.argument_size_in_bytes),
    'temp_bytes': int(analysis.temp_size_in_bytes),
    'output_bytes': int(analysis.output_size_in_bytes),
  }


def device_peak_bytes() -> Optional[int]:
  """The device allocator's peak (GPU/TPU); None where not reported (CPU)."""
  stats = jax.devices()[0].memory_stats()
  return None if not stats else stats.get('peak_bytes_in_use')


def corpus_bleu(
  vocabulary_path: Optional[str], outputs: np.ndarray, references: Optional[Sequence[str]]
) -> Optional[float]:
  """sacrebleu corpus BLEU (T5's settings) of decodes against references.

  Ids past the SentencePiece model's pieces (a vocabulary padded to a
  multiple of 128) decode as UNK, as seqio's vocabularies decode them.
  """
  if vocabulary_path is None or references is None:
    return None
  import sentencepiece  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary_path)
  pieces, unk = processor.get_piece_size(), processor.unk_id()
  texts = [
    processor.decode([int(t) if t < pieces else unk for t in row[:n] if t != EOS_ID])
    for row, n in zip(outputs, layouts.output_lengths(outputs))
  ]
  return float(tasks_core.bleu(list(references), texts)['bleu'])


# Keys of the sampled-quality measurement at T > 0 (`sampled_quality`).
QUALITY_KEYS = 8


def _mean_and_stderr(values: Sequence[float]) -> Dict[str, Any]:
  return dict(
    mean=float(np.mean(values)),
    stderr=acceptance.standard_error(values),
    per_key=[float(v) for v in values],
  )


def sampled_quality(
  decoders: Mapping[str, models.Decoder],
  inputs: np.ndarray,
  decoder_prompts: Optional[np.ndarray] = None,
  *,
  vocabulary_path: Optional[str],
  references: Optional[Sequence[str]],
  num_keys: int = QUALITY_KEYS,
  seed: int = 1,
  result_cache: Optional[result_cache_lib.ResultCache] = None,
) -> Dict[str, Any]:
  """BLEU and mean output length of each decoder's samples: mean +- standard error over keys.

  At T > 0 a decode is one sample of the target's distribution, and speculative
  decoding's samples are samples of that same distribution: one key's BLEU on a
  few sentences differs between the two decoders by sampling noise alone. Each
  decoder here decodes all `inputs` (one batch) with each of `num_keys` keys
  (`fold_in(PRNGKey(seed), k)`, the same keys for every decoder, none of them
  the timed passes'); each key gives one corpus BLEU and one mean output length
  (tokens up to and including EOS), and the record is their mean and standard
  error (`acceptance.standard_error`) over the keys.

  The samples are a function of the decoder (its models, settings and
  sampling arguments), the inputs and the keys: each decoder's per-key
  figures are kept in `result_cache` under that key, so the baseline's are
  computed once for every gamma it is compared with, and a second run on the
  same checkpoints and machine reads them back.

  Returns:
    {'num_keys', 'num_examples', and per decoder name {'bleu': {'mean',
    'stderr', 'per_key'} (None without references or vocabulary), 'length':
    the same, 'cached_from': None, or the date of the run that computed them}},
    and with exactly two decoders 'bleu_difference_in_stderr': (second -
    first) / sqrt(stderr_first^2 + stderr_second^2).
  """
  if num_keys < 2:
    raise ValueError(f'sampled_quality needs num_keys >= 2 for a standard error, got {num_keys}.')
  result_cache = result_cache or result_cache_lib.ResultCache(None)
  inputs = jnp.asarray(inputs)
  prompts = None if decoder_prompts is None else jnp.asarray(decoder_prompts)
  keys = [jax.random.fold_in(jax.random.PRNGKey(seed), k) for k in range(num_keys)]
  record: Dict[str, Any] = dict(num_keys=num_keys, num_examples=int(len(inputs)))

  def per_key(decode: models.Decoder) -> Dict[str, List[Optional[float]]]:
    outputs = [np.asarray(decode(inputs, key, prompts).tokens) for key in keys]
    eos_id = decode.static_args['eos_id']
    return dict(
      bleu=[corpus_bleu(vocabulary_path, tokens, references) for tokens in outputs],
      length=[float(layouts.output_lengths(tokens, eos_id).mean()) for tokens in outputs],
    )

  vocabulary_digest = result_cache_lib.file_digest(vocabulary_path)  # Read once, not per decoder.
  for name, decode in decoders.items():
    entry = result_cache.get_or_compute(
      'sampled_quality',
      dict(
        decoder=decode,
        inputs=inputs,
        decoder_prompts=prompts,
        references=references,
        vocabulary=vocabulary_digest,
        num_keys=num_keys,
        seed=seed,
      ),
      functools.partial(per_key, decode),
      description=dict(decoder=name, num_examples=int(len(inputs)), num_keys=num_keys),
    )
    bleus, lengths = entry.value['bleu'], entry.value['length']
    record[name] = dict(
      bleu=None if bleus[0] is None else _mean_and_stderr(bleus),
      length=_mean_and_stderr(lengths),
      cached_from=result_cache_lib.cached_from(entry),
    )
  names = list(decoders)
  if len(names) == 2 and record[names[0]]['bleu'] is not None:
    record['bleu_difference_in_stderr'] = _difference_in_stderr(
      record[names[0]]['bleu'], record[names[1]]['bleu']
    )
  return record


def _difference_in_stderr(first: Mapping[str, float], second: Mapping[str, float]) -> float:
  """(second - first) / sqrt(stderr_first^2 + stderr_second^2) of two `_mean_and_stderr`s."""
  spread = float(np.hypot(first['stderr'], second['stderr']))
  return (second['mean'] - first['mean']) / spread if spread > 0 else 0.0


# ------------------------------------------------------------------------------
# The whole benchmark.
# ------------------------------------------------------------------------------


def timing_judge(emulate_alpha: Optional[float] = None) -> acceptance_counts.AcceptanceCounts:
  """The judge of the benchmark's speculative decoders and of their parts' timings.

  The exact rules, or (timing only) acceptance i.i.d. at `emulate_alpha`
  (`emulation.EmulatedJudge`), counted for the records' histogram and
  acceptance by position (`acceptance_counts.AcceptanceCounts`).
  """
  return acceptance_counts.AcceptanceCounts(emulation.judge_at(emulate_alpha))


def measure_parts(
  target: models.Model,
  draft,
  temperatures: Sequence[float],
  gammas: Sequence[int],
  settings: settings_lib.SpeculativeSettings,
  *,
  input_length: int,
  max_decode_len: int,
  prompt_length: int = 0,
  emulate_alpha: Optional[float] = None,
  repetitions: int = 7,
  batch_size: int = 1,
  target_parts: Optional[Mapping[Any, measure.IterationParts]] = None,
) -> Dict[Any, measure.IterationParts]:
  """`measure.iteration_parts` at `batch_size` for every (temperature, gamma).

  `target_parts` (another draft's result at the same settings): its target
  parts are reused, only this draft's are timed.

  `settings` gives the rest of each gamma's settings (its verification rule
  is what the judge part times, with `timing_judge(emulate_alpha)`). `prompt_length` is the prompts' width (a
  decoder-only target's inputs, or decoder prompts; 0: none),
  `input_length` the input tokens'.
  """
  parts, target_step = {}, None
  for temperature in temperatures:
    for gamma in gammas:
      parts[temperature, gamma] = measure.iteration_parts(
        target.config,
        target.decode_params,  # What the timed decoders run on (the CPU kernel where on).
        draft,
        settings.replace(gamma=gamma),
        batch_size=batch_size,
        input_length=input_length,
        max_decode_len=max_decode_len,
        prompt_length=prompt_length,
        inputs_bidirectional_attention=target.inputs_bidirectional_attention,
        temperature=temperature,
        judge=timing_judge(emulate_alpha),
        target_step=target_step,
        target_parts=None if target_parts is None else target_parts[temperature, gamma],
        repetitions=repetitions,
      )
      target_step = parts[temperature, gamma].target_step
  return parts


def costs_record(
  target: models.Model,
  draft,
  parts: Mapping[Any, measure.IterationParts],
  input_length: int,
  max_decode_len: int,
  prompt_length: int = 0,
) -> Dict[str, Any]:
  """c, v(gamma), each part's milliseconds, and the steps against the memory floor."""
  bandwidth = measure.memory_bandwidth()
  first = next(iter(parts.values()))
  shape = dict(
    batch_size=1,
    block_size=1,
    input_length=input_length,
    cache_length=decoding.speculative_cache_length(prompt_length + max_decode_len, first.gamma),
  )
  floors = {
    'target': measure.step_floor(
      measure.decoder_step_bytes(target.config, target.params, **shape),
      first.target_step,
      bandwidth,
    )
  }
  if isinstance(draft, drafts.ModelDraft):
    floors['draft'] = measure.step_floor(
      measure.decoder_step_bytes(draft.config, kernels.plain_params(draft.params), **shape),
      first.draft_catch_up,
      bandwidth,
    )
  elif isinstance(draft, (drafts.FeatureDraft, parallel_draft.ParallelDraft)):
    # One call reads its weights once: a head's over the block, a parallel draft's rollout.
    call = first.draft_observe if isinstance(draft, drafts.FeatureDraft) else first.draft_rollout
    floors['draft'] = measure.step_floor(measure.draft_weight_bytes(draft), call, bandwidth)
  if 'draft' in floors:
    floors['draft_bytes_over_target_bytes'] = floors['draft']['bytes'] / floors['target']['bytes']
  temperatures = sorted({t for t, _ in parts})
  return dict(
    draft=describe_draft(draft),
    target_step_ms=1000 * first.target_step,
    bandwidth_gb_per_s=bandwidth / 1e9,
    floors=floors,
    verify_cost={g: p.verify_cost for (t, g), p in parts.items() if t == temperatures[0]},
    c={t: {g: p.c for (pt, g), p in parts.items() if pt == t} for t in temperatures},
    parts_ms={t: {g: p.as_ms() for (pt, g), p in parts.items() if pt == t} for t in temperatures},
  )


def describe_draft(draft) -> Dict[str, Any]:
  """{'kind', ...}: what drafts, for the records (a network's or a feature head's shape)."""
  if isinstance(draft, drafts.FeatureDraft):
    config = draft.config
    return dict(
      kind='feature head',
      width=config.emb_dim,
      layers=config.num_layers,
      output=config.output,
      feature_layers=list(config.feature_layers),
      parameters=int(network.parameter_count(kernels.plain_params(draft.params))),
    )
  if isinstance(draft, (drafts.ModelDraft, parallel_draft.ParallelDraft)):
    # Its packed copy, if any, is not counted twice.
    parameters = network.parameter_count(kernels.plain_params(draft.params))
    kind = (
      records_lib.PARALLEL_DRAFT_KIND
      if isinstance(draft, parallel_draft.ParallelDraft)
      else 'network'
    )
    return dict(kind=kind, parameters=int(parameters))
  return dict(kind=type(draft).__name__)


def prompts_record(prompts: Optional[np.ndarray]) -> Optional[Dict[str, Any]]:
  """{'width', 'mean_tokens', 'max_tokens'} of prompts int [N, Lp], or None without."""
  if prompts is None:
    return None
  lengths = (np.asarray(prompts) != 0).sum(axis=1)
  return dict(
    width=int(prompts.shape[1]), mean_tokens=float(lengths.mean()), max_tokens=int(lengths.max())
  )


def summary(values: Sequence[float]) -> Dict[str, float]:
  """{'median', 'min', 'max'} of `values` (e.g. per-pass ms/token or speedups)."""
  return {
    'median': float(np.median(values)),
    'min': float(np.min(values)),
    'max': float(np.max(values)),
  }


def _iid_alpha(draft, alpha: Optional[float]) -> Optional[float]:
  """The alpha that Eq. 1's predictions take for `draft`: None for a parallel draft.

  A parallel draft's alpha record is its first position's (q_1, its network's
  next-token output); its later positions accept less, so one rate does not
  describe its blocks: its walltime records carry acceptance by position.
  """
  return None if isinstance(draft, parallel_draft.ParallelDraft) else alpha


# How alpha records name the pair's own draft (a model, n-gram or prompt-lookup
# draft), beside the other drafts measured on the same target samples.
PAIR_DRAFT = 'pair draft'


# ------------------------------------------------------------------------------
# What one benchmark run measures: `run_benchmark`'s options.
# ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What is swept: temperatures, gammas, batch sizes and the verification.

  Attributes:
    temperatures: sampling temperatures (0 is greedy); each its own rows.
    gammas: the gamma sweep at batch 1.
    batch_sizes: batch sizes of the batch-size sweep (1 always runs).
    batch_size_gamma: gamma for the batch-size sweep (None: the best at batch
      1); 'auto': the gamma that alpha and the parts predict best (`gamma_choice`).
    verification, draft_threshold: as `settings.SpeculativeSettings`; with a
      threshold each gamma is the most drafted.
    profile_dir: if given, the speculation-profile sweep (`_profile_sweep`):
      every gamma timed at every batch size with c(B) and v(gamma, B) measured
      there, one `profile_t<T>.json` per temperature written there, and
      gamma='auto' timed with it (`records.Auto`). Without it the batch-size
      sweep times `batch_size_gamma` alone.
  """

  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int] = (1, 3, 5, 7)
  batch_sizes: Sequence[int] = (1,)
  batch_size_gamma: Optional[Union[int, str]] = None
  verification: str = settings_lib.DEFAULTS.verification
  draft_threshold: float = settings_lib.DEFAULTS.draft_threshold
  profile_dir: Optional[str] = None

  def __post_init__(self):
    self.settings  # pylint: disable=pointless-statement  # ValueError before anything is measured.

  @property
  def settings(self) -> settings_lib.SpeculativeSettings:
    """The settings at the largest gamma; each gamma of the sweep replaces its gamma."""
    return settings_lib.SpeculativeSettings(
      gamma=max(self.gammas),
      verification=self.verification,
      draft_threshold=self.draft_threshold,
    )

  @property
  def gammas_with_parts(self) -> List[int]:
    """The gammas whose iteration parts the pair measures: the sweep's and the batch sweep's."""
    batch_gamma = {self.batch_size_gamma} if isinstance(self.batch_size_gamma, int) else set()
    return sorted(set(self.gammas) | batch_gamma)


@dataclasses.dataclass(frozen=True)
class Measurement:
  """How much is measured, and how each configuration is timed.

  Attributes:
    num_walltime_examples: the first this many inputs are timed (a multiple
      of every batch size); all of them feed alpha.
    repetitions: timed passes per configuration.
    max_decode_len: output length.
    alpha_tokens: target tokens for each alpha measurement (>= 10,000 as the paper).
    emulate_alpha: if set, the timing mode for random weights: acceptances
      drawn i.i.d. with this probability (no alpha, text or BLEU; records say
      `emulated`).
  """

  num_walltime_examples: int = 64
  repetitions: int = 3
  max_decode_len: int = 64
  alpha_tokens: int = 10_000
  emulate_alpha: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class OtherDrafts:
  """The drafts measured beside the pair's, on the same target samples and passes.

  Attributes:
    ngram_corpus: target-side token sequences; if given, unigram and bigram
      drafts are fitted on them and their alpha measured (Table 3).
    alpha_drafts: more drafts (name -> a draft `acceptance.draft_logits`
      takes) whose alpha is measured, e.g. the draft before distillation.
    compared_drafts: more drafts (pair label -> a draft as `run_benchmark`'s
      `draft`), each timed in the baseline's and the pair's interleaved passes
      over the gamma sweep at batch 1, with its own costs and alpha records
      labelled as its `pair`; no batch or profile sweep, no sampled quality
      (greedy rows still check identical outputs).
  """

  ngram_corpus: Optional[Sequence[np.ndarray]] = None
  alpha_drafts: Optional[Mapping[str, Any]] = None
  compared_drafts: Optional[Mapping[str, Any]] = None


@dataclasses.dataclass(frozen=True)
class Report:
  """How the records are labelled, what they report besides, and where they go.

  Attributes:
    pair_name, task_name: labels of the records.
    vocabulary_path: SentencePiece model, for BLEU and token strings.
    distillation: if given, the draft's distillation ({'divergence', 'steps',
      'temperature', 'data_mix', 'eval_examples', 'curve'}), reported.
    output_dir: if given, writes benchmark.json, benchmark.md and figures.
    result_cache: where alpha and sampled quality are kept between runs
      (their records say `cached_from`; None: computed in this run); timings
      are always measured.
    progress: called with a line per step.
  """

  pair_name: str = 'pair'
  task_name: str = 'task'
  vocabulary_path: Optional[str] = None
  distillation: Optional[Mapping[str, Any]] = None
  output_dir: Optional[str] = None
  result_cache: Optional[result_cache_lib.ResultCache] = None
  progress: Callable[[str], None] = print


# `run_benchmark`'s option parameters and their classes.
OPTIONS = {
  'sweep': Sweep,
  'measurement': Measurement,
  'other_drafts': OtherDrafts,
  'report': Report,
}


def options_from_fields(**fields) -> Dict[str, Any]:
  """`run_benchmark`'s options from their fields by name, as gin binds `benchmark_pair`.

  E.g. `options_from_fields(gammas=[2], repetitions=1)` is {'sweep':
  Sweep(gammas=[2]), 'measurement': Measurement(repetitions=1),
  'other_drafts': OtherDrafts(), 'report': Report()}. TypeError for a name
  that no option has.
  """
  names = {param: {f.name for f in dataclasses.fields(cls)} for param, cls in OPTIONS.items()}
  known = set().union(*names.values())
  unknown = sorted(set(fields) - known)
  if unknown:
    raise TypeError(
      f'Unknown benchmark settings {unknown}: the settings are the fields of '
      f'{", ".join(cls.__name__ for cls in OPTIONS.values())}: {sorted(known)}. '
      'Check the spelling of the binding.'
    )
  return {
    param: cls(**{name: value for name, value in fields.items() if name in names[param]})
    for param, cls in OPTIONS.items()
  }


def run_benchmark(
  target: models.Model,
  draft,
  inputs: np.ndarray,
  *,
  decoder_prompts: Optional[np.ndarray] = None,
  references: Optional[Sequence[str]] = None,
  sweep: Sweep = Sweep(),
  measurement: Measurement = Measurement(),
  other_drafts: OtherDrafts = OtherDrafts(),
  report: Report = Report(),
) -> List[records_lib.Record]:
  """Measures everything in the module docstring; returns typed records (`records`).

  Args:
    target: the target model, encoder-decoder or decoder-only.
    draft: a `models.Model` of the target's architecture, a draft from
      `drafts` (n-gram, prompt lookup, `drafts.FeatureDraft`) or a
      `models.FeatureHeadCheckpoint`.
    inputs: int32 [N, Lin] encoder inputs, or a decoder-only target's prompts
      [N, Lp] (tokens, then 0-padding; a prefix LM's keep their EOS); the
      first `measurement.num_walltime_examples` are timed, all feed alpha.
    decoder_prompts: optional int32 [N, Lp] decoder prompts of an
      encoder-decoder target (T5X's `prompt_with_targets`), continued by
      decoding, alpha and the timed parts.
    references: optional N reference strings (of what follows the prompts), for BLEU.
    sweep, measurement, other_drafts, report: what is swept, how much is
      measured, the drafts measured beside the pair's, the records' labels
      and where they go (`options_from_fields` builds them from field names).

  Returns:
    `records.Costs`, `records.Alpha` (per draft and temperature),
    `records.Walltime` (per temperature, gamma and batch size),
    `records.GammaChoice`, with a profile directory `records.Profile` and
    `records.Auto`, and `records.Distillation` if given; each names the
    target's `architecture`.
  """
  draft = _checked_draft(target, draft, decoder_prompts)
  timed = TimedExamples.of(target, draft, inputs, decoder_prompts, references, measurement, report)
  compared = _compared_examples(timed, other_drafts.compared_drafts or {}, decoder_prompts)
  records, parts, compared_parts = _measure_all_costs(timed, compared, sweep)
  alpha_candidates = dict(other_drafts.alpha_drafts or {})
  alpha_candidates.update({name: _alpha_candidate(other.draft) for name, other in compared.items()})
  alpha_records, alphas = _measure_alphas(
    timed,
    inputs,
    decoder_prompts,
    sweep.temperatures,
    measurement.alpha_tokens,
    other_drafts.ngram_corpus,
    alpha_candidates,
  )
  records += alpha_records
  for temperature in sweep.temperatures:
    alpha_of = {r.draft: r.alpha for r in alpha_records if r.temperature == temperature}
    alpha = alphas.get(temperature)
    compared_now = [
      (other, alpha_of.get(name, alpha), compared_parts[name]) for name, other in compared.items()
    ]
    records += _measure_walltimes(
      timed, records, temperature, sweep, alpha, parts=parts, compared=compared_now
    )
  if report.distillation is not None:
    records.append(
      records_lib.make(records_lib.Distillation, **timed.common, **report.distillation)
    )
  if report.output_dir is not None:
    reports.write_report(records, report.output_dir)
  return records


def _checked_draft(target: models.Model, draft, decoder_prompts: Optional[np.ndarray]):
  """The draft as a `drafts` draft; ValueError unless it fits the target and the prompts."""
  draft = models.as_draft(
    models.draft_for(target, draft)
  )  # A head's checkpoint, read for the target.
  drafts.check_shared_vocabulary(draft.vocab_size, target.vocab_size)
  models.check_same_architecture(target, draft)
  if decoder_prompts is not None and network.is_decoder_only(target.config):
    raise ValueError(
      'A decoder-only target takes its prompts as the inputs; decoder_prompts is for '
      'encoder-decoder targets. Pass the prompts as inputs.'
    )
  return draft


@dataclasses.dataclass(frozen=True)
class TimedExamples:
  """What every timing of one benchmark shares: the pair, the timed examples, how they are timed.

  Attributes:
    target, draft: the pair (the draft as a `drafts` draft).
    inputs: int32 [N, Lin] the timed inputs, padding columns trimmed.
    decoder_prompts: int32 [N, Lp] their decoder prompts, trimmed, or None.
    references: their N reference strings, or None.
    vocabulary_path: SentencePiece model, for BLEU.
    common: the fields every record shares (pair, task, emulated, architecture).
    repetitions: timed passes per configuration.
    max_decode_len: output length.
    emulate_alpha: the timing-only emulated acceptance (None: the pair's own).
    result_cache: where sampled quality is kept between runs.
    sampled_quality: whether T > 0 rows at batch 1 measure it (not for compared drafts).
    progress: called with a line per step.
  """

  target: models.Model
  draft: Any
  inputs: np.ndarray
  decoder_prompts: Optional[np.ndarray]
  references: Optional[List[str]]
  vocabulary_path: Optional[str]
  common: Dict[str, Any]
  repetitions: int
  max_decode_len: int
  emulate_alpha: Optional[float]
  result_cache: result_cache_lib.ResultCache
  progress: Callable[[str], None]
  sampled_quality: bool = True

  @classmethod
  def of(
    cls,
    target: models.Model,
    draft,
    inputs: np.ndarray,
    decoder_prompts: Optional[np.ndarray],
    references: Optional[Sequence[str]],
    measurement: Measurement,
    report: Report,
  ) -> 'TimedExamples':
    """The first `measurement.num_walltime_examples` rows, padding columns trimmed.

    The records' common fields are `report`'s labels, whether emulated, and
    the target's architecture.
    """
    n = measurement.num_walltime_examples
    return cls(
      target=target,
      draft=draft,
      inputs=layouts.trim_padding(inputs[:n]),
      decoder_prompts=None
      if decoder_prompts is None
      else layouts.trim_padding(decoder_prompts[:n]),
      references=None if references is None else list(references)[:n],
      vocabulary_path=report.vocabulary_path,
      common=dict(
        pair=report.pair_name,
        task=report.task_name,
        emulated=measurement.emulate_alpha is not None,
        architecture=models.architecture(target),
      ),
      repetitions=measurement.repetitions,
      max_decode_len=measurement.max_decode_len,
      emulate_alpha=measurement.emulate_alpha,
      result_cache=report.result_cache or result_cache_lib.ResultCache(None),
      progress=report.progress,
    )

  @property
  def emulated(self) -> bool:
    return self.emulate_alpha is not None

  @property
  def eos_id(self) -> int:
    return -1 if self.emulated else EOS_ID  # Emulated rows run to full length.

  @property
  def prompt_length(self) -> int:
    """The prompts' width (a decoder-only target's inputs, or decoder prompts; 0: none)."""
    prompts = layouts.prompts_of(self.target, self.inputs, self.decoder_prompts)
    return 0 if prompts is None else prompts.shape[1]

  def decoder(self, temperature: float, settings=None):
    """The baseline (`settings` None) or speculative decoder at `temperature`."""
    return models.make_decoder(
      self.target,
      None if settings is None else self.draft,
      settings,
      temperature=temperature,
      max_decode_len=self.max_decode_len,
      eos_id=self.eos_id,
      judge=self.judge,
    )

  @property
  def judge(self) -> acceptance_counts.AcceptanceCounts:
    """The speculative decoders' judge (`timing_judge`)."""
    return timing_judge(self.emulate_alpha)

  def time(self, decoders, batch_size: int) -> List[DecodeRun]:
    """`time_decodings` of `decoders` on the timed examples, batches interleaved."""
    return time_decodings(
      decoders,
      self.inputs,
      decoder_prompts=self.decoder_prompts,
      batch_size=batch_size,
      repetitions=self.repetitions,
    )


def _compared_examples(
  timed: TimedExamples, compared_drafts: Mapping[str, Any], decoder_prompts: Optional[np.ndarray]
) -> Dict[str, TimedExamples]:
  """The compared drafts (label -> draft) as the pair's timed examples with another draft and label."""
  return {
    name: dataclasses.replace(
      timed,
      draft=_checked_draft(timed.target, other, decoder_prompts),
      common=dict(timed.common, pair=name),
      sampled_quality=False,  # The pair's draft reports it against the same baseline.
    )
    for name, other in compared_drafts.items()
  }


def _measure_all_costs(
  timed: TimedExamples, compared: Mapping[str, TimedExamples], sweep: Sweep
) -> Tuple[List[records_lib.Record], Dict[Any, measure.IterationParts], Dict[str, Any]]:
  """The costs records of the pair and of each compared draft: `(records, parts, compared_parts)`.

  The pair's parts at `sweep.gammas_with_parts` (the sweep's and the batch
  sweep's gamma), each compared draft's at `sweep.gammas` (the batch-1
  sweep's); the target's parts are the pair's: one measurement, one v(gamma)
  for every draft.
  """
  settings, temperatures = sweep.settings, sweep.temperatures
  costs, parts = _measure_costs(timed, settings, temperatures, sweep.gammas_with_parts)
  records: List[records_lib.Record] = [costs]
  compared_parts = {}
  for name, other in compared.items():
    other_costs, compared_parts[name] = _measure_costs(
      other, settings, temperatures, sweep.gammas, target_parts=parts
    )
    records.append(other_costs)
  return records, parts, compared_parts


def _measure_costs(
  timed: TimedExamples,
  settings: settings_lib.SpeculativeSettings,
  temperatures: Sequence[float],
  gammas: Sequence[int],
  batch_size: int = 1,
  target_parts: Optional[Mapping[Any, measure.IterationParts]] = None,
) -> Tuple[records_lib.Costs, Dict[Any, measure.IterationParts]]:
  """The parts of an iteration at every (temperature, gamma), and the costs record (batch 1).

  `target_parts`: another draft's, whose target parts are reused (`measure_parts`).
  """
  timed.progress('Measuring the parts of an iteration, bytes and bandwidth ...')
  parts = _measure_parts(timed, settings, temperatures, gammas, batch_size, target_parts)
  costs = records_lib.Costs(
    **timed.common,
    prompts=prompts_record(layouts.prompts_of(timed.target, timed.inputs, timed.decoder_prompts)),
    **costs_record(
      timed.target,
      timed.draft,
      parts,
      timed.inputs.shape[1],
      timed.max_decode_len,
      timed.prompt_length,
    ),
  )
  return costs, parts


def _measure_parts(timed, settings, temperatures, gammas, batch_size, target_parts=None):
  """`measure_parts` at the timed examples' shapes."""
  return measure_parts(
    timed.target,
    timed.draft,
    temperatures,
    gammas,
    settings,
    input_length=timed.inputs.shape[1],
    max_decode_len=timed.max_decode_len,
    prompt_length=timed.prompt_length,
    emulate_alpha=timed.emulate_alpha,
    repetitions=max(5, timed.repetitions),
    batch_size=batch_size,
    target_parts=target_parts,
  )


def _alpha_candidate(draft):
  """A `drafts` draft as `acceptance.draft_logits` takes it (a network draft as its `Model`).

  A parallel draft's network gives its q_1 (the next-token output at the last
  true token): alpha of its first position.
  """
  if isinstance(draft, (drafts.ModelDraft, parallel_draft.ParallelDraft)):
    return models.Model(
      draft.config, kernels.plain_params(draft.params), draft.inputs_bidirectional_attention
    )
  return draft


def _measure_alphas(
  timed: TimedExamples,
  inputs: np.ndarray,
  decoder_prompts: Optional[np.ndarray],
  temperatures: Sequence[float],
  alpha_tokens: int,
  ngram_corpus: Optional[Sequence[np.ndarray]],
  alpha_drafts: Optional[Mapping[str, Any]],
) -> Tuple[List[records_lib.Alpha], Dict[float, Optional[float]]]:
  """alpha of the pair's draft (and of the other drafts) on target samples, per temperature.

  Returns the alpha records and {temperature: the pair's alpha} (emulated: the
  emulated rate, nothing measured).
  """
  if timed.emulated:
    return [], {temperature: timed.emulate_alpha for temperature in temperatures}
  target = timed.target
  candidates = {PAIR_DRAFT: _alpha_candidate(timed.draft)}
  candidates.update(alpha_drafts or {})
  if ngram_corpus is not None:
    for order in (1, 2):
      candidates[f'{order}-gram'] = drafts.NgramDraft.fit(
        ngram_corpus, target.vocab_size, order=order
      )
  records, alphas = [], {}
  for temperature in temperatures:
    timed.progress(f'alpha of {", ".join(candidates)} at temperature {temperature} ...')
    key = dict(
      target=target,
      drafts=candidates,
      inputs=inputs,
      decoder_prompts=decoder_prompts,
      temperature=temperature,
      max_decode_len=timed.max_decode_len,
      alpha_tokens=alpha_tokens,
    )
    entry = timed.result_cache.get_or_compute(
      'alpha',
      key,
      functools.partial(
        _alpha_records,
        target,
        candidates,
        inputs,
        decoder_prompts,
        temperature=temperature,
        max_decode_len=timed.max_decode_len,
        alpha_tokens=alpha_tokens,
      ),
      description=dict(drafts=list(candidates), temperature=temperature, num_inputs=len(inputs)),
    )
    if entry.from_cache:
      timed.progress(f'  read from the result cache (computed {entry.computed})')
    for alpha in entry.value:
      records.append(
        records_lib.Alpha(
          **timed.common,
          temperature=temperature,
          **alpha,
          cached_from=result_cache_lib.cached_from(entry),
        )
      )
      if alpha['draft'] == PAIR_DRAFT:
        alphas[temperature] = alpha['alpha']
  return records, alphas


def _measure_walltimes(
  timed: TimedExamples,
  records: Sequence[records_lib.Record],
  temperature: float,
  sweep: Sweep,
  alpha: Optional[float],
  *,
  parts: Mapping[Any, measure.IterationParts],
  compared: Sequence[Tuple[TimedExamples, Optional[float], Mapping[Any, Any]]] = (),
) -> List[records_lib.Record]:
  """One temperature's walltime: the gamma sweep at batch 1, the choice, the batch sweep.

  `records` are the run's so far (its costs record among them). With a
  profile directory, the batch sweep is the profile's (`_profile_sweep`);
  otherwise one gamma (`sweep.batch_size_gamma`, or the best at batch 1) is
  timed at every other batch size. `compared`: (timed examples, alpha, parts)
  of the compared drafts, timed in the batch-1 sweep's passes (their records
  follow).
  """
  settings, gammas, batch_sizes = sweep.settings, sweep.gammas, sweep.batch_sizes
  batch_size_gamma, profile_dir = sweep.batch_size_gamma, sweep.profile_dir
  new, beside = [], []
  for gamma in gammas:
    record, others = _measure_walltime(
      timed, temperature, settings.replace(gamma=gamma), 1, alpha, parts=parts, compared=compared
    )
    new.append(record)
    beside += others
  choice = gamma_choice(new, temperature)
  if choice:
    new.append(records_lib.GammaChoice(**timed.common, **choice))
  if profile_dir is not None:
    costs = next(r for r in records if isinstance(r, records_lib.Costs))
    return (
      new
      + beside
      + _profile_sweep(
        timed, new, costs, temperature, settings, gammas, batch_sizes, alpha, profile_dir
      )
    )
  if batch_size_gamma == 'auto':
    sweep_gamma = choice['chosen_gamma'] if choice else best_gamma(new, temperature)
  else:
    sweep_gamma = batch_size_gamma or best_gamma(new, temperature)
  for batch_size in sorted(set(batch_sizes) - {1}):
    new.append(
      _measure_walltime(
        timed, temperature, settings.replace(gamma=sweep_gamma), batch_size, alpha, parts=parts
      )[0]
    )
  return new + beside


def _alpha_records(
  target, candidates, inputs, decoder_prompts, *, temperature, max_decode_len, alpha_tokens
) -> List[Dict[str, Any]]:
  """`acceptance.measure_alpha` of every candidate draft as alpha fields (JSON, for the cache)."""
  results = acceptance.measure_alpha(
    target,
    candidates,
    inputs,
    decoder_prompts=decoder_prompts,
    temperature=temperature,
    max_decode_len=max_decode_len,
    min_tokens=alpha_tokens,
  )
  records = []
  for name, result in results.items():
    worst = sorted((v[1], k, v[0]) for k, v in result.beta_by_token.items() if v[0] >= 20)[:10]
    records.append(
      dict(
        draft=name,
        alpha=result.alpha,
        alpha_stderr=result.stderr,
        num_tokens=result.num_tokens,
        cut_share=result.cut_share,
        alpha_cut=result.alpha_cut,
        alpha_ended=result.alpha_ended,
        worst_tokens=[dict(token=k, count=n, beta=b) for b, k, n in worst],
      )
    )
  return records


def _measure_walltime(
  timed: TimedExamples,
  temperature: float,
  settings: settings_lib.SpeculativeSettings,
  batch_size: int,
  alpha: Optional[float],
  *,
  parts: Mapping[Any, measure.IterationParts],
  batch1_rows: Optional[Mapping[str, Sequence[int]]] = None,
  compared: Sequence[Tuple[TimedExamples, Optional[float], Mapping[Any, Any]]] = (),
) -> Tuple[records_lib.Walltime, List[records_lib.Walltime]]:
  """Times the baseline and speculative decoding, batches interleaved: (record, compared's).

  `compared` ((timed examples, alpha, parts) of other drafts) are timed in the
  same passes, each against the same baseline run.
  """
  timed.progress(
    f'baseline and speculative, temperature {temperature}, gamma {settings.gamma}, '
    f'batch {batch_size}{f" (and {len(compared)} compared drafts)" if compared else ""} ...'
  )
  decoders = [timed.decoder(temperature), timed.decoder(temperature, settings)]
  decoders += [other.decoder(temperature, settings) for other, _, _ in compared]
  baseline, speculative, *others = timed.time(decoders, batch_size)
  record = _walltime_record(
    timed, temperature, settings, batch_size, alpha, parts, baseline, speculative, batch1_rows
  )
  beside = [
    _walltime_record(
      other, temperature, settings, batch_size, other_alpha, other_parts, baseline, run
    )
    for (other, other_alpha, other_parts), run in zip(compared, others)
  ]
  return record, beside


def _walltime_record(
  timed: TimedExamples,
  temperature: float,
  settings: settings_lib.SpeculativeSettings,
  batch_size: int,
  alpha: Optional[float],
  parts: Mapping[Any, measure.IterationParts],
  baseline: DecodeRun,
  speculative: DecodeRun,
  batch1_rows: Optional[Mapping[str, Sequence[int]]] = None,
) -> records_lib.Walltime:
  """The `records.Walltime` of one speculative run against the baseline's.

  The timings and the loop's statistics (`_timed_fields`), the predictions
  from alpha and the parts (`_predicted_fields`), and the outputs' quality
  (`_quality_fields`). `batch1_rows` ({'row_lengths', 'row_iterations'}: int
  [N] each, this gamma's batch-1 record's): adds the batched prediction from
  each row's own batch-1 decode (`_predict_from_rows`).
  """
  part = parts[temperature, settings.gamma]
  # [batches, batch_size]: what each batch's rows emit, the length of each batch's loop.
  lengths_by_batch = layouts.output_lengths(baseline.outputs, timed.eos_id).reshape(-1, batch_size)
  alpha = _iid_alpha(timed.draft, alpha)
  fields = _timed_fields(baseline, speculative, part, alpha, lengths_by_batch)
  if alpha is not None and not settings.draft_threshold:  # Eq. 1 is for a fixed gamma.
    if batch_size == 1:  # Its own rows: at batch 1 this checks the cost terms alone.
      batch1_rows = {k: fields[k] for k in ('row_lengths', 'row_iterations')}
    fields.update(
      _predicted_fields(
        timed, temperature, settings.gamma, alpha, part, lengths_by_batch, speculative, batch1_rows
      )
    )
  if not timed.emulated:
    fields.update(_quality_fields(timed, temperature, settings, batch_size, baseline, speculative))
  record = records_lib.Walltime(
    **timed.common,
    temperature=temperature,
    **settings.as_dict(),
    batch_size=batch_size,
    num_examples=int(len(timed.inputs)),
    alpha=alpha,
    **fields,
  )
  timed.progress(reports.walltime_line(record))
  return record


def _timed_fields(
  baseline: DecodeRun,
  speculative: DecodeRun,
  part: measure.IterationParts,
  alpha: Optional[float],
  lengths_by_batch: np.ndarray,
) -> Dict[str, Any]:
  """The measured `records.Walltime` fields: timings, the loop's statistics, memory."""
  stats = speculative.stats
  counts = acceptance_counts.counts(stats)
  speedups = [b / s for b, s in zip(baseline.ms_per_token, speculative.ms_per_token)]
  fields = dict(
    alpha_loop=float(stats.mean_beta),
    c=part.c,
    verify_cost=part.verify_cost,
    ms_per_token_baseline=summary(baseline.ms_per_token),
    ms_per_token_speculative=summary(speculative.ms_per_token),
    speedup=summary(speedups),
    tokens_per_call=float(stats.tokens_per_target_call),
    mean_acceptance_length=float(stats.mean_acceptance_length),
    drafted_per_iteration=float(stats.drafted_per_iteration),
    draft_steps_per_call=int(stats.draft_steps) / max(int(stats.target_calls), 1),
    finished_row_share=speculative.finished_row_share,
    baseline_finished_row_share=theory.finished_row_share(alpha, 0, lengths_by_batch),
    accepted_histogram=np.asarray(counts.accepted_histogram).tolist(),
    acceptance_by_position=np.asarray(counts.acceptance_by_position).tolist(),
    memory=speculative.memory,
    device_peak_bytes=device_peak_bytes(),
  )
  if lengths_by_batch.shape[1] == 1:
    fields['breakdown'] = iteration_breakdown(part, baseline, speculative)
    # Per row, in input order: what the batched predictions start from (`_predict_from_rows`).
    fields.update(
      row_lengths=lengths_by_batch.ravel().tolist(),
      row_iterations=np.asarray(stats.iterations).ravel().tolist(),
    )
  return fields


def _predicted_fields(
  timed: TimedExamples,
  temperature: float,
  gamma: int,
  alpha: float,
  part: measure.IterationParts,
  lengths_by_batch: np.ndarray,
  speculative: DecodeRun,
  batch1_rows: Optional[Mapping[str, Sequence[int]]],
) -> Dict[str, Any]:
  """The predicted `records.Walltime` fields: Eq. 1 and Theorem 3.8 from alpha and the parts."""
  batch_size = lengths_by_batch.shape[1]
  # Emulated rows run to the full length: their last call is cut (Eq. 1 overstates).
  tokens_per_call = (
    timed.max_decode_len / theory.expected_iterations(alpha, gamma, timed.max_decode_len)
    if timed.emulated
    else float(theory.expected_tokens(alpha, gamma))
  )
  fields = dict(
    predicted_tokens_per_call=tokens_per_call,
    predicted_speedup=float(
      theory.walltime_improvement(alpha, gamma, part.c, verify_cost=part.verify_cost)
    ),
    predicted_speedup_free_verify=float(theory.walltime_improvement(alpha, gamma, part.c)),
    # Both loops wait for their slowest row: the baseline's lengths set each batch's.
    predicted_speedup_batched=theory.batch_walltime_improvement(
      alpha, gamma, part.c, part.verify_cost, lengths_by_batch
    ),
    predicted_finished_row_share=theory.finished_row_share(alpha, gamma, lengths_by_batch),
  )
  # An emulated acceptance is i.i.d. at one known rate: the one-alpha model is exact.
  if batch1_rows is not None and not timed.emulated:
    fields.update(_predict_from_rows(temperature, gamma, part, batch1_rows, lengths_by_batch))
  if batch_size == 1:
    call = part.call_seconds(
      tokens=speculative.tokens / len(timed.inputs),
      tokens_per_call=tokens_per_call,
      catch_up_rate=1 - (1 - alpha**gamma) ** batch_size,
    )
    fields['predicted_speedup_parts'] = call['baseline'] / call['speculative']
  return fields


def _quality_fields(
  timed: TimedExamples,
  temperature: float,
  settings: settings_lib.SpeculativeSettings,
  batch_size: int,
  baseline: DecodeRun,
  speculative: DecodeRun,
) -> Dict[str, Any]:
  """The outputs' `records.Walltime` fields: identical to the baseline's, BLEU or its spread."""
  fields = dict(
    identical_outputs=float(np.mean(np.all(baseline.outputs == speculative.outputs, axis=1)))
  )
  if sampling.is_greedy(temperature):  # One output each; identical_outputs checks them.
    fields.update(
      bleu_baseline=corpus_bleu(timed.vocabulary_path, baseline.outputs, timed.references),
      bleu_speculative=corpus_bleu(timed.vocabulary_path, speculative.outputs, timed.references),
    )
  elif batch_size == 1 and timed.sampled_quality:  # One distribution's: mean +- stderr over keys.
    fields['sampled_quality'] = sampled_quality(
      dict(
        baseline=timed.decoder(temperature),
        speculative=timed.decoder(temperature, settings),
      ),
      timed.inputs,
      timed.decoder_prompts,
      vocabulary_path=timed.vocabulary_path,
      references=timed.references,
      result_cache=timed.result_cache,
    )
  return fields


def _predict_from_rows(
  temperature: float,
  gamma: int,
  part: measure.IterationParts,
  batch1_rows: Mapping[str, Sequence[int]],
  lengths_by_batch: np.ndarray,
) -> Dict[str, float]:
  """The batched prediction from each row's batch-1 decode: {'predicted_speedup_rows', ...}.

  Greedy: each row's batch-1 iterations replayed (a greedy row accepts the same
  tokens in any batch; `theory.replayed_batch_walltime_improvement`). Sampled:
  each row's alpha fitted to them (`theory.fit_row_alphas`) in the i.i.d.
  model; one sampled decode per row overstates the rows' spread, so the
  profile chooses sampled gammas on the one-alpha prediction instead
  (`profile_sweep.best_prediction`).

  Args:
    batch1_rows: {'row_lengths', 'row_iterations'}, int [N] each, in input order.
    lengths_by_batch: int [N / B, B], the tokens each row emits in this run.
  """
  iterations = np.reshape(batch1_rows['row_iterations'], lengths_by_batch.shape)
  if sampling.is_greedy(temperature):
    speedup, finished = theory.replayed_batch_walltime_improvement(
      iterations, gamma, part.c, part.verify_cost, lengths_by_batch
    )
  else:
    alphas = theory.fit_row_alphas(
      gamma, batch1_rows['row_lengths'], batch1_rows['row_iterations']
    ).reshape(lengths_by_batch.shape)
    speedup = theory.batch_walltime_improvement(
      alphas, gamma, part.c, part.verify_cost, lengths_by_batch
    )
    finished = theory.finished_row_share(alphas, gamma, lengths_by_batch)
  return dict(predicted_speedup_rows=speedup, predicted_finished_row_share_rows=finished)


def _profile_sweep(
  timed: TimedExamples,
  batch1: Sequence[records_lib.Record],
  costs: records_lib.Costs,
  temperature: float,
  settings: settings_lib.SpeculativeSettings,
  gammas: Sequence[int],
  batch_sizes: Sequence[int],
  alpha: Optional[float],
  profile_dir: str,
) -> List[records_lib.Record]:
  """The speculation-profile sweep of one temperature (see `Sweep.profile_dir`).

  `batch1` are this temperature's batch-1 records; every other batch size
  gets each gamma's walltime record with its c and v measured at that size.
  Writes the profile, then times gamma='auto' with it against the baseline at
  every batch size. Returns the new records: walltime, the profile, auto.
  """
  new_records = []
  batch1_rows = {  # gamma: {'row_lengths', 'row_iterations'} of its batch-1 record.
    r.gamma: {'row_lengths': r.row_lengths, 'row_iterations': r.row_iterations}
    for r in batch1
    if isinstance(r, records_lib.Walltime) and r.batch_size == 1
  }
  for batch_size in sorted(set(batch_sizes) - {1}):
    parts = _measure_parts(timed, settings, [temperature], gammas, batch_size)
    for gamma in gammas:
      new_records.append(
        _measure_walltime(
          timed,
          temperature,
          settings.replace(gamma=gamma),
          batch_size,
          alpha,
          parts=parts,
          batch1_rows=batch1_rows.get(gamma),  # Used only where alpha is measured.
        )[0]
      )
  walltime = [
    r
    for r in list(batch1) + new_records
    if isinstance(r, records_lib.Walltime) and r.gamma in gammas
  ]
  profile = profile_sweep.profile_from_records(walltime, temperature, alpha)
  path = os.path.join(profile_dir, f'profile_t{temperature:g}.json')
  profile = dict(
    profile,
    **{k: timed.common[k] for k in ('pair', 'task', 'architecture')},
    machine=measure.machine(bandwidth=costs.bandwidth_gb_per_s * 1e9),
  )
  profile_sweep.write_profile(path, profile)
  new_records.append(
    records_lib.make(
      records_lib.Profile, **dict(timed.common, **profile), temperature=temperature, path=path
    )
  )
  auto = settings.replace(gamma=settings_lib.AUTO, profile=path)
  for batch_size in sorted(set(batch_sizes)):
    new_records.append(_measure_auto(timed, temperature, auto, batch_size, gammas))
  return new_records


def _measure_auto(
  timed: TimedExamples,
  temperature: float,
  settings: settings_lib.SpeculativeSettings,
  batch_size: int,
  gammas: Sequence[int],
) -> records_lib.Auto:
  """Times gamma='auto' (a profile's choice, possibly the baseline) and every fixed gamma.

  All run side by side with the baseline, batches interleaved, so auto's
  speedup and the best fixed gamma's (the baseline's 1 included) come from
  the same moments, measured after, and apart from, the sweep the profile
  chose on.
  """
  baseline, auto, *fixed = timed.time(
    [timed.decoder(temperature), timed.decoder(temperature, settings)]
    + [timed.decoder(temperature, settings.replace(gamma=g, profile=None)) for g in gammas],
    batch_size,
  )
  speedup = lambda run: summary([b / s for b, s in zip(baseline.ms_per_token, run.ms_per_token)])
  fixed_speedups = {g: speedup(run) for g, run in zip(gammas, fixed)}
  fixed_median = lambda g: fixed_speedups[g]['median'] if g else 1.0
  best_fixed = max([0] + list(gammas), key=fixed_median)
  record = records_lib.Auto(
    **timed.common,
    temperature=temperature,
    batch_size=batch_size,
    gamma_ran=auto.gamma,
    profile=settings.profile,
    ms_per_token_baseline=summary(baseline.ms_per_token),
    ms_per_token_auto=summary(auto.ms_per_token),
    speedup=speedup(auto),
    fixed_speedups={str(g): s for g, s in fixed_speedups.items()},
    best_fixed_gamma=best_fixed,
    finished_row_share=auto.finished_row_share,
    identical_outputs=float(np.mean(np.all(baseline.outputs == auto.outputs, axis=1))),
    auto_over_best_fixed=speedup(auto)['median'] / fixed_median(best_fixed),
    # The choice itself, apart from the noise between two timings of one program: the chosen
    # gamma's fixed decoder against the best, timed in the same passes (None: not timed).
    chosen_over_best_fixed=(
      fixed_median(auto.gamma) / fixed_median(best_fixed)
      if auto.gamma == 0 or auto.gamma in fixed_speedups
      else None
    ),
  )
  timed.progress(
    f'  T={temperature} gamma=auto (ran {auto.gamma}) batch={batch_size}: '
    f'{record.speedup["median"]:.2f}x; best fixed gamma {best_fixed}, auto / best '
    f'{record.auto_over_best_fixed:.2f}, chosen gamma / best '
    f'{record.chosen_over_best_fixed or float("nan"):.2f}'
  )
  return record


def gamma_choice(records: Sequence[records_lib.Record], temperature: float) -> Dict[str, Any]:
  """gamma='auto' from the measured parts, next to the measured best (batch 1).

  The choice is `theory.choose_gamma` over `predicted_speedup_parts` (alpha,
  and each part of an iteration timed alone); it needs no walltime run of its
  own, so a user can take it from one benchmark of the pair. Returns the
  fields of a `records.GammaChoice` ({} without predictions).
  """
  rows = [
    r for r in _batch1_walltime(records, temperature) if r.predicted_speedup_parts is not None
  ]
  if not rows:
    return {}
  by_gamma = {r.gamma: r for r in rows}
  chosen = by_gamma[
    theory.choose_gamma({g: r.predicted_speedup_parts for g, r in by_gamma.items()})
  ]
  best = max(rows, key=lambda r: r.speedup['median'])
  return dict(
    temperature=temperature,
    chosen_gamma=chosen.gamma,
    chosen_predicted_speedup=chosen.predicted_speedup_parts,
    chosen_measured_speedup=chosen.speedup['median'],
    best_gamma=best.gamma,
    best_measured_speedup=best.speedup['median'],
    chosen_over_best=chosen.speedup['median'] / best.speedup['median'],
  )


def best_gamma(records: Sequence[records_lib.Record], temperature: float) -> int:
  """The gamma of the fastest (median speedup) batch-1 walltime record at `temperature`."""
  return max(_batch1_walltime(records, temperature), key=lambda r: r.speedup['median']).gamma


def _batch1_walltime(records, temperature: float) -> List[records_lib.Walltime]:
  """The batch-1 `records.Walltime` records at `temperature` (JSON dicts read as records)."""
  return [
    r
    for r in records_lib.typed(records)
    if isinstance(r, records_lib.Walltime) and r.batch_size == 1 and r.temperature == temperature
  ]


def iteration_breakdown(
  part: measure.IterationParts, baseline: DecodeRun, speculative: DecodeRun
) -> Dict[str, float]:
  """Milliseconds of one iteration: each part, their sum, the measured time, the rest.

  Batch 1. The measured iteration is a pass's median time over its target
  calls. The catch-up counts at the rate the pass needed it (the iterations
  after a fully accepted block), the encoders (once per decode call) at
  their share per iteration. The baseline's step is set against its parts
  the same way.
  """
  stats = speculative.stats
  iterations = max(int(stats.target_calls), 1)
  num_calls = len(speculative.outputs)  # Batch 1: one decode call per row.
  catch_up_rate = float(acceptance_counts.counts(stats).fully_accepted) / iterations
  # The rollout was timed for gamma steps; an adaptive draft length runs fewer.
  rollout_share = float(stats.draft_steps) / (part.gamma * iterations)
  ms = part.as_ms()
  breakdown = dict(
    draft_catch_up=ms['draft_catch_up'] * catch_up_rate,
    draft_rollout=ms['draft_rollout'] * rollout_share,
    draft_observe=ms['draft_observe'],
    target_block=ms['target_block'],
    judge=ms['judge'],
    emit=ms['emit'],
    encode=(ms['target_encode'] + ms['draft_encode']) * num_calls / iterations,
  )
  measured = 1000 * float(np.median(speculative.seconds)) / iterations
  baseline_parts = (
    ms['target_step'] + ms['sampling'] + ms['target_encode'] * num_calls / baseline.tokens
  )
  baseline_measured = float(np.median(baseline.ms_per_token))
  return dict(
    breakdown,
    parts_sum=sum(breakdown.values()),
    measured=measured,
    unexplained=measured - sum(breakdown.values()),
    catch_up_rate=catch_up_rate,
    baseline_parts=baseline_parts,
    baseline_measured=baseline_measured,
    baseline_unexplained=baseline_measured - baseline_parts,
  )


# ------------------------------------------------------------------------------
# The gin-configured main.
# ------------------------------------------------------------------------------


def benchmark_pair(
  *,
  target: models.Model,
  draft,
  output_dir: str,
  task=None,
  split: str = 'test',
  tsv_path: Optional[str] = None,
  vocabulary_path: Optional[str] = None,
  prefix: Optional[str] = None,
  num_examples: Optional[int] = None,
  ngram_tsv_path: Optional[str] = None,
  ngram_examples: int = 20_000,
  random_input_length: int = 64,
  decoder_prompt_length: int = 0,
  result_cache_dir: Optional[str] = None,
  remeasure: bool = False,
  **settings,
) -> List[records_lib.Record]:
  """`run_benchmark` on a task split, a TSV file, or random inputs (emulation).

  Either architecture: an encoder-decoder pair encodes the inputs, a
  decoder-only pair continues them (a prefix-LM task's inputs are the
  prompts, its targets the references).

  Args:
    target, draft: the pair (configs/pairs/*.gin bind them).
    output_dir: where the report goes.
    task, split: a seqio task (configs/tasks/*.gin bind TASK) and its split
      to decode; the task tokenizes (and prefixes) the inputs.
    tsv_path: instead of a task, `source<TAB>target` examples to decode; None
      only with `emulate_alpha`, which then decodes random inputs.
    vocabulary_path: the pair's SentencePiece model, a local file (tokenizes
      the TSV; BLEU).
    prefix: prepended to every source, as the task does (None: T5's EnDe
      prefix, `tasks_core.EN_DE_PREFIX`).
    num_examples: read at most this many examples.
    ngram_tsv_path, ngram_examples: a TSV whose first `ngram_examples` targets
      fit the unigram/bigram drafts of Table 3 (the train split); None: none.
    random_input_length: input length in the emulation mode.
    decoder_prompt_length: for an encoder-decoder pair, the first this many
      tokens of each reference (at most all but one) become its decoder
      prompt and the rest its reference (T5X's `prompt_with_targets`); in the
      emulation mode, random prompts of this length. 0: no decoder prompts.
    result_cache_dir: a folder that keeps alpha and the sampled quality
      between runs (`result_cache`; None: recomputed every run).
    remeasure: recompute (and overwrite) what `result_cache_dir` holds.
    **settings: `run_benchmark`'s options' fields by name (`options_from_fields`:
      gammas, temperatures, batch_sizes, emulate_alpha, pair_name, ...).
  """
  if decoder_prompt_length and network.is_decoder_only(target.config):
    raise ValueError(
      f'decoder_prompt_length={decoder_prompt_length} is for encoder-decoder pairs; a '
      "decoder-only pair's prompts are the task's inputs. Set DECODER_PROMPT_LENGTH = 0."
    )
  # The cache takes its directory's writer lock if it computes an entry, until it closes.
  with result_cache_lib.ResultCache(
    result_cache_dir, remeasure=remeasure, job='speculative_t5x_lab.benchmark'
  ) as result_cache:
    options = options_from_fields(
      vocabulary_path=vocabulary_path,
      output_dir=output_dir,
      result_cache=result_cache,
      **settings,
    )
    inputs, references, vocabulary = _pair_inputs(
      target,
      task=task,
      split=split,
      tsv_path=tsv_path,
      vocabulary_path=vocabulary_path,
      prefix=prefix,
      num_examples=num_examples,
      random_input_length=random_input_length,
      measurement=options['measurement'],
    )
    decoder_prompts, references = _decoder_prompts(
      target, len(inputs), references, vocabulary, decoder_prompt_length
    )
    if ngram_tsv_path is not None:
      corpus = tsv_target_tokens(ngram_tsv_path, vocabulary_path, ngram_examples)
      options['other_drafts'] = dataclasses.replace(options['other_drafts'], ngram_corpus=corpus)
    return run_benchmark(
      target, draft, inputs, decoder_prompts=decoder_prompts, references=references, **options
    )


def _pair_inputs(
  target: models.Model,
  *,
  task,
  split: str,
  tsv_path: Optional[str],
  vocabulary_path: Optional[str],
  prefix: Optional[str],
  num_examples: Optional[int],
  random_input_length: int,
  measurement: Measurement,
) -> Tuple[np.ndarray, Optional[List[str]], Any]:
  """`benchmark_pair`'s examples: `(inputs, references, vocabulary)`.

  inputs int32 [N, Lin] from the task's split, else from the TSV file, else
  (with `measurement.emulate_alpha`) random [N, random_input_length] without
  references; vocabulary: what tokenizes the references into decoder prompts
  (None for random inputs).
  """
  if task is not None:
    from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top
    from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

    inputs, references = tasks.task_inputs(task, split, num_examples=num_examples)
    return inputs, references, tasks_core.get_task(task).output_features['targets'].vocabulary
  if tsv_path is not None:
    if vocabulary_path is None:
      raise ValueError(
        "tsv_path needs vocabulary_path, the pair's SentencePiece model, to "
        'tokenize it (VOCABULARY in configs/runs/benchmark.gin).'
      )
    from speculative_t5x.data import tasks_core  # pylint: disable=g-import-not-at-top

    inputs, references = tsv_inputs(
      tsv_path,
      vocabulary_path,
      prefix=tasks_core.EN_DE_PREFIX if prefix is None else prefix,
      num_examples=num_examples,
    )
    import sentencepiece  # pylint: disable=g-import-not-at-top

    return inputs, references, sentencepiece.SentencePieceProcessor(model_file=vocabulary_path)
  if measurement.emulate_alpha is not None:
    inputs, references = random_inputs(
      num_examples or measurement.num_walltime_examples,
      random_input_length,
      target.vocab_size,
    )
    return inputs, references, None
  raise ValueError(
    'Nothing to decode: include a task file (TASK), set TSV_PATH to '
    'source<TAB>target lines, or set EMULATE_ALPHA to time random inputs '
    'with emulated acceptance.'
  )


def _decoder_prompts(
  target: models.Model,
  num_examples: int,
  references: Optional[List[str]],
  vocabulary,
  decoder_prompt_length: int,
) -> Tuple[Optional[np.ndarray], Optional[List[str]]]:
  """`benchmark_pair`'s decoder prompts int32 [N, decoder_prompt_length], and the references.

  The first tokens of each reference (the rest its reference), or random
  prompts without a vocabulary (emulation); (None, references) for 0.
  """
  if not decoder_prompt_length:
    return None, references
  if vocabulary is None:
    prompts = measure.random_encoder_inputs(
      num_examples, decoder_prompt_length, target.vocab_size, seed=1
    )
    return np.asarray(prompts), references
  return reference_prompts(references, vocabulary, decoder_prompt_length)


def main(argv: Sequence[str]) -> None:
  """Runs the gin-configured `benchmark_pair` (configs/runs/benchmark.gin)."""
  if len(argv) > 1:
    from absl import app  # pylint: disable=g-import-not-at-top

    raise app.UsageError(f'Unexpected arguments: {argv[1:]}.')
  # Bindings name `speculative_t5x_lab.benchmark.benchmark_pair`, which is not this
  # module's function when it runs as `python -m speculative_t5x_lab.benchmark`.
  import gin  # pylint: disable=g-import-not-at-top
  from speculative_t5x_lab import benchmark as benchmark_lib  # pylint: disable=g-import-not-at-top

  from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top

  with gin_utils.naming_checkpoint_owners():
    gin.get_configurable(benchmark_lib.benchmark_pair)()


if __name__ == '__main__':
  from speculative_t5x import gin_utils  # pylint: disable=g-import-not-at-top

  gin_utils.run(main)
