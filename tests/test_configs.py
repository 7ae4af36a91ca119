"""Every gin file in configs/ parses, binds and says what it claims; gin_utils.

configs/t5x/ include T5X's own gin files and are tested with t5x
(tests/test_t5x_adapter.py). Sizes too large to build are checked through
`network.abstract_params`, which computes shapes only.
"""

import glob
import os
import sys

import gin
import jax
import numpy as np
import pytest
import seqio

from speculative_t5x import checkpoints
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x.data import tasks_core

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Macros the run files define, which model files use.
RUN_MACROS = ['DROPOUT_RATE = 0.0']
PAIR_MACROS = ["CHECKPOINT_PATH = '/target'", "DRAFT_CHECKPOINT_PATH = '/draft'"]
# T5 1.1 sizes (network.T5_1_1_SIZES) and their parameter counts in millions.
SIZES = {
  'tiny': 9.013,
  'small': 76.961,
  'base': 247.578,
  'large': 783.150,
  'xl': 2849.757,
  'xxl': 11135.332,
}
# T5X's decoder-only sizes (t5x/examples/decoder_only/models/*.gin): (emb_dim,
# num_heads, num_layers, mlp_dim) and parameter counts (T5X's own network
# builds these counts; the comments of T5X's gin files are stale).
DECODER_ONLY_SIZES = {
  'base': ((768, 12, 12, 2048), 109_628_544),
  'large': ((1024, 16, 24, 2816), 341_231_104),
  'xl': ((2048, 32, 24, 5120), 1_223_527_424),
  'xxl': ((4096, 64, 24, 10240), 4_762_310_656),
}
# Leviathan et al. 2023, Table 3: the GPT-like 97M target and 6M draft
# (emb_dim, num_heads, num_layers, mlp_dim), parameter counts, and the paper's
# counts in millions.
GPT_LIKE = {
  'gpt_like_target': ((768, 12, 12, 3072), 97_537_152, 97),
  'gpt_like_draft': ((256, 4, 2, 1024), 5_768_576, 6),
}
# (pair file, target model file, draft model file, gamma).
PAIRS = [
  ('xxl_small', 'xxl', 'small', 7),
  ('xxl_base', 'xxl', 'base', 7),
  ('xxl_large', 'xxl', 'large', 7),
  ('gettext_tiny', 'gettext_target', 'gettext_draft', 5),
]


@gin.configurable('configs_test_values')
def _values(**values):
  return values


def _evaluate(files, bindings=(), **expressions):
  """Parses `files` with `bindings`; returns {name: value of the gin expression}."""
  return gin_utils.call_configured(
    _values,
    [f'configs/{file}.gin' for file in files],
    [*bindings, *(f'configs_test_values.{name} = {value}' for name, value in expressions.items())],
  )


def _model_config(model_file, bindings=(), config_class='T5Config'):
  return _evaluate(
    [f'models/{model_file}'], [*RUN_MACROS, *bindings], config=f'@network.{config_class}()'
  )['config']


def _num_params(config):
  return network.parameter_count(network.abstract_params(config)[0])


def test_rewrite_gin_args():
  assert gin_utils.rewrite_gin_args(
    ['prog', '--gin.BATCH_SIZE=8', "--gin.TSV_FILES={'test': 'a=b.tsv'}", '--gin_file=x.gin']
  ) == [
    'prog',
    '--gin_bindings=BATCH_SIZE = 8',
    "--gin_bindings=TSV_FILES = {'test': 'a=b.tsv'}",
    '--gin_file=x.gin',
  ]
  for bad in ('--gin.BATCH_SIZE', '--gin.=3'):
    with pytest.raises(ValueError, match='--gin.NAME=VALUE'):
      gin_utils.rewrite_gin_args([bad])


def test_file_bindings_follow_includes_and_ignore_comments_and_layout(tmp_path, monkeypatch):
  """What a demo workdir's recipe compares: the same bindings however the files are written."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'base.gin').write_text('A = 1  # a comment\n')
  (tmp_path / 'one.gin').write_text(
    "include 'base.gin'\n\n# Blocks and comments\nf:\n  x = %A\n  y = (1, 2)\n  z = @g()\n"
  )
  (tmp_path / 'two.gin').write_text('A=1\nf.x=%A\nf.y=(1,2)\nf.z=@g()\n')
  assert gin_utils.file_bindings(['one.gin']) == gin_utils.file_bindings(['two.gin'])
  assert gin_utils.file_bindings(['one.gin']) == ['A = 1', 'f.x = %A', 'f.y = (1, 2)', 'f.z = @g()']
  # Repository files resolve from any directory, as gin finds them.
  assert 'HEAD_STEPS = 180' in gin_utils.file_bindings(['configs/runs/train_feature_head.gin'])
  with pytest.raises(FileNotFoundError, match="No gin file 'missing.gin'"):
    gin_utils.file_bindings(['missing.gin'])


def test_configs_resolve_from_any_directory(tmp_path, monkeypatch):
  # As for a user elsewhere: the checkout is not on sys.path (pytest put it
  # there; gin would then take configs/ for a Python package).
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if p not in ('', REPO)])
  monkeypatch.chdir(tmp_path)
  assert gin_utils.default_search_paths() == [REPO]
  # models/small.gin includes 'configs/models/base.gin' by a repository-relative path.
  assert _model_config('small').emb_dim == 512


@pytest.mark.parametrize('size', sorted(SIZES))
def test_model_files_are_the_t5_1_1_sizes(size):
  config = _model_config(size)
  dtype = 'float32' if size == 'tiny' else 'bfloat16'
  assert config == network.t5_1_1_config(size, dtype=dtype, dropout_rate=0.0)
  assert _num_params(config) / 1e6 == pytest.approx(SIZES[size], abs=1e-3)


@pytest.mark.parametrize('size', sorted(DECODER_ONLY_SIZES))
def test_decoder_only_files_are_t5x_decoder_only_sizes(size):
  (emb_dim, num_heads, num_layers, mlp_dim), count = DECODER_ONLY_SIZES[size]
  config = _model_config(f'decoder_only_{size}', config_class='DecoderOnlyConfig')
  # The values of T5X's decoder-only base.gin.
  assert config == network.DecoderOnlyConfig(
    vocab_size=32128,
    dtype='bfloat16',
    emb_dim=emb_dim,
    num_heads=num_heads,
    num_layers=num_layers,
    head_dim=64,
    mlp_dim=mlp_dim,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
    logits_via_embedding=True,
  )
  assert _num_params(config) == count
  # The named size of the T5X gin file (configs/t5x/speculative_decoder_only.gin) is the same.
  assert config == network.decoder_only_config(size, dtype='bfloat16', dropout_rate=0.0)


@pytest.mark.parametrize('model', sorted(GPT_LIKE))
def test_gpt_like_files_are_the_papers_sizes(model):
  (emb_dim, num_heads, num_layers, mlp_dim), count, paper_millions = GPT_LIKE[model]
  config = _model_config(model, config_class='DecoderOnlyConfig')
  assert config == network.DecoderOnlyConfig(
    vocab_size=8192,
    dtype='float32',
    emb_dim=emb_dim,
    num_heads=num_heads,
    num_layers=num_layers,
    head_dim=64,
    mlp_dim=mlp_dim,
    mlp_activations=('gelu',),
    dropout_rate=0.0,
    logits_via_embedding=False,
  )
  assert _num_params(config) == count
  assert count / 1e6 == pytest.approx(paper_millions, abs=0.6)
  assert config == network.decoder_only_config(model, dtype='float32', dropout_rate=0.0)


def test_model_vocabulary_is_a_macro():
  assert _model_config('tiny', ['VOCAB_SIZE = 64']).vocab_size == 64


@pytest.mark.parametrize('pair, target, draft, gamma', PAIRS)
def test_pair_files_bind_their_models_and_gamma(pair, target, draft, gamma):
  values = _evaluate(
    [f'pairs/{pair}'],
    RUN_MACROS + PAIR_MACROS,
    target_config=('@network.T5Config()'),
    draft_config='@draft/network.T5Config()',
    gamma='%GAMMA',
  )
  assert values['target_config'] == _model_config(target)
  assert values['draft_config'] == _model_config(draft)
  assert values['gamma'] == gamma
  # TARGET and DRAFT load the checkpoints; one binding makes the baseline.
  with pytest.raises(FileNotFoundError, match='/draft'):
    _evaluate([f'pairs/{pair}'], RUN_MACROS + PAIR_MACROS, draft='%DRAFT')
  assert _evaluate(
    [f'pairs/{pair}'], RUN_MACROS + PAIR_MACROS + ['DRAFT = None'], draft='%DRAFT'
  ) == {'draft': None}


def test_pairs_load_in_bfloat16_for_the_xxl_target_only(tmp_path):
  config = network.t5_1_1_config('tiny', vocab_size=64)
  checkpoints.save_params(tmp_path, models.random_model(config).params)
  bindings = [
    *RUN_MACROS,
    f"CHECKPOINT_PATH = '{tmp_path}'",
    'VOCAB_SIZE = 64',
    *(f'network.T5Config.{name} = {value}' for name, value in network.T5_1_1_SIZES['tiny'].items()),
    'network.T5Config.logits_via_embedding = False',
  ]
  for pair, dtype in (('xxl_small', 'bfloat16'), ('gettext_tiny', 'float32')):
    target = _evaluate([f'pairs/{pair}'], bindings, target='%TARGET')['target']
    assert isinstance(target, models.Model)
    assert {leaf.dtype.name for leaf in jax.tree_util.tree_leaves(target.params)} == {dtype}


def test_task_files_name_or_register_their_tasks(tmp_path):
  for file, name in (
    ('wmt_ende', tasks_core.WMT_ENDE_TASK),
    ('cnn_dailymail', tasks_core.CNN_DAILYMAIL_TASK),
  ):
    task = _evaluate([f'tasks/{file}'], task='%TASK')['task']
    assert task == name and seqio.get_mixture_or_task(name).name == name
  task = _evaluate(
    ['tasks/tsv'],
    [
      f"TSV_FILES = {{'test': '{tmp_path}/test.tsv'}}",
      f"VOCABULARY = '{tmp_path}/spm.model'",
      "TASK_NAME = 'speculative_t5x:configs_test_tsv'",
    ],
    task='%TASK',
  )['task']
  assert (task.name, list(task.splits)) == ('speculative_t5x:configs_test_tsv', ['test'])
  (metric_fn,) = task.predict_metric_fns  # gin's wrapper of tasks_core.bleu.
  sentence = 'Die Datei wurde nicht gespeichert .'
  assert metric_fn([sentence], [sentence]) == {'bleu': pytest.approx(100.0)}
  task = _evaluate(
    ['tasks/gettext_ende'],
    [
      f"CORPUS_DIR = '{tmp_path}'",
      f"VOCABULARY = '{tmp_path}/spm.model'",
      "tasks.register_gettext_task.name = 'speculative_t5x:configs_test_gettext'",
    ],
    task='%TASK',
  )['task']
  assert sorted(task.splits) == ['test', 'train', 'validation']


def test_run_files_bind_with_a_pair_and_a_task(tmp_path):
  task_macros = [
    f"TSV_FILES = {{'test': '{tmp_path}/test.tsv'}}",
    f"VOCABULARY = '{tmp_path}/spm.model'",
  ]
  values = _evaluate(
    ['pairs/gettext_tiny', 'tasks/tsv', 'runs/infer'],
    [
      *PAIR_MACROS,
      *task_macros,
      "INFER_OUTPUT_DIR = '/out'",
      "TASK_FEATURE_LENGTHS = {'inputs': 48, 'targets': 48}",
    ],
    feature_lengths='%TASK_FEATURE_LENGTHS',
    batch_size='%BATCH_SIZE',
  )
  assert values == {'feature_lengths': {'inputs': 48, 'targets': 48}, 'batch_size': 32}
  values = _evaluate(
    ['models/gettext_target', 'tasks/gettext_ende', 'runs/train'],
    [
      f"CORPUS_DIR = '{tmp_path}'",
      f"VOCABULARY = '{tmp_path}/spm.model'",
      "MODEL_DIR = '/model'",
      'TRAIN_STEPS = 10',
    ],
    config='@network.T5Config()',
  )
  assert values['config'].dropout_rate == 0.0
  values = _evaluate(
    ['models/gettext_target', 'tasks/gettext_ende', 'runs/train', 'runs/cosine_schedule'],
    [
      f"CORPUS_DIR = '{tmp_path}'",
      f"VOCABULARY = '{tmp_path}/spm.model'",
      "MODEL_DIR = '/model'",
      'TRAIN_STEPS = 300',
    ],
    learning_rate='%LEARNING_RATE',
  )
  # The make demo target's schedule: a 10-step warm-up to 0.03, a cosine decay to 0.003 at
  # the run's last step.
  rates = [float(values['learning_rate'](step)) for step in (0, 10, 155, 300)]
  np.testing.assert_allclose(rates, [0.0, 0.03, 0.0165, 0.003], rtol=1e-5)
  values = _evaluate(
    ['pairs/gettext_tiny', 'tasks/tsv', 'runs/benchmark'],
    [*PAIR_MACROS, *task_macros, "BENCHMARK_OUTPUT_DIR = '/out'", 'GAMMAS = [2, 3]'],
    gammas='%GAMMAS',
    output_dir='%BENCHMARK_OUTPUT_DIR',
    task='%TASK',
  )
  assert values['gammas'] == [2, 3] and values['output_dir'] == '/out'
  assert values['task'].name == 'speculative_t5x:tsv'
  assert values_of_profile_sweep(tmp_path, task_macros) == {
    'profile_dir': '/profiles',
    'batch_sizes': [1, 2, 4, 8, 16, 32, 64],
    'gammas': [1, 3, 5, 7],
    'num_walltime_examples': 64,
  }
  values = _evaluate(
    ['pairs/gettext_tiny', 'tasks/tsv', 'runs/distill'],
    [*PAIR_MACROS, *task_macros, "MODEL_DIR = '/distilled'"],
    model_dir='%MODEL_DIR',
    divergence='%DIVERGENCE',
    data_mix='%DATA_MIX',
    num_steps='%DISTILL_STEPS',
  )
  assert values == {
    'model_dir': '/distilled',
    'divergence': 'tvd',
    'data_mix': {'draft': 1.0},
    'num_steps': 300,
  }
  values = _evaluate(
    ['pairs/gettext_tiny', 'tasks/tsv', 'runs/parallel_distill'],
    [*PAIR_MACROS, *task_macros, "MODEL_DIR = '/parallel'"],
    model_dir='%MODEL_DIR',
    depth='%DEPTH',
    keep='%KEEP',
    data_mix='%DATA_MIX',
    num_steps='%PARALLEL_STEPS',
  )
  assert values == {
    'model_dir': '/parallel',
    'depth': 4,
    'keep': 0.5,
    'data_mix': {'target': 1.0},
    'num_steps': 300,
  }


def values_of_profile_sweep(tmp_path, task_macros):
  """runs/profile: benchmark.gin's main with the sweep over batch sizes 1-64 and a profile folder."""
  with pytest.raises(ValueError, match='PROFILE_DIR'):
    _evaluate(
      ['pairs/gettext_tiny', 'tasks/tsv', 'runs/profile'],
      [*PAIR_MACROS, *task_macros, "BENCHMARK_OUTPUT_DIR = '/out'"],
      profile_dir='%PROFILE_DIR',
    )
  return _evaluate(
    ['pairs/gettext_tiny', 'tasks/tsv', 'runs/profile'],
    [*PAIR_MACROS, *task_macros, "BENCHMARK_OUTPUT_DIR = '/out'", "PROFILE_DIR = '/profiles'"],
    profile_dir='%PROFILE_DIR',
    batch_sizes='%BATCH_SIZES',
    gammas='%GAMMAS',
    num_walltime_examples='%NUM_EXAMPLES',
  )


# pairs/pair is included by every pair file.
COVERED = (
  {f'models/{size}' for size in SIZES}
  | {f'models/{model}' for _, target, draft, _ in PAIRS for model in (target, draft)}
  | {f'models/decoder_only_{size}' for size in DECODER_ONLY_SIZES}
  | {f'models/{model}' for model in GPT_LIKE}
  | {f'pairs/{pair}' for pair, _, _, _ in PAIRS}
  | {
    'pairs/pair',
    'tasks/wmt_ende',
    'tasks/cnn_dailymail',
    'tasks/tsv',
    'tasks/gettext_ende',
    'runs/infer',
    'runs/train',
    'runs/cosine_schedule',
    'runs/benchmark',
    'runs/profile',
    'runs/distill',
    'runs/parallel_distill',
    # Parsed by tests/test_train.py and tests/test_tasks_english.py.
    'runs/train_decoder_only',
    'tasks/english_lm',
    # Bound and run by tests/lab/test_benchmark.py and tests/test_infer.py.
    'pairs/gpt_like',
    # Parsed and run by tests/lab/test_tree_benchmark.py.
    'runs/tree_benchmark',
    # Run by tests/test_feature_head_runs.py (the head's gin main, and infer with the head).
    'runs/train_feature_head',
    'runs/feature_head_draft',
    # Run by tests/test_parallel_distill.py (infer with a parallel draft's checkpoint).
    'runs/parallel_draft',
  }
)


def test_every_gin_file_is_tested():
  found = {
    os.path.relpath(path, os.path.join(REPO, 'configs'))[: -len('.gin')]
    for path in glob.glob(os.path.join(REPO, 'configs', '**', '*.gin'), recursive=True)
  }
  assert {name for name in found if not name.startswith('t5x/')} == COVERED
