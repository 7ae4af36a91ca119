"""The Colab notebook runs end to end (tiny random models, random inputs) without errors."""

import json
import os
import sys

import nbclient
import nbformat
import pytest

NOTEBOOK = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  'notebooks',
  'speculative_t5x_colab.ipynb',
)


@pytest.mark.slow
def test_notebook_runs_in_tiny_mode(tmp_path, monkeypatch):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  code_cells = [cell for cell in notebook.cells if cell.cell_type == 'code']
  assert not any(cell.outputs for cell in code_cells), 'save the notebook without outputs'
  # The kernel is this interpreter (a 'python3' kernelspec found first on JUPYTER_PATH), and it
  # inherits this process's environment.
  kernel_dir = tmp_path / 'jupyter' / 'kernels' / 'python3'
  kernel_dir.mkdir(parents=True)
  (kernel_dir / 'kernel.json').write_text(
    json.dumps(
      dict(
        argv=[sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
        display_name='Python 3',
        language='python',
      )
    )
  )
  monkeypatch.setenv('JUPYTER_PATH', str(tmp_path / 'jupyter'))
  monkeypatch.setenv('SPECULATIVE_T5X_NOTEBOOK_TINY', '1')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  workdir = tmp_path / 'work'
  workdir.mkdir()

  nbclient.NotebookClient(
    notebook, timeout=120, kernel_name='python3', resources={'metadata': {'path': str(workdir)}}
  ).execute()

  # execute() raises CellExecutionError on the first failing cell; check anyway.
  assert not [o for cell in code_cells for o in cell.outputs if o.output_type == 'error']
  text = ''.join(
    o.get('text', '') for cell in code_cells for o in cell.outputs if o.output_type == 'stream'
  )
  assert 'greedy speculative == greedy baseline: True' in text
  assert 'tokens per target call:' in text
  images = [o for cell in code_cells for o in cell.outputs if 'image/png' in o.get('data', {})]
  assert len(images) >= 3  # Acceptance histogram, speedup vs gamma, Theorem 3.8 curves.
  assert (workdir / 'runs' / 'colab' / 'colab_report' / 'speedup_vs_gamma.png').is_file()
