"""SLURM jobs for replibench runs: the sbatch script, its submission, its following.

One job runs one `replibench run` on all its tasks (`srun`; each task derives its
TF_CONFIG from the step: replibench/cluster.py), or, as a job array, one run per
array task (a sweep's trials of one shape). What a job leaves beside each run, under
RUN_DIR/slurm/: the script (job.sbatch), SLURM's output (%j.out, every task's lines
labelled with its rank by `srun --label`) and the chief's exit code
(chief-exit-<job id>, written by slurm_task.py).

Submission and state go through SLURM's own commands, asked for one machine-readable
field: `sbatch --parsable`, `squeue --noheader --format=%T`, `scontrol show job
--oneliner` for a finished job's exit code where no chief wrote one, `scancel`.
"""

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Callable, Sequence

from replibench import atomic, cluster
from replibench.errors import UserError

SLURM_DIR = "slurm"
SCRIPT = "job.sbatch"
POLL_S = 2.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
_PROGRESS = re.compile(r"^0: .*?(step \d+/\d+ \|.*)$")


@dataclasses.dataclass(frozen=True)
class Allocation:
  """What each job asks SLURM for, beside its tasks (sbatch's options of the same names).

  nodes and tasks_per_node: None lets SLURM place the tasks (sbatch --ntasks only).
  gpus_per_task 0: a CPU job (no --gpus-per-task). container_image: pyxis/enroot's
  srun --container-image, as NVIDIA's and MLPerf's scripts use (the image's python).
  exclusive: whole nodes, so no other job's load enters the timings. overcommit: more
  tasks than CPUs (sbatch --overcommit), e.g. a parameter-server cluster's light ps
  tasks beside its workers on a small node.
  """
  nodes: int | None = None
  tasks_per_node: int | None = None
  cpus_per_task: int = 1
  gpus_per_task: int = 0
  time: str = "01:00:00"
  partition: str | None = None
  account: str | None = None
  container_image: str | None = None
  container_mounts: str | None = None
  exclusive: bool = True
  overcommit: bool = False
  python: str = sys.executable


@dataclasses.dataclass(frozen=True)
class Shape:
  """A job's tasks: W workers, or a chief + W workers + P ps (cluster.from_slurm's rule);
  workers 0: one process that is no cluster (a sweep's single-process trial)."""
  workers: int = 1
  ps: int = 0

  @property
  def tasks(self) -> int:
    return max(self.workers, 1) + (1 + self.ps if self.ps else 0)

  def describe(self) -> str:
    if not self.workers:
      return "1 process"
    return (f"1 chief, {self.workers} worker(s) and {self.ps} ps" if self.ps
            else f"{self.workers} worker(s)")


@dataclasses.dataclass(frozen=True)
class Run:
  """One `replibench run` of a job: its arguments after `run`, its run directory, and
  where its chief's output is appended too (a sweep's trial.log; None: only SLURM's)."""
  args: tuple
  workdir: str
  log: str | None = None

  @property
  def slurm_dir(self) -> str:
    return os.path.join(self.workdir, SLURM_DIR)

  def exit_file(self, job_id: str) -> str:
    return os.path.join(self.slurm_dir, f"chief-exit-{job_id}")


def check_allocation(allocation: Allocation, shape: Shape) -> None:
  """UserError naming the flag where the allocation cannot hold the shape's tasks."""
  for name in ("nodes", "tasks_per_node"):
    value = getattr(allocation, name)
    if value is not None and value < 1:
      raise UserError(f"--{name}={value}: give at least 1 (or leave it out for SLURM's "
                      f"choice).")
  if allocation.cpus_per_task < 1 or allocation.gpus_per_task < 0:
    raise UserError(f"--cpus_per_task={allocation.cpus_per_task} / --gpus_per_task="
                    f"{allocation.gpus_per_task}: give >= 1 CPU and >= 0 GPUs a task.")
  if not _TIME.match(allocation.time):
    raise UserError(f"--time={allocation.time!r}: give SLURM's time format, e.g. 30, "
                    f"01:00:00 or 1-12:00:00.")
  if allocation.nodes and allocation.tasks_per_node:
    room = allocation.nodes * allocation.tasks_per_node
    if room != shape.tasks:
      raise UserError(
          f"--nodes={allocation.nodes} x --tasks_per_node={allocation.tasks_per_node} gives "
          f"{room} task(s), but the topology asks for {shape.tasks} ({shape.describe()}); "
          f"make them equal, or give one of the two and let SLURM place the tasks.")
  if allocation.nodes and allocation.nodes > shape.tasks:
    raise UserError(f"--nodes={allocation.nodes} for {shape.tasks} task(s) "
                    f"({shape.describe()}): some nodes would hold none.")


def check_scheduler(allocation: Allocation) -> None:
  """UserError where this machine cannot submit: no sbatch, or an unknown partition."""
  missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if not shutil.which(c)]
  if missing:
    raise UserError(f"--backend=slurm needs SLURM's client commands on PATH, and "
                    f"{', '.join(missing)} is not (PATH={os.environ.get('PATH', '')}). Run "
                    f"it on a login node of the cluster, or use the local backend.")
  if allocation.partition:
    known = _output(["sinfo", "--noheader", "--format=%R"]).split()
    if allocation.partition not in known:
      raise UserError(f"--partition={allocation.partition}: SLURM has no such partition "
                      f"(sinfo lists {', '.join(sorted(set(known))) or 'none'}).")


def _output(command: list[str]) -> str:
  try:
    return subprocess.run(command, capture_output=True, text=True, check=True,
                          timeout=60).stdout
  except subprocess.CalledProcessError as e:
    raise UserError(f"`{shlex.join(command)}` failed (exit {e.returncode}): "
                    f"{' '.join(e.stderr.split())[:500]}") from None
  except subprocess.TimeoutExpired:
    raise UserError(f"`{shlex.join(command)}` did not answer within 60 s: is the SLURM "
                    f"controller up?") from None


def _directives(allocation: Allocation, shape: Shape, name: str, output: str,
                array: int) -> list[str]:
  options = [f"--job-name={name}", f"--ntasks={shape.tasks}",
             f"--cpus-per-task={allocation.cpus_per_task}", f"--time={allocation.time}",
             f"--output={output}", "--open-mode=append"]
  options += [f"--nodes={allocation.nodes}"] if allocation.nodes else []
  options += ([f"--ntasks-per-node={allocation.tasks_per_node}"]
              if allocation.tasks_per_node else [])
  options += ([f"--gpus-per-task={allocation.gpus_per_task}"]
              if allocation.gpus_per_task else [])
  options += [f"--{k}={getattr(allocation, k)}" for k in ("partition", "account")
              if getattr(allocation, k)]
  options += ["--exclusive"] if allocation.exclusive else []
  options += ["--overcommit"] if allocation.overcommit else []
  options += [f"--array=0-{array - 1}"] if array > 1 else []
  return [f"#SBATCH {o}" for o in options]


def _srun(allocation: Allocation, shape: Shape) -> list[str]:
  # Synchronous workers fail together (one lost worker stalls the ring); the servers of
  # a parameter-server cluster end when the chief does (slurm_task.py).
  srun = ["srun", "--label", f"--kill-on-bad-exit={0 if shape.ps else 1}"]
  if allocation.container_image:
    srun += [f"--container-image={allocation.container_image}",
             "--container-workdir=" + os.getcwd()]
    if allocation.container_mounts:
      srun += [f"--container-mounts={allocation.container_mounts}"]
  python = "python" if allocation.container_image else allocation.python
  return srun + [python, "-m", "replibench.scheduler.slurm_task"]


def _task_line(srun: list[str], run: Run) -> str:
  exit_file = os.path.join(run.slurm_dir, "chief-exit-${JOB_KEY}")
  log = [f"--log={shlex.quote(run.log)}"] if run.log else []
  return " ".join([*map(shlex.quote, srun), f'--exit_file="{exit_file}"', *log, "--",
                   "run", *map(shlex.quote, run.args)])


def batch_script(allocation: Allocation, shape: Shape, runs: Sequence[Run], name: str,
                 made_by: str, output_dir: str) -> str:
  """The sbatch script of one run, or of a job array whose task k runs runs[k]; SLURM
  writes its output into output_dir (output_path)."""
  output = os.path.join(output_dir, "%j.out" if len(runs) == 1 else "%A_%a.out")
  srun = _srun(allocation, shape)
  lines = ["#!/bin/bash", f"# replibench: {len(runs)} run(s) of {shape.describe()} each.",
           f"# Made by: {made_by}",
           *_directives(allocation, shape, name, output, len(runs)),
           "set -u", f"cd {shlex.quote(os.getcwd())}",
           *([f"export {cluster.SLURM_PS_ENV}={shape.ps} "
              f"{cluster.SLURM_TASKS_ENV}={shape.tasks}"] if shape.workers else []),
           # The chief's exit file is named by the id sbatch printed (an array's own).
           'JOB_KEY="${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"']
  if len(runs) == 1:
    return "\n".join(lines + [_task_line(srun, runs[0]), ""])
  lines.append('case "$SLURM_ARRAY_TASK_ID" in')
  for k, run in enumerate(runs):
    lines.append(f"  {k}) {_task_line(srun, run)} ;;")
  return "\n".join(lines + ["esac", ""])


def write_script(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  atomic.write_text(path, text)
  os.chmod(path, 0o755)


def submit(script_path: str) -> str:
  """sbatch's job id for the script (UserError with sbatch's words if it refuses)."""
  out = _output(["sbatch", "--parsable", script_path]).strip()
  return out.split(";")[0]


def states(job_id: str) -> list[str]:
  """The job's (or array's tasks') states while SLURM lists them; [] once it does not."""
  try:
    out = subprocess.run(["squeue", "--noheader", "--array", f"--jobs={job_id}",
                          "--format=%T"], capture_output=True, text=True, timeout=60).stdout
  except subprocess.TimeoutExpired:
    return ["UNKNOWN"]
  return out.split()


def job_exit_code(job_id: str) -> int | None:
  """A finished job's exit code from `scontrol show job` (None once SLURM forgot it)."""
  try:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id],
                         capture_output=True, text=True, timeout=60).stdout
  except (subprocess.TimeoutExpired, OSError):
    return None
  codes = [int(code) + (128 + int(sig) if int(sig) else 0)
           for code, sig in re.findall(r"\bExitCode=(\d+):(\d+)", out)]
  return max(codes) if codes else None


def cancel(job_id: str) -> None:
  subprocess.run(["scancel", job_id], capture_output=True, timeout=60, check=False)


def chief_exit_code(run: Run, job_id: str) -> int | None:
  """The code rank 0 wrote ('rank 0: N'), None if it wrote none (it never ran, or died
  with its task)."""
  try:
    with open(run.exit_file(job_id)) as f:
      return int(f.read().split(":")[1])
  except (OSError, IndexError, ValueError):
    return None


def follow(job_id: str, runs: Sequence[Run], output_dir: str, log: Callable[[str], None],
           poll_s: float = POLL_S) -> dict[int, int]:
  """Waits for the job to leave the queue, logging its state and the chief's progress
  lines as they change; returns each run's exit code (the chief's, else the job's)."""
  seen, outputs = None, {}
  while True:
    now = states(job_id)
    summary = ", ".join(f"{s} x{now.count(s)}" if len(runs) > 1 else s
                        for s in sorted(set(now)))
    progress = _latest_progress(output_dir, job_id, outputs)
    line = f"job {job_id}: {summary or 'ended'}" + (f" | {progress}" if progress else "")
    if line != seen:
      log(line)
      seen = line
    if not now or set(now) <= TERMINAL:
      break
    time.sleep(poll_s)
  fallback = job_exit_code(job_id)
  codes = {}
  for k, run in enumerate(runs):
    code = chief_exit_code(run, job_id)
    codes[k] = code if code is not None else (fallback if fallback else 1)
  return codes


def _latest_progress(output_dir: str, job_id: str, seen: dict) -> str | None:
  """The newest `step N/M | ...` line that a rank 0 printed in the job's output files
  (read on from where the last call stopped: seen holds each file's offset and line)."""
  if not os.path.isdir(output_dir):
    return None
  latest = None
  for name in sorted(os.listdir(output_dir)):
    if name != f"{job_id}.out" and not (name.startswith(f"{job_id}_") and
                                         name.endswith(".out")):
      continue
    path = os.path.join(output_dir, name)
    offset, line = seen.get(path, (0, None))
    with open(path, "rb") as f:
      f.seek(offset)
      text = f.read().decode(errors="replace")
      offset = f.tell()
    for row in text.splitlines():
      match = _PROGRESS.match(row)
      line = match.group(1) if match else line
    seen[path] = (offset, line)
    latest = line or latest
  return latest


def output_path(output_dir: str, job_id: str, k: int | None = None) -> str:
  """Where SLURM writes a job's output (k: an array task's), as batch_script asks."""
  return os.path.join(output_dir, f"{job_id}.out" if k is None else f"{job_id}_{k}.out")
