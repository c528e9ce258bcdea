"""`replibench export`: Kubernetes manifests of a config's cluster, and their validators.

The exports of a synchronous (workers.gin) and a parameter-server (ps.gin) config pass
the offline validators in both formats; seeded mistakes each fail them; the Indexed
Job's task list follows its index order; bad flags exit 2 and write nothing. Nothing
trains: a config is only compiled.
"""

import copy
import json
import os

import pytest
import yaml

from replibench.scheduler import k8s_validate, kubernetes
from tests import helpers, inprocess_cli

CONFIG = os.path.join(helpers.REPO, "configs/resnet/fashion_mnist.gin")
WORKERS = os.path.join(helpers.REPO, "configs/topology/workers.gin")
PS = os.path.join(helpers.REPO, "configs/topology/ps.gin")
IMAGE = "registry.example/replibench:1"


def _export(fmt: str, topology: str, **fields) -> tuple[str, list[dict]]:
  request = kubernetes.Request(fmt, (CONFIG, topology), workdir="/runs/fmnist", image=IMAGE,
                               **fields)
  text = kubernetes.export(request)
  return text, list(yaml.safe_load_all(text))


@pytest.fixture(scope="module")
def manifests():
  """{(format, 'sync'|'ps'): docs} for the four exports the tests mutate."""
  return {(fmt, regime): _export(fmt, topology, **extra)[1]
          for fmt in kubernetes.FORMATS
          for regime, topology, extra in (("sync", WORKERS, {"workers": 2}),
                                          ("ps", PS, {"ps": 1}))}


def _container(template: dict) -> dict:
  (container,) = template["spec"]["containers"]
  return container


@pytest.mark.parametrize("regime", ["sync", "ps"])
def test_tfjob_export_is_valid_and_has_the_topologys_replicas(manifests, regime):
  docs = manifests[("tfjob", regime)]
  assert [d["kind"] for d in docs] == ["TFJob"]
  k8s_validate.check_all(docs)
  tfjob = docs[0]
  assert tfjob["apiVersion"] == "kubeflow.org/v1"
  assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
  specs = tfjob["spec"]["tfReplicaSpecs"]
  expected = {"Worker": 2} if regime == "sync" else {"Chief": 1, "Worker": 2, "PS": 1}
  assert {t: s["replicas"] for t, s in specs.items()} == expected
  for spec in specs.values():
    assert spec["restartPolicy"] == "OnFailure"
    container = _container(spec["template"])
    assert container["name"] == "tensorflow" and container["image"] == IMAGE
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    topology = WORKERS if regime == "sync" else PS
    assert container["command"] == ["python", "-m", "replibench.cli", "run",
                                    f"--gin_file={CONFIG}", f"--gin_file={topology}",
                                    "--workdir=/runs/fmnist"]
    assert container["volumeMounts"] == [{"name": "workdir", "mountPath": "/runs/fmnist"}]


@pytest.mark.parametrize("regime", ["sync", "ps"])
def test_job_export_is_valid_and_resolves_through_its_headless_service(manifests, regime):
  docs = manifests[("job", regime)]
  assert [d["kind"] for d in docs] == ["Service", "Job"]
  k8s_validate.check_all(docs)
  service, job = docs
  assert service["spec"]["clusterIP"] == "None"
  spec, pod = job["spec"], job["spec"]["template"]["spec"]
  assert spec["completionMode"] == "Indexed" and pod["subdomain"] == service["metadata"]["name"]
  total = 2 if regime == "sync" else 4
  assert spec["completions"] == spec["parallelism"] == total
  exit_2 = spec["podFailurePolicy"]["rules"][0]
  assert exit_2["action"] == "FailJob" and exit_2["onExitCodes"]["values"] == [2]
  # With a chief, the Job ends when it does; the servers never exit by themselves.
  assert spec.get("successPolicy") == (
      None if regime == "sync" else {"rules": [{"succeededIndexes": "0"}]})


@pytest.mark.parametrize("ps,expected", [
    (0, {"worker": [0, 1, 2]}),
    (2, {"chief": [0], "worker": [1, 2, 3, 4], "ps": [5, 6]}),
])
def test_job_task_list_follows_the_index_order(ps, expected):
  topology = PS if ps else WORKERS
  workers = len(expected["worker"])
  bindings = ((f"topology.MultiWorker.workers = {workers}", f"topology.MultiWorker.ps = {ps}")
              if ps else ())
  _, docs = _export("job", topology, workers=workers, ps=ps, bindings=bindings, namespace="team",
                    name="fm")
  job = docs[1]
  (env,) = _container(job["spec"]["template"])["env"]
  assert env["name"] == kubernetes.K8S_TASKS_ENV == "REPLIBENCH_K8S_TASKS"
  tasks = json.loads(env["value"])
  assert list(tasks) == list(expected)   # chief, worker, ps; jobs of no task left out
  assert tasks == {job_name: [f"fm-{k}.fm.team.svc:2222" for k in indexes]
                   for job_name, indexes in expected.items()}
  assert job["spec"]["completions"] == sum(map(len, expected.values()))


def test_resources_follow_the_topology_and_flags(monkeypatch):
  monkeypatch.chdir(helpers.REPO)
  # Goyal et al.: 32 workers of 8 replicas, one per GPU.
  request = kubernetes.Request("tfjob", ("configs/resnet/imagenet_goyal256.gin",),
                               workdir="/runs/in", image=IMAGE, cpus_per_worker=6)
  worker = yaml.safe_load(kubernetes.export(request))["spec"]["tfReplicaSpecs"]["Worker"]
  assert worker["replicas"] == 32
  assert _container(worker["template"])["resources"] == {
      "requests": {"cpu": "6"}, "limits": {"nvidia.com/gpu": "8"}}
  _, docs = _export("tfjob", PS, ps=1)   # One CPU replica a worker: no GPUs, no request.
  for spec in docs[0]["spec"]["tfReplicaSpecs"].values():
    assert "resources" not in _container(spec["template"])


def test_volume_claim_holds_the_workdir_and_the_header_says_so():
  text, docs = _export("tfjob", WORKERS, volume_claim="runs")
  template = docs[0]["spec"]["tfReplicaSpecs"]["Worker"]["template"]
  assert template["spec"]["volumes"] == [{"name": "workdir",
                                          "persistentVolumeClaim": {"claimName": "runs"}}]
  assert "# Made by: replibench export --format=tfjob" in text
  assert "--volume_claim=runs" in text and "PersistentVolumeClaim runs" in text
  text, docs = _export("job", WORKERS)
  volumes = docs[1]["spec"]["template"]["spec"]["volumes"]
  assert volumes == [{"name": "workdir", "emptyDir": {}}]
  assert "no --volume_claim" in text and "starts the run over" in text


# --- seeded mistakes ---------------------------------------------------------------------


def _set(path: str, value):
  """A mutation setting the dotted path ([i] for list items) to value."""
  def mutate(docs):
    *parents, last = path.replace("[", ".[").lstrip(".").split(".")
    node = docs
    for part in parents:
      node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    if last.startswith("["):
      node[int(last[1:-1])] = value
    else:
      node[last] = value
  return mutate


def _add_chief_and_master(docs):
  specs = docs[0]["spec"]["tfReplicaSpecs"]
  specs["Master"] = copy.deepcopy(specs["Chief"])


def _rename_replica_type(docs):
  specs = docs[0]["spec"]["tfReplicaSpecs"]
  specs["Trainer"] = specs.pop("Worker")


TFJOB_MISTAKES = {
    "wrong type": (_set("[0].spec.tfReplicaSpecs.Worker.replicas", "two"),
                   "'two' is not of type 'integer'"),
    "unknown field": (_set("[0].spec.tfReplicaSpecs.Worker.template.spec.containers[0]"
                           ".imagePullPolcy", "Always"), "imagePullPolcy"),
    "unknown replica type": (_rename_replica_type, "unknown replica type"),
    "no tensorflow container": (_set("[0].spec.tfReplicaSpecs.PS.template.spec.containers[0]"
                                     ".name", "main"), "no container named 'tensorflow'"),
    "two chiefs": (_add_chief_and_master, "2 Chief/Master replicas"),
}


@pytest.mark.parametrize("mistake", TFJOB_MISTAKES)
def test_tfjob_validator_refuses_each_seeded_mistake(manifests, mistake):
  docs = copy.deepcopy(manifests[("tfjob", "ps")])
  mutate, says = TFJOB_MISTAKES[mistake]
  mutate(docs)
  with pytest.raises(k8s_validate.InvalidManifest, match=None) as caught:
    k8s_validate.check_all(docs)
  assert says in str(caught.value), caught.value


def test_one_chief_with_two_replicas_is_refused(manifests):
  docs = copy.deepcopy(manifests[("tfjob", "ps")])
  docs[0]["spec"]["tfReplicaSpecs"]["Chief"]["replicas"] = 2
  assert any("2 Chief/Master" in p for p in k8s_validate.problems(docs[0]))


JOB_MISTAKES = {
    "wrong type": (_set("[1].spec.completions", "two"), "'two' is not of type 'integer'"),
    "unknown field": (_set("[1].spec.template.spec.subDomain", "fashion-mnist"), "subDomain"),
    "unknown Service field": (_set("[0].spec.headless", True), "headless"),
    "restart with a podFailurePolicy": (_set("[1].spec.template.spec.restartPolicy",
                                             "OnFailure"), "needs 'Never'"),
    "not headless": (_set("[0].spec.clusterIP", "10.0.0.7"), "headless Service"),
    "tasks and indexes disagree": (_set("[1].spec.parallelism", 3), "lists 4 task(s)"),
    "no tensorflow container": (_set("[1].spec.template.spec.containers[0].name", "main"),
                                "no container named 'tensorflow'"),
    "bad name": (_set("[0].metadata.name", "Fashion_MNIST"), "not a DNS label"),
}


@pytest.mark.parametrize("mistake", JOB_MISTAKES)
def test_job_validator_refuses_each_seeded_mistake(manifests, mistake):
  docs = copy.deepcopy(manifests[("job", "ps")])
  mutate, says = JOB_MISTAKES[mistake]
  mutate(docs)
  with pytest.raises(k8s_validate.InvalidManifest) as caught:
    k8s_validate.check_all(docs)
  assert says in str(caught.value), caught.value


def test_strict_schema_keeps_declared_and_open_maps():
  schema = k8s_validate.strict({"type": "object", "properties": {
      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
      "free": {"type": "object", "properties": {"a": {}},
               "x-kubernetes-preserve-unknown-fields": True}}})
  assert schema["additionalProperties"] is False
  assert schema["properties"]["labels"]["additionalProperties"] == {"type": "string"}
  assert "additionalProperties" not in schema["properties"]["free"]


def test_an_invalid_export_is_a_bug_and_writes_nothing(tmp_path, monkeypatch):
  tfjob = kubernetes.tfjob

  def broken(cluster):
    docs = tfjob(cluster)
    docs[0]["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    return docs
  monkeypatch.setattr(kubernetes, "tfjob", broken)
  out = tmp_path / "job.yaml"
  request = kubernetes.Request("tfjob", (CONFIG, WORKERS), workdir="/w", image=IMAGE)
  with pytest.raises(k8s_validate.InvalidManifest, match="a bug in"):
    kubernetes.export(request, str(out))
  assert not out.exists()


@pytest.mark.parametrize("gin_file,name", [
    ("configs/resnet/fashion_mnist.gin", "fashion-mnist"),
    ("Imagenet_TPU32.gin", "imagenet-tpu32"),
    ("2x_big.gin", "x-big"),
    ("___.gin", "replibench"),
])
def test_default_name_is_the_config_files_as_a_dns_label(gin_file, name):
  assert kubernetes.default_name(gin_file) == name
  assert kubernetes.default_name("a" * 80 + ".gin", 50) == "a" * 50


# --- the command line --------------------------------------------------------------------

BASE = ("export", "--gin_file=configs/resnet/fashion_mnist.gin",
        "--gin_file=configs/topology/workers.gin")


def test_cli_prints_or_writes_the_manifest(tmp_path, capsys):
  args = (*BASE, "--format=job", f"--image={IMAGE}", "--workdir=/runs/fmnist", "--workers=3")
  printed = inprocess_cli.cli(capsys, *args)
  assert printed.returncode == 0, printed.stderr
  out = tmp_path / "fm.yaml"
  wrote = inprocess_cli.cli(capsys, *args, f"--out={out}")
  assert wrote.returncode == 0, wrote.stderr
  assert wrote.stdout.strip() == f"wrote the job manifest: {out}"
  assert out.read_text() == printed.stdout
  assert [d["kind"] for d in yaml.safe_load_all(printed.stdout)] == ["Service", "Job"]


@pytest.mark.parametrize("flags,culprit", [
    (("--format=tfjob", "--workdir=/w"), "--image"),
    (("--format=helm", "--image=i", "--workdir=/w"), "--format=helm"),
    (("--format=tfjob", "--image=i", "--workdir=/w", "--name=Fashion_MNIST"),
     "--name=Fashion_MNIST"),
    (("--format=job", "--image=i", "--workdir=/w", "--gin_bindings=Nope.x = 1"), "Nope.x"),
    (("--format=job", "--image=i", "--workdir=/w", "--network=1gbit"), "--network"),
    (("--format=job", "--image=i", "--workdir=runs/w"), "--workdir=runs/w"),
    (("--format=job", "--image=i", "--workdir=/w", "--ps=1"), "--ps=1"),
    (("--format=job", "--image=", "--workdir=/w"), "--image"),
    (("--format=job", "--image=i", "--workdir=/w", "--namespace=My_NS"), "--namespace"),
])
def test_cli_bad_inputs_exit_2_and_write_nothing(tmp_path, capsys, flags, culprit):
  out = tmp_path / "manifest.yaml"
  run = inprocess_cli.cli(capsys, *BASE, *flags, f"--out={out}")
  assert run.returncode == 2, (run.stdout[-2000:], run.stderr[-2000:])
  errors = [l for l in run.stderr.splitlines() if l.startswith("replibench export: error:")]
  assert len(errors) == 1 and culprit in errors[0], run.stderr
  assert not out.exists() and not os.listdir(tmp_path)


def test_cli_refuses_a_single_process_topology(tmp_path, capsys):
  out = tmp_path / "manifest.yaml"
  run = inprocess_cli.cli(capsys, "export", "--gin_file=configs/resnet/fashion_mnist.gin",
                          "--format=tfjob", "--image=i", "--workdir=/w", f"--out={out}")
  assert run.returncode == 2 and "topology.MultiWorker" in run.stderr, run.stderr
  assert not out.exists()
