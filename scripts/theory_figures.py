"""Regenerates the paper's Table 1 and Figures 2-4 from `speculative_t5x_lab.theory`.

  .venv/bin/python scripts/theory_figures.py --output_dir=docs/theory

Writes table1.md and figure2.png (expected tokens per target call vs alpha),
figure3.png (optimal gamma vs alpha for several c), figure4.png (walltime
improvement and operations factor vs alpha for several gamma, c = c_hat = 0 as
in the paper's Table 1).
"""

import argparse
import os

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from speculative_t5x_lab import theory

ALPHAS = np.linspace(0.0, 0.99, 199)


def table1() -> str:
  """Table 1: speed and operations factors for (alpha, gamma), c = c_hat = 0."""
  rows = [(0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10)]
  lines = ['| alpha | gamma | walltime improvement | operations factor |', '|---|---|---|---|']
  for alpha, gamma in rows:
    lines.append(
      f'| {alpha} | {gamma} | {theory.walltime_improvement(alpha, gamma, 0.0):.2f}x '
      f'| {theory.operations_factor(alpha, gamma, 0.0):.2f}x |'
    )
  return '\n'.join(lines) + '\n'


def figure2(path: str) -> None:
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for gamma in (1, 3, 5, 7, 10):
    ax.plot(ALPHAS, theory.expected_tokens(ALPHAS, gamma), label=f'gamma = {gamma}')
  ax.plot(ALPHAS, theory.oracle_expected_tokens(ALPHAS), 'k--', label='gamma oracle, 1/(1-alpha)')
  ax.set(xlabel='alpha', ylabel='expected tokens per target call', ylim=(0, 12))
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def figure3(path: str) -> None:
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for c in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
    ax.step(ALPHAS, theory.optimal_gamma(ALPHAS, c, max_gamma=64), where='mid', label=f'c = {c}')
  ax.set(xlabel='alpha', ylabel='optimal gamma', yscale='log')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def figure4(path: str) -> None:
  fig, (speed_ax, ops_ax) = plt.subplots(1, 2, figsize=(9, 3.5))
  for gamma in (1, 2, 3, 5, 7, 10):
    speed_ax.plot(ALPHAS, theory.walltime_improvement(ALPHAS, gamma, 0.0), label=f'gamma = {gamma}')
    ops_ax.plot(ALPHAS, theory.operations_factor(ALPHAS, gamma, 0.0), label=f'gamma = {gamma}')
  speed_ax.set(xlabel='alpha', ylabel='walltime improvement (c = 0)')
  ops_ax.set(xlabel='alpha', ylabel='operations factor (c_hat = 0)')
  speed_ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--output_dir', default='docs/theory')
  output_dir = parser.parse_args().output_dir
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'table1.md'), 'w') as f:
    f.write(table1())
  figure2(os.path.join(output_dir, 'figure2.png'))
  figure3(os.path.join(output_dir, 'figure3.png'))
  figure4(os.path.join(output_dir, 'figure4.png'))
  print(table1())
  print(f'Figures written to {output_dir}/.')


if __name__ == '__main__':
  main()
