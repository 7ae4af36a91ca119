"""The benchmarks' records: one dataclass per kind, and their JSON form.

`benchmark.run_benchmark`, `tree_benchmark` and the demo return lists of
these; `reports` turns them into benchmark.json, benchmark.md and figures.
Each class names its kind once (`KIND`, the JSON's 'kind' field):

  'costs'         `Costs`: c, v(gamma), each part of an iteration, memory floors.
  'alpha'         `Alpha`: one draft's alpha (Table 3) at one temperature.
  'walltime'      `Walltime`: baseline vs speculative at one (T, settings, batch size).
  'gamma_choice'  `GammaChoice`: gamma chosen from the parts vs the measured best.
  'distillation'  `Distillation`: the draft's distillation settings and curve.
  'head_training' `HeadTraining`: a feature head's training: steps, time, curve.
  'profile'       `Profile`: a speculation profile written by the sweep.
  'auto'          `Auto`: gamma='auto' against every fixed gamma at one batch size.
  'machine'       `Machine`: the machine the run measured.
  'tree_rates'    `TreeRates`: acceptance by (depth, rank) of a pair.
  'tree_costs'    `TreeCosts`: one tree's target and draft call costs.
  'tree_walltime' `TreeWalltime`: a tree or chain timed against the baseline.

JSON. `to_json` gives the dict benchmark.json has always held (the kind
first, then the fields; the fields marked `_OMITTED_IF_NONE` are left out when
None, as the dicts left them out: e.g. a walltime record's 'breakdown' is there
at batch 1 only). `from_json` reads such a dict back, older files included:
fields it lacks take their defaults, keys the class does not name are kept in
`extra` and written back. A record also reads as that JSON dict
(`record['speedup']`, `record.get('breakdown')`, `'breakdown' in record`), for
scripts that read benchmark.json and records alike.
"""

import dataclasses
from typing import Any, ClassVar, Dict, Iterator, List, Mapping, Optional, Sequence, Type

# A field that a record holds only where it was measured: absent from the JSON when None.
_OMITTED_IF_NONE = {'omitted_if_none': True}


def _optional(**kwargs):
  """A field that is None unless measured, and then absent from the JSON."""
  return dataclasses.field(default=None, metadata=_OMITTED_IF_NONE, **kwargs)


Summary = Dict[str, float]  # {'median', 'min', 'max'} over repetitions.

# A costs record's draft kind for a parallel draft (one network call drafts the block).
PARALLEL_DRAFT_KIND = 'parallel network'


@dataclasses.dataclass(kw_only=True)
class Record(Mapping[str, Any]):
  """The base of every record: its `KIND`, its JSON form, and unnamed keys (`extra`)."""

  KIND: ClassVar[str] = ''
  extra: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  def to_json(self) -> Dict[str, Any]:
    """The record as benchmark.json holds it: {'kind': KIND, field: value, ...}."""
    data = {'kind': self.KIND}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name == 'extra' or (value is None and field.metadata.get('omitted_if_none')):
        continue
      data[field.name] = value
    data.update(self.extra)
    return data

  # The JSON form, read-only, as a mapping.
  def __getitem__(self, key: str) -> Any:
    return self.to_json()[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self.to_json())

  def __len__(self) -> int:
    return len(self.to_json())


@dataclasses.dataclass(kw_only=True)
class PairRecord(Record):
  """A record of `benchmark.run_benchmark`: which pair, task and architecture, emulated or not.

  Attributes:
    pair, task: the run's labels.
    emulated: acceptances drawn i.i.d. on random weights (`emulate_alpha`):
      timings only, no text and no alpha.
    architecture: `models.architecture` of the target.
  """

  pair: str
  task: str
  emulated: bool
  architecture: str


@dataclasses.dataclass(kw_only=True)
class Costs(PairRecord):
  """What one step of each part costs, at batch 1 (`benchmark.costs_record`).

  Attributes:
    prompts: {'width', 'mean_tokens', 'max_tokens'} of the timed examples'
      prompts, or None without prompts.
    target_step_ms: one target step.
    bandwidth_gb_per_s: the memory bandwidth measured in the same run.
    floors: {'target', 'draft' (a model draft's step, a feature head's call
      over the block): `measure.step_floor` dicts, 'draft_bytes_over_target_bytes'}.
    verify_cost: {gamma: v(gamma)} at the first temperature.
    c: {temperature: {gamma: c}}.
    parts_ms: {temperature: {gamma: `IterationParts.as_ms()`}}.
    draft: what drafts (`benchmark.describe_draft`): {'kind': 'network',
      `PARALLEL_DRAFT_KIND`, 'feature head' (with its width, layers, output
      and feature layers) or the draft's class, 'parameters'}; None in
      records written before it.
  """

  KIND: ClassVar[str] = 'costs'
  prompts: Optional[Dict[str, Any]]
  target_step_ms: float
  bandwidth_gb_per_s: float
  floors: Dict[str, Any]
  verify_cost: Dict[Any, float]
  c: Dict[Any, Dict[Any, float]]
  parts_ms: Dict[Any, Dict[Any, Dict[str, float]]]
  draft: Optional[Dict[str, Any]] = _optional()


@dataclasses.dataclass(kw_only=True)
class Alpha(PairRecord):
  """One draft's alpha on target samples (Table 3; `acceptance.measure_alpha`).

  Attributes:
    temperature: the sampling temperature (0: greedy).
    draft: the draft's name (`benchmark.PAIR_DRAFT` for the pair's own).
    alpha, alpha_stderr: mean beta and its standard error.
    num_tokens: target tokens it was measured on.
    cut_share, alpha_cut, alpha_ended: the share of those tokens in samples
      cut at the decode length without EOS, and alpha over them and over the
      samples that end (`acceptance.AlphaResult`; None in results cached
      before they were measured).
    worst_tokens: [{'token', 'count', 'beta'}], the ten lowest-beta tokens seen >= 20 times.
    cached_from: where the result cache read it from (None: computed in this run).
  """

  KIND: ClassVar[str] = 'alpha'
  temperature: float
  draft: str
  alpha: float
  alpha_stderr: float
  num_tokens: int
  worst_tokens: List[Dict[str, Any]]
  cut_share: Optional[float] = None
  alpha_cut: Optional[float] = None
  alpha_ended: Optional[float] = None
  cached_from: Optional[Dict[str, Any]] = None


@dataclasses.dataclass(kw_only=True)
class Walltime(PairRecord):
  """Baseline and speculative decoding timed side by side at one configuration.

  Attributes:
    temperature: the sampling temperature.
    gamma, lenience, verification, draft_threshold, profile, tree: the
      decode's `settings.SpeculativeSettings.as_dict()`.
    batch_size, num_examples: the timed batch size and examples.
    alpha: the pair's measured (or emulated) alpha; None if not measured, or
      where Eq. 1's one rate does not hold (a parallel draft: its alpha record
      is its first position's; acceptance by position describes its blocks).
    alpha_loop: mean beta inside the decode loop.
    c, verify_cost: the draft's step cost and v(gamma), from the measured parts.
    ms_per_token_baseline, ms_per_token_speculative, speedup: `Summary`s over
      repetitions.
    tokens_per_call, mean_acceptance_length, drafted_per_iteration,
      draft_steps_per_call: the loop's statistics.
    finished_row_share, baseline_finished_row_share: the share of finished
      rows a call carries (batched decoding), measured and for the baseline.
    accepted_histogram, acceptance_by_position: tokens accepted per call, and
      acceptance by draft position.
    memory: XLA's memory analysis of the compiled decode call.
    device_peak_bytes: the device's peak, where it reports one.
    breakdown: batch 1, where each iteration's time goes
      (`benchmark.iteration_breakdown`).
    row_lengths, row_iterations: batch 1, each row's tokens and iterations.
    predicted_*: Eq. 1 and Theorem 3.8's predictions where alpha is known
      (and the draft length fixed); `predicted_speedup_parts` from the parts
      (batch 1), `*_rows` from each row's batch-1 decode (batch > 1).
    identical_outputs: share of rows equal to the baseline's (not emulated).
    bleu_baseline, bleu_speculative: greedy, BLEU of both decodes.
    sampled_quality: sampled, batch 1, `benchmark.sampled_quality`.
  """

  KIND: ClassVar[str] = 'walltime'
  temperature: float
  gamma: Any
  lenience: float
  verification: str
  draft_threshold: float
  profile: Optional[str]
  tree: Optional[Dict[str, Any]]
  batch_size: int
  num_examples: int
  alpha: Optional[float]
  alpha_loop: float
  c: float
  verify_cost: float
  ms_per_token_baseline: Summary
  ms_per_token_speculative: Summary
  speedup: Summary
  tokens_per_call: float
  mean_acceptance_length: float
  drafted_per_iteration: float
  draft_steps_per_call: float
  finished_row_share: Optional[float]
  baseline_finished_row_share: Optional[float]
  accepted_histogram: List[int]
  acceptance_by_position: List[float]
  memory: Dict[str, Any]
  device_peak_bytes: Optional[int]
  breakdown: Optional[Dict[str, float]] = _optional()
  row_lengths: Optional[List[int]] = _optional()
  row_iterations: Optional[List[int]] = _optional()
  predicted_tokens_per_call: Optional[float] = _optional()
  predicted_speedup: Optional[float] = _optional()
  predicted_speedup_free_verify: Optional[float] = _optional()
  predicted_speedup_batched: Optional[float] = _optional()
  predicted_finished_row_share: Optional[float] = _optional()
  predicted_speedup_rows: Optional[float] = _optional()
  predicted_finished_row_share_rows: Optional[float] = _optional()
  predicted_speedup_parts: Optional[float] = _optional()
  identical_outputs: Optional[float] = _optional()
  bleu_baseline: Optional[float] = _optional()
  bleu_speculative: Optional[float] = _optional()
  sampled_quality: Optional[Dict[str, Any]] = _optional()


@dataclasses.dataclass(kw_only=True)
class GammaChoice(PairRecord):
  """gamma chosen from the parts' prediction against the measured best, at batch 1.

  Attributes:
    temperature: the sampling temperature.
    chosen_gamma, chosen_predicted_speedup, chosen_measured_speedup: the choice.
    best_gamma, best_measured_speedup: the measured best.
    chosen_over_best: the chosen gamma's measured speedup / the best's.
  """

  KIND: ClassVar[str] = 'gamma_choice'
  temperature: float
  chosen_gamma: int
  chosen_predicted_speedup: float
  chosen_measured_speedup: float
  best_gamma: int
  best_measured_speedup: float
  chosen_over_best: float


@dataclasses.dataclass(kw_only=True)
class Distillation(PairRecord):
  """The draft's distillation, as given to `run_benchmark` (reported with its curve).

  Attributes:
    divergence, steps, temperature, data_mix, eval_examples: its settings
      (the rest of `distill`'s settings stay in `extra`).
    curve: the held-out alpha records of `distill.DistillResult.eval_metrics`.
  """

  KIND: ClassVar[str] = 'distillation'
  divergence: str
  steps: int
  temperature: float
  data_mix: Any
  eval_examples: int
  curve: List[Dict[str, Any]]


@dataclasses.dataclass(kw_only=True)
class HeadTraining(PairRecord):
  """A feature head's training (`train_feature_head`), reported with its curve.

  Attributes:
    steps: its training steps.
    training_seconds: the run's wall time to `steps` (since its last start,
      if it was resumed); None if not recorded.
    curve: its held-out records ({'step', 'alpha': the first draft token's
      alpha at T = 1 on the target's samples, 'loss'}).
  """

  KIND: ClassVar[str] = 'head_training'
  steps: int
  training_seconds: Optional[float]
  curve: List[Dict[str, Any]]


@dataclasses.dataclass(kw_only=True)
class Profile(PairRecord):
  """A speculation profile the sweep wrote (`profile_sweep.profile_from_records`).

  Attributes:
    temperature: the profile's temperature.
    path: where it was written.
    mode, alpha, basis, gamma_by_batch_size, predicted_gamma_by_batch_size,
      batch_sizes, machine: the profile's own fields (see `profiles`).
  """

  KIND: ClassVar[str] = 'profile'
  temperature: float
  path: str
  mode: Dict[str, Any]
  alpha: Optional[float]
  basis: str
  gamma_by_batch_size: Dict[str, Any]
  predicted_gamma_by_batch_size: Optional[Dict[str, Any]]
  batch_sizes: Dict[str, Any]
  machine: Dict[str, Any]


@dataclasses.dataclass(kw_only=True)
class Auto(PairRecord):
  """gamma='auto' with a profile, timed against the baseline and every fixed gamma.

  Attributes:
    temperature, batch_size: the configuration.
    gamma_ran: the gamma the profile chose (0: the baseline).
    profile: the profile's path.
    ms_per_token_baseline, ms_per_token_auto, speedup: `Summary`s.
    fixed_speedups: {str(gamma): `Summary`} of each fixed gamma, same passes.
    best_fixed_gamma: the best fixed gamma (0: the baseline).
    finished_row_share: as `Walltime`'s.
    identical_outputs: share of rows equal to the baseline's.
    auto_over_best_fixed: auto's median speedup / the best fixed gamma's.
    chosen_over_best_fixed: the chosen gamma's fixed decoder / the best
      (None: the chosen gamma was not among those timed).
  """

  KIND: ClassVar[str] = 'auto'
  temperature: float
  batch_size: int
  gamma_ran: int
  profile: Optional[str]
  ms_per_token_baseline: Summary
  ms_per_token_auto: Summary
  speedup: Summary
  fixed_speedups: Dict[str, Summary]
  best_fixed_gamma: int
  finished_row_share: Optional[float]
  identical_outputs: float
  auto_over_best_fixed: float
  chosen_over_best_fixed: Optional[float]


@dataclasses.dataclass(kw_only=True)
class Machine(Record):
  """The machine a run measured (`measure.machine`, and the demo's training step).

  Attributes:
    device, platform: JAX's device kind and backend.
    cpu, cpu_family: /proc/cpuinfo's model name and family (None elsewhere).
    cores: schedulable cores.
    bandwidth_gb_per_s: memory bandwidth measured in the same run.
    training_step_s, training_step_rows: the demo's target training step.
    emulated: the demo's records say False (reports check every record).
  """

  KIND: ClassVar[str] = 'machine'
  device: str
  platform: str
  cpu: Optional[str]
  cpu_family: Optional[str]
  cores: int
  bandwidth_gb_per_s: float
  training_step_s: Optional[float] = _optional()
  training_step_rows: Optional[int] = _optional()
  emulated: Optional[bool] = _optional()


@dataclasses.dataclass(kw_only=True)
class TreeRates(Record):
  """Acceptance rates by (parent depth, sibling rank) of a pair (`tree_benchmark.measure_rates`).

  Attributes:
    temperature: the sampling temperature.
    rates: float [depths, K] (emulated: the K given rates by rank).
    emulated: the rates were given, not measured (random weights).
    probe, num_examples, stderr, reached, accepted: the probe tree's decode
      (measured only).
  """

  KIND: ClassVar[str] = 'tree_rates'
  temperature: float
  rates: List[Any]
  emulated: Optional[bool] = _optional()
  probe: Optional[str] = _optional()
  num_examples: Optional[int] = _optional()
  stderr: Optional[List[Any]] = _optional()
  reached: Optional[List[Any]] = _optional()
  accepted: Optional[List[Any]] = _optional()


@dataclasses.dataclass(kw_only=True)
class TreeCosts(Record):
  """One tree's costs (`tree_benchmark.tree_costs`) and its predicted tokens per call.

  Attributes:
    tree, parents, nodes: the tree.
    target_step_ms, target_tree_call_ms, v_nodes: one target step, one tree
      call, their ratio.
    draft_level_ms, draft_level_widths, draft_total_over_target_step: the
      draft's call per level.
    temperature, budget, predicted_tokens_per_call: set by
      `compare_trees_and_chains` (budget None: a given shape).
  """

  KIND: ClassVar[str] = 'tree_costs'
  tree: str
  parents: List[int]
  nodes: int
  target_step_ms: float
  target_tree_call_ms: float
  v_nodes: float
  draft_level_ms: List[float]
  draft_level_widths: List[int]
  draft_total_over_target_step: float
  temperature: Optional[float] = None
  budget: Optional[int] = None
  predicted_tokens_per_call: Optional[float] = None


@dataclasses.dataclass(kw_only=True)
class TreeWalltime(Record):
  """A tree or a chain timed against the baseline (`tree_benchmark.compare_trees_and_chains`).

  Attributes:
    temperature, emulated, name: the configuration.
    tree, parents: the tree (None: a chain).
    gamma, nodes_per_call: draft depth and target nodes per call.
    num_examples: examples timed.
    tokens_per_call: {'mean', 'stderr'} over the timed examples.
    ms_per_token_baseline, ms_per_token: medians over repetitions.
    speedup: `Summary`.
    identical_to_baseline: share of rows equal to the baseline's.
    acceptance_by_rank: acceptance by sibling rank.
  """

  KIND: ClassVar[str] = 'tree_walltime'
  temperature: float
  emulated: bool
  name: str
  tree: Optional[str]
  parents: Optional[List[int]]
  gamma: int
  nodes_per_call: int
  num_examples: int
  tokens_per_call: Dict[str, float]
  ms_per_token_baseline: float
  ms_per_token: float
  speedup: Summary
  identical_to_baseline: float
  acceptance_by_rank: List[float]


KINDS: Dict[str, Type[Record]] = {
  cls.KIND: cls
  for cls in (
    Costs,
    Alpha,
    Walltime,
    GammaChoice,
    Distillation,
    HeadTraining,
    Profile,
    Auto,
    Machine,
    TreeRates,
    TreeCosts,
    TreeWalltime,
  )
}


def make(cls: Type[Record], **fields) -> Record:
  """`cls` from keyword fields; keys it does not name go to `extra` (e.g. a profile's)."""
  names = {field.name for field in dataclasses.fields(cls)} - {'extra'}
  known = {k: v for k, v in fields.items() if k in names}
  return cls(**known, extra={k: v for k, v in fields.items() if k not in names})


def from_json(data: Mapping[str, Any]) -> Record:
  """The record of a benchmark.json dict (see the module docstring); ValueError for a kind
  this version does not know."""
  kind = data.get('kind')
  if kind not in KINDS:
    raise ValueError(f'Unknown record kind {kind!r}; the kinds are {sorted(KINDS)}.')
  cls = KINDS[kind]
  fields = {k: v for k, v in data.items() if k != 'kind'}
  missing = [
    field.name
    for field in dataclasses.fields(cls)
    if field.name not in fields
    and field.default is dataclasses.MISSING
    and field.default_factory is dataclasses.MISSING
  ]
  return make(cls, **fields, **{name: None for name in missing})


def to_json(records: Sequence[Record]) -> List[Dict[str, Any]]:
  """benchmark.json's list: each record's `to_json()`."""
  return [record.to_json() for record in records]


def typed(records: Sequence[Any]) -> List[Record]:
  """`records` as `Record`s: typed ones as they are, benchmark.json dicts read (`from_json`)."""
  return [r if isinstance(r, Record) else from_json(r) for r in records]
