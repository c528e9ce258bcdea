"""Per-test wall time and memory, for finding what makes the suite's peak: set
REPLIBENCH_TEST_MEMORY_LOG=FILE and every test process (each xdist worker) appends a
line a test to FILE:

  <seconds> s  rss <MiB> MiB  tree_peak <MiB> MiB  <pid>  <test id>

seconds: setup + call + teardown; rss: this process's resident memory after the
test; tree_peak: the most resident memory this process and its descendants (the
clusters and runs a test starts) held together while the test ran, sampled every
0.25 s. Resident pages shared between processes (TensorFlow's libraries, ~420 MiB a
process) count once per process, so tree_peak overstates what the machine lost.

  REPLIBENCH_TEST_MEMORY_LOG=/tmp/mem.log make test
  sort -k7 -n -r /tmp/mem.log | head -20      # the largest tree peaks
  sort -k1 -n -r /tmp/mem.log | head -20      # the slowest tests
"""

import os
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int:
  """pid's resident bytes (0 if it has gone)."""
  try:
    with open(f"/proc/{pid}/statm") as f:
      return int(f.read().split()[1]) * _PAGE
  except (OSError, IndexError, ValueError):
    return 0


def _tree_rss(root: int) -> int:
  """Resident bytes of root and every process descending from it."""
  parents = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        pass
  tree, grew = {root}, True
  while grew:
    more = {pid for pid, parent in parents.items() if parent in tree} - tree
    tree |= more
    grew = bool(more)
  return sum(_rss(pid) for pid in tree)


class MemoryLog:
  """The pytest hooks that write FILE's lines (conftest registers it when asked)."""

  def __init__(self, path: str):
    self.path, self.start, self.peak, self.test = path, time.monotonic(), 0, 0
    threading.Thread(target=self._sample, daemon=True).start()

  def _sample(self):
    me = os.getpid()
    while True:
      test = self.test
      total = _tree_rss(me)
      if test == self.test:   # Not a sample begun during the test before.
        self.peak = max(self.peak, total)
      time.sleep(0.25)

  def pytest_runtest_logstart(self, nodeid, location):
    del nodeid, location
    self.test += 1
    self.start, self.peak = time.monotonic(), _rss(os.getpid())

  def pytest_runtest_logfinish(self, nodeid, location):
    del location
    mib = lambda b: b / 2**20  # noqa: E731
    with open(self.path, "a") as f:
      f.write(f"{time.monotonic() - self.start:7.1f} s  rss {mib(_rss(os.getpid())):6.0f} MiB  "
              f"tree_peak {mib(self.peak):6.0f} MiB  {os.getpid()}  {nodeid}\n")
