"""Peer comparison: our decoding next to Hugging Face assisted generation.

The same target/draft pair is exported with `huggingface.save_t5`,
loaded by transformers (PyTorch, CPU), and decoded greedily at batch 1 by four
systems on the same inputs with the same maximum length:

  'ours baseline'     `models.generate(target, None, ...)`
  'ours speculative'  `models.generate(target, draft, gamma=...)`
  'hf greedy'         `T5ForConditionalGeneration.generate(do_sample=False)`
  'hf assisted'       the same with `assistant_model=` (HF's speculative decoding)

  result = peers.compare_with_huggingface(target, draft, input_tokens,
                                          max_decode_len=24, gamma=3,
                                          workdir='/tmp/peers')
  print(peers.format_markdown(result))

Fairness. One example at a time; one untimed pass first (it compiles our two
decode functions, warms transformers up, and records every system's output);
then `repetitions` timed passes in which the four systems take turns on each
example, so that load from other processes falls on all of them alike. PyTorch
runs under `torch.inference_mode()` with `num_threads` intra-op threads, by
default as many as JAX's CPU backend may use (all schedulable cores). JAX's own
count is fixed when it starts, by XLA_FLAGS (one thread:
'--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'); the
result records both. Both run in float32.

HF's draft length. transformers (checked in 5.24) reads `num_assistant_tokens`,
`num_assistant_tokens_schedule` and `assistant_confidence_threshold` from the
*assistant's* `generation_config`, not from the arguments of `generate`; its
defaults (20 tokens, and stopping the draft early once the draft's top
probability falls below 0.4) make gamma dynamic. This module sets gamma with
a constant schedule and the threshold off on the assistant, so HF drafts
min(gamma, tokens left - 1) tokens per round as we draft gamma (EOS aside);
both then call the target equally often unless the two drafts' float32
arithmetic breaks a near-tie differently, which the records show.

HF's draft cache. Without a `decoder_attention_mask`, transformers 5.24 feeds
an encoder-decoder assistant the whole decoder prefix on top of its cache in
every round after the first (its `_prefill` slices off the cached tokens only
when a mask's length matches the inputs'), so the draft conditions on a
garbled context: outputs stay exact, but acceptance drops. Both HF systems
therefore get `decoder_attention_mask=ones([1, 1])`, which transformers
extends as decoding proceeds and which changes no output, to measure HF's
assisted generation as intended.

HF's cache size. transformers 5.24 sizes a T5's generation cache by the
config's `num_layers`, the *encoder's* depth, so a T5 with more decoder than
encoder layers (our demo target: 2 and 4) fails with an IndexError in
`generate`. The loaded models' `config.num_layers` is therefore set to the
decoder's depth after loading: transformers reads it only to build the
encoder (already built) and to size that cache.

Spread. Examples differ in how much of them the draft guesses, so the
speedup over all examples together comes with each example's own speedup (the
median of its timed passes): their mean, standard error and range
(`Comparison.speedup_spread`). Compare with the benchmark on the examples it
times (the demo passes those).

Tokens are counted alike: each example's tokens up to and including EOS (all
`max_decode_len` if none). HF's sequences begin with decoder_start_token_id,
which is not a generated token.

Exactness. Before timing, the logits of both exported models are compared
with ours (teacher-forced on the first example; see `LOGITS_TOLERANCE`). Where
a system's output differs from our greedy output, the first differing
position is examined in float32: the gap between the two candidate tokens'
logits under our target, and under HF's, and the largest difference between
the two implementations' logits there (`Divergence`).
"""

import contextlib
import dataclasses
import functools
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import acceptance
from speculative_t5x.checkpoints import huggingface
from speculative_t5x import checks
from speculative_t5x import drafts
from speculative_t5x import layouts
from speculative_t5x import models

OURS_BASELINE = 'ours baseline'
OURS_SPECULATIVE = 'ours speculative'
HF_GREEDY = 'hf greedy'
HF_ASSISTED = 'hf assisted'
SYSTEMS = (OURS_BASELINE, OURS_SPECULATIVE, HF_GREEDY, HF_ASSISTED)
# Each system's speedup is over the plain greedy decoding of its own framework.
_BASELINE_OF = {
  OURS_BASELINE: OURS_BASELINE,
  OURS_SPECULATIVE: OURS_BASELINE,
  HF_GREEDY: HF_GREEDY,
  HF_ASSISTED: HF_GREEDY,
}

# Largest |our logits - HF logits| allowed, relative to max(1, max |logit|):
# float32 round-off of two implementations of the same network stays ~1e-6.
LOGITS_TOLERANCE = 1e-4
# A divergence is a near-tie when the two tokens' logits under our float32
# target differ by at most this, relative to max(1, max |logit|) there.
NEAR_TIE_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class SystemResult:
  """One system's outputs and timings over all examples.

  Attributes:
    system: one of `SYSTEMS`.
    tokens_per_example: tokens each example emitted (EOS included).
    target_calls_per_example: target decoder calls per example (one per token
      for greedy decoding, one per draft-and-verify round for speculative).
    seconds_median: median over repetitions of the seconds one pass over all
      examples took.
    seconds_min: fastest pass.
    seconds_max: slowest pass.
    identical_fraction: fraction of examples whose output equals our greedy
      output token for token.
    seconds_per_example: median over repetitions of each example's seconds.
  """

  system: str
  tokens_per_example: Tuple[int, ...]
  target_calls_per_example: Tuple[int, ...]
  seconds_median: float
  seconds_min: float
  seconds_max: float
  identical_fraction: float
  seconds_per_example: Tuple[float, ...]

  @property
  def tokens(self) -> int:
    """Tokens emitted over all examples."""
    return sum(self.tokens_per_example)

  @property
  def target_calls(self) -> int:
    """Target decoder calls over all examples."""
    return sum(self.target_calls_per_example)

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / self.seconds_median

  @property
  def ms_per_token(self) -> float:
    return 1e3 * self.seconds_median / self.tokens

  @property
  def tokens_per_target_call(self) -> float:
    return self.tokens / self.target_calls


@dataclasses.dataclass(frozen=True)
class Divergence:
  """Where a system's output first differs from our greedy output.

  Attributes:
    system: the system whose output differs.
    example: row of `input_tokens`.
    position: index of the first differing output token.
    our_token: our greedy token there.
    their_token: the system's token there.
    our_gap: our target's logit of `our_token` minus that of `their_token`,
      teacher-forced on the common prefix (>= 0 up to round-off).
    their_gap: the same difference, negated, under HF's target.
    implementation_difference: max over the vocabulary of |our logits - HF
      logits| at that position.
    near_tie: whether `our_gap` <= NEAR_TIE_TOLERANCE * max(1, max |logit|).
  """

  system: str
  example: int
  position: int
  our_token: int
  their_token: int
  our_gap: float
  their_gap: float
  implementation_difference: float
  near_tie: bool


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What `compare_with_huggingface` measured.

  Attributes:
    systems: one `SystemResult` per entry of `SYSTEMS`, in that order.
    divergences: every example on which a system's output differs from ours.
    num_examples: examples decoded (batch 1 each).
    input_length: their padded length.
    max_decode_len: output length limit of every system.
    gamma: draft tokens per round of both speculative systems.
    repetitions: timed passes.
    torch_threads: PyTorch intra-op threads used.
    cpu_cores: schedulable cores (JAX's CPU backend uses them all unless
      XLA_FLAGS restricts it).
    xla_flags: the XLA_FLAGS environment variable ('' if unset).
    target_logits_error: max |our - HF| target logits in the parity check.
    draft_logits_error: the same for the draft.
    versions: package versions (jax, torch, transformers).
  """

  systems: Tuple[SystemResult, ...]
  divergences: Tuple[Divergence, ...]
  num_examples: int
  input_length: int
  max_decode_len: int
  gamma: int
  repetitions: int
  torch_threads: int
  cpu_cores: int
  xla_flags: str
  target_logits_error: float
  draft_logits_error: float
  versions: Dict[str, str]

  def __getitem__(self, system: str) -> SystemResult:
    for result in self.systems:
      if result.system == system:
        return result
    raise KeyError(f'No system {system!r}; the systems are {SYSTEMS}.')

  def speedup(self, system: str) -> float:
    """Tokens/s of `system` over those of its own framework's greedy decoding."""
    return self[system].tokens_per_second / self[_BASELINE_OF[system]].tokens_per_second

  def speedups_per_example(self, system: str) -> np.ndarray:
    """float64 [num_examples]: `speedup` on each example alone (its median seconds)."""
    ours, baseline = self[system], self[_BASELINE_OF[system]]
    rate = lambda r: np.asarray(r.tokens_per_example) / np.asarray(r.seconds_per_example)
    return rate(ours) / rate(baseline)

  def speedup_spread(self, system: str) -> Dict[str, float]:
    """{'mean', 'stderr', 'min', 'max'} of `speedups_per_example` over the examples.

    Examples differ in how much of them the draft guesses, so the ratio differs
    from one to the next: the spread says how far the aggregate `speedup` would
    move on other examples of the same kind.
    """
    ratios = self.speedups_per_example(system)
    stderr = float(np.std(ratios, ddof=1) / np.sqrt(len(ratios))) if len(ratios) > 1 else 0.0
    return dict(
      mean=float(np.mean(ratios)),
      stderr=stderr,
      min=float(np.min(ratios)),
      max=float(np.max(ratios)),
    )


def _import_torch_and_transformers():
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(
      'The Hugging Face comparison needs PyTorch and transformers: '
      'pip install "speculative_t5x[hf]".'
    ) from error
  return torch, transformers


def emitted_tokens(decode: np.ndarray, eos_id: int = models.EOS_ID) -> np.ndarray:
  """A decode's tokens up to and including its first EOS (all if none).

  Args:
    decode: int [L], one output row (ours: EOS then zeros; 0 before the EOS is
      a real token).
    eos_id: end-of-sequence id.
  """
  return decode[: layouts.output_lengths(decode[None], eos_id)[0]]


def _hf_logits(
  torch, hf_model, input_tokens: np.ndarray, decoder_input_tokens: np.ndarray
) -> np.ndarray:
  input_ids = torch.from_numpy(np.asarray(input_tokens, np.int64))
  with torch.inference_mode():
    return hf_model(
      input_ids=input_ids,
      attention_mask=input_ids > 0,
      decoder_input_ids=torch.from_numpy(np.asarray(decoder_input_tokens, np.int64)),
    ).logits.numpy()


def _shift_right(tokens: np.ndarray, length: int) -> np.ndarray:
  """Decoder inputs [1, length]: BOS (0), then `tokens`, cut or 0-padded."""
  return layouts.shift_right(layouts.pad_rows([tokens[:length]], length))


def _divergence(
  system: str,
  example: int,
  ours: np.ndarray,
  theirs: np.ndarray,
  our_logits: Callable[[np.ndarray], np.ndarray],
  hf_logits: Callable[[np.ndarray], np.ndarray],
  max_decode_len: int,
) -> Divergence:
  """Examines the first position at which `theirs` differs from `ours`.

  Args:
    system: the system that produced `theirs`.
    example: the example's row.
    ours: int [n], our greedy emitted tokens.
    theirs: int [m], the system's emitted tokens; differs from `ours`.
    our_logits: decoder inputs int [1, max_decode_len] -> float32 [1, L, V].
    hf_logits: the same under HF's target.
    max_decode_len: output length limit.
  """
  common = min(len(ours), len(theirs))
  mismatches = np.flatnonzero(ours[:common] != theirs[:common])
  position = int(mismatches[0]) if mismatches.size else common
  if position >= common:
    raise ValueError(
      f'{system} output of example {example} does not differ from ours '
      'before one of them ends; an output must end at its EOS.'
    )
  decoder_inputs = _shift_right(ours[:position], max_decode_len)
  ours_at = np.asarray(our_logits(decoder_inputs), np.float32)[0, position]
  theirs_at = np.asarray(hf_logits(decoder_inputs), np.float32)[0, position]
  a, b = int(ours[position]), int(theirs[position])
  our_gap = float(ours_at[a] - ours_at[b])
  return Divergence(
    system=system,
    example=example,
    position=position,
    our_token=a,
    their_token=b,
    our_gap=our_gap,
    their_gap=float(theirs_at[b] - theirs_at[a]),
    implementation_difference=float(np.abs(ours_at - theirs_at).max()),
    near_tie=our_gap <= NEAR_TIE_TOLERANCE * max(1.0, float(np.abs(ours_at).max())),
  )


def _check_model(model, role: str) -> None:
  if not isinstance(model, models.Model):
    raise ValueError(
      f'The {role} must be a models.Model (a network and its parameters) to be '
      f'exported to Hugging Face; got {type(model).__name__}.'
    )
  if jnp.dtype(model.config.dtype) != jnp.float32:
    raise ValueError(
      f'The {role} computes in {jnp.dtype(model.config.dtype)}, but transformers runs T5 in '
      f'float32 on CPU; compare in float32: models.Model(dataclasses.replace(config, '
      f'dtype="float32"), params).'
    )


def _check_input_tokens(input_tokens, vocab_size: int) -> np.ndarray:
  input_tokens = np.asarray(input_tokens)
  if (
    input_tokens.ndim != 2
    or not input_tokens.size
    or not np.issubdtype(input_tokens.dtype, np.integer)
  ):
    raise ValueError(
      'input_tokens must be a non-empty integer array [examples, length] (one '
      f'0-padded example per row); got dtype {input_tokens.dtype} and shape '
      f'{input_tokens.shape}.'
    )
  if input_tokens.min() < 0 or input_tokens.max() >= vocab_size:
    raise ValueError(
      f'input_tokens must lie in [0, {vocab_size}) (the vocabulary); got min '
      f'{input_tokens.min()}, max {input_tokens.max()}.'
    )
  if not (input_tokens > 0).any(axis=1).all():
    raise ValueError(
      'Every row of input_tokens needs at least one non-padding token; rows '
      f'{np.flatnonzero(~(input_tokens > 0).any(axis=1)).tolist()} are all 0.'
    )
  return input_tokens.astype(np.int32)


@contextlib.contextmanager
def _quiet(transformers):
  """Silences transformers' warnings and progress bars, then restores them.

  It warns that it will not tie the separate lm_head of an untied (T5 1.1)
  export, which is what we want (the parity check verifies it), and, once,
  about arguments its own assistant loop passes.
  """
  verbosity = transformers.logging.get_verbosity()
  progress_bar = transformers.logging.is_progress_bar_enabled()
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  try:
    yield
  finally:
    transformers.logging.set_verbosity(verbosity)
    if progress_bar:
      transformers.logging.enable_progress_bar()


def _export(model: models.Model, directory: str, transformers):
  """Saves `model` in Hugging Face format and loads it back with transformers."""
  huggingface.save_t5(model.config, model.params, directory)
  hf_model = transformers.T5ForConditionalGeneration.from_pretrained(
    directory, dtype='float32'
  ).eval()
  hf_model.config.num_layers = hf_model.config.num_decoder_layers  # See "HF's cache size".
  return hf_model


def _logits_error(
  torch, model: models.Model, hf_model, input_row: np.ndarray, decoder_inputs: np.ndarray, role: str
) -> float:
  """Max |our - HF| teacher-forced logits; raises if beyond LOGITS_TOLERANCE."""
  ours = np.asarray(
    acceptance.teacher_forced_logits(model.config, model.params, input_row, decoder_inputs)
  )
  theirs = _hf_logits(torch, hf_model, input_row, decoder_inputs)
  error = float(np.abs(ours - theirs).max())
  if error > LOGITS_TOLERANCE * max(1.0, float(np.abs(ours).max())):
    raise RuntimeError(
      f'The exported {role} does not reproduce our logits under transformers: max |difference| '
      f'{error:.3g} (logits up to {np.abs(ours).max():.3g}). The timing comparison would not '
      'compare the same model; check the export (huggingface.save_t5) against '
      'this transformers version.'
    )
  return error


def _time_passes(
  runners: Dict[str, Callable], input_tokens: np.ndarray, outputs: Dict[str, list], repetitions: int
) -> Dict[str, np.ndarray]:
  """Per system, float64 [repetitions, num_examples]: each example's seconds in each pass.

  The systems take turns on each example, so that load from other processes
  falls on all of them alike. Each output must equal the untimed pass's.
  """
  seconds = {system: np.zeros((repetitions, len(input_tokens))) for system in runners}
  for repetition in range(repetitions):
    for example, row in enumerate(input_tokens):
      for system, run in runners.items():
        start = time.perf_counter()
        tokens, _ = run(row)
        seconds[system][repetition, example] = time.perf_counter() - start
        if not np.array_equal(tokens, outputs[system][example][0]):
          raise RuntimeError(
            f'{system} decoded example {example} differently in repetition '
            f'{repetition} than in the untimed pass; greedy decoding must be '
            'deterministic.'
          )
  return seconds


def compare_with_huggingface(
  target: models.Model,
  draft: models.Model,
  input_tokens,
  *,
  max_decode_len: int,
  gamma: int,
  workdir: str,
  repetitions: int = 3,
  num_threads: Optional[int] = None,
  eos_id: int = models.EOS_ID,
) -> Comparison:
  """Times our greedy and speculative decoding beside transformers' at batch 1.

  Args:
    target: the target, a float32 `models.Model` exportable to transformers
      (gated-GELU or ReLU T5).
    draft: the draft, likewise, with the target's vocabulary (it may be the
      target itself: acceptance 1, the upper bound of speculative speed).
    input_tokens: int [N, Lin], one 0-padded, EOS-terminated example per row.
    max_decode_len: the most tokens any system emits per example.
    gamma: draft tokens per round, for us and (fixed) for transformers.
    workdir: directory for the two Hugging Face exports (`target_hf/`,
      `draft_hf/`); created if missing.
    repetitions: timed passes over all examples.
    num_threads: PyTorch intra-op threads; default the cores JAX's CPU
      backend uses unless XLA_FLAGS restricts it (then pass that count).
    eos_id: end-of-sequence id.

  Returns:
    A `Comparison`.

  Raises:
    ImportError: PyTorch or transformers is missing.
    ValueError: bad arguments (see the message).
    RuntimeError: an exported model's logits differ from ours, or a system's
      output changed between passes.
  """
  torch, transformers = _import_torch_and_transformers()
  input_tokens = _checked_arguments(
    target, draft, input_tokens, max_decode_len=max_decode_len, gamma=gamma, repetitions=repetitions
  )
  cpu_cores, torch_threads = _thread_counts(num_threads)
  outputs, seconds, divergences, target_error, draft_error = _decode_check_and_time(
    torch,
    transformers,
    target,
    draft,
    input_tokens,
    workdir=workdir,
    gamma=gamma,
    max_decode_len=max_decode_len,
    eos_id=eos_id,
    repetitions=repetitions,
    torch_threads=torch_threads,
  )

  return Comparison(
    systems=tuple(
      _system_result(system, outputs[system], seconds[system], divergences) for system in SYSTEMS
    ),
    divergences=tuple(divergences),
    num_examples=len(input_tokens),
    input_length=input_tokens.shape[1],
    max_decode_len=int(max_decode_len),
    gamma=int(gamma),
    repetitions=int(repetitions),
    torch_threads=torch_threads,
    cpu_cores=cpu_cores,
    xla_flags=os.environ.get('XLA_FLAGS', ''),
    target_logits_error=target_error,
    draft_logits_error=draft_error,
    versions={
      'jax': jax.__version__,
      'torch': torch.__version__,
      'transformers': transformers.__version__,
    },
  )


def _thread_counts(num_threads: Optional[int]) -> Tuple[int, int]:
  """(the cores this process may run on, PyTorch's intra-op threads: `num_threads`, or
  those cores when None); ValueError unless `num_threads` is None or an integer >= 1."""
  cpu_cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  torch_threads = cpu_cores if num_threads is None else num_threads
  if not isinstance(torch_threads, (int, np.integer)) or torch_threads < 1:
    raise ValueError(f'num_threads must be an integer >= 1 or None; got {num_threads!r}.')
  return cpu_cores, int(torch_threads)


def _decode_check_and_time(
  torch,
  transformers,
  target,
  draft,
  input_tokens,
  *,
  workdir,
  gamma,
  max_decode_len,
  eos_id,
  repetitions,
  torch_threads,
):
  """Exports the pair, decodes with every system, checks the exports' logits, times the passes.

  input_tokens: int [N, Lin]. Returns (outputs: system -> per example
  (tokens, target calls), seconds: system -> float [repetitions, N], the
  divergences, the target's and the draft's logits errors).
  """
  with _quiet(transformers):
    hf_target = _export(target, os.path.join(workdir, 'target_hf'), transformers)
    hf_draft = _export(draft, os.path.join(workdir, 'draft_hf'), transformers)
    runners, target_calls = _runners(
      torch, transformers, target, draft, hf_target, hf_draft, gamma, max_decode_len, eos_id
    )
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    hook = hf_target.register_forward_hook(functools.partial(_count_call, target_calls))
    try:
      # Untimed pass: compiles, warms up, and records outputs and target
      # calls; the parity check then uses our first output as decoder inputs.
      outputs = {system: [run(row) for row in input_tokens] for system, run in runners.items()}
      decoder_inputs = _shift_right(outputs[OURS_BASELINE][0][0], max_decode_len)
      target_error = _logits_error(
        torch, target, hf_target, input_tokens[:1], decoder_inputs, 'target'
      )
      draft_error = _logits_error(torch, draft, hf_draft, input_tokens[:1], decoder_inputs, 'draft')
      seconds = _time_passes(runners, input_tokens, outputs, repetitions)
      divergences = _divergences(torch, target, hf_target, input_tokens, outputs, max_decode_len)
    finally:
      hook.remove()
      torch.set_num_threads(previous_threads)
  return outputs, seconds, divergences, target_error, draft_error


def _checked_arguments(target, draft, input_tokens, **positive_ints) -> np.ndarray:
  """`compare_with_huggingface`'s checks of the pair, the inputs and the counts.

  Returns the input tokens as int [N, Lin]; ValueError naming any bad argument.
  """
  _check_model(target, 'target')
  _check_model(draft, 'draft')
  drafts.check_shared_vocabulary(draft.vocab_size, target.vocab_size)
  input_tokens = _check_input_tokens(input_tokens, target.vocab_size)
  for name, value in positive_ints.items():
    checks.check_positive_int(name, value)
  return input_tokens


def _count_call(counter, *unused):
  """A forward hook's body: one more target call."""
  counter[0] += 1


def _runners(
  torch, transformers, target, draft, hf_target, hf_draft, gamma, max_decode_len, eos_id
):
  """({system: run(row) -> (tokens, target calls)}, the HF target's call counter [1]).

  The counter is a one-element list that a forward hook on `hf_target`
  increments; `run_hf` resets it per example.
  """
  target_calls = [0]

  def run_ours(row, draft_or_none):
    out = models.generate(
      target,
      draft_or_none,
      row[None],
      gamma=gamma,
      temperature=0.0,
      max_decode_len=max_decode_len,
      eos_id=eos_id,
    )
    tokens = emitted_tokens(np.asarray(out.tokens)[0], eos_id)
    return tokens, len(tokens) if out.stats is None else int(out.stats.iterations[0])

  def run_hf(row, assistant):
    target_calls[0] = 0
    input_ids = torch.from_numpy(row[None].astype(np.int64))
    with torch.inference_mode():
      sequences = hf_target.generate(
        input_ids=input_ids,
        attention_mask=input_ids > 0,
        generation_config=greedy_config,
        assistant_model=assistant,
        decoder_attention_mask=torch.ones((1, 1), dtype=torch.long),
      )
    # Drop decoder_start_token_id; at batch 1 nothing follows the EOS.
    return emitted_tokens(sequences[0, 1:].numpy(), eos_id), target_calls[0]

  # transformers' candidate generator reads these from the assistant's
  # config (see the module docstring): a fixed gamma, no early stop.
  hf_draft.generation_config.num_assistant_tokens = int(gamma)
  hf_draft.generation_config.num_assistant_tokens_schedule = 'constant'
  hf_draft.generation_config.assistant_confidence_threshold = 0.0
  greedy_config = transformers.GenerationConfig(
    do_sample=False,
    num_beams=1,
    max_new_tokens=int(max_decode_len),
    eos_token_id=eos_id,
    pad_token_id=0,
    decoder_start_token_id=0,
  )
  runners = {
    OURS_BASELINE: functools.partial(run_ours, draft_or_none=None),
    OURS_SPECULATIVE: functools.partial(run_ours, draft_or_none=draft),
    HF_GREEDY: functools.partial(run_hf, assistant=None),
    HF_ASSISTED: functools.partial(run_hf, assistant=hf_draft),
  }
  return runners, target_calls


def _divergences(
  torch, target, hf_target, input_tokens, outputs, max_decode_len
) -> List[Divergence]:
  """A `Divergence` for every example on which a system's output differs from our greedy one."""
  reference = [tokens for tokens, _ in outputs[OURS_BASELINE]]
  divergences = []
  for system in SYSTEMS[1:]:
    for example, (tokens, _) in enumerate(outputs[system]):
      if not np.array_equal(tokens, reference[example]):
        row = input_tokens[example : example + 1]
        divergences.append(
          _divergence(
            system,
            example,
            reference[example],
            tokens,
            functools.partial(acceptance.teacher_forced_logits, target.config, target.params, row),
            functools.partial(_hf_logits, torch, hf_target, row),
            max_decode_len,
          )
        )
  return divergences


def _system_result(system, outputs, seconds, divergences) -> SystemResult:
  """One system's `SystemResult` from its outputs and seconds [repetitions, examples]."""
  per_pass = seconds.sum(axis=1)
  return SystemResult(
    system=system,
    tokens_per_example=tuple(len(tokens) for tokens, _ in outputs),
    target_calls_per_example=tuple(calls for _, calls in outputs),
    seconds_median=float(np.median(per_pass)),
    seconds_min=float(np.min(per_pass)),
    seconds_max=float(np.max(per_pass)),
    identical_fraction=1.0 - sum(d.system == system for d in divergences) / len(outputs),
    seconds_per_example=tuple(float(t) for t in np.median(seconds, axis=0)),
  )


def format_markdown(result: Comparison) -> str:
  """The comparison as a Markdown table, its setting, and any divergences."""
  lines = [
    f'{result.num_examples} examples (input length {result.input_length}), batch 1, greedy, '
    f'max_decode_len {result.max_decode_len}, gamma {result.gamma}; median of '
    f'{result.repetitions} timed passes (after an untimed one). JAX {result.versions["jax"]} '
    f'on {result.cpu_cores} CPU cores (XLA_FLAGS: {result.xla_flags or "none"}); PyTorch '
    f'{result.versions["torch"]} with {result.torch_threads} intra-op thread(s), '
    f'transformers {result.versions["transformers"]}. '
    f'Exported logits match ours within {result.target_logits_error:.1e} (target) and '
    f'{result.draft_logits_error:.1e} (draft).',
    '',
    "The speedup is over the same framework's greedy decoding, on all examples together; "
    "per example: the mean of the examples' own speedups +- its standard error, and "
    'their range.',
    '',
    '| system | tokens | target calls | tokens/call | s per pass (min-max) | ms/token '
    '| tokens/s | speedup | per example: mean +- s.e. (range) | identical to ours greedy |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for r in result.systems:
    spread = result.speedup_spread(r.system)
    lines.append(
      f'| {r.system} | {r.tokens} | {r.target_calls} | {r.tokens_per_target_call:.2f} '
      f'| {r.seconds_median:.3f} ({r.seconds_min:.3f}-{r.seconds_max:.3f}) '
      f'| {r.ms_per_token:.2f} | {r.tokens_per_second:.1f} | {result.speedup(r.system):.2f}x '
      f'| {spread["mean"]:.2f} +- {spread["stderr"]:.2f} ({spread["min"]:.2f}-{spread["max"]:.2f}) '
      f'| {r.identical_fraction:.0%} |'
    )
  if result.divergences:
    lines += [
      '',
      '| system | example | position | ours | theirs | our logit gap | HF logit gap '
      '| max logit difference | near-tie |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |',
    ]
    lines += [
      f'| {d.system} | {d.example} | {d.position} | {d.our_token} | {d.their_token} '
      f'| {d.our_gap:.2e} | {d.their_gap:.2e} | {d.implementation_difference:.2e} '
      f'| {"yes" if d.near_tie else "no"} |'
      for d in result.divergences
    ]
  return '\n'.join(lines) + '\n'
