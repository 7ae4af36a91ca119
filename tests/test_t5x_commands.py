"""The T5X commands of docs/t5x.md, run as written against the real T5X (`make test-t5x`).

docs/t5x.md gives an install recipe and two `python -m t5x.infer` commands
(README.md repeats the recipe and the encoder-decoder command: checked equal
here). The recipe is what scripts/t5x_venv.sh runs to build the side venv of
`make test-t5x`, line for line (checked here without t5x). Each command is read
from docs/t5x.md and run in a subprocess, with only the values that cannot run
offline on two CPU cores substituted (`--gin.X=` values replaced, bindings
appended: see each test), on checkpoints written by T5X's own checkpointer, and
compared with stock T5X on T5X's network: the same greedy outputs, and sampled
outputs that carry the acceptance statistics. The encoder-decoder command also
runs on a ('data', 'model') mesh of 8 host CPU devices through T5X's
partitioner: the same outputs, the draft's parameters partitioned as the
target's.
"""

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from speculative_t5x import network
from testing_utils import import_t5x, phrase_task

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WMT_PREFIX = 'translate English to German: '  # t5.data's wmt_t2t_ende_v003.
# The test split's size (testing_utils.PAIRS[::5]) and the feature length of
# T5X's base_wmt_infer.gin.
NUM_EXAMPLES = 8
TARGETS_LENGTH = 64
# T5X's own decode function for the stock baseline: greedy (T5X's
# EncoderDecoderModel defaults to beam search).
STOCK_GREEDY_GIN = """
from __gin__ import dynamic_registration
from t5x import decoding
from t5x import models

models.EncoderDecoderModel.decode_fn = @decoding.temperature_sample
decoding.temperature_sample.topk = 1
"""
AUX_NAMES = [
  'accepted',
  'batch_mean_beta',
  'batch_target_calls',
  'drafted',
  'emitted',
  'iterations',
  'scores',
]


# ------------------------------------------------------------------------------
# The documentation's text.
# ------------------------------------------------------------------------------
def fenced_blocks(path, section=None):
  """The fenced code blocks of the file at `path` (or of its `## section`), in order."""
  with open(os.path.join(REPO_ROOT, path), encoding='utf-8') as f:
    text = f.read()
  if section is not None:
    text = text.split(f'\n## {section}\n', 1)[1].split('\n## ', 1)[0]
  return re.findall(r'^```[^\n]*\n(.*?)^```', text, flags=re.M | re.S)


def t5x_doc_blocks():
  """The fenced code blocks of docs/t5x.md, in order: the install recipe, then the commands."""
  return fenced_blocks(os.path.join('docs', 't5x.md'))


def t5x_doc_command(index):
  """The argv of docs/t5x.md's `index`-th inference command.

  0: encoder-decoder, 1: decoder-only, 2: with a feature head, 3: with a
  parallel draft. The draft-training section's `t5x.infer` (the target
  writing its outputs) is test_t5x_distill's.
  """
  sections = ('Encoder-decoder pairs', 'Decoder-only pairs', 'Feature heads', 'Parallel drafts')
  blocks = [
    block
    for section in sections
    for block in fenced_blocks(os.path.join('docs', 't5x.md'), section)
  ]
  commands = [block for block in blocks if block.startswith('python -m t5x.infer')]
  assert len(commands) == 4, 'docs/t5x.md should hold four t5x.infer commands for inference'
  return shlex.split(commands[index].replace('\\\n', ' '))


def substituted(argv, values, appended=()):
  """`argv` with `values` substituted, then `appended`.

  A key of `values` is a whole argument (`--gin_file=/path/to/x.gin`) or a
  flag (`--gin.CHECKPOINT_PATH`); each must occur in `argv`, so that only the
  command's own values are replaced.
  """
  unused = set(values)
  result = []
  for arg in argv:
    flag = arg.split('=', 1)[0]
    key = arg if arg in values else flag if flag in values else None
    if key is None:
      result.append(arg)
      continue
    unused.discard(key)
    result.append(values[key] if key == arg else f'{flag}={values[key]}')
  assert not unused, f'not in the docs/t5x.md command: {sorted(unused)}'
  assert result[:3] == ['python', '-m', 't5x.infer']
  return [sys.executable, *result[1:], *appended]


def test_install_recipe_is_what_make_test_t5x_runs():
  """Every line of docs/t5x.md's recipe is a line of scripts/t5x_venv.sh, in the same order."""
  recipe = [line for line in t5x_doc_blocks()[0].splitlines() if line.strip()]
  with open(os.path.join(REPO_ROOT, 'scripts', 't5x_venv.sh'), encoding='utf-8') as f:
    script = f.read().splitlines()
  with open(os.path.join(REPO_ROOT, 'Makefile'), encoding='utf-8') as f:
    makefile = f.read()
  assert recipe[0].startswith('pip install -e .')
  positions = []
  for line in recipe:
    if line.startswith('git clone '):  # The script unpacks the snapshot (or T5X_SOURCE) instead.
      assert line == 'git clone https://github.com/google-research/t5x'
      continue
    assert line in script, f'scripts/t5x_venv.sh does not run the docs/t5x.md line {line!r}'
    positions.append(script.index(line))
  assert positions == sorted(positions)
  assert re.search(r'^test-t5x:.*\n(\t.*\n)*\tscripts/t5x_venv\.sh', makefile, flags=re.M)
  assert 'SPECULATIVE_T5X_REQUIRE_T5X=1' in makefile and '-m t5x' in makefile


def test_readme_t5x_blocks_are_those_of_docs():
  """README.md's "With T5X" recipe and command are docs/t5x.md's, which the tests run."""
  readme = fenced_blocks('README.md', 'With T5X')
  assert readme == t5x_doc_blocks()[:2]


# ------------------------------------------------------------------------------
# Running t5x.infer.
# ------------------------------------------------------------------------------
def t5x_root():
  t5x = import_t5x()
  return os.path.dirname(os.path.dirname(os.path.abspath(t5x.__file__)))


def save_t5x_checkpoint(params, params_axes, directory):
  """T5X's own legacy checkpoint of an InferenceState holding `params`; returns its path."""
  from t5x import checkpoints as t5x_checkpoints  # pylint: disable=g-import-not-at-top
  from t5x import partitioning as t5x_partitioning  # pylint: disable=g-import-not-at-top
  from t5x import train_state as t5x_train_state  # pylint: disable=g-import-not-at-top

  state = t5x_train_state.InferenceState.create({'params': params, 'params_axes': params_axes})
  os.makedirs(directory)
  t5x_checkpoints.Checkpointer(
    state, t5x_partitioning.PjitPartitioner(num_partitions=1), os.fspath(directory)
  ).save(state)
  return os.path.join(directory, 'checkpoint_0')


@dataclasses.dataclass
class InferRun:
  records: list  # The JSON records written, in order.
  output_dir: str
  stderr: str

  @property
  def predictions(self):
    return [record['prediction'] for record in self.records]


def run_t5x_infer(argv, output_dir, work_dir, devices=1):
  """Runs `argv` (a `python -m t5x.infer` command) from `work_dir`, on `devices` CPU devices.

  `work_dir` (holding a task module) is put on PYTHONPATH. Returns the run.
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if devices > 1:
    flags += f' --xla_force_host_platform_device_count={devices}'
  env = {
    **os.environ,
    'JAX_PLATFORMS': 'cpu',
    'XLA_FLAGS': flags.strip(),
    # Not this process's sys.path: with the checkout on it, gin's lookup of
    # configs/t5x/... as a package resource meets `configs` as a namespace
    # package and fails.
    'PYTHONPATH': os.pathsep.join(
      filter(None, [os.fspath(work_dir), os.environ.get('PYTHONPATH')])
    ),
  }
  result = subprocess.run(argv, cwd=work_dir, env=env, capture_output=True, text=True, timeout=600)
  # T5X logs every restored key: show the traceback, not the log's tail.
  traceback = max(result.stderr.rfind('Traceback (most recent call last)'), 0)
  assert result.returncode == 0, shlex.join(argv) + '\n' + result.stderr[traceback:][-6000:]
  (path,) = [
    os.path.join(output_dir, name)
    for name in os.listdir(output_dir)
    if name.endswith('.jsonl-00000-of-00001')
  ]
  with open(path, encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  return InferRun(records, os.fspath(output_dir), result.stderr)


def check_aux(records, gamma, max_length, some_accepted=True):
  """The acceptance statistics of predict_with_aux: present and consistent, per example.

  With `some_accepted`, the draft had some tokens accepted.
  """
  for record in records:
    aux = record['aux']
    assert set(AUX_NAMES) <= set(aux), sorted(aux)
    assert 1 <= aux['emitted'] <= max_length
    assert 1 <= aux['iterations'] <= aux['emitted'] <= aux['iterations'] + aux['accepted']
    assert 0 <= aux['accepted'] <= aux['drafted'] <= gamma * aux['iterations']
    assert aux['iterations'] <= aux['batch_target_calls']
    assert 0.0 <= aux['batch_mean_beta'] <= 1.0
  if some_accepted:
    assert sum(record['aux']['accepted'] for record in records) > 0


# ------------------------------------------------------------------------------
# The encoder-decoder command: T5X's t5_1_1 base_wmt_infer.gin + our pair file.
# ------------------------------------------------------------------------------
TASK_MODULE = """
from speculative_t5x.data import tasks

# wmt_t2t_ende_v003's form (prefix, cc_all.32000-like vocabulary with 100 extra
# ids, BLEU), over a local TSV file instead of TFDS's WMT data.
tasks.register_tsv_task({name!r}, {{'test': {test!r}}}, {vocabulary!r}, extra_ids=100,
                        prefix={prefix!r})
"""
ENCODER_DECODER_TASK = 'st5x_wmt_t2t_ende_local'
TINY = network.t5_1_1_config('tiny', dtype='float32')
PAIR_GAMMA = 7  # configs/t5x/speculative_xxl_small.gin's.


class EncoderDecoderRuns:
  """The task, the checkpoints and the t5x.infer runs shared by the tests (each run once)."""

  def __init__(self, work_dir):
    self.work_dir = work_dir
    directory = os.path.join(work_dir, 'data')
    os.makedirs(directory)
    _, _, self.vocabulary = phrase_task(directory, 'st5x_phrases_wmt_prefix', WMT_PREFIX)
    test = os.path.join(directory, 'test.tsv')
    os.rename(os.path.join(directory, 'validation.tsv'), test)
    with open(os.path.join(work_dir, 'st5x_t5x_task.py'), 'w', encoding='utf-8') as f:
      f.write(
        TASK_MODULE.format(
          name=ENCODER_DECODER_TASK, test=test, vocabulary=self.vocabulary, prefix=WMT_PREFIX
        )
      )
    # Random weights whose greedy tokens are pieces of the 64-piece vocabulary
    # (ids 1 to 63, EOS among them), never padding or ids beyond it; the draft
    # is the target perturbed, so that it is often right but not always.
    params, params_axes = network.random_params(TINY, seed=0)
    self.num_leaves = len(jax.tree.leaves(params))
    kernel = params['decoder']['logits_dense']['kernel']
    kernel[:, 0] = 0.0
    kernel[:, 64:] = 0.0
    kernel[:, 1] *= 1.5  # Rows end at different lengths.
    rng = np.random.default_rng(1)
    roles = {
      'target': params,
      'draft': _map(lambda x: x + 0.3 * np.std(x) * rng.standard_normal(x.shape), params),
    }
    self.checkpoints = {
      role: save_t5x_checkpoint(p, params_axes, os.path.join(work_dir, role))
      for role, p in roles.items()
    }
    self._runs = {}

  # The documented command, with these values substituted: the paths (checkpoints
  # written above, the output directory, this repository) and the vocabulary
  # (a local SentencePiece model for the gs:// one). Appended: the sizes of the
  # checkpoints (tiny), this task (the same form as base_wmt_infer.gin's
  # wmt_t2t_ende_v003, over a local file: its TFDS data is not here), float32
  # networks and restore (exact comparisons), and `extra`.
  def speculative_argv(self, output_dir, extra=()):
    return substituted(
      t5x_doc_command(0),
      {
        '--gin_search_paths': REPO_ROOT,
        '--gin.CHECKPOINT_PATH': repr(self.checkpoints['target']),
        '--gin.DRAFT_CHECKPOINT_PATH': repr(self.checkpoints['draft']),
        '--gin.INFER_OUTPUT_DIR': repr(os.fspath(output_dir)),
        '--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file': repr(self.vocabulary),
      },
      [
        "--gin.TARGET_SIZE='tiny'",
        "--gin.DRAFT_SIZE='tiny'",
        *self._task_bindings(),
        "--gin.speculative_network.t5_1_1_config.dtype='float32'",
        *extra,
      ],
    )

  def _task_bindings(self):
    return [
      f'--gin.MIXTURE_OR_TASK_NAME={ENCODER_DECODER_TASK!r}',
      "--gin.MIXTURE_OR_TASK_MODULE='st5x_t5x_task'",
      "--gin.utils.RestoreCheckpointConfig.dtype='float32'",
    ]

  def stock_argv(self, output_dir):
    """Stock T5X: base_wmt_infer.gin, T5X's network at the same size, greedy temperature_sample."""
    greedy_gin = os.path.join(self.work_dir, 'stock_greedy.gin')
    with open(greedy_gin, 'w', encoding='utf-8') as f:
      f.write(STOCK_GREEDY_GIN)
    fields = (
      'emb_dim',
      'num_heads',
      'num_encoder_layers',
      'num_decoder_layers',
      'head_dim',
      'mlp_dim',
    )
    return [
      sys.executable,
      '-m',
      't5x.infer',
      '--gin_file=t5x/examples/t5/t5_1_1/examples/base_wmt_infer.gin',
      f'--gin_file={greedy_gin}',
      f'--gin.CHECKPOINT_PATH={self.checkpoints["target"]!r}',
      f'--gin.INFER_OUTPUT_DIR={os.fspath(output_dir)!r}',
      f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file={self.vocabulary!r}',
      '--gin.seqio.SentencePieceVocabulary.extra_ids=100',
      "--gin.infer.mode='predict_with_aux'",
      *(f'--gin.network.T5Config.{field}={getattr(TINY, field)!r}' for field in fields),
      "--gin.network.T5Config.dtype='float32'",
      *self._task_bindings(),
    ]

  def run(self, name, argv_fn, devices=1):
    """The run `name` (argv_fn(output_dir) is its command), made on first use."""
    if name not in self._runs:
      output_dir = os.path.join(self.work_dir, name)
      self._runs[name] = run_t5x_infer(argv_fn(output_dir), output_dir, self.work_dir, devices)
    return self._runs[name]

  def stock(self):
    return self.run('stock', self.stock_argv)

  def speculative(self):
    return self.run('speculative', self.speculative_argv)


def _map(fn, tree):
  return {k: _map(fn, v) if isinstance(v, dict) else fn(v).astype(v.dtype) for k, v in tree.items()}


@pytest.fixture(scope='module')
def encoder_decoder(tmp_path_factory):
  import_t5x()
  return EncoderDecoderRuns(os.fspath(tmp_path_factory.mktemp('encoder_decoder')))


@pytest.mark.t5x
@pytest.mark.slow
def test_encoder_decoder_command_equals_stock_t5x_greedy(encoder_decoder):
  stock, ours = encoder_decoder.stock(), encoder_decoder.speculative()
  assert len(stock.records) == NUM_EXAMPLES
  assert len(set(stock.predictions)) > 1 and all(stock.predictions)  # Varied, non-empty.
  assert [r['inputs'] for r in ours.records] == [r['inputs'] for r in stock.records]
  assert ours.predictions == stock.predictions
  np.testing.assert_allclose(
    [r['aux']['scores'] for r in ours.records],
    [r['aux']['scores'] for r in stock.records],
    atol=1e-4,
  )
  # Decoded speculatively: the statistics of each example, and fewer target
  # calls than tokens.
  check_aux(ours.records, PAIR_GAMMA, TARGETS_LENGTH)
  aux = [r['aux'] for r in ours.records]
  assert sum(a['iterations'] for a in aux) < sum(a['emitted'] for a in aux)


@pytest.mark.t5x
@pytest.mark.slow
def test_encoder_decoder_command_samples(encoder_decoder):
  """The documented sampling overrides: valid decodes with the statistics, unlike greedy's."""
  sampled = encoder_decoder.run(
    'sampled',
    lambda output_dir: encoder_decoder.speculative_argv(
      output_dir,
      [
        '--gin.speculative_decoding.speculative_sample.topk=0',
        '--gin.speculative_decoding.speculative_sample.temperature=1.0',
      ],
    ),
  )
  greedy = encoder_decoder.speculative()
  assert len(sampled.records) == NUM_EXAMPLES
  assert all(isinstance(p, str) for p in sampled.predictions)
  assert sampled.predictions != greedy.predictions
  check_aux(sampled.records, PAIR_GAMMA, TARGETS_LENGTH)
  assert all(r['aux']['scores'] < 0 for r in sampled.records)  # Log-probabilities of samples.


_MODEL_INFO = re.compile(r'^Variable\s+(\S+)\s+size\s+\S+\s+shape\s+(.*?)\s+partition spec\s+(.*)$')


def _model_info(output_dir):
  """{variable: (shape with logical axes, partition spec)} from T5X's model-info.txt."""
  with open(os.path.join(output_dir, 'model-info.txt'), encoding='utf-8') as f:
    matches = [_MODEL_INFO.match(line.rstrip()) for line in f]
  return {m.group(1): (m.group(2), m.group(3)) for m in matches if m}


@pytest.mark.t5x
@pytest.mark.slow
@pytest.mark.parametrize('model_partitions', [2, 4])
def test_encoder_decoder_command_sharded_over_8_devices(encoder_decoder, model_partitions):
  """T5X's PjitPartitioner on a (8 / k, k) ('data', 'model') mesh of 8 host CPU devices.

  On CPU, T5X's default mesh puts every device on 'model' whatever
  num_partitions says (partitioning.get_cpu_mesh); model_parallel_submesh=(1, k)
  gives the mesh num_partitions=k gives on a GPU host: data 8 / k, model k.
  """
  sharded = encoder_decoder.run(
    f'sharded_{model_partitions}',
    lambda output_dir: encoder_decoder.speculative_argv(
      output_dir,
      [
        '--gin.partitioning.PjitPartitioner.num_partitions=None',
        f'--gin.partitioning.PjitPartitioner.model_parallel_submesh=(1, {model_partitions})',
        # Greedy as argmax: T5X's spelling (topk=1, the default) runs a
        # cumulative sum over the vocabulary in each step (sampling's top-k
        # ties), which XLA:CPU takes minutes over on a vocabulary sharded
        # over 'model'.
        '--gin.speculative_decoding.speculative_sample.temperature=0.0',
      ],
    ),
    devices=8,
  )
  assert f'global_mesh devices shape: ({8 // model_partitions}, {model_partitions})' in (
    sharded.stderr
  )
  assert sharded.predictions == encoder_decoder.speculative().predictions
  assert sharded.predictions == encoder_decoder.stock().predictions
  check_aux(sharded.records, PAIR_GAMMA, TARGETS_LENGTH)

  # The draft's parameters: partitioned as the target's, leaf for leaf (the
  # pair's networks have one size here), by T5X's rules over their logical axes.
  info = _model_info(sharded.output_dir)
  params = {name: value for name, value in info.items() if name != 'step'}
  draft = {
    name[len('draft/') :]: value for name, value in params.items() if name.startswith('draft/')
  }
  target = {name: value for name, value in params.items() if not name.startswith('draft/')}
  assert len(draft) == encoder_decoder.num_leaves
  assert draft == target
  assert draft['token_embedder/embedding'] == ('(vocab=32128, embed=128)', "('model', None)")
  assert draft['decoder/layers_0/mlp/wi_0/kernel'] == ('(embed=128, mlp=256)', "(None, 'model')")


# ------------------------------------------------------------------------------
# The decoder-only command: T5X's decoder_only model file, infer.gin, our file.
# ------------------------------------------------------------------------------
DECODER_ONLY_TASK_MODULE = """
from speculative_t5x.data import tasks

tasks.register_tsv_task(
    'st5x_decoder_only_infer', {{'test': {test!r}}}, {vocabulary!r}, extra_ids=0, prefix='translate: ')
"""


@pytest.mark.t5x
@pytest.mark.slow
@pytest.mark.parametrize('bidirectional', [False, True], ids=['causal', 'prefix_lm'])
def test_decoder_only_command_equals_stock_t5x_greedy(tmp_path, bidirectional):
  root = t5x_root()
  _, directory, vocabulary = phrase_task(os.fspath(tmp_path), 'st5x_phrases', 'translate: ')
  os.rename(os.path.join(directory, 'validation.tsv'), os.path.join(directory, 'test.tsv'))
  (tmp_path / 'st5x_infer_task.py').write_text(
    DECODER_ONLY_TASK_MODULE.format(test=os.path.join(directory, 'test.tsv'), vocabulary=vocabulary)
  )
  config = network.decoder_only_config('tiny', vocab_size=64, dtype='float32')
  _, params_axes = network.abstract_params(config)
  params = {
    role: network.random_params(config, seed=seed)[0]
    for role, seed in (('target', 0), ('draft', 1))
  }
  for role in params:  # Logits through the embedding: PAD and EOS never win, so text comes out.
    params[role]['decoder']['token_embedder']['embedding'][:2] = 0.0
  paths = {
    role: save_t5x_checkpoint(p, params_axes, os.fspath(tmp_path / role))
    for role, p in params.items()
  }
  # Appended to both runs: this task (a local TSV file for the user's task) and
  # its vocabulary (for the gs:// one of T5X's decoder-only base.gin), float32
  # restore, 2 batches, the prompt's attention.
  common = [
    "--gin.MIXTURE_OR_TASK_MODULE='st5x_infer_task'",
    f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file={vocabulary!r}',
    '--gin.seqio.SentencePieceVocabulary.extra_ids=0',
    "--gin.utils.RestoreCheckpointConfig.dtype='float32'",
    '--gin.utils.DatasetConfig.batch_size=4',
    f'--gin.models.DecoderOnlyModel.inputs_bidirectional_attention={bidirectional}',
  ]
  # The documented command with its values substituted: the paths, the
  # target's size (tiny, as its checkpoint), the task. Appended: a vocabulary
  # of 64 (the checkpoints'), float32 networks, predict_with_aux.
  command = t5x_doc_command(1)
  (model_file,) = [arg for arg in command if arg.endswith('/decoder_only/models/base.gin')]
  values = {
    '--gin_search_paths': REPO_ROOT,
    model_file: f'--gin_file={os.path.join(root, "t5x/examples/decoder_only/models/base.gin")}',
    '--gin.TARGET_SIZE': "'tiny'",
    '--gin.CHECKPOINT_PATH': repr(paths['target']),
    '--gin.DRAFT_CHECKPOINT_PATH': repr(paths['draft']),
    '--gin.MIXTURE_OR_TASK_NAME': "'st5x_decoder_only_infer'",
  }
  ours_dir, stock_dir = tmp_path / 'speculative', tmp_path / 'stock'
  ours_argv = substituted(
    command,
    {**values, '--gin.INFER_OUTPUT_DIR': repr(os.fspath(ours_dir))},
    [
      *common,
      '--gin.VOCAB_SIZE=64',
      f'--gin.INPUTS_BIDIRECTIONAL_ATTENTION={bidirectional}',
      "--gin.speculative_network.decoder_only_config.dtype='float32'",
      "--gin.infer.mode='predict_with_aux'",
    ],
  )
  # Stock T5X: the same files and values without our file, T5X's network at
  # the same size, greedy.
  stock_argv = [
    arg
    for arg in substituted(
      command, {**values, '--gin.INFER_OUTPUT_DIR': repr(os.fspath(stock_dir))}
    )
    if arg != '--gin_file=configs/t5x/speculative_decoder_only.gin'
    and not arg.startswith(('--gin.TARGET_SIZE', '--gin.DRAFT_SIZE', '--gin.DRAFT_CHECKPOINT'))
  ] + [
    *common,
    *(
      f'--gin.network.TransformerConfig.{field}={value!r}'
      for field, value in dataclasses.asdict(config).items()
      if field not in ('float32_attention_logits', 'dtype', 'dropout_rate')
    ),
    "--gin.network.TransformerConfig.dtype='float32'",
    '--gin.decoding.temperature_sample.topk=1',
  ]
  stock = run_t5x_infer(stock_argv, stock_dir, tmp_path)
  ours = run_t5x_infer(ours_argv, ours_dir, tmp_path)
  assert len(stock.predictions) == NUM_EXAMPLES and len(set(stock.predictions)) > 1
  assert ours.predictions == stock.predictions
  # Decoded speculatively: the acceptance statistics come with each output.
  check_aux(ours.records, gamma=5, max_length=128)


# ------------------------------------------------------------------------------
# The feature-head command: configs/t5x/speculative_feature_head.gin.
# ------------------------------------------------------------------------------
@pytest.mark.t5x
@pytest.mark.slow
def test_feature_head_command_sharded_over_8_devices(encoder_decoder):
  """docs/t5x.md's feature-head command on the (4, 2) mesh: stock T5X's greedy outputs.

  The head (random weights: greedy outputs do not depend on them) is in
  `train_feature_head`'s checkpoint layout; T5X's `model-info.txt` gives its
  parameters the partition specs of T5X's rules over their logical axes.
  """
  from speculative_t5x import checkpoints  # pylint: disable=g-import-not-at-top
  from speculative_t5x import feature_head  # pylint: disable=g-import-not-at-top

  head_config = feature_head.config_for(TINY, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=128)
  head_dir = os.path.join(encoder_decoder.work_dir, 'head')
  checkpoints.save_params(head_dir, feature_head.init_params(head_config, seed=3))

  def argv(output_dir):
    return substituted(
      t5x_doc_command(2),
      {
        '--gin_search_paths': REPO_ROOT,
        '--gin.CHECKPOINT_PATH': repr(encoder_decoder.checkpoints['target']),
        '--gin.HEAD_CHECKPOINT_PATH': repr(head_dir),
        '--gin.INFER_OUTPUT_DIR': repr(os.fspath(output_dir)),
        '--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file': repr(
          encoder_decoder.vocabulary
        ),
      },
      [
        "--gin.TARGET_SIZE='tiny'",
        *encoder_decoder._task_bindings(),  # pylint: disable=protected-access
        "--gin.speculative_network.t5_1_1_config.dtype='float32'",
        '--gin.HEAD_EMB_DIM=64',
        '--gin.HEAD_NUM_HEADS=2',
        '--gin.HEAD_MLP_DIM=128',
        '--gin.partitioning.PjitPartitioner.num_partitions=None',
        '--gin.partitioning.PjitPartitioner.model_parallel_submesh=(1, 2)',
        '--gin.speculative_decoding.speculative_sample.temperature=0.0',
      ],
    )

  run = encoder_decoder.run('feature_head', argv, devices=8)
  assert 'global_mesh devices shape: (4, 2)' in run.stderr
  assert run.predictions == encoder_decoder.stock().predictions
  check_aux(run.records, 5, TARGETS_LENGTH, some_accepted=False)  # A random head: alpha ~ 0.

  info = _model_info(run.output_dir)
  head = {n[len('draft_head/') :]: v for n, v in info.items() if n.startswith('draft_head/')}
  assert len(head) == len(jax.tree.leaves(feature_head.abstract_params(head_config)))
  # The head's input: the target's feature and its embedding of the next token (2 x 128).
  assert head['pre_projection/kernel'] == ('(mlp=256, embed=64)', "('model', None)")
  assert head['layers_0/mlp/wi_0/kernel'] == ('(embed=64, mlp=128)', "(None, 'model')")
  # The same rules as the target's: a logical axis maps to one mesh axis in both.
  target = {n: v for n, v in info.items() if n != 'step' and not n.startswith('draft_head/')}
  assert head['layers_0/mlp/wi_0/kernel'][1] == target['decoder/layers_0/mlp/wi_0/kernel'][1]


# ------------------------------------------------------------------------------
# The parallel-draft command: configs/t5x/speculative_parallel_draft.gin.
# ------------------------------------------------------------------------------
@pytest.mark.t5x
@pytest.mark.slow
def test_parallel_draft_command_reads_a_parallel_distill_model_directory(encoder_decoder):
  """docs/t5x.md's parallel-draft command on `training.parallel_distill`'s model directory.

  `parallel_distill` adapts the draft checkpoint for 2 steps (on the phrase
  task's examples as ground truth); the command, its DRAFT_CHECKPOINT_PATH
  that directory, gives stock T5X's greedy outputs with the statistics of
  drafts of GAMMA = 4 tokens.
  """
  from speculative_t5x import checkpoints  # pylint: disable=g-import-not-at-top
  from speculative_t5x import models  # pylint: disable=g-import-not-at-top
  from speculative_t5x.data import tasks  # pylint: disable=g-import-not-at-top
  from speculative_t5x.training import parallel_distill  # pylint: disable=g-import-not-at-top

  work_dir = encoder_decoder.work_dir
  task = tasks.register_tsv_task(
    'st5x_parallel_phrases',
    {'train': os.path.join(work_dir, 'data', 'test.tsv')},
    encoder_decoder.vocabulary,
    extra_ids=100,
    prefix=WMT_PREFIX,
  )
  target, draft = (
    models.Model(TINY, checkpoints.load_params(encoder_decoder.checkpoints[role]))
    for role in ('target', 'draft')
  )
  draft_dir = os.path.join(work_dir, 'parallel_draft')
  result = parallel_distill.parallel_distill(
    draft_dir,
    target,
    draft,
    task,
    feature_lengths={'inputs': 32, 'targets': 16},
    batch_size=4,
    num_steps=2,
    data_mix={'ground_truth': 1.0},
    checkpoint_every=2,
    progress=False,
  )
  assert result.step == 2
  assert not np.allclose(result.draft.mask_embedding, draft.as_parallel_draft().mask_embedding)

  def argv(output_dir):
    return substituted(
      t5x_doc_command(3),
      {
        '--gin_search_paths': REPO_ROOT,
        '--gin.DRAFT_SIZE': "'tiny'",
        '--gin.CHECKPOINT_PATH': repr(encoder_decoder.checkpoints['target']),
        '--gin.DRAFT_CHECKPOINT_PATH': repr(draft_dir),
        '--gin.INFER_OUTPUT_DIR': repr(os.fspath(output_dir)),
        '--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file': repr(
          encoder_decoder.vocabulary
        ),
      },
      [
        "--gin.TARGET_SIZE='tiny'",
        *encoder_decoder._task_bindings(),  # pylint: disable=protected-access
        "--gin.speculative_network.t5_1_1_config.dtype='float32'",
      ],
    )

  run = encoder_decoder.run('parallel_draft', argv)
  assert run.predictions == encoder_decoder.stock().predictions
  check_aux(run.records, 4, TARGETS_LENGTH)
