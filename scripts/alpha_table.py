"""alpha beyond the paper's Table 3: the main job's pair, every draft, T = 0 and 1.

For the target `make demo` trains (in --workdir, default runs/demo), alpha of
the data-trained draft, of the drafts distilled under each divergence of
`losses.DIVERGENCES` for each decoding temperature (each run as the demo
distills: `demo.distilled_model`, cached in the workdir as
gettext_draft_<divergence>_T<t>), and of the bigram and unigram drafts fitted
on the training split, all measured at T = 0 and 1 on the same target samples
of the test split (>= --alpha_tokens target tokens per temperature, standard
errors from per-sequence means). Prints a Markdown table and writes it with
the records to <workdir>/report/alpha_table.{md,json}.

  make demo && .venv/bin/python scripts/alpha_table.py

Run the demo first: it builds the corpus and vocabulary, trains both models
and distills with its default divergence, which is reused here.
"""

import argparse
import json
import os

from speculative_t5x import acceptance
from speculative_t5x_lab import benchmark
from speculative_t5x_lab import demo
from speculative_t5x.training import losses
from speculative_t5x import drafts
from speculative_t5x.data import tasks_core


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='runs/demo')
  parser.add_argument('--vocab_size', type=int, default=4000)
  parser.add_argument('--draft_steps', type=int, default=demo.DRAFT_STEPS)
  parser.add_argument(
    '--distill_steps',
    type=int,
    nargs=len(demo.TEMPERATURES),
    default=demo.DISTILL_STEPS,
    help=f'Distillation steps for each of the temperatures {demo.TEMPERATURES}.',
  )
  parser.add_argument('--target_steps', type=int, default=demo.TARGET_STEPS)
  parser.add_argument('--alpha_tokens', type=int, default=10_000)
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  args = parser.parse_args()

  corpus_dir, vocabulary = demo.prepare_data(args.workdir, args.vocab_size)
  train_model = lambda name, steps, batch_size=None: demo.trained_model(
    args.workdir, name, steps, corpus_dir, vocabulary, args.vocab_size, batch_size
  )
  # The demo's target (its batch size too: a workdir's target of another recipe is refused).
  target = train_model('gettext_target', args.target_steps, demo.TARGET_BATCH_SIZE)
  candidates = {'data-trained draft': train_model('gettext_draft', args.draft_steps)}
  for temperature, steps in zip(demo.TEMPERATURES, args.distill_steps):
    for divergence in losses.DIVERGENCES:
      model, _ = demo.distilled_model(
        args.workdir, steps, divergence, temperature, corpus_dir, vocabulary, args.vocab_size
      )
      candidates[f'distilled for T={temperature:g}, {divergence}'] = model
  corpus = benchmark.tsv_target_tokens(os.path.join(corpus_dir, 'train.tsv'), vocabulary, 20_000)
  for order, name in ((2, 'bigram'), (1, 'unigram')):
    candidates[name] = drafts.NgramDraft.fit(corpus, target.vocab_size, order=order)
  inputs, _ = benchmark.tsv_inputs(
    os.path.join(corpus_dir, 'test.tsv'), vocabulary, prefix=tasks_core.EN_DE_PREFIX
  )

  records = []
  for temperature in args.temperatures:
    print(f'alpha at temperature {temperature} ...', flush=True)
    results = acceptance.measure_alpha(
      target,
      candidates,
      inputs,
      temperature=temperature,
      max_decode_len=demo.MAX_DECODE_LEN,
      min_tokens=args.alpha_tokens,
    )
    for name, result in results.items():
      records.append(
        dict(
          draft=name,
          temperature=temperature,
          alpha=result.alpha,
          stderr=result.stderr,
          num_tokens=result.num_tokens,
        )
      )
  temperatures = sorted({r['temperature'] for r in records})
  by_key = {(r['draft'], r['temperature']): r for r in records}
  lines = [
    '| draft | ' + ' | '.join(f'alpha, T = {t:g}' for t in temperatures) + ' |',
    '|---|' + '---|' * len(temperatures),
  ]
  for name in candidates:
    cells = [by_key[name, t] for t in temperatures]
    lines.append(
      f'| {name} | '
      + ' | '.join(
        f'{c["alpha"]:.3f} ± {c["stderr"]:.3f} ({c["num_tokens"]} tokens)' for c in cells
      )
      + ' |'
    )
  table = '\n'.join(lines) + '\n'
  print(table)
  report_dir = os.path.join(args.workdir, 'report')
  os.makedirs(report_dir, exist_ok=True)
  with open(os.path.join(report_dir, 'alpha_table.md'), 'w') as f:
    f.write(table)
  with open(os.path.join(report_dir, 'alpha_table.json'), 'w') as f:
    json.dump(records, f, indent=1)


if __name__ == '__main__':
  main()
