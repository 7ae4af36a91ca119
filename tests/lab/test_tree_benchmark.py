"""`tree_benchmark` on tiny networks: the probe tree, tokens per call's error, a comparison, the main."""

import json
import os

import gin
import numpy as np
import pytest

from speculative_t5x import decoding
from speculative_t5x import gin_utils
from speculative_t5x import tree as tree_lib
from speculative_t5x_lab import tree_benchmark
from speculative_t5x_lab import tree_design
from test_infer import VOCAB_SIZE, fixture  # noqa: F401 (a pytest fixture by name)
from test_models import DRAFT, TARGET
from testing_utils import padded_inputs


def test_the_probe_tree_is_a_spine_with_every_rank_at_every_depth():
  probe = tree_benchmark.probe_tree(depth=3, width=2)
  assert probe.parents == (-1, 0, 0, 1, 1, 3, 3)
  assert probe.max_depth == 3 and probe.max_children == 2


def test_tokens_per_call_is_the_ratio_of_sums_with_the_delta_method_error():
  stats = decoding.SpeculativeStats.zeros(3, 2).replace(
    emitted=np.array([6, 3, 9]), iterations=np.array([2, 3, 3])
  )
  result = tree_benchmark.tokens_per_call(stats)
  ratio = 18 / 8
  residual = np.array([6, 3, 9]) - ratio * np.array([2, 3, 3])
  assert result['mean'] == ratio
  np.testing.assert_allclose(result['stderr'], np.sqrt(np.sum(residual**2) / 6) / (8 / 3))


@pytest.mark.slow  # Six decoders compiled; tests/test_tree_decoding.py checks greedy trees fast.
def test_a_greedy_comparison_gives_the_baselines_outputs_for_every_decoder():
  inputs = padded_inputs(0, 4, 9, TARGET.vocab_size)
  records = tree_benchmark.compare_trees_and_chains(
    TARGET,
    DRAFT,
    inputs,
    temperature=0.0,
    gammas=(2,),
    node_budgets=(4,),
    shapes=((3, 1),),
    max_decode_len=8,
    repetitions=1,
    progress=lambda line: None,
  )
  kinds = [r['kind'] for r in records]
  assert kinds == ['tree_rates'] + ['tree_costs'] * 2 + ['tree_walltime'] * 3
  walltime = [r for r in records if r['kind'] == 'tree_walltime']
  assert [r['identical_to_baseline'] for r in walltime] == [1.0, 1.0, 1.0]
  assert [r['nodes_per_call'] for r in walltime] == [3, 5, 7]
  chosen, given = records[1:3]
  assert chosen['budget'] == 4 and given['budget'] is None
  assert chosen['v_nodes'] > 0 and len(chosen['draft_level_ms']) == len(
    chosen['draft_level_widths']
  )
  assert given['predicted_tokens_per_call'] > 1
  table = tree_benchmark.markdown_table(records)
  assert '| 0 | tree <= 4 nodes | 5 |' in table and '| 0 | tree (3, 1) (given) | 7 |' in table


def test_a_shape_deeper_than_the_measured_rates_is_not_predicted():
  rates = np.array([[0.5, 0.2], [0.4, 0.1]])  # Parent depths 0 and 1.
  shallow, deep = tree_lib.Tree.from_branching((2, 1)), tree_lib.Tree.chain(3)
  assert tree_benchmark.predicted_tokens_per_call(shallow, rates) == pytest.approx(
    1 + tree_design.expected_accepted(shallow, rates)
  )
  assert tree_benchmark.predicted_tokens_per_call(deep, rates) is None
  # Rates by rank alone hold at every depth.
  assert tree_benchmark.predicted_tokens_per_call(deep, rates[0]) == pytest.approx(1.875)


def _run_gin_main(bindings):
  """configs/runs/tree_benchmark.gin's main on the tiny pair, with `bindings`."""
  files = ['configs/models/tiny.gin', 'configs/pairs/pair.gin', 'configs/runs/tree_benchmark.gin']
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags([], files, bindings)
    tree_benchmark.main(['tree_benchmark'])
  finally:
    gin.clear_config()


@pytest.mark.slow  # A whole comparison; its parts are the fast tests here and in test_tree*.
def test_the_gin_main_writes_the_report(fixture, tmp_path):  # noqa: F811
  """configs/runs/tree_benchmark.gin on tests/test_infer.py's saved pair and TSV split."""
  bindings = [
    f"CHECKPOINT_PATH = '{fixture['directory'] / 'target'}'",
    f"DRAFT_CHECKPOINT_PATH = '{fixture['directory'] / 'draft'}'",
    f'VOCAB_SIZE = {VOCAB_SIZE}',
    f"TSV_PATH = '{fixture['test_tsv']}'",
    f"VOCABULARY = '{fixture['vocabulary']}'",
    f"TREE_BENCHMARK_DIR = '{tmp_path}'",
    'TEMPERATURES = [0.0]',
    'NUM_EXAMPLES = 4',
    'RATE_EXAMPLES = 8',
    'tree_benchmark.benchmark_pair_trees.gammas = [2]',
    'tree_benchmark.benchmark_pair_trees.node_budgets = [4]',
    'tree_benchmark.benchmark_pair_trees.max_decode_len = 8',
    'tree_benchmark.benchmark_pair_trees.repetitions = 1',
  ]
  _run_gin_main(bindings)
  assert sorted(os.listdir(tmp_path)) == [
    'tree_benchmark.json',
    'tree_benchmark.md',
    'tree_benchmark.png',
  ]
  with open(tmp_path / 'tree_benchmark.json') as f:
    records = json.load(f)
  walltime = [r for r in records if r['kind'] == 'tree_walltime']
  assert [r['name'] for r in walltime] == ['chain gamma=2', 'tree <= 4 nodes']
  assert all(r['identical_to_baseline'] == 1.0 for r in walltime)


@pytest.mark.slow  # The emulated walk itself: tests/test_tree.py and tests/test_tree_decoding.py.
def test_the_emulated_gin_main_times_random_weights_at_the_given_rates(tmp_path):
  """EMULATE_RATES: no TSV, random inputs, the trees chosen from the rates, records marked."""
  bindings = [
    # configs/runs/tree_benchmark.gin's emulation example: random weights, no checkpoint.
    'TARGET = @target/models.random_model()',
    'DRAFT = @draft/models.random_model()',
    'CHECKPOINT_PATH = None',
    'VOCAB_SIZE = 64',
    f"TREE_BENCHMARK_DIR = '{tmp_path}'",
    'EMULATE_RATES = [0.9, 0.5]',
    'TEMPERATURES = [0.0]',
    'NUM_EXAMPLES = 2',
    'tree_benchmark.benchmark_pair_trees.random_input_length = 6',
    'tree_benchmark.benchmark_pair_trees.gammas = [2]',
    'tree_benchmark.benchmark_pair_trees.node_budgets = [4]',
    'tree_benchmark.benchmark_pair_trees.max_decode_len = 8',
    'tree_benchmark.benchmark_pair_trees.repetitions = 1',
  ]
  _run_gin_main(bindings)
  with open(tmp_path / 'tree_benchmark.json') as f:
    records = json.load(f)
  (rates,) = [r for r in records if r['kind'] == 'tree_rates']
  assert rates['emulated'] and rates['rates'] == [0.9, 0.5]
  walltime = [r for r in records if r['kind'] == 'tree_walltime']
  assert [r['name'] for r in walltime] == ['chain gamma=2', 'tree <= 4 nodes']
  assert all(r['emulated'] for r in walltime)
  # Rows run to the full length: 8 tokens each, at least 1 per call.
  assert all(1.0 <= r['tokens_per_call']['mean'] <= r['nodes_per_call'] for r in walltime)
  assert (tmp_path / 'tree_benchmark.md').read_text().startswith('**EMULATION**')


def test_the_tree_benchmark_without_a_tsv_or_rates_is_a_named_error():
  with pytest.raises(ValueError, match='decodes TSV_PATH.*EMULATE_RATES'):
    tree_benchmark.benchmark_pair_trees(target=TARGET, draft=DRAFT, output_dir='/tmp/unused')
