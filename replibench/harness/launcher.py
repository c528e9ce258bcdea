"""`replibench launch`: N worker processes on this machine, wired by TF_CONFIG.

For trying a multi-worker topology locally; on a cluster, the launcher of your
choice (Kubeflow, SLURM scripts...) sets TF_CONFIG instead. Workers listen on
free ports of 127.0.0.1. Output is streamed with a `[worker i]` prefix; if any
worker fails the others are stopped and launch exits with that worker's code.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


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


def tf_config(ports: list[int], index: int) -> str:
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}})


def core_share(index: int, cpus_per_worker: int) -> set[int] | None:
  """The cores worker index is pinned to (None: no pinning)."""
  if not cpus_per_worker:
    return None
  cores = sorted(os.sched_getaffinity(0))
  return {cores[(index * cpus_per_worker + k) % len(cores)] for k in range(cpus_per_worker)}


def _stream(proc: subprocess.Popen, prefix: str) -> None:
  for line in iter(proc.stdout.readline, b""):
    sys.stdout.write(f"{prefix} {line.decode(errors='replace')}")
    sys.stdout.flush()


def _start(index: int, ports: list[int], args: list[str], cpus_per_worker: int):
  env = dict(os.environ, TF_CONFIG=tf_config(ports, index))
  env.pop("REPLIBENCH_CPU_DEVICES", None)   # One CPU replica per worker process.
  cores = core_share(index, cpus_per_worker)
  proc = subprocess.Popen(
      [sys.executable, "-m", "replibench.cli", *args], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, start_new_session=True,
      preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
  threading.Thread(target=_stream, args=(proc, f"[worker {index}]"), daemon=True).start()
  return proc


def _stop(procs) -> None:
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, sig)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
      time.sleep(0.1)


def launch(workers: int, args: list[str], cpus_per_worker: int = 0,
           timeout_s: float | None = None) -> int:
  """Runs `replibench <args>` in workers processes; returns the exit code."""
  ports = free_ports(workers)
  procs = [_start(i, ports, args, cpus_per_worker) for i in range(workers)]
  start = time.monotonic()
  try:
    while True:
      codes = [p.poll() for p in procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        i, code = failed[0]
        print(f"[launch] worker {i} exited with code {code}; stopping the others.",
              file=sys.stderr)
        return code
      if all(c == 0 for c in codes):
        return 0
      if timeout_s and time.monotonic() - start > timeout_s:
        print(f"[launch] timed out after {timeout_s:.0f} s; stopping the workers.",
              file=sys.stderr)
        return 124
      time.sleep(0.2)
  finally:
    _stop(procs)
    for p in procs:
      p.wait()
