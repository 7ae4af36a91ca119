"""The benchmarks' typed records and their JSON form (`bench.records`)."""

import dataclasses
import json

import pytest

from speculative_t5x_lab import records

SUMMARY = dict(median=1.2, min=1.1, max=1.3)


def walltime(**fields):
  return records.Walltime(
    **dict(
      pair='p',
      task='t',
      emulated=False,
      architecture='encoder-decoder',
      temperature=0.0,
      gamma=3,
      lenience=1.0,
      verification='token',
      draft_threshold=0.0,
      profile=None,
      tree=None,
      batch_size=2,
      num_examples=4,
      alpha=None,
      alpha_loop=0.5,
      c=0.1,
      verify_cost=1.4,
      ms_per_token_baseline=SUMMARY,
      ms_per_token_speculative=SUMMARY,
      speedup=SUMMARY,
      tokens_per_call=2.0,
      mean_acceptance_length=1.0,
      drafted_per_iteration=3.0,
      draft_steps_per_call=3.0,
      finished_row_share=0.1,
      baseline_finished_row_share=None,
      accepted_histogram=[1, 2, 1, 0],
      acceptance_by_position=[0.5, 0.4, 0.3],
      memory={},
      device_peak_bytes=None,
    ),
    **fields,
  )


def test_every_kind_is_one_class_and_the_json_names_it():
  assert len(records.KINDS) == 12
  for kind, cls in records.KINDS.items():
    assert cls.KIND == kind and cls.__doc__
  record = walltime()
  data = record.to_json()
  assert next(iter(data)) == 'kind' and data['kind'] == 'walltime'


def test_fields_measured_only_somewhere_are_absent_from_the_json_when_not_measured():
  data = walltime().to_json()
  # Present with None (always there), absent (only where measured), as the dicts were.
  assert data['alpha'] is None and data['baseline_finished_row_share'] is None
  assert 'breakdown' not in data and 'predicted_speedup' not in data
  data = walltime(breakdown={'measured': 1.0}, predicted_speedup=1.5).to_json()
  assert data['breakdown'] == {'measured': 1.0} and data['predicted_speedup'] == 1.5


def test_json_round_trip_keeps_unnamed_keys_and_reads_older_files():
  record = walltime(predicted_speedup=1.5)
  data = json.loads(json.dumps(record.to_json()))
  assert records.from_json(data) == record
  # A key this version does not name is kept and written back; a missing one is None.
  data.update(added_later=7)
  del data['device_peak_bytes']
  read = records.from_json(data)
  assert read.extra == {'added_later': 7} and read.device_peak_bytes is None
  assert read.to_json()['added_later'] == 7
  with pytest.raises(ValueError, match="Unknown record kind 'walltimes'"):
    records.from_json(dict(data, kind='walltimes'))


def test_a_record_reads_as_its_json_dict():
  record = walltime(breakdown={'measured': 1.0})
  assert record['speedup'] == SUMMARY and record['kind'] == 'walltime'
  assert 'breakdown' in record and 'predicted_speedup' not in record
  assert record.get('predicted_speedup') is None
  assert dict(record) == record.to_json()


def test_make_puts_the_keys_a_class_does_not_name_in_extra():
  machine = records.make(
    records.Machine,
    device='cpu',
    platform='cpu',
    cpu=None,
    cpu_family=None,
    cores=2,
    bandwidth_gb_per_s=30.0,
    notes='x',
  )
  assert machine.extra == {'notes': 'x'} and machine.to_json()['notes'] == 'x'
  assert 'training_step_s' not in machine.to_json()
  assert records.typed([machine.to_json()]) == [machine]
  assert dataclasses.replace(machine, cores=4).cores == 4
