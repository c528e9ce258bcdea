"""Child processes that die with their parent, and SIGTERM passed down to them.

A process that `replibench launch` or `sweep` starts asks the kernel for a
signal when its parent dies (prctl PR_SET_PDEATHSIG), so a SIGKILL of the
parent leaves no orphan training or serving; SIGTERM and SIGINT to the parent
are forwarded to the children it waits on.
"""

import contextlib
import ctypes
import os
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
_LIBC = None


def _set_parent_death_signal(sig: int) -> None:
  global _LIBC  # pylint: disable=global-statement
  if _LIBC is None:
    _LIBC = ctypes.CDLL(None, use_errno=True)
  if _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def preexec(cores: set[int] | None = None, death_signal: int = signal.SIGKILL):
  """A Popen preexec_fn: die with the parent (death_signal), optionally pinned to cores.

  The parent-death signal follows exec; the parent's pid is checked after setting it,
  for a parent that died in between.
  """
  parent = os.getpid()

  def run():
    _set_parent_death_signal(death_signal)
    if os.getppid() != parent:
      os.kill(os.getpid(), death_signal)
    if cores:
      os.sched_setaffinity(0, cores)

  return run


@contextlib.contextmanager
def forwarding_signals(processes, on_signal=None):
  """While inside, SIGTERM / SIGINT to this process go to processes() (a callable
  returning Popen objects), then on_signal(signum) runs (e.g. raising to stop waiting)."""
  previous = {}

  def handler(signum, frame):
    del frame
    for proc in processes():
      if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          proc.send_signal(signum)
    if on_signal is not None:
      on_signal(signum)

  for sig in (signal.SIGTERM, signal.SIGINT):
    previous[sig] = signal.signal(sig, handler)
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


class Terminated(Exception):
  """Raised by a signal handler to stop waiting on children; carries the signal."""

  def __init__(self, signum: int):
    super().__init__(f"terminated by signal {signum}")
    self.signum = signum


def raise_terminated(signum: int) -> None:
  raise Terminated(signum)


def exit_code(signum: int) -> int:
  """The shell's convention for a process ended by a signal."""
  return 128 + signum


def exit_status(returncode: int) -> int:
  """A child's Popen returncode as an exit status to pass on: a child killed by signal
  N has returncode -N, which as this process's status would wrap to 256 - N (247 for
  SIGKILL); the shell's 128 + N is what a caller expects."""
  return exit_code(-returncode) if returncode < 0 else returncode


def popen(command: list[str], **kwargs) -> subprocess.Popen:
  """subprocess.Popen of a child that dies with this process (preexec by default)."""
  kwargs.setdefault("preexec_fn", preexec())
  return subprocess.Popen(command, **kwargs)
