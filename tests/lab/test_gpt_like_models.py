"""scripts/gpt_like_models.py's summary of a training run (the training itself is train's)."""

import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PATH = os.path.join(REPO, 'scripts', 'gpt_like_models.py')
_SPEC = importlib.util.spec_from_file_location('gpt_like_models', _PATH)
gpt_like_models = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpt_like_models)


def test_training_figures_count_a_resumed_run_once_per_step(tmp_path):
  train = lambda step, loss, tokens, seconds: dict(
    split='train', step=step, loss=loss, tokens=tokens, tokens_per_second=100.0, seconds=seconds
  )
  evaluation = lambda step, seconds: dict(
    split='validation', step=step, cross_entropy=5.0 - step / 100, accuracy=0.1, seconds=seconds
  )
  records = [
    # Killed after step 30, last checkpoint at 20: steps 21-30 are trained again.
    train(10, 9.0, 1000, 12.0),
    train(20, 8.0, 1100, 20.0),
    evaluation(20, 22.0),
    train(30, 7.5, 1200, 30.0),
    train(30, 7.4, 1300, 11.0),  # The resumed segment: its clock restarts.
    train(40, 7.0, 1400, 19.0),
    evaluation(40, 21.0),
  ]
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.writelines(json.dumps(record) + '\n' for record in records)
  figures = gpt_like_models.training_figures(str(tmp_path))
  assert figures['steps'] == 40
  assert figures['tokens_seen'] == 1000 + 1100 + 1300 + 1400
  assert figures['wall_seconds'] == pytest.approx(30.0 + 21.0)
  assert figures['train_loss_first_interval'] == {'steps': '1-10', 'loss': 9.0}
  assert figures['train_loss_last_interval'] == {'step': 40, 'loss': 7.0}
  assert [r['step'] for r in figures['validation']] == [20, 40]
