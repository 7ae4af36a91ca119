"""benchmark.sampled_quality: BLEU and output length at T > 0 as mean +- stderr over keys."""

import numpy as np
import pytest

from speculative_t5x import acceptance
from speculative_t5x_lab import benchmark
from speculative_t5x import models
from speculative_t5x_lab import result_cache
from testing_utils import padded_inputs, tiny_model

TARGET = tiny_model(seed=0, vocab_size=24, layers=2, scale=1.5)
DRAFT = tiny_model(seed=1, vocab_size=24, scale=1.5)


def test_each_decoder_gets_mean_and_stderr_over_its_keys():
  inputs = padded_inputs(0, 6, 5, TARGET.vocab_size)
  sample = dict(temperature=1.0, max_decode_len=24)
  decoders = dict(
    baseline=models.make_decoder(TARGET, None, **sample),
    speculative=models.make_decoder(TARGET, DRAFT, gamma=3, **sample),
  )
  record = benchmark.sampled_quality(
    decoders, inputs, vocabulary_path=None, references=None, num_keys=4
  )
  assert record['num_keys'] == 4 and record['num_examples'] == 6
  for name in decoders:
    length = record[name]['length']
    assert record[name]['bleu'] is None  # No vocabulary: lengths only.
    assert len(length['per_key']) == 4 and 1 <= min(length['per_key'])
    assert length['mean'] == pytest.approx(np.mean(length['per_key']))
    assert length['stderr'] == pytest.approx(acceptance.standard_error(length['per_key']))
  # The keys differ: four samples, not one repeated.
  assert len(set(record['baseline']['length']['per_key'])) > 1
  # Every call gets the same keys: the baseline decoded again (not read from this call's
  # result cache, a new one per call) gives the same samples.
  again = benchmark.sampled_quality(
    dict(baseline=models.make_decoder(TARGET, None, **sample)),
    inputs,
    vocabulary_path=None,
    references=None,
    num_keys=4,
  )
  assert again['baseline'] == record['baseline']
  with pytest.raises(ValueError, match='num_keys >= 2'):
    benchmark.sampled_quality(decoders, inputs, vocabulary_path=None, references=None, num_keys=1)


@pytest.mark.slow  # Two sampled comparisons; one runs fast above.
def test_a_decoder_shared_by_two_comparisons_samples_once(monkeypatch):
  """The baseline beside each gamma: its samples come from the result cache after the first."""
  decoded = []
  corpus_bleu = benchmark.corpus_bleu
  monkeypatch.setattr(
    benchmark, 'corpus_bleu', lambda *args: decoded.append(1) or corpus_bleu(*args)
  )
  inputs = padded_inputs(0, 4, 5, TARGET.vocab_size)
  sample = dict(temperature=1.0, max_decode_len=8)
  cache = result_cache.ResultCache(None)
  records = [
    benchmark.sampled_quality(
      dict(
        baseline=models.make_decoder(TARGET, None, **sample),
        speculative=models.make_decoder(TARGET, DRAFT, gamma=gamma, **sample),
      ),
      inputs,
      vocabulary_path=None,
      references=None,
      num_keys=2,
      result_cache=cache,
    )
    for gamma in (1, 2)
  ]
  assert len(decoded) == 2 * 3  # Two keys each: the baseline once, each gamma once.
  assert records[0]['baseline'] == records[1]['baseline']
