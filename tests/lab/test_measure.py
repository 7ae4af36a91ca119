"""Tests for speculative_t5x_lab.measure's load monitor: what else ran on the CPU meanwhile.

(The timing functions are tested with the benchmark, in test_benchmark.py.)
"""

import os
import subprocess
import sys
import time

import pytest

from speculative_t5x_lab import measure

# Waits for a line, uses 0.3 s of CPU time, says so, then waits for its stdin to close.
SPIN = """
import sys, time
sys.stdin.readline()
while time.process_time() < 0.3: pass
print('spun', flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='cpu_times reads /proc')
def test_busy_since_finds_a_process_that_used_the_cpu_meanwhile():
  spinner = subprocess.Popen(
    [sys.executable, '-c', SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  try:
    before = measure.cpu_times()
    spinner.stdin.write('go\n')
    spinner.stdin.flush()
    assert spinner.stdout.readline() == 'spun\n'
    # The spinner used >= 0.3 s of CPU between the readings, however long they took.
    busy = measure.busy_since(before, threshold=0.0)
  finally:
    spinner.kill()
    spinner.wait()
  assert spinner.pid in busy, busy
  assert busy[spinner.pid]['cpu_percent'] > 0
  assert 'process_time() < 0.3' in busy[spinner.pid]['command']
  assert os.getpid() not in busy
  # A process that is gone, or not there, is skipped.
  assert spinner.pid not in measure.busy_since(before, threshold=0.0)
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
