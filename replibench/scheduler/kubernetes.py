"""`replibench export`: Kubernetes manifests that run a config's cluster.

Two shapes of the same cluster (the tasks `replibench launch --workers W --ps P` starts
on one machine, each running the same `replibench run`):

  tfjob  a Kubeflow TFJob (kubeflow.org/v1, training operator v1.9): the operator starts
         the pods and sets each one's TF_CONFIG. --ps 0: W Worker replicas, synchronous
         (MultiWorkerMirroredStrategy); --ps P: a Chief, W Workers and P PS replicas, the
         asynchronous parameter-server regime (regimes.AsyncPS).
  job    core Kubernetes only: a headless Service and an Indexed Job with one index per
         task (chief first, then the workers, then the ps). Each pod gets every task's
         DNS name in REPLIBENCH_K8S_TASKS and its own index in JOB_COMPLETION_INDEX
         (set by Kubernetes); replibench/cluster.py turns the two into TF_CONFIG.

A task that fails is restarted and its `run` resumes from the run's last checkpoint,
which must therefore outlive the pod: --volume_claim mounts a PersistentVolumeClaim
at the workdir (the manifest's header says what happens without one).

Everything written is validated first (k8s_validate.py): an invalid manifest is a bug
here, raised as such, and nothing is written.
"""

import dataclasses
import json
import os
import re
import shlex

import yaml

from replibench import atomic, inputs
from replibench.cluster import K8S_TASKS_ENV   # What cluster.py reads in each pod.
from replibench.errors import UserError
from replibench.scheduler import k8s_validate
from replibench.scheduler.k8s_validate import CONTAINER

FORMATS = ("tfjob", "job")
PORT, PORT_NAME = 2222, "tfjob-port"   # The operator's default port and its name.
BACKOFF_LIMIT = 3   # Restarts of a task, as `replibench launch` allows a worker.
MAX_TASKS = 1024    # Every pod carries all tasks' names (REPLIBENCH_K8S_TASKS).
LABEL_MAX = 63      # A DNS label: pod hostnames, Service names, label values.
ROLES = {"chief": "Chief", "worker": "Worker", "ps": "PS"}   # TF job -> TFJob replica type.
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class Request:
  """The export's flags, as the CLI parsed them (None: not given)."""

  format: str
  gin_files: tuple[str, ...]
  bindings: tuple[str, ...] = ()
  workdir: str | None = None
  image: str | None = None
  name: str | None = None
  namespace: str = "default"
  workers: int | None = None
  ps: int | None = None
  cpus_per_worker: int = 0
  volume_claim: str | None = None


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A checked request: what the manifests are made from."""

  request: Request
  name: str
  workers: int
  ps: int
  gpus_per_worker: int

  def counts(self) -> dict[str, int]:
    """Tasks per TF job, in index order (chief, worker, ps), jobs of none left out."""
    counts = {"chief": 1 if self.ps else 0, "worker": self.workers, "ps": self.ps}
    return {job: n for job, n in counts.items() if n}

  def tasks(self) -> list[tuple[str, int]]:
    """(job, index) of every task: the Indexed Job's index k is the k-th."""
    return [(job, i) for job, n in self.counts().items() for i in range(n)]


def export(request: Request, out: str | None = None) -> str:
  """The manifest's YAML, validated; written atomically to out if given."""
  cluster = resolve(request)
  docs = tfjob(cluster) if request.format == "tfjob" else job(cluster)
  text = header(cluster) + yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True,
                                              width=100)
  _validate(text)
  if out:
    atomic.write_text(out, text)
  return text


# --- the request, checked ----------------------------------------------------------------


def resolve(request: Request) -> Cluster:
  """The request checked against itself and the config (UserError naming the flag)."""
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  inputs.one_of("--format", request.format, FORMATS)
  if not request.gin_files:
    raise UserError("--gin_file is required (e.g. --gin_file=configs/resnet/"
                    "fashion_mnist.gin --gin_file=configs/topology/workers.gin).")
  if not request.image:
    raise UserError("--image is required: the container image the pods run, with "
                    "replibench installed and the gin files at the paths given.")
  if not request.workdir or not request.workdir.startswith("/"):
    raise UserError(f"--workdir={request.workdir or ''}: give an absolute path in "
                    f"the container (the run's volume is mounted there), e.g. "
                    f"--workdir=/runs/fmnist.")
  _check_label("--namespace", request.namespace, _DNS1123, LABEL_MAX)
  if request.volume_claim is not None:
    _check_label("--volume_claim", request.volume_claim, _DNS1123, 253)
  inputs.number("--cpus_per_worker", request.cpus_per_worker, 0, integer=True,
                meaning="each worker pod's cpu request; 0 requests none")
  experiment = load_experiment(list(request.gin_files), list(request.bindings))
  workers, ps = _task_counts(request, experiment)
  gpus = _gpus_per_worker(experiment.topology)
  draft = Cluster(request, "x", workers, ps, gpus)
  longest = max(len(_suffix(request.format, job, i)) for job, i in draft.tasks())
  name = request.name
  if name is None:
    name = default_name(request.gin_files[0], LABEL_MAX - longest)
  _check_label("--name", name, _DNS1035, LABEL_MAX - longest,
               f"pods are named NAME{_suffix(request.format, *draft.tasks()[-1])}")
  return dataclasses.replace(draft, name=name)


def _task_counts(request: Request, experiment) -> tuple[int, int]:
  """--workers / --ps, defaulting to what the config's topology pins, checked against it
  and against the regime (parameter servers are for regimes.AsyncPS only)."""
  from replibench.engine import topology as topology_lib  # pylint: disable=import-outside-toplevel
  from replibench.engine.regimes.async_ps import AsyncPS  # pylint: disable=import-outside-toplevel
  topology, files = experiment.topology, " --gin_file=".join(request.gin_files)
  if not isinstance(topology, topology_lib.MultiWorker):
    raise UserError(f"--gin_file={files}: the topology is {topology.describe()}, one "
                    f"process; a cluster needs Experiment.topology = @topology.MultiWorker() "
                    f"(add --gin_file=configs/topology/workers.gin, or ps.gin for "
                    f"parameter servers).")
  workers = request.workers if request.workers is not None else topology.workers or 2
  ps = request.ps if request.ps is not None else topology.ps
  inputs.number("--workers", workers, 1, MAX_TASKS, integer=True, meaning="worker pods")
  inputs.number("--ps", ps, 0, MAX_TASKS - workers - 1, integer=True,
                meaning="parameter-server pods")
  for flag, given, pinned, binding in (("--workers", workers, topology.workers, "workers"),
                                       ("--ps", ps, topology.ps, "ps")):
    if pinned and given != pinned:
      raise UserError(f"{flag}={given}, but the config sets topology.MultiWorker."
                      f"{binding} = {pinned}; give {flag}={pinned} or change the binding.")
  asynchronous = isinstance(experiment.regime, AsyncPS)   # BackupPS is one too.
  if ps and not asynchronous:
    raise UserError(f"--ps={ps}: parameter servers are for asynchronous training; "
                    f"the config's regime is synchronous (use configs/topology/ps.gin, "
                    f"Experiment.regime = @regimes.AsyncPS(), or --ps=0).")
  if asynchronous and not ps:
    raise UserError("--ps=0: the config's regime is regimes.AsyncPS, which needs "
                    "parameter servers; give --ps=P (P >= 1).")
  return workers, ps


def _gpus_per_worker(topology) -> int:
  """GPUs each worker pod asks for: a CPU worker runs one replica (one CPU device per
  process, as `launch` gives it), so more replicas per worker are that many GPUs, one
  replica each (topology.MultiWorker.replicas_per_worker); one replica means CPU."""
  return topology.replicas_per_worker if topology.replicas_per_worker > 1 else 0


def default_name(gin_file: str, limit: int = LABEL_MAX) -> str:
  """The config file's name as a DNS-1035 label: 'fashion_mnist.gin' -> 'fashion-mnist'."""
  stem = os.path.splitext(os.path.basename(gin_file))[0].lower()
  name = re.sub(r"[^a-z0-9]+", "-", stem)
  name = re.sub(r"^[^a-z]+", "", name)[:limit].strip("-")
  return name or "replibench"


def _check_label(flag: str, value, rule, limit: int, why: str = "") -> None:
  if not (isinstance(value, str) and rule.match(value) and len(value) <= limit):
    first = "a letter" if rule is _DNS1035 else "a letter or digit"
    raise UserError(f"{flag}={value}: not a valid Kubernetes name: lower-case letters, "
                    f"digits and '-', starting with {first} and ending with a letter or "
                    f"digit, at most {limit} characters{' (' + why + ')' if why else ''}.")


def _suffix(fmt: str, job: str, index: int) -> str:
  """What a task's pod name adds to the export's name (operator's or Job controller's)."""
  return f"-{job}-{index}" if fmt == "tfjob" else f"-{index}"


# --- the manifests -----------------------------------------------------------------------


def tfjob(cluster: Cluster) -> list[dict]:
  """One TFJob; the operator restarts a failed pod (OnFailure) up to BACKOFF_LIMIT times
  and, once the job ends, deletes the pods still running (the ps never exit)."""
  specs = {ROLES[job]: {"replicas": n, "restartPolicy": "OnFailure",
                        "template": _template(cluster, job, "OnFailure")}
           for job, n in cluster.counts().items()}
  return [{"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _metadata(cluster),
           "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": BACKOFF_LIMIT},
                    "tfReplicaSpecs": specs}}]


def job(cluster: Cluster) -> list[dict]:
  """A headless Service (the pods' DNS names) and an Indexed Job, one index per task."""
  total, name = len(cluster.tasks()), cluster.name
  service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(cluster), "spec": {
      "clusterIP": "None", "selector": _labels(cluster),
      # Tasks dial each other before they are Ready: resolve them from the start.
      "publishNotReadyAddresses": True,
      "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT}]}}
  spec = {"completionMode": "Indexed", "completions": total, "parallelism": total,
          # Per index, as TFJob counts per replica; a task that runs out fails the Job.
          "backoffLimitPerIndex": BACKOFF_LIMIT, "maxFailedIndexes": 0,
          "podFailurePolicy": {"rules": [
              # Exit 2 is bad input (replibench.errors): a retry would fail the same way.
              {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER,
                                                    "operator": "In", "values": [2]}},
              # A preempted or evicted pod is not the task's failure.
              {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                       "status": "True"}]}]},
          "template": _template(cluster, None, "Never")}
  if cluster.ps:
    # The chief (index 0) decides; the workers and ps serve until they are stopped.
    spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
  spec["template"]["spec"]["subdomain"] = name   # Pods resolve as NAME-k.NAME.NAMESPACE.svc.
  return [service, {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(cluster),
                    "spec": spec}]


def tasks_env(cluster: Cluster) -> str:
  """REPLIBENCH_K8S_TASKS: every task's address by job, in the Job's index order."""
  request, addresses, index = cluster.request, {}, 0
  for job_name, n in cluster.counts().items():
    addresses[job_name] = [f"{cluster.name}-{index + i}.{cluster.name}.{request.namespace}"
                           f".svc:{PORT}" for i in range(n)]
    index += n
  return json.dumps(addresses)


def _template(cluster: Cluster, job_name: str | None, restart: str) -> dict:
  """The pod template of one TFJob replica type, or (job_name None) of every Job index."""
  request = cluster.request
  container = {"name": CONTAINER, "image": request.image, "command": run_command(request),
               "ports": [{"name": PORT_NAME, "containerPort": PORT}],
               "volumeMounts": [{"name": "workdir", "mountPath": request.workdir}]}
  if job_name is None:
    container["env"] = [{"name": K8S_TASKS_ENV, "value": tasks_env(cluster)}]
  resources = _resources(cluster, job_name)
  if resources:
    container["resources"] = resources
  volume = ({"persistentVolumeClaim": {"claimName": request.volume_claim}}
            if request.volume_claim else {"emptyDir": {}})
  labels = _labels(cluster, job_name)
  return {"metadata": {"labels": labels},
          "spec": {"restartPolicy": restart, "containers": [container],
                   "volumes": [{"name": "workdir", **volume}]}}


def _resources(cluster: Cluster, job_name: str | None) -> dict:
  """A worker's cpu request and GPUs. The Job has one template for every index, so there
  every pod gets them (GPUs come with synchronous configs only, where all are workers)."""
  if job_name not in ("worker", None):
    return {}
  resources = {}
  if cluster.request.cpus_per_worker:
    resources["requests"] = {"cpu": str(cluster.request.cpus_per_worker)}
  if cluster.gpus_per_worker:
    resources["limits"] = {"nvidia.com/gpu": str(cluster.gpus_per_worker)}
  return resources


def run_command(request: Request) -> list[str]:
  """What every task runs: the config's `replibench run`, resuming on a restart."""
  return ["python", "-m", "replibench.cli", "run",
          *(f"--gin_file={f}" for f in request.gin_files),
          *(f"--gin_bindings={b}" for b in request.bindings), f"--workdir={request.workdir}"]


def _labels(cluster: Cluster, job_name: str | None = None) -> dict:
  labels = {"app.kubernetes.io/name": "replibench", "app.kubernetes.io/instance": cluster.name}
  if job_name:
    labels["app.kubernetes.io/component"] = job_name
  return labels


def _metadata(cluster: Cluster) -> dict:
  return {"name": cluster.name, "namespace": cluster.request.namespace,
          "labels": _labels(cluster)}


# --- header and validation ---------------------------------------------------------------


def made_by(request: Request) -> str:
  """The export command, as flags that make this manifest again."""
  flags = [f"--format={request.format}", *(f"--gin_file={f}" for f in request.gin_files),
           *(f"--gin_bindings={b}" for b in request.bindings)]
  for flag in ("workers", "ps", "cpus_per_worker", "image", "name", "namespace", "workdir",
               "volume_claim"):
    value = getattr(request, flag)
    if value is not None and not (flag == "cpus_per_worker" and not value):
      flags.append(f"--{flag}={value}")
  return "replibench export " + " ".join(shlex.quote(f) for f in flags)


def header(cluster: Cluster) -> str:
  """The YAML's leading comment: what runs where, what made it, what a restart keeps."""
  request = cluster.request
  shape = (f"1 chief, {cluster.workers} worker(s) and {cluster.ps} ps: asynchronous "
           f"parameter-server training (regimes.AsyncPS), the chief coordinating"
           if cluster.ps else f"{cluster.workers} worker(s): synchronous training "
           f"(MultiWorkerMirroredStrategy), worker 0 the chief")
  if request.format == "tfjob":
    lines = ["a Kubeflow TFJob (kubeflow.org/v1, training operator v1.9), which sets each "
             "pod's TF_CONFIG",
             f"a failed pod's container restarts (OnFailure, {BACKOFF_LIMIT} "
             f"restarts in all); when the job ends, pods still running are deleted"]
  else:
    lines = ["a headless Service and an Indexed batch/v1 Job (Kubernetes >= 1.31, no "
             "operator); index k is the k-th task of " + K8S_TASKS_ENV + " (chief, workers, "
             "ps), and replibench derives TF_CONFIG from it and JOB_COMPLETION_INDEX",
             f"a failed pod is replaced ({BACKOFF_LIMIT} times per index); exit "
             f"code 2 (bad input) fails the Job at once"
             + ("; the Job succeeds when the chief (index 0) does, and the rest are "
                "stopped" if cluster.ps else "")]
  if request.volume_claim:
    keep = (f"PersistentVolumeClaim {request.volume_claim} mounted at {request.workdir} in "
            f"every pod (ReadWriteMany where pods share no node): a restarted task resumes "
            f"from the run's last checkpoint there, and result.json stays there")
  else:
    # An emptyDir outlives a container restarted in place (TFJob's OnFailure), not its
    # pod: the Job's retries are new pods (restartPolicy Never, which a podFailurePolicy
    # needs), so there no retry ever finds a checkpoint.
    kept = ("a container restarted in the same pod resumes from its checkpoint, but a pod "
            "that is replaced, evicted or rescheduled starts its run over"
            if request.format == "tfjob" else "every retry is a new pod, which starts the "
            "run over")
    keep = (f"no --volume_claim: {request.workdir} is an emptyDir, which lives as long as "
            f"its pod: {kept}, and the checkpoints and result.json go with the pods (the "
            f"run's summary line stays in `kubectl logs`). Give --volume_claim=PVC to keep "
            f"them")
  text = [f"replibench export --format={request.format}: {lines[0]}.",
          f"Runs, in each of {shape}:", "  " + shlex.join(run_command(request)),
          f"Made by: {made_by(request)}", f"Workdir: {keep}.", f"On failure: {lines[1]}.",
          f"Apply: kubectl apply -f FILE (namespace {request.namespace})."]
  wrapped = []
  for line in text:
    wrapped += _wrap(line)
  return "".join(f"# {line}\n" for line in wrapped)


def _wrap(line: str, width: int = 96) -> list[str]:
  """line in pieces of at most width characters, broken at spaces (a long word whole)."""
  indent = " " * (len(line) - len(line.lstrip(" ")))
  out, current = [], indent
  for word in line.lstrip(" ").split(" "):
    if current.strip() and len(current) + 1 + len(word) > width:
      out.append(current)
      current = indent + "   " + word
    else:
      current = f"{current} {word}" if current.strip() else current + word
  return out + [current]


def _validate(text: str) -> None:
  """The YAML as written, parsed back and validated; an invalid manifest is a bug."""
  try:
    import jsonschema, kubernetes_validate  # noqa: F401  pylint: disable=import-outside-toplevel,multiple-imports,unused-import
  except ImportError as e:
    raise UserError(f"export validates what it writes with jsonschema and "
                    f"kubernetes-validate, which are not installed ({e}); install them with "
                    f"`make install` (they are replibench's dependencies).") from None
  try:
    k8s_validate.check_all(list(yaml.safe_load_all(text)))
  except k8s_validate.InvalidManifest as e:
    raise k8s_validate.InvalidManifest(
        f"export made a manifest that Kubernetes would refuse (a bug in "
        f"replibench/scheduler/kubernetes.py): {e}") from None
