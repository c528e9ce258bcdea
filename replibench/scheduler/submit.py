"""`replibench launch --backend=slurm`: one run as a SLURM job, followed to its end.

The same config and flags as a local `launch --workers W [--ps P] -- run ...`: the job
has W tasks (or a chief, W workers and P ps), each derives its TF_CONFIG from the
step (cluster.from_slurm), and the run directory and result.json are what a local
launch leaves, with result.json's `scheduler` naming the job and its nodes. The
config is compiled here before anything is submitted: a bad binding, a topology the
allocation cannot hold, or a partition SLURM does not have is exit 2 with nothing
submitted or written.
"""

import json
import os
import shlex
import shutil
import sys

from replibench import errors, processes
from replibench.errors import UserError
from replibench.scheduler import slurm


def _log(message: str) -> None:
  print(f"[slurm] {message}", file=sys.stderr, flush=True)


def run_arguments(args: list[str]) -> tuple[list[str], list[str], str]:
  """(gin files, bindings, workdir) of `run ...` arguments; UserError for another command."""
  if not args or args[0] != "run":
    raise UserError(f"launch --backend=slurm runs `run ...` on its tasks (got "
                    f"{shlex.join(args[:1]) or 'nothing'} after '--'), e.g. `replibench "
                    f"launch --backend=slurm --workers 2 -- run --gin_file=F --workdir=D`.")
  values = {"gin_file": [], "gin_bindings": [], "workdir": []}
  rest = iter(args[1:])
  for arg in rest:
    name, _, value = arg.lstrip("-").partition("=")
    if arg.startswith("--") and name in values:
      values[name].append(value if "=" in arg else next(rest, ""))
  if not values["workdir"] or not values["workdir"][-1]:
    raise UserError("launch --backend=slurm: give the run a --workdir (on storage every "
                    "node sees): its result.json, checkpoints and the job's files go there.")
  return values["gin_file"], values["gin_bindings"], values["workdir"][-1]


def check_config(gin_files, bindings, shape: slurm.Shape) -> None:
  """The config compiled and its models built as `run` will (no training), and its
  topology's worker and ps counts, where it fixes them, equal to the job's."""
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  if not gin_files:
    raise UserError("launch --backend=slurm: the run needs --gin_file (after '--').")
  experiment = load_experiment(list(gin_files), list(bindings))
  experiment.check_models()
  topology = experiment.topology
  for field, have in (("workers", shape.workers), ("ps", shape.ps)):
    want = getattr(topology, field, 0) or 0
    if want and want != have:
      raise UserError(
          f"topology.{type(topology).__name__}.{field} = {want} but the job has {have} "
          f"{field} task(s) (--{field}={have}): the allocation does not fit the topology; "
          f"give --{field}={want}.")


def launch_on_slurm(shape: slurm.Shape, allocation: slurm.Allocation, args: list[str],
                    dry_run: bool, made_by: str) -> int:
  """Submits the run, follows it, and returns the chief's exit code (the script alone,
  on stdout, with dry_run)."""
  slurm.check_allocation(allocation, shape)
  gin_files, bindings, workdir = run_arguments(args)
  if not dry_run:
    slurm.check_scheduler(allocation)
  check_config(gin_files, bindings, shape)
  run = slurm.Run(tuple(args[1:]), os.path.abspath(workdir))
  name = "rb-" + os.path.basename(os.path.abspath(workdir))[:40]
  script = slurm.batch_script(allocation, shape, [run], name, made_by, run.slurm_dir)
  if dry_run:
    print(script, end="")
    return errors.EXIT_OK
  created = _first_missing(run.slurm_dir)
  path = os.path.join(run.slurm_dir, slurm.SCRIPT)
  try:
    slurm.write_script(path, script)
    job_id = slurm.submit(path)
  except UserError:
    if created:
      shutil.rmtree(created, ignore_errors=True)
    raise
  _log(f"submitted job {job_id}: {shape.describe()}; script {path}; output "
       f"{slurm.output_path(run.slurm_dir, job_id)}")
  return _follow(job_id, run)


def _first_missing(path: str) -> str | None:
  """The top-most directory of path that does not exist yet (what to remove on failure)."""
  path, missing = os.path.abspath(path), None
  while not os.path.exists(path):
    path, missing = os.path.dirname(path), path
  return missing


def _follow(job_id: str, run: slurm.Run) -> int:
  try:
    with processes.forwarding_signals(lambda: [], processes.raise_terminated):
      code = slurm.follow(job_id, [run], run.slurm_dir, _log)[0]
  except processes.Terminated as e:
    _log(f"signal {e.signum}: cancelling job {job_id}.")
    slurm.cancel(job_id)
    return processes.exit_code(e.signum)
  _summarise(run, job_id, code)
  return code


def _summarise(run: slurm.Run, job_id: str, code: int) -> None:
  """The run's result, as `replibench run` prints it, after the job's last line."""
  path = os.path.join(run.workdir, "result.json")
  if not os.path.exists(path):
    _log(f"job {job_id} ended (chief's exit code {code}) without a result.json in "
         f"{run.workdir}; see {slurm.output_path(run.slurm_dir, job_id)}.")
    return
  with open(path) as f:
    result = json.load(f)
  keys = ("status", "target_metric", "target", "time_to_target_s", "steps_to_target",
          "final_metric", "final_step", "examples_per_s", "init_s", "scheduler")
  print(json.dumps({k: result.get(k) for k in keys}))
  _log(f"job {job_id} ended: chief's exit code {code}; result {path}")

