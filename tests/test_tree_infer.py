"""Token trees through infer (gin TREE) and the T5X model: the greedy baseline's outputs.

Reuses tests/test_infer.py's fixture (a tiny SentencePiece task and a
target/draft pair saved as checkpoints) and its command line, and
tests/test_t5x_adapter.py's T5X models.
"""

import json
import os

import jax
import numpy as np
import pytest


from test_infer import (  # noqa: F401 (pytest fixtures by name)
  TASK_NAME,
  _cli,
  _records,
  _run_main_in_process,
  fixture,
  greedy_runs,
)
from testing_utils import speculative_t5x_models
from test_t5x_adapter import (  # noqa: F401 (pytest fixtures by name)
  BATCH,
  DRAFT,
  MODULE,
  TARGET,
  _with_draft,
  t5x_env,
)


@pytest.mark.slow  # Builds test_infer's checkpoints again; greedy trees run fast in test_tree_decoding.
def test_a_tree_run_writes_the_baselines_predictions(fixture, greedy_runs, tmp_path):  # noqa: F811
  _run_main_in_process(_cli(fixture, tmp_path / 'tree', '--gin.TREE=(2, 2, 1)', '--gin.GAMMA=None'))
  tree, baseline = _records(tmp_path / 'tree'), _records(greedy_runs['baseline_dir'])
  assert [r['prediction'] for r in tree] == [r['prediction'] for r in baseline]
  with open(os.path.join(tmp_path / 'tree', f'{TASK_NAME}-test.summary.json')) as f:
    summary = json.load(f)
  assert summary['gamma'] == 3  # The tree's depth.
  assert sum(r['accepted'] for r in tree) > 0


@pytest.mark.t5x
def test_a_t5x_model_with_a_tree_predicts_stock_t5x_greedy(t5x_env):  # noqa: F811
  """SpeculativeEncoderDecoderModel(tree=...): T5X's temperature_sample(topk=1) tokens."""
  vocabulary = t5x_env['vocabulary']
  model = speculative_t5x_models().SpeculativeEncoderDecoderModel(
    MODULE,
    vocabulary,
    vocabulary,
    optimizer_def=None,
    draft_module=MODULE,
    gamma=None,
    tree=(2, 2, 1),
  )
  assert model.settings.gamma == 3
  expected, _ = jax.jit(t5x_env['stock'].predict_batch_with_aux)(TARGET.params, BATCH)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_with_draft(DRAFT.params), BATCH)
  np.testing.assert_array_equal(decodes, expected)
  assert np.asarray(aux['accepted']).sum() > 0
