"""`python -m speculative_t5x.infer` with a token tree (gin TREE): the greedy baseline's outputs.

Reuses tests/test_infer.py's fixture (a tiny SentencePiece task and a
target/draft pair saved as checkpoints) and its command line.
"""

import json
import os

from test_infer import (  # noqa: F401 (pytest fixtures by name)
  TASK_NAME,
  _cli,
  _records,
  _run_main_in_process,
  fixture,
  greedy_runs,
)


def test_a_tree_run_writes_the_baselines_predictions(fixture, greedy_runs, tmp_path):  # noqa: F811
  _run_main_in_process(_cli(fixture, tmp_path / 'tree', '--gin.TREE=(2, 2, 1)', '--gin.GAMMA=None'))
  tree, baseline = _records(tmp_path / 'tree'), _records(greedy_runs['baseline_dir'])
  assert [r['prediction'] for r in tree] == [r['prediction'] for r in baseline]
  with open(os.path.join(tmp_path / 'tree', f'{TASK_NAME}-test.summary.json')) as f:
    summary = json.load(f)
  assert summary['gamma'] == 3  # The tree's depth.
  assert sum(r['accepted'] for r in tree) > 0
