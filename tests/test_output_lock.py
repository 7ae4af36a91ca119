"""Tests for speculative_t5x.output_lock: one writer per output directory.

Holders in other processes are small Python programs that import the lock
module alone (no JAX): each holds the lock until told to let go, so every
race here is decided by the lock, never by a wait.
"""

import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest

from speculative_t5x import output_lock
import testing_utils


def _holder(directory):
  """A process holding `directory`'s lock."""
  process = testing_utils.start_lock_holder(directory)
  assert process.stdout.readline().strip() == 'held'
  return process


def _lock_path(directory):
  return os.path.join(str(directory), output_lock.LOCK_FILE)


def test_a_holder_records_itself_and_removes_the_lock_when_done(tmp_path):
  directory = tmp_path / 'out'
  with output_lock.hold(directory, job='a test') as record:
    assert os.path.isdir(directory)
    on_disk = json.loads(open(_lock_path(directory)).read())
    assert on_disk == record
    assert record['pid'] == os.getpid() and record['host'] == socket.gethostname()
    assert record['job'] == 'a test' and record['since'].endswith('UTC')
    # Re-entrant within the process: a main and the function it calls.
    with output_lock.hold(str(directory), job='inner') as inner:
      assert inner == record
    assert os.path.exists(_lock_path(directory))
  assert os.listdir(directory) == []


def test_a_second_writer_is_refused_naming_the_holder_until_it_ends(tmp_path):
  holder = _holder(tmp_path)
  try:
    with pytest.raises(output_lock.OutputLockedError) as error:
      with output_lock.hold(tmp_path):
        pytest.fail('a second writer got the lock')
    message = str(error.value)
    assert str(tmp_path) in message and _lock_path(tmp_path) in message
    assert f'test holder, process {holder.pid} on host {socket.gethostname()}' in message
    assert 'writing since' in message and f'kill {holder.pid}' in message
    assert error.value.holder['pid'] == holder.pid and error.value.directory == str(tmp_path)
  finally:
    testing_utils.let_go(holder)
  with output_lock.hold(tmp_path) as record:
    assert record['pid'] == os.getpid()


def test_writers_started_together_leave_exactly_one_holder(tmp_path):
  processes = [testing_utils.start_lock_holder(tmp_path) for _ in range(6)]
  # The holder waits for its stdin: every other one has tried while it held.
  first_lines = {process.pid: process.stdout.readline() for process in processes}
  holders = [pid for pid, line in first_lines.items() if line.strip() == 'held']
  assert len(holders) == 1, first_lines
  for pid, line in first_lines.items():
    if pid not in holders:
      assert line.startswith('refused') and f'process {holders[0]} ' in line, line
  for process in processes:
    testing_utils.let_go(process)
  assert os.listdir(tmp_path) == []


def test_a_killed_holders_lock_is_taken_over(tmp_path, caplog):
  holder = _holder(tmp_path)
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert json.loads(open(_lock_path(tmp_path)).read())['pid'] == holder.pid  # Left behind.
  with caplog.at_level(logging.WARNING):
    with output_lock.hold(tmp_path) as record:
      assert output_lock.read_holder(tmp_path) == record
  assert f'Taking over the writer lock of {tmp_path} from test holder, process {holder.pid}' in (
    caplog.text
  )
  assert os.listdir(tmp_path) == []


def _dead_pid():
  process = subprocess.Popen([sys.executable, '-c', ''])
  process.wait()
  return process.pid


def _write_record(directory, **fields):
  record = {'host': socket.gethostname(), 'since': '2020-01-01 00:00:00 UTC', 'job': 'old job'}
  record.update(fields)
  with open(_lock_path(directory), 'w') as f:
    json.dump(record, f)


def test_without_flock_the_record_decides(tmp_path, monkeypatch):
  monkeypatch.setattr(output_lock, '_flock', lambda fd: None)  # A filesystem without locks.
  # A live process of this host: refused.
  parent = os.getppid()
  _write_record(tmp_path, pid=parent, pid_start=output_lock._process_start(parent))
  with pytest.raises(output_lock.OutputLockedError, match=f'kill {parent}'):
    with output_lock.hold(tmp_path):
      pass
  # A dead one, or its pid now another process's (started at another time): taken over.
  for pid, start in ((_dead_pid(), None), (parent, 'another start')):
    _write_record(tmp_path, pid=pid, pid_start=start)
    with output_lock.hold(tmp_path) as record:
      assert output_lock.read_holder(tmp_path) == record
    assert os.listdir(tmp_path) == []
  # Another host's: it cannot be told from here; the error says how to proceed.
  _write_record(tmp_path, host='elsewhere', pid=1)
  with pytest.raises(output_lock.OutputLockedError) as error:
    with output_lock.hold(tmp_path):
      pass
  message = str(error.value)
  assert 'old job, process 1 on host elsewhere, writing since 2020-01-01' in message
  assert f'known to have ended (killed, its host lost), delete {_lock_path(tmp_path)}' in message
  # Without flock, a holder is still refused by its record alone.
  os.remove(_lock_path(tmp_path))
  with output_lock.hold(tmp_path):
    with pytest.raises(output_lock.OutputLockedError, match=f'kill {os.getpid()}'):
      output_lock._acquire(str(tmp_path), 'second')


def test_host_local_locks_refuse_another_hosts_record(tmp_path, monkeypatch):
  monkeypatch.setattr(output_lock, '_host_local_locks', lambda directory: True)
  _write_record(tmp_path, host='elsewhere', pid=1)
  with pytest.raises(output_lock.OutputLockedError, match='do not reach across hosts'):
    with output_lock.hold(tmp_path):
      pass
  # This host's unlocked record is a dead holder's: flock reaches this host's processes.
  _write_record(tmp_path, pid=os.getppid())
  with output_lock.hold(tmp_path):
    pass


@pytest.mark.parametrize(
  'fs_type, options, host_local',
  [
    ('ext4', 'rw,relatime', False),
    ('nfs4', 'rw,vers=4.2,local_lock=none', False),
    ('nfs', 'rw,vers=3,nolock', True),
    ('nfs4', 'rw,local_lock=flock', True),
    ('fuse.gcsfuse', 'rw,nosuid', True),
  ],
)
def test_mounts_whose_flock_reaches_one_host_are_known(monkeypatch, fs_type, options, host_local):
  monkeypatch.setattr(output_lock, '_mount_of', lambda path: (fs_type, options.split(',')))
  assert output_lock._host_local_locks('/data/out') == host_local


def test_the_mount_of_a_path_is_the_longest_mount_point_above_it(tmp_path):
  fs_type, options = output_lock._mount_of(str(tmp_path))
  with open('/proc/self/mounts') as f:
    assert any(line.split()[2] == fs_type for line in f)
  assert options
