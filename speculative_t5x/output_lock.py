"""One writer per output directory: an exclusive lock held for as long as a job writes.

Every job that writes resumable output (`infer`, `train`, `distill`,
`train_feature_head`) runs inside `hold(directory, job)`, taken before it
computes anything. A second writer started on the same directory stops at
once with `OutputLockedError`, which names the directory, the holder (its
job, host, process id and since when it writes) and what to do, instead of
interleaving its results with the first one's. Jobs that only read a finished
output take no lock and run beside a writer.

How. The lock is `LOCK_FILE` inside the directory: a JSON record of the
holder (host, pid, the process's start time, since when, the job and its
command line), created atomically with the record in it (written to a file
of the process's own, hard-linked into place), and an exclusive
`fcntl.flock` on it, held open for the job's life. A job that ends removes
the file. The kernel releases the flock of a process that dies, SIGKILL
included: the next job finds the dead holder's file unlocked, says whose
lock it takes over, and proceeds. Within one process `hold` is re-entrant (a
main holds its output before gin loads the models, the function it calls
holds it again). A forked child shares its parent's open lock file, so the
lock lasts as long as either runs; a `hold` in the child is another writer's.

Filesystems without working locks. Where `flock` fails (ENOLCK or
EOPNOTSUPP: some NFS and FUSE mounts), the record alone is the lock, and
where a mount's flock only reaches the processes of one host (NFS mounted
with `nolock` or `local_lock=flock|all`, FUSE filesystems such as gcsfuse:
`_host_local_locks` reads /proc/self/mounts), the flock guards this host and
the record the others. Then a record found on starting is judged:
  * the holder ran on this host: where flock works on this host, its lock
    decides; without flock, the holder is alive if its pid runs a process
    started when the record says (a reused pid is not mistaken for it), and
    the job is refused; otherwise the lock is stale and taken over;
  * the holder ran on another host: this host cannot tell whether it still
    runs. The job is refused, naming the holder; if that job is known to
    have ended (killed, its host lost), delete the lock file and start again.
Two jobs taking over one dead holder's record at the same instant on a
filesystem without locks could both proceed (a record cannot be replaced
atomically only if unchanged); `infer` then keeps the longest consistent
prefix of its records on the next run. A URL (gs://...) has no file to lock:
the job warns and writes unlocked.

Imports the standard library only.
"""

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Iterator, Optional, Tuple

LOCK_FILE = '.writer.lock'

# How long a refused job waits for a holder's record being rewritten in place
# (a takeover) before naming the holder as unknown.
_RECORD_WAIT_SECONDS = 1.0
# flock's errors of a filesystem that has no locks (not EWOULDBLOCK: a held lock).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF)


class OutputLockedError(RuntimeError):
  """Another job writes the directory (or may: a holder on another host without locks).

  Attributes:
    directory: the output directory.
    lock_path: its `LOCK_FILE`.
    holder: the holder's record ({'host', 'pid', 'since', 'job', ...}), or
      None where it could not be read.
  """

  def __init__(self, message: str, directory: str, lock_path: str, holder: Optional[Dict]):
    super().__init__(message)
    self.directory, self.lock_path, self.holder = directory, lock_path, holder


@dataclasses.dataclass
class _Held:
  fd: int
  path: str
  record: Dict[str, Any]
  depth: int = 1


# This process's locks, by (pid, the directory's real path): a forked child's are its own.
_HELD: Dict[Tuple[int, str], _Held] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def hold(directory: str, job: Optional[str] = None) -> Iterator[Dict[str, Any]]:
  """Holds `directory`'s writer lock (creating the directory) for the `with` block.

  Yields this process's holder record. Raises `OutputLockedError` if another
  job holds it (see the module docstring); a dead holder's lock is taken
  over with a warning. Re-entrant within a process.

  Args:
    directory: the output directory (a local path; a URL is not locked).
    job: what writes, for the record (e.g. 'speculative_t5x.infer'); default
      the command line's program.
  """
  directory = os.fspath(directory)
  if '://' in directory:
    logging.warning(
      '%s is a URL: no lock file there, so a second writer is not refused.', directory
    )
    yield _own_record(job)
    return
  os.makedirs(directory, exist_ok=True)
  key = (os.getpid(), os.path.realpath(directory))
  with _HELD_LOCK:
    held = _HELD.get(key)
    if held is not None:
      held.depth += 1
    else:
      held = _HELD[key] = _acquire(directory, job)
  try:
    yield held.record
  finally:
    with _HELD_LOCK:
      held.depth -= 1
      if not held.depth:
        del _HELD[key]
        _release(held)


def read_holder(directory: str) -> Optional[Dict[str, Any]]:
  """The record in `directory`'s lock file, or None (no file, or unreadable).

  A reader's view: the record may be a dead holder's (the flock says whether
  it is held; only a writer takes it).
  """
  return _read_path(os.path.join(os.fspath(directory), LOCK_FILE))


def describe(record: Optional[Dict[str, Any]]) -> str:
  """'JOB, process PID on host HOST, writing since SINCE' of a holder record."""
  if not record:
    return 'a process whose record cannot be read'
  return (
    f'{record.get("job", "a job")}, process {record.get("pid")} on host {record.get("host")}, '
    f'writing since {record.get("since")}'
  )


# ------------------------------------------------------------------------------
# Records.
# ------------------------------------------------------------------------------
def _process_start(pid: int) -> Optional[str]:
  """The start time of process `pid` in clock ticks since boot (Linux), or None."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read()
  except OSError:
    return None
  fields = stat[stat.rfind(b')') + 2 :].split()
  return fields[19].decode() if len(fields) > 19 else None


def _own_record(job: Optional[str]) -> Dict[str, Any]:
  now = datetime.datetime.now(datetime.timezone.utc)
  return {
    'host': socket.gethostname(),
    'pid': os.getpid(),
    'pid_start': _process_start(os.getpid()),
    'since': now.strftime('%Y-%m-%d %H:%M:%S UTC'),
    'job': job or os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else 'python'),
    'command': ' '.join(sys.argv)[:500],
  }


def _parse(data: bytes) -> Optional[Dict[str, Any]]:
  try:
    record = json.loads(data)
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def _read_path(path: str) -> Optional[Dict[str, Any]]:
  try:
    with open(path, 'rb') as f:
      return _parse(f.read())
  except OSError:
    return None


def _read_fd(fd: int) -> Optional[Dict[str, Any]]:
  return _parse(os.pread(fd, 1 << 16, 0))


def _write_fd(fd: int, record: Dict[str, Any]) -> None:
  data = (json.dumps(record, indent=1) + '\n').encode()
  os.ftruncate(fd, 0)
  os.pwrite(fd, data, 0)
  os.fsync(fd)


def _settled_record(path: str) -> Optional[Dict[str, Any]]:
  """The holder's record, waiting briefly while a takeover rewrites it in place."""
  deadline = time.monotonic() + _RECORD_WAIT_SECONDS
  record = _read_path(path)
  while record is None and time.monotonic() < deadline:
    time.sleep(0.02)
    record = _read_path(path)
  return record


def _is_alive(record: Dict[str, Any]) -> bool:
  """Whether the record's process (on this host) still runs: its pid, started when recorded."""
  pid = record.get('pid')
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # Another user's process.
  recorded, current = record.get('pid_start'), _process_start(pid)
  return recorded is None or current is None or recorded == current


# ------------------------------------------------------------------------------
# Locks.
# ------------------------------------------------------------------------------
def _flock(fd: int) -> Optional[bool]:
  """True: locked; False: another open file holds it; None: this filesystem has no flock."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    return False
  except OSError as error:
    if error.errno in _NO_LOCKS:
      return None
    raise


def _mount_of(path: str) -> Optional[tuple]:
  """(filesystem type, options) of the mount holding `path`, from /proc/self/mounts; or None."""
  try:
    with open('/proc/self/mounts') as f:
      mounts = [line.split() for line in f]
  except OSError:
    return None
  path = os.path.realpath(path)
  best = None
  for fields in mounts:
    if len(fields) < 4:
      continue
    point = fields[1].encode().decode('unicode_escape')  # \040 is a space.
    inside = path == point or path.startswith(point.rstrip('/') + '/')
    if inside and (best is None or len(point) > len(best[0])):
      best = (point, fields[2], fields[3].split(','))
  return best and best[1:]


def _host_local_locks(directory: str) -> bool:
  """Whether flock on `directory`'s mount reaches this host's processes only (module docstring)."""
  mount = _mount_of(directory)
  if mount is None:
    return False
  fs_type, options = mount
  if fs_type.startswith('fuse'):
    return True
  return fs_type.startswith('nfs') and any(
    option in ('nolock', 'local_lock=flock', 'local_lock=all') for option in options
  )


def _same_file(fd: int, path: str) -> bool:
  """Whether `path` is still the file open as `fd` (a releasing holder removes it)."""
  try:
    here, there = os.fstat(fd), os.stat(path)
  except FileNotFoundError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _create(path: str, record: Dict[str, Any]) -> Optional[int]:
  """Creates the lock file holding `record`, locked; its descriptor, or None if it exists.

  The record is written and locked in a file of this process's own, then
  hard-linked into place, so no one sees the lock file empty or unlocked.
  Where hard links fail (some FUSE filesystems), an exclusive create.
  """
  own = f'{path}.{record["host"]}.{record["pid"]}'
  fd = os.open(own, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
  try:
    _write_fd(fd, record)
    _flock(fd)
    try:
      os.link(own, path)
      return fd
    except FileExistsError:
      os.close(fd)
      return None
    except OSError:  # No hard links here.
      os.close(fd)
  finally:
    os.unlink(own)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
  except FileExistsError:
    return None
  _flock(fd)
  _write_fd(fd, record)
  return fd


def _refusal(directory: str, path: str, holder: Optional[Dict], why: str) -> OutputLockedError:
  return OutputLockedError(
    f'{directory} is being written by another job: {describe(holder)} (lock file {path}). '
    f'One writer per output directory: this job stops before computing anything. {why}',
    directory,
    path,
    holder,
  )


def _judge(
  directory: str, path: str, previous: Optional[Dict], locked: Optional[bool]
) -> Optional[OutputLockedError]:
  """None if the unlocked record `previous` is stale (taken over); else the refusal."""
  if not previous:
    return None  # An exclusive create cut short: nobody recorded itself.
  if locked and not _host_local_locks(directory):
    return None  # The kernel released it: its holder ended without removing the file.
  if previous.get('host') == socket.gethostname():
    if locked or not _is_alive(previous):
      return None
    return _refusal(
      directory,
      path,
      previous,
      f'Its process runs on this host: wait for it to end or stop it (kill {previous["pid"]}), '
      'or write to another directory.',
    )
  return _refusal(
    directory,
    path,
    previous,
    'Its host is another one, and locks on this filesystem do not reach across hosts, so '
    'whether it still runs cannot be told from here. Wait for it, or write to another '
    f'directory; if that job is known to have ended (killed, its host lost), delete {path} '
    'and start again.',
  )


def _acquire(directory: str, job: Optional[str]) -> _Held:
  path = os.path.join(directory, LOCK_FILE)
  record = _own_record(job)
  for _ in range(100):  # Retries only while other holders release or take over meanwhile.
    fd = _create(path, record)
    if fd is not None:
      return _Held(fd, path, record)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
      continue  # Released meanwhile.
    locked = _flock(fd)
    if locked is False:
      os.close(fd)
      holder = _settled_record(path)
      here = holder and holder.get('host') == socket.gethostname()
      raise _refusal(
        directory,
        path,
        holder,
        'It holds the lock now'
        + (
          f': wait for it to end or stop it (kill {holder["pid"]}), or write to another directory.'
          if here
          else '. Wait for it to end, or write to another directory. If that job is known to '
          'have ended (its host lost), the file server releases its lock once it notices (NFS: '
          f'after its lease time); otherwise delete {path} and start again.'
        ),
      )
    if locked and not _same_file(fd, path):
      os.close(fd)
      continue  # The holder released and removed it between our open and flock.
    previous = _read_fd(fd)
    if previous is None and not locked:
      previous = _settled_record(path)  # Perhaps a holder between its create and its write.
    refusal = _judge(directory, path, previous, locked)
    if refusal is not None:
      os.close(fd)
      raise refusal
    logging.warning(
      'Taking over the writer lock of %s from %s: that job ended without releasing it.',
      directory,
      describe(previous),
    )
    if locked:
      _write_fd(fd, record)
      return _Held(fd, path, record)
    os.close(fd)  # No locks here: replace the stale record with ours, if still that one.
    if _read_path(path) == previous:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
  raise RuntimeError(f'Could not take the writer lock {path}: it kept changing hands.')


def _release(held: _Held) -> None:
  try:
    if _same_file(held.fd, held.path) and _read_fd(held.fd) == held.record:
      os.unlink(held.path)
  finally:
    os.close(held.fd)
