"""`replibench launch` isolates its cluster and leaves nothing behind.

The tasks' gRPC servers listen in a private network namespace whose only
interface is its own loopback: from this machine's loopback the ports are
closed. Killing the launcher (SIGKILL or SIGTERM), or a sweep running a trial,
ends every process it started.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
LONG_RUN = ["run", f"--gin_file={CONFIG}", "--gin_file=configs/topology/workers.gin",
            *(f"--gin_bindings={b}" for b in helpers.TINY[CONFIG]),
            "--gin_bindings=Experiment.train_epochs = 1000"]
STARTED = re.compile(r"\[launch\] started (\w+ \d) \(pid (\d+)\) at 127\.0\.0\.1:(\d+)")


class _Launch:
  """A `replibench launch` in the background, with the tasks it reports starting."""

  def __init__(self, args, workers: int):
    self.proc = subprocess.Popen([sys.executable, "-m", "replibench.cli", *args],
                                 cwd=helpers.REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    self.tasks, self.lines = {}, []
    self._all_started = threading.Event()
    self.workers = workers
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.append(line)
      if match := STARTED.search(line):
        self.tasks[match.group(1)] = (int(match.group(2)), int(match.group(3)))
        if len(self.tasks) == self.workers:
          self._all_started.set()

  def wait_started(self, timeout=120):
    assert self._all_started.wait(timeout), "".join(self.lines)[-3000:]

  def stop(self):
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(timeout=60)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as f:   # A zombie has exited.
    return f.read().split(")")[-1].split()[0] != "Z"


def _gone(pids, timeout=30) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if not any(_alive(p) for p in pids):
      return True
    time.sleep(0.2)
  return False


def _cmdline(pid: int) -> bytes:
  with open(f"/proc/{pid}/cmdline", "rb") as f:
    return f.read()


def _children(pid: int) -> list[int]:
  return [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                         text=True).stdout.split()]


def _runs(pid: int) -> bool:
  """Whether pid is a `replibench run` (False once it has gone)."""
  try:
    return b"\0run\0" in _cmdline(pid)
  except (FileNotFoundError, ProcessLookupError):
    return False


def _in_namespace(pid: int, *command: str) -> str:
  return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", *command],
                        capture_output=True, text=True, check=True).stdout


def _host_addresses() -> list[str]:
  """This machine's non-loopback IPv4 addresses (outside any namespace)."""
  lines = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
  addresses = [line.split()[3].split("/")[0] for line in lines]
  return [a for a in addresses if not a.startswith("127.")]


def _listening(pid: int, port: int) -> bool:
  return f":{port} " in _in_namespace(pid, "ss", "-ltnH")


def test_servers_listen_only_inside_a_private_namespace_and_die_with_the_launcher():
  launch = _Launch(["launch", "--workers=2", "--", *LONG_RUN, "--workdir=/tmp/rb-launch-a"], 2)
  try:
    launch.wait_started()
    pid, port = launch.tasks["worker 0"]
    deadline = time.monotonic() + 120
    while not _listening(pid, port):   # The server starts with the strategy.
      assert time.monotonic() < deadline and launch.proc.poll() is None, "".join(launch.lines)
      time.sleep(0.5)
    # The namespace has one interface, its loopback: there is no other address to come in by.
    interfaces = _in_namespace(pid, "ip", "-o", "link", "show").split("\n")
    assert [line.split(":")[1].strip() for line in interfaces if line] == ["lo"]
    # This machine's loopback and its other addresses: nothing listens there.
    for address in ["127.0.0.1", *_host_addresses()]:
      for _, task_port in launch.tasks.values():
        with pytest.raises(ConnectionRefusedError):
          socket.create_connection((address, task_port), timeout=5).close()
    pids = [p for p, _ in launch.tasks.values()]
    os.kill(launch.proc.pid, signal.SIGKILL)
    assert _gone(pids), "tasks outlived a SIGKILLed launcher"
  finally:
    launch.stop()
    subprocess.run(["rm", "-rf", "/tmp/rb-launch-a"], check=False)


def test_sigterm_to_the_launcher_stops_the_cluster(tmp_path):
  launch = _Launch(["launch", "--workers=2", "--", *LONG_RUN, f"--workdir={tmp_path}"], 2)
  try:
    launch.wait_started()
    time.sleep(2)
    os.kill(launch.proc.pid, signal.SIGTERM)
    assert launch.proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert _gone([p for p, _ in launch.tasks.values()])
  finally:
    launch.stop()


def test_a_killed_sweep_leaves_no_trial_running(tmp_path):
  (tmp_path / "s.sweep").write_text(f"""
gin_files = ["{helpers.REPO}/{CONFIG}"]
seeds = [1]
seed_binding = "Experiment.seed"
bindings = ["Experiment.train_epochs = 1000", "small_resnet.widths = (4, 8, 8)",
            "FashionMNIST.num_train_examples = 2560"]
""")
  sweep = subprocess.Popen([sys.executable, "-m", "replibench.cli", "sweep",
                            f"--sweep={tmp_path / 's.sweep'}", f"--workdir={tmp_path / 'w'}"],
                           cwd=helpers.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    # Killed once its trial process exists (starting TensorFlow or training: the
    # parent-death signal it dies by is set before its exec, processes.preexec).
    deadline = time.monotonic() + 120
    while not any(_runs(p) for p in _children(sweep.pid)):
      assert time.monotonic() < deadline and sweep.poll() is None
      time.sleep(0.2)
    trial = _children(sweep.pid)
    assert trial
    sweep.kill()
    assert _gone(trial), "the trial outlived a SIGKILLed sweep"
  finally:
    if sweep.poll() is None:
      sweep.kill()
    sweep.wait()


@pytest.mark.parametrize("victim", ["inner launcher", "task"])
def test_a_launch_whose_launcher_or_task_is_killed_exits_128_plus_the_signal(tmp_path, victim):
  """`launch` re-runs itself inside the namespace; a SIGKILL of that inner launcher, or
  of a task, is exit status 137 (the README's 128 + N), not Popen's -9 wrapped to 247."""
  launch = _Launch(["launch", "--workers=1", "--", *LONG_RUN, f"--workdir={tmp_path}"], 1)
  try:
    launch.wait_started()
    if victim == "task":
      pid = launch.tasks["worker 0"][0]
    else:   # The child running `launch` again; the other, stderr's filter (native_logs),
      # is a fork of the launcher, with its command line.
      pid = next(int(p) for p in subprocess.run(
          ["pgrep", "-P", str(launch.proc.pid)], capture_output=True, text=True,
          check=True).stdout.split() if _cmdline(int(p)) != _cmdline(launch.proc.pid))
    os.kill(pid, signal.SIGKILL)
    assert launch.proc.wait(timeout=60) == 128 + signal.SIGKILL, "".join(launch.lines)[-3000:]
  finally:
    launch.stop()
