"""Tests for speculative_t5x.bench.measure's load monitor: what else ran on the CPU meanwhile.

(The timing functions are tested with the benchmark, in test_benchmark.py.)
"""

import os
import subprocess
import sys
import time

import pytest

from speculative_t5x.bench import measure

SPIN = 'import time\nend = time.time() + 10\nwhile time.time() < end: pass'


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='busy_processes reads /proc')
def test_busy_processes_finds_a_spinning_process():
  spinner = subprocess.Popen([sys.executable, '-c', SPIN])
  try:
    time.sleep(0.5)  # Past the interpreter's start.
    busy = measure.busy_processes(interval=1.0, threshold=10.0)
  finally:
    spinner.kill()
    spinner.wait()
  assert spinner.pid in busy, busy
  assert 10.0 <= busy[spinner.pid]['cpu_percent'] <= 100.0 * (os.cpu_count() or 1) + 5
  assert 'while time.time() < end' in busy[spinner.pid]['command']
  assert os.getpid() not in busy
  # A process that is gone, or not there, is skipped.
  assert spinner.pid not in measure.busy_processes(interval=0.1)


def test_load_monitor_samples_while_it_runs_and_summarizes():
  with measure.LoadMonitor(period=0.1) as monitor:
    time.sleep(0.2)
  summary = monitor.summary()
  assert summary['samples'] == len(monitor.samples) >= 1
  load = summary['load_average_1min']
  assert 0 <= load['min'] <= load['max']
  assert monitor.summary(since=time.time() + 60) == dict(samples=0, load_average_1min=None, busy=[])


def test_load_monitor_summary_counts_each_command_and_its_peak():
  monitor = measure.LoadMonitor()
  busy = lambda *pairs: [dict(command=c, cpu_percent=p) for c, p in pairs]
  monitor.samples = [
    dict(time=1.0, load_average=[0.5, 0.4, 0.3], busy=busy(('make', 90.0))),
    dict(time=2.0, load_average=[1.5, 0.6, 0.4], busy=busy(('make', 40.0), ('cron', 10.0))),
    dict(time=3.0, load_average=[1.0, 0.7, 0.5], busy=busy(('make', 60.0))),
  ]
  assert monitor.summary() == dict(
    samples=3,
    load_average_1min=dict(min=0.5, max=1.5),
    busy=[
      dict(command='make', peak_cpu_percent=90.0, samples=3),
      dict(command='cron', peak_cpu_percent=10.0, samples=1),
    ],
  )
  assert monitor.summary(since=2.0)['busy'][0] == dict(
    command='make', peak_cpu_percent=60.0, samples=2
  )
