"""benchmarks/d4pg/cpu_split.py: a run's CPU by thread name, child processes and idle
cores."""

import re
import subprocess
import sys
import textwrap

from tests import helpers

# A parent with one busy named thread and one busy child process, for ~2 s.
_BUSY = textwrap.dedent("""
    import ctypes, subprocess, sys, threading, time
    def spin(name):
      ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)   # PR_SET_NAME
      end = time.time() + 2
      while time.time() < end:
        pass
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\\nend = time.time() + 2\\nwhile time.time() < end: pass"])
    thread = threading.Thread(target=spin, args=("spinner",))
    thread.start(); thread.join(); child.wait()
""")


def test_cpu_split_names_a_busy_thread_and_counts_its_child_process():
  done = subprocess.run(
      [sys.executable, "benchmarks/d4pg/cpu_split.py", "--start_s=0.5", "--end_s=1.4", "--",
       sys.executable, "-c", _BUSY], cwd=helpers.REPO, capture_output=True, text=True,
      timeout=60)
  assert done.returncode == 0, done.stderr[-2000:]
  spinner = float(re.search(r"thread spinner +([\d.]+) cores", done.stdout).group(1))
  children = float(re.search(r"child processes ([\d.]+)", done.stdout).group(1))
  # Attribution, not speed: under a loaded test machine each still gets some CPU.
  assert spinner > 0.05 and children > 0.05, done.stdout
  assert "command exited 0" in done.stdout


def test_cpu_split_refuses_a_window_past_the_commands_end():
  done = subprocess.run(
      [sys.executable, "benchmarks/d4pg/cpu_split.py", "--start_s=0.1", "--end_s=1.5", "--",
       sys.executable, "-c", "pass"], cwd=helpers.REPO, capture_output=True, text=True,
      timeout=60)
  assert done.returncode != 0 and "ended (0) before --end_s" in done.stderr
