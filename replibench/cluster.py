"""Cluster facts: TF_CONFIG, the one place that reads or writes it.

A multi-process run learns its cluster from the TF_CONFIG environment
variable, as Kubeflow and other launchers set it (`replibench launch` on one
machine):

  {"cluster": {"chief": [...], "worker": ["host:port", ...], "ps": [...]},
   "task": {"type": "worker", "index": 0}}

Where TF_CONFIG is unset, adopt() derives it from a scheduler's own variables
and sets it, so TensorFlow's resolvers read the same cluster (TF_CONFIG, when
set, always wins):
- a SLURM step (`srun`): its nodes, tasks per node, distribution, rank and job
  id (see from_slurm for the rule that splits ranks into chief, workers and ps);
- a Kubernetes Indexed Job: JOB_COMPLETION_INDEX and the task list that
  `replibench export --format=job` writes into REPLIBENCH_K8S_TASKS.

Topologies, the replicators, the launcher and workloads ask this module, not
the environment or a strategy's resolver: which task this process is, which
process is the chief, how many workers train and which one this is.
"""

import dataclasses
import json
import os

from replibench import hostlist
from replibench.errors import UserError

ENV = "TF_CONFIG"
JOBS = ("chief", "worker", "ps")
# What `replibench launch --backend=slurm` tells every task of its step: the ps tasks
# (0: a synchronous cluster) and the tasks the topology asks for, which the step must
# have.
SLURM_PS_ENV = "REPLIBENCH_SLURM_PS"
SLURM_TASKS_ENV = "REPLIBENCH_SLURM_TASKS"
K8S_TASKS_ENV = "REPLIBENCH_K8S_TASKS"
# Each job's ports: 32 a node from a base that its job id picks among 1,250 (15000-54999),
# so two jobs sharing a node listen apart unless their ids are 1,250 apart and overlap.
PORT_BASE, PORT_SLOTS, PORTS_PER_JOB = 15000, 1250, 32


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
        "as Kubeflow and other launchers set it, or an `srun` step of several tasks "
        "(replibench derives it there; a SLURM batch script itself is not one); for a "
        "local try use `replibench launch --workers N [--ps P] -- run ...`, on SLURM "
        "`replibench launch --backend=slurm ...`.")
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


def adopt(environ=os.environ) -> "Cluster | None":
  """Sets TF_CONFIG from a SLURM step's or a Kubernetes Indexed Job's variables where it
  is unset; returns the derived cluster (None: TF_CONFIG was set, or no scheduler
  started this process as one task of several). UserError where the variables
  contradict each other or the topology's task count."""
  if environ.get(ENV):
    return None
  derived = from_slurm(environ) or from_indexed_job(environ)
  if derived is not None:
    environ[ENV] = derived.to_env()
  return derived


def from_slurm(env) -> "Cluster | None":
  """This task's cluster inside an `srun` step of several tasks (None outside one).

  Ranks follow SLURM's own placement (SLURM_DISTRIBUTION block, cyclic or plane over
  SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE). The rule for the jobs: with
  REPLIBENCH_SLURM_PS = P > 0, rank 0 is the chief, the last P ranks are ps and the
  ranks between are workers; otherwise every rank r is worker r. Each task listens
  on its node at PORT_BASE + a slot picked by SLURM_JOB_ID + its rank on the node.
  """
  if "SLURM_STEP_NODELIST" not in env or "SLURM_PROCID" not in env:
    return None
  nodes = hostlist.expand_hosts(env["SLURM_STEP_NODELIST"])
  counts = hostlist.expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE", "1"))
  if len(counts) != len(nodes):
    raise UserError(f"SLURM_STEP_TASKS_PER_NODE={env.get('SLURM_STEP_TASKS_PER_NODE')!r} "
                    f"gives {len(counts)} node count(s) for the {len(nodes)} node(s) of "
                    f"SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']!r}.")
  placed = placement(nodes, counts, env.get("SLURM_DISTRIBUTION", "block"),
                     int(env.get("SLURM_DIST_PLANESIZE", "1") or 1))
  asked = env.get(SLURM_TASKS_ENV)
  if len(placed) < 2 and not asked:
    return None   # One task: a single-process run, no cluster.
  rank = int(env["SLURM_PROCID"])
  _check_rank(env, placed, rank)
  ps = int(env.get(SLURM_PS_ENV, "0") or 0)
  _check_task_count(len(placed), ps, asked, env)
  addresses = [f"{node}:{_slurm_port(env, local)}" for node, local in placed]
  jobs, task = _split_ranks(addresses, ps, rank)
  return Cluster(jobs, *task)


def placement(nodes: list[str], counts: list[int], distribution: str,
              plane: int = 1) -> list[tuple[str, int]]:
  """(node, rank on that node) for each global rank, as SLURM places tasks.

  distribution: SLURM_DISTRIBUTION; its first field (before ':') is the placement over
  nodes: block fills each node in turn, cyclic deals one task a node round-robin,
  plane deals `plane` tasks a node round-robin; a node takes no more than its count.
  """
  kind = distribution.split(":")[0].split(",")[0] or "block"
  if kind not in ("block", "cyclic", "plane"):
    raise UserError(f"SLURM_DISTRIBUTION={distribution!r}: replibench derives the ranks' "
                    f"addresses for block, cyclic and plane placement only; run srun with "
                    f"--distribution=block or cyclic, or set TF_CONFIG yourself.")
  left, local, out = list(counts), [0] * len(nodes), []
  chunk = {"block": max(counts, default=1), "cyclic": 1, "plane": max(plane, 1)}[kind]
  while any(left):
    for i, node in enumerate(nodes):
      for _ in range(min(chunk, left[i])):
        out.append((node, local[i]))
        local[i] += 1
        left[i] -= 1
  return out


def _slurm_port(env, local_rank: int) -> int:
  if local_rank >= PORTS_PER_JOB:
    raise UserError(f"SLURM placed {local_rank + 1} tasks on one node; replibench gives a "
                    f"job {PORTS_PER_JOB} ports a node. Use fewer tasks per node.")
  job = int(env.get("SLURM_JOB_ID", "0") or 0)
  return PORT_BASE + (job % PORT_SLOTS) * PORTS_PER_JOB + local_rank


def _check_rank(env, placed, rank: int) -> None:
  """This task's own node and local rank must be where the placement puts its rank."""
  if not 0 <= rank < len(placed):
    raise UserError(f"SLURM_PROCID={rank} is outside the step's {len(placed)} task(s) "
                    f"(SLURM_STEP_TASKS_PER_NODE={env.get('SLURM_STEP_TASKS_PER_NODE')!r}).")
  node, local = placed[rank]
  here = env.get("SLURMD_NODENAME", node)
  local_id = int(env.get("SLURM_LOCALID", local))
  if (here, local_id) != (node, local):
    raise UserError(
        f"SLURM runs rank {rank} on {here} as local task {local_id}, but its placement "
        f"(SLURM_DISTRIBUTION={env.get('SLURM_DISTRIBUTION', 'block')!r}) puts it on {node} "
        f"as local task {local}: the other tasks would dial the wrong address. Set "
        f"TF_CONFIG yourself, or run srun with --distribution=block.")


def _check_task_count(found: int, ps: int, asked: str | None, env) -> None:
  """The step's tasks against what the topology asks (REPLIBENCH_SLURM_TASKS, where the
  submitter set it; a parameter-server cluster needs a chief, a worker and its ps)."""
  needed = int(asked) if asked else max(found, ps + 2 if ps else 2)
  if found == needed and (not ps or found >= ps + 2):
    return
  what = (f"1 chief, {needed - ps - 1} worker(s) and {ps} ps" if ps
          else f"{needed} worker(s)")
  raise UserError(
      f"The topology asks for {needed} task(s) ({what}) but this SLURM step has {found} "
      f"(SLURM_STEP_TASKS_PER_NODE={env.get('SLURM_STEP_TASKS_PER_NODE')!r} on "
      f"SLURM_STEP_NODELIST={env.get('SLURM_STEP_NODELIST')!r}); allocate {needed} "
      f"task(s) (sbatch --ntasks, or --nodes x --ntasks-per-node) or change the topology.")


def _split_ranks(addresses: list[str], ps: int, rank: int):
  """The jobs of a cluster of len(addresses) ranks and rank's (job, index) in it."""
  if not ps:
    return {"worker": addresses}, ("worker", rank)
  workers = len(addresses) - ps - 1
  jobs = {"chief": addresses[:1], "worker": addresses[1:1 + workers],
          "ps": addresses[1 + workers:]}
  if rank == 0:
    return jobs, ("chief", 0)
  return jobs, (("worker", rank - 1) if rank <= workers else ("ps", rank - 1 - workers))


def from_indexed_job(env) -> "Cluster | None":
  """This pod's cluster in a Kubernetes Indexed Job made by `replibench export
  --format=job`: REPLIBENCH_K8S_TASKS lists the jobs' addresses (chief, workers, ps)
  and JOB_COMPLETION_INDEX k is the k-th task in that order."""
  raw, index = env.get(K8S_TASKS_ENV), env.get("JOB_COMPLETION_INDEX")
  if not raw or index is None:
    return None
  try:
    jobs = {job: list(a) for job, a in json.loads(raw).items() if a}
    order = [(job, i) for job in JOBS for i in range(len(jobs.get(job, [])))]
    task = order[int(index)]
  except (ValueError, TypeError, AttributeError, IndexError) as e:
    raise UserError(f"{K8S_TASKS_ENV}={raw!r} with JOB_COMPLETION_INDEX={index!r} does "
                    f"not name this pod's task ({type(e).__name__}: {e}); re-export the "
                    f"manifest with `replibench export --format=job`.") from None
  return Cluster(jobs, *task)


def scheduler_record(env=os.environ) -> dict | None:
  """Where a scheduler ran this task (result.json's `scheduler`): SLURM's job id, node
  list, placement and GPUs a task, or the Kubernetes pod; None outside both."""
  if env.get("SLURM_JOB_ID"):
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    gpus = env.get("CUDA_VISIBLE_DEVICES", "") if (
        env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")) else ""
    try:
      hosts = hostlist.expand_hosts(nodes) if nodes else []
    except UserError:   # Recorded as SLURM wrote it: a result is no place to fail.
      hosts = [nodes]
    return {"name": "slurm", "job_id": env["SLURM_JOB_ID"],
            "array_task_id": env.get("SLURM_ARRAY_TASK_ID"),
            "nodes": hosts,
            "tasks_per_node": env.get("SLURM_STEP_TASKS_PER_NODE"),
            "distribution": env.get("SLURM_DISTRIBUTION"),
            "gpus_per_task": len([g for g in gpus.split(",") if g])}
  if env.get("JOB_COMPLETION_INDEX") is not None and env.get(K8S_TASKS_ENV):
    return {"name": "kubernetes", "pod": env.get("HOSTNAME"),
            "index": int(env["JOB_COMPLETION_INDEX"])}
  return None
