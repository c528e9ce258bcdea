"""Cluster facts: TF_CONFIG, the one place that reads or writes it.

A multi-process run learns its cluster from the TF_CONFIG environment
variable, as Kubeflow and other launchers set it (`replibench launch` on one
machine):

  {"cluster": {"chief": [...], "worker": ["host:port", ...], "ps": [...]},
   "task": {"type": "worker", "index": 0}}

Topologies, the replicators, the launcher and workloads ask this module, not
the environment or a strategy's resolver: which task this process is, which
process is the chief, how many workers train and which one this is.
"""

import dataclasses
import json
import os

from replibench.errors import UserError

ENV = "TF_CONFIG"
JOBS = ("chief", "worker", "ps")


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A parsed, validated TF_CONFIG: the jobs' addresses and this process's task."""

  jobs: dict          # {'chief'|'worker'|'ps': ['host:port', ...]}
  task_type: str
  task_index: int

  @property
  def address(self) -> str:
    """This task's 'host:port' in the cluster."""
    return self.jobs[self.task_type][self.task_index]

  def count(self, job: str) -> int:
    return len(self.jobs.get(job, []))

  @property
  def is_chief(self) -> bool:
    """The process that writes results: the chief task, or worker 0 without one."""
    if self.count("chief"):
      return self.task_type == "chief"
    return self.task_type == "worker" and self.task_index == 0

  @property
  def training_processes(self) -> int:
    """Processes that run replicas of a synchronous step: workers and a chief."""
    return self.count("worker") + self.count("chief")

  @property
  def replica_processes(self) -> int:
    """Processes whose replicas split the global batch: the workers of a parameter-server
    cluster (its chief coordinates), every training process of a synchronous one."""
    return self.count("worker") if self.count("ps") else self.training_processes

  @property
  def worker_index(self) -> int:
    """This process's index among the training processes (the chief first)."""
    if self.task_type == "chief":
      return 0
    return self.task_index + self.count("chief")

  def training_tasks(self) -> list[tuple[str, int]]:
    """(job, index) of each training process, in worker_index order (the chief first)."""
    return ([("chief", 0)] if self.count("chief") else []) + [
        ("worker", i) for i in range(self.count("worker"))]

  def to_env(self) -> str:
    return to_env(self.jobs, self.task_type, self.task_index)


def to_env(jobs: dict, task_type: str, task_index: int) -> str:
  """The TF_CONFIG value for one task of a cluster."""
  return json.dumps({"cluster": jobs, "task": {"type": task_type, "index": task_index}})


def present() -> bool:
  return bool(os.environ.get(ENV))


def current() -> Cluster:
  """This process's cluster from TF_CONFIG; UserError (naming TF_CONFIG) if absent or bad."""
  raw = os.environ.get(ENV)
  if not raw:
    raise UserError(
        f"topology.MultiWorker needs the {ENV} environment variable (cluster and task), "
        "as Kubeflow and other launchers set it; for a local try use "
        "`replibench launch --workers N [--ps P] -- run ...`.")
  try:
    config = json.loads(raw)
    jobs = {job: list(addresses) for job, addresses in config["cluster"].items()}
    workers = jobs["worker"]
    task_type, index = config["task"]["type"], int(config["task"]["index"])
    if not isinstance(workers, list) or not all(isinstance(a, str) for a in workers):
      raise TypeError("cluster.worker must be a list of 'host:port' strings")
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise UserError(
        f"{ENV} is malformed ({type(e).__name__}: {e}); expected JSON like "
        '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}.'
    ) from None
  unknown = sorted(set(jobs) - set(JOBS))
  if unknown:
    raise UserError(f"{ENV} lists job(s) {unknown}; replibench knows {', '.join(JOBS)}.")
  if task_type not in JOBS or not 0 <= index < len(jobs.get(task_type, [])):
    raise UserError(
        f"{ENV} names this task {task_type!r} #{index}, which is not in its cluster "
        f"{jobs}; each process needs its own task entry.")
  return Cluster(jobs, task_type, index)
