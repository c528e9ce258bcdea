"""The run directory: checked before anything is written, locked while a run owns it.

One run at a time per workdir: the chief holds an flock on DIR/.lock for the
whole run (the kernel drops it when the process dies, so a stale lock from a
killed run never blocks). A second `replibench run` on the same DIR gets a
UserError naming the process that holds it. A run that stops with a UserError
before training leaves nothing behind: what it created is removed again.
"""

import contextlib
import errno
import fcntl
import os
import shutil

from replibench import inputs
from replibench.errors import UserError

LOCK_FILE = ".lock"


def check(workdir: str) -> None:
  """UserError if workdir cannot be a run directory (a file, or not writable)."""
  inputs.output_directory("--workdir", workdir)


@contextlib.contextmanager
def owned(workdir: str, chief: bool = True):
  """Creates workdir if needed; on the chief, holds its lock and, on a UserError inside
  the block, removes what the block created (the whole directory if this made it).
  Other workers of a multi-process run share the chief's directory and do neither."""
  check(workdir)
  created = not os.path.exists(workdir)
  before = set() if created else set(os.listdir(workdir))
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise UserError(f"--workdir={workdir} cannot be created ({e.strerror}).") from None
  if not chief:
    yield
    return
  handle = _acquire(workdir)
  try:
    yield
  except UserError:
    _release(handle)
    handle = None
    _remove_new(workdir, before, created)
    raise
  finally:
    _release(handle)


def _acquire(workdir: str):
  path = os.path.join(workdir, LOCK_FILE)
  handle = open(path, "a+")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      raise
    handle.seek(0)
    holder = handle.read().strip() or "another process"
    handle.close()
    raise UserError(
        f"--workdir={workdir} is in use by a run that is still going ({holder}); two runs "
        f"on one directory would overwrite each other's checkpoints and result. Wait for "
        f"it to end, or use another --workdir.") from None
  handle.seek(0)
  handle.truncate()
  handle.write(f"pid {os.getpid()}")
  handle.flush()
  return handle


def _release(handle) -> None:
  if handle is not None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def _remove_new(workdir: str, before: set, created: bool) -> None:
  if created:
    shutil.rmtree(workdir, ignore_errors=True)
    return
  for name in set(os.listdir(workdir)) - before:
    path = os.path.join(workdir, name)
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.remove(path)
