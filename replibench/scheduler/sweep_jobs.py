"""`replibench sweep --executor=slurm`: a sweep's pending trials as SLURM jobs.

Trials of one shape (workers, ps, CPUs a task) go into one job array, one array
task a trial; every array is submitted before any is followed, so SLURM runs them
side by side where the cluster has room (each trial on nodes of its own with
--exclusive). The sweep itself is unchanged (suite/sweep.py): finished trials are
skipped, a failed trial is named and makes the sweep exit 1, each trial's
trial.log gets its chief's output, and the report reads the same result.json files.
"""

import dataclasses
import os
import shlex
import sys
from typing import Iterator

from replibench import processes
from replibench.errors import UserError
from replibench.scheduler import slurm
from replibench.suite.sweep import LOG_FILE, run_arguments
from replibench.suite.sweep_file import Trial


def _log(message: str) -> None:
  print(f"[slurm] {message}", flush=True)


def trial_shape(trial: Trial) -> slurm.Shape:
  return slurm.Shape(trial.launch.workers, trial.launch.ps)


def _check_local_only(trials) -> None:
  linked = [t.name for t in trials if t.launch.network != "none"]
  if linked:
    raise UserError(
        f"sweep --executor=slurm: trial(s) {', '.join(linked)} set `network` (an emulated "
        f"link of the local launch's private namespace); on SLURM the cluster's own "
        f"network carries the traffic. Drop the key or run those points locally.")


class SlurmExecutor:
  """Runs a sweep's trials as SLURM job arrays (sweep.Executor)."""

  def __init__(self, allocation: slurm.Allocation, workdir: str, made_by: str):
    self.allocation, self.made_by = allocation, made_by
    self.output_dir = os.path.join(os.path.abspath(workdir), slurm.SLURM_DIR)

  def check(self, trials) -> None:
    """Before anything runs: SLURM reachable, every trial's shape held by the allocation."""
    _check_local_only(trials)
    slurm.check_scheduler(self.allocation)
    for trial in trials:
      try:
        slurm.check_allocation(self._allocation(trial), trial_shape(trial))
      except UserError as e:
        raise UserError(f"sweep trial {trial.name}: {e}") from None

  def _allocation(self, trial: Trial) -> slurm.Allocation:
    cpus = trial.launch.cpus_per_worker or self.allocation.cpus_per_task
    return dataclasses.replace(self.allocation, cpus_per_task=cpus)

  def _groups(self, pending) -> dict:
    groups = {}
    for k, (trial, _) in enumerate(pending):
      key = (trial_shape(trial), self._allocation(trial))
      groups.setdefault(key, []).append(k)
    return groups

  def __call__(self, pending) -> Iterator[tuple[int, int]]:
    jobs = []
    for n, ((shape, allocation), members) in enumerate(self._groups(pending).items()):
      runs = [slurm.Run(tuple(run_arguments(pending[k][0], pending[k][1])[1:]),
                        os.path.abspath(pending[k][1]),
                        os.path.join(os.path.abspath(pending[k][1]), LOG_FILE))
              for k in members]
      script = slurm.batch_script(allocation, shape, runs, f"rb-sweep-{n}", self.made_by,
                                  self.output_dir)
      path = os.path.join(self.output_dir, f"group-{n}.sbatch")
      slurm.write_script(path, script)
      job_id = slurm.submit(path)
      _log(f"submitted job {job_id}: {len(runs)} trial(s) of {shape.describe()} "
           f"({', '.join(pending[k][0].name for k in members)}); script {path}")
      jobs.append((job_id, runs, members))
    try:
      with processes.forwarding_signals(lambda: [], processes.raise_terminated):
        for job_id, runs, members in jobs:
          codes = slurm.follow(job_id, runs, self.output_dir, _log)
          for position, k in enumerate(members):
            yield k, codes[position]
    except processes.Terminated:
      for job_id, _, _ in jobs:
        slurm.cancel(job_id)
      raise


def made_by() -> str:
  return shlex.join(["replibench", *sys.argv[1:]])
