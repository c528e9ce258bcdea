"""`replibench launch`: a cluster of processes on this machine, wired by TF_CONFIG.

For trying a multi-worker topology locally; on a cluster, the launcher of your
choice (Kubeflow, SLURM scripts...) sets TF_CONFIG instead. The launcher first
re-runs itself in a private network namespace (netns.py): the tasks' gRPC
servers, which TensorFlow binds to every interface, are then reachable from the
cluster's own loopback and from nowhere else; `--network=RATE` rate-limits that
loopback. Tasks listen on free ports of 127.0.0.1 there and their output is
streamed with a `[job i]` prefix; the launcher's own lines start with `[launch]`
(on stderr). Every task dies with the launcher (also on SIGKILL), and SIGTERM
or SIGINT to the launcher stops the cluster.

  --ps 0 (synchronous, MultiWorkerMirrored): W 'worker' tasks, all training. If
      any fails the others are stopped and launch exits with its code.
  --ps P > 0 (regimes.AsyncPS): a 'chief' that trains, W 'worker' and P 'ps'
      tasks that serve it. The chief's exit code is the launch's, and the
      servers are stopped when it ends. A worker that dies is restarted on its
      port (at most max_restarts times per worker; the coordinator reruns its
      updates), except after exit code 2 (bad input, which a restart repeats);
      a ps that dies ends the launch (variables live there). A chief that
      crashes (killed by a signal such as SIGSEGV, SIGABRT or SIGKILL, not by an
      error exit) is the coordinator failure of TF's parameter-server training:
      the whole cluster is restarted, at most max_restarts times, and the run
      resumes from its last checkpoint, or starts over if it has none (work
      after the checkpoint is redone and timed again; the result counts the
      resume). TF 2.21's coordinator segfaulted once in ~60 otherwise clean
      runs of the tests' SN-GAN launch, at its first scheduled updates.
"""

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from replibench import cluster as cluster_lib
from replibench import errors, processes, rates
from replibench.harness import netns



def free_ports(n: int) -> list[int]:
  sockets = []
  for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    sockets.append(s)
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def make_cluster(workers: int, ps: int) -> dict:
  """{job: ['127.0.0.1:port', ...]}: W workers, or a chief + W workers + P ps."""
  counts = {"worker": workers} if not ps else {"chief": 1, "worker": workers, "ps": ps}
  ports = iter(free_ports(sum(counts.values())))
  return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in counts.items()}


def core_share(index: int, cpus_per_worker: int) -> set[int] | None:
  """The cores worker index is pinned to (None: no pinning)."""
  if not cpus_per_worker:
    return None
  cores = sorted(os.sched_getaffinity(0))
  return {cores[(index * cpus_per_worker + k) % len(cores)] for k in range(cpus_per_worker)}


def _log(message: str) -> None:
  print(f"[launch] {message}", file=sys.stderr, flush=True)


def _stream(proc: subprocess.Popen, prefix: str) -> None:
  for line in iter(proc.stdout.readline, b""):
    sys.stdout.write(f"{prefix} {line.decode(errors='replace')}")
    sys.stdout.flush()


@dataclasses.dataclass
class _Task:
  """One process of the cluster; start() (re)starts it with the same TF_CONFIG."""

  job: str
  index: int
  cluster: dict
  args: list
  cores: set | None = None   # Pinned cores (worker tasks with --cpus_per_worker).
  proc: subprocess.Popen | None = None
  restarts: int = 0
  wire_base: int = 0   # The link's byte count when the cluster (re)started.

  @property
  def name(self) -> str:
    return f"{self.job} {self.index}"

  def start(self) -> None:
    env = dict(os.environ, **{cluster_lib.ENV: cluster_lib.to_env(self.cluster, self.job,
                                                                   self.index),
                              netns.BASE_ENV: str(self.wire_base)})
    env.pop("REPLIBENCH_CPU_DEVICES", None)   # One CPU replica per worker process.
    self.proc = processes.popen(
        [sys.executable, "-m", "replibench.cli", *self.args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=processes.preexec(self.cores))
    threading.Thread(target=_stream, args=(self.proc, f"[{self.name}]"), daemon=True).start()
    _log(f"started {self.name} (pid {self.proc.pid}) at {self.cluster[self.job][self.index]}")


def _stop(tasks) -> None:
  procs = [t.proc for t in tasks]
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for p in procs:
      if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(p.pid, sig)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
      time.sleep(0.1)


def _synchronous_outcome(tasks) -> int | None:
  """--ps 0: the first failure's code, 0 once all succeeded, None while running."""
  codes = [t.proc.poll() for t in tasks]
  for task, code in zip(tasks, codes):
    if code not in (None, 0):
      _log(f"{task.name} exited with code {code}; stopping the others.")
      return code
  return 0 if all(c == 0 for c in codes) else None


# Signals that end a process abnormally (a crash, the OOM killer, a preemption),
# as opposed to SIGTERM / SIGINT, which ask it to stop.
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE,
                  signal.SIGKILL}
_RESTART_CLUSTER = "restart the cluster"


def _crashed(code: int) -> bool:
  return code < 0 and -code in _CRASH_SIGNALS


def _asynchronous_outcome(tasks, max_restarts: int, cluster_restarts: int) -> int | str | None:
  """--ps > 0: the chief's code once it ended, a fatal server exit's, _RESTART_CLUSTER
  after a chief crash with restarts left, or None while running."""
  chief, servers = tasks[0], tasks[1:]
  code = chief.proc.poll()
  if code is not None and _crashed(code) and cluster_restarts < max_restarts:
    _log(f"{chief.name} crashed ({signal.Signals(-code).name}, code {code}); restarting the "
         f"cluster, the run resumes from its last checkpoint if any "
         f"(restart {cluster_restarts + 1} of {max_restarts}).")
    return _RESTART_CLUSTER
  if code is not None:
    return code
  for task in servers:
    code = task.proc.poll()
    if code is None:
      continue
    if task.job == "worker" and code != errors.EXIT_USER_ERROR and task.restarts < max_restarts:
      task.restarts += 1
      _log(f"{task.name} exited with code {code}; restarting it "
           f"(restart {task.restarts} of {max_restarts}).")
      task.start()
      continue
    _log(f"{task.name} exited with code {code}; stopping the cluster.")
    return code or 1
  return None


def launch(workers: int, args: list[str], cpus_per_worker: int = 0,
           timeout_s: float | None = None, ps: int = 0, max_restarts: int = 3,
           network: str = "none") -> int:
  """Runs `replibench <args>` in every task of the cluster; returns the exit code.

  Outside the private network namespace this starts the launcher again inside one
  (and waits for it); inside, it sets the loopback up, limits its rate and runs the
  cluster.
  """
  rates.check("--network", network)
  if not netns.inside():
    return _relaunch_in_namespace(workers, args, cpus_per_worker, timeout_s, ps, network)
  netns.bring_up_loopback()
  netns.limit_rate(network)
  return _run_cluster(workers, args, cpus_per_worker, timeout_s, ps, max_restarts, network)


def _relaunch_in_namespace(workers, args, cpus_per_worker, timeout_s, ps, network) -> int:
  netns.check_available()
  netns.tc_program(network)   # Before anything starts: no silent unlimited run.
  command = [sys.executable, "-m", "replibench.cli", "launch", f"--workers={workers}",
             f"--ps={ps}", f"--cpus_per_worker={cpus_per_worker}", f"--network={network}",
             *([f"--timeout={timeout_s}"] if timeout_s else []), "--", *args]
  env = dict(os.environ, **{netns.ENV: network})
  inner = processes.popen(netns.unshare_command(command), env=env)
  with processes.forwarding_signals(lambda: [inner]):
    return processes.exit_status(inner.wait())


def _start_all(tasks) -> None:
  """(Re)starts the cluster's tasks, telling them the link's byte count now."""
  base = netns.loopback_bytes()
  for task in tasks:
    task.wire_base = base
    task.start()


def _run_cluster(workers, args, cpus_per_worker, timeout_s, ps, max_restarts, network) -> int:
  cluster = make_cluster(workers, ps)
  tasks = [_Task(job, i, cluster, args, core_share(i, cpus_per_worker) if job == "worker"
                 else None) for job, addresses in cluster.items() for i in range(len(addresses))]
  _log(f"cluster in a private network namespace (loopback only, rate {network}): "
       f"{', '.join(f'{job} x{len(a)}' for job, a in cluster.items())}")
  start, cluster_restarts = time.monotonic(), 0
  try:
    with processes.forwarding_signals(lambda: [], processes.raise_terminated):
      _start_all(tasks)
      while True:
        outcome = (_asynchronous_outcome(tasks, max_restarts, cluster_restarts) if ps
                   else _synchronous_outcome(tasks))
        if outcome == _RESTART_CLUSTER:
          cluster_restarts += 1
          _stop(tasks)
          _start_all(tasks)
          continue
        if outcome is not None:
          return processes.exit_status(outcome)
        if timeout_s and time.monotonic() - start > timeout_s:
          _log(f"timed out after {timeout_s:.0f} s; stopping the cluster.")
          return 124
        time.sleep(0.2)
  except processes.Terminated as e:
    _log(f"signal {e.signum}: stopping the cluster.")
    return processes.exit_code(e.signum)
  finally:
    _stop([t for t in tasks if t.proc is not None])
    for task in tasks:
      if task.proc is not None:
        task.proc.wait()
    _log(f"the cluster's link carried {netns.loopback_bytes():,} bytes in all "
         f"(result.json's network record: init_bytes, then bytes_on_wire; the rest is "
         f"the tasks' shutdown).")
