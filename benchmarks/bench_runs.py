"""What the benchmarks share: one trial's `replibench run` and the result.json it writes."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks import REPO


def command(gin_file: str, kind: str, n: int, bindings: list[str], max_steps: int,
            workdir: str, cpus_per_worker: int = 1) -> list[str]:
  """`python -m replibench.cli run` of gin_file on n logical replicas in one process
  (kind 'replicas': configs/topology/localN.gin) or on n worker processes of `launch`,
  each pinned to cpus_per_worker cores (kind 'workers'), with bindings, for max_steps."""
  if kind == "replicas":
    topology = f"configs/topology/local{n}.gin"
  else:
    topology = "configs/topology/workers.gin"
    bindings = [*bindings, f"topology.MultiWorker.workers = {n}"]
  run = ["run", f"--gin_file={gin_file}", f"--gin_file={topology}",
         *(f"--gin_bindings={b}" for b in bindings), f"--max_steps={max_steps}",
         f"--workdir={workdir}"]
  base = [sys.executable, "-m", "replibench.cli"]
  if kind == "replicas":
    return [*base, *run]
  return [*base, "launch", f"--workers={n}", f"--cpus_per_worker={cpus_per_worker}", "--",
          *run]


def result(workdir: str, returncode: int, output: str, label: str) -> dict:
  """The run's result.json; RuntimeError with the end of its output if it failed."""
  path = os.path.join(workdir, "result.json")
  if returncode or not os.path.exists(path):
    raise RuntimeError(f"{label} failed ({returncode}):\n{output[-6000:]}")
  with open(path) as f:
    return json.load(f)


def run(cmd: list[str], label: str, env: dict | None = None,
        keep: str | None = None) -> tuple[dict, str]:
  """Runs cmd (whose --workdir is WORKDIR) in a fresh directory: (result.json, output).
  keep: a directory to copy the run's TensorBoard files to (its profile, events and
  result.json; not its checkpoints)."""
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [a.replace("WORKDIR", workdir) for a in cmd]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    output = proc.stdout + proc.stderr
    if keep:
      shutil.copytree(workdir, keep, dirs_exist_ok=True,
                      ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    return result(workdir, proc.returncode, output, label), output
