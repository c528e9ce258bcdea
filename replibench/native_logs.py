"""TensorFlow's C++ start-up notices kept out of a user's way; its warnings and errors kept.

TensorFlow's shared libraries log through absl before anything can configure absl
("WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR"), so TF_CPP_MIN_LOG_LEVEL does not reach them: every process that loads
TensorFlow printed the banner, the oneDNN notice, the CUDA stub's "Could not find cuda
drivers" and, on a machine without an NVIDIA driver, "failed call to cuInit: ... CUDA
error" (an error line that only says there is no GPU) before its first line of its own.

`filter_stderr()` passes this process's stderr (file descriptor 2, which TensorFlow's
C++ code writes to directly) through a small child process that drops exactly those
lines and forwards every other one as it comes: Python's logging and tracebacks, and
every C++ warning, error or fatal line except the no-GPU cuInit one. The child reads
until the last writer closes the pipe, so nothing written before a crash is lost.
Asked for with absl's verbosity flag (`-v 0`, `--verbosity=1`...) or
REPLIBENCH_NATIVE_LOGS=all (which child processes inherit), nothing is filtered and
TensorFlow's C++ code logs from INFO up.
"""

import os
import re
import signal

ENV = "REPLIBENCH_NATIVE_LOGS"   # 'all': show TensorFlow's C++ logging, unfiltered.
# A C++ log line (absl/glog format) of a .cc/.h source: severity, date, time, thread.
_NATIVE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [\w/.+-]+\.(?:cc|h|cpp):\d+\] ")
_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# The second line of cpu_feature_guard.cc's INFO message (which instructions the build
# does not use), the one continuation line a dropped notice has.
_CONTINUATION = "To enable the following instructions:"
_NO_GPU = "failed call to cuInit"


def wanted(environ=None) -> bool:
  """Whether the user asked to see TensorFlow's own logging."""
  return (environ if environ is not None else os.environ).get(ENV) == "all"


def has_nvidia_driver() -> bool:
  return os.path.exists("/proc/driver/nvidia/version")


def keep(line: str, nvidia_driver: bool) -> bool:
  """Whether a line of stderr reaches the user: all but TensorFlow's C++ INFO lines,
  the absl banner and, without an NVIDIA driver, the cuInit failure."""
  if line.startswith((_BANNER, _CONTINUATION)):
    return False
  native = _NATIVE.match(line)
  if native is None:
    return True
  if native[1] == "I":
    return False
  return nvidia_driver or _NO_GPU not in line


def filter_stderr() -> None:
  """From now on this process's stderr (and its children's, unless redirected) goes
  through a child process that drops TensorFlow's start-up notices (keep)."""
  read_end, write_end = os.pipe()
  if os.fork() == 0:   # The filter: forwards kept lines to the original stderr.
    os.close(write_end)
    _forward(read_end, has_nvidia_driver())
  os.close(read_end)
  os.dup2(write_end, 2)
  os.close(write_end)


def _forward(read_end: int, nvidia_driver: bool) -> None:
  # Stopping the user's command must not stop the filter first: it ends when the
  # last writer closes the pipe (end of file), after forwarding everything.
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
  os.closerange(0, 2)              # stdin and stdout: keep no pipe of a caller's open.
  os.closerange(3, read_end)
  os.closerange(read_end + 1, 1 << 16)
  pending = b""
  while chunk := os.read(read_end, 1 << 16):
    *lines, pending = (pending + chunk).split(b"\n")
    _write_kept(lines, nvidia_driver)
  if pending:
    _write_kept([pending], nvidia_driver, newline=False)
  os._exit(0)   # pylint: disable=protected-access  (a forked child: no atexit, no flushes)


def _write_kept(lines: list[bytes], nvidia_driver: bool, newline: bool = True) -> None:
  kept = [line for line in lines if keep(line.decode(errors="replace"), nvidia_driver)]
  data = b"\n".join(kept) + (b"\n" if newline and kept else b"")
  try:
    while data:
      data = data[os.write(2, data):]
  except OSError:   # Nobody reads our stderr any more: drain the pipe, show nothing.
    pass
