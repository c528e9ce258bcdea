"""The cluster from a SLURM step's or a Kubernetes Indexed Job's variables (faked), the
sbatch script, and `launch --backend=slurm`'s refusals: no SLURM needed.

The same derivation against a real SLURM: tests/test_slurm_local.py.
"""

import json
import os

import pytest

from replibench import cluster, hostlist
from replibench.errors import UserError
from replibench.scheduler import slurm
from tests import inprocess_cli

CONFIG = "configs/resnet/fashion_mnist.gin"
WORKERS = "configs/topology/workers.gin"


def _step(nodes: str, tasks_per_node: str, rank: int, node: str, local: int, job="4242",
          **extra) -> dict:
  return {"SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
          "SLURM_PROCID": str(rank), "SLURM_JOB_ID": job, "SLURMD_NODENAME": node,
          "SLURM_LOCALID": str(local), **extra}


@pytest.mark.parametrize("expression, hosts", [
    ("n[9-10]", ["n9", "n10"]),
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
    ("a,rack[1-2]n[08-09],b", ["a", "rack1n08", "rack1n09", "rack2n08", "rack2n09", "b"]),
    ("localhost", ["localhost"])])
def test_hostlists_expand_in_slurm_order(expression, hosts):
  assert hostlist.expand_hosts(expression) == hosts


def test_tasks_per_node_repeats_expand():
  assert hostlist.expand_counts("2(x3),1") == [2, 2, 2, 1]
  with pytest.raises(UserError, match="SLURM_STEP_TASKS_PER_NODE"):
    hostlist.expand_counts("2(x")


def test_ranks_keep_slurms_numeric_node_order_not_the_string_order():
  """n9 before n10 (TensorFlow's SlurmClusterResolver sorts them as strings)."""
  env = _step("n[9-10]", "1(x2)", 0, "n9", 0)
  spec = cluster.from_slurm(env)
  port = spec.address.split(":")[1]
  assert spec.jobs == {"worker": [f"n9:{port}", f"n10:{port}"]}
  assert (spec.task_type, spec.task_index, spec.address) == ("worker", 0, f"n9:{port}")


def test_cyclic_placement_deals_ranks_round_robin():
  env = _step("gpu[001-002]", "2(x2)", 1, "gpu002", 0, SLURM_DISTRIBUTION="cyclic")
  spec = cluster.from_slurm(env)
  hosts = [a.split(":")[0] for a in spec.jobs["worker"]]
  assert hosts == ["gpu001", "gpu002", "gpu001", "gpu002"]
  ports = [int(a.split(":")[1]) for a in spec.jobs["worker"]]
  assert ports[2] == ports[0] + 1 and ports[3] == ports[1] + 1   # Second task on a node.
  assert spec.address == spec.jobs["worker"][1]


def test_block_placement_fills_each_node_in_turn():
  placed = cluster.placement(["a", "b"], [3, 1], "block")
  assert placed == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
  assert cluster.placement(["a", "b"], [3, 1], "cyclic") == [
      ("a", 0), ("b", 0), ("a", 1), ("a", 2)]


def test_two_jobs_on_one_node_listen_on_different_ports():
  one = cluster.from_slurm(_step("localhost", "2", 0, "localhost", 0, job="101"))
  two = cluster.from_slurm(_step("localhost", "2", 0, "localhost", 0, job="102"))
  assert not set(one.jobs["worker"]) & set(two.jobs["worker"])


def test_parameter_server_ranks_follow_the_stated_rule():
  """Rank 0 the chief, the last P ranks ps, the ranks between workers."""
  env = {cluster.SLURM_PS_ENV: "2", cluster.SLURM_TASKS_ENV: "5"}
  specs = [cluster.from_slurm(_step("n[1-5]", "1(x5)", r, f"n{r + 1}", 0, **env))
           for r in range(5)]
  assert [(s.task_type, s.task_index) for s in specs] == [
      ("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)]
  assert specs[0].jobs["chief"][0].startswith("n1:") and specs[0].jobs["ps"][1].startswith("n5:")
  assert specs[0].is_chief and not specs[1].is_chief


def test_an_allocation_smaller_than_the_topology_is_refused_naming_both_counts():
  env = _step("localhost", "2", 0, "localhost", 0, **{cluster.SLURM_TASKS_ENV: "4"})
  with pytest.raises(UserError, match=r"asks for 4 task\(s\).*this SLURM step has 2"):
    cluster.from_slurm(env)


def test_a_rank_placed_elsewhere_than_its_node_is_refused():
  env = _step("n[1-2]", "2(x2)", 1, "n2", 0)   # Block puts rank 1 on n1; it runs on n2.
  with pytest.raises(UserError, match="SLURM_DISTRIBUTION"):
    cluster.from_slurm(env)
  with pytest.raises(UserError, match="arbitrary"):
    cluster.from_slurm({**env, "SLURM_DISTRIBUTION": "arbitrary"})


def test_tf_config_wins_and_one_task_is_no_cluster():
  env = {**_step("n[1-2]", "1(x2)", 0, "n1", 0), cluster.ENV: '{"set": "by hand"}'}
  assert cluster.adopt(env) is None and env[cluster.ENV] == '{"set": "by hand"}'
  assert cluster.from_slurm(_step("n1", "1", 0, "n1", 0)) is None
  assert cluster.from_slurm({"SLURM_JOB_ID": "7"}) is None   # A batch script, no step.


def test_adopt_writes_the_tf_config_tensorflow_reads():
  env = _step("n[1-2]", "1(x2)", 1, "n2", 0)
  spec = cluster.adopt(env)
  assert json.loads(env[cluster.ENV]) == {"cluster": spec.jobs,
                                          "task": {"type": "worker", "index": 1}}


def test_an_indexed_job_pod_finds_its_task_by_completion_index():
  tasks = {"chief": ["j-0.s:2222"], "worker": ["j-1.s:2222", "j-2.s:2222"], "ps": ["j-3.s:2222"]}
  env = {cluster.K8S_TASKS_ENV: json.dumps(tasks), "JOB_COMPLETION_INDEX": "2"}
  spec = cluster.from_indexed_job(env)
  assert (spec.task_type, spec.task_index, spec.address) == ("worker", 1, "j-2.s:2222")
  with pytest.raises(UserError, match="JOB_COMPLETION_INDEX"):
    cluster.from_indexed_job({**env, "JOB_COMPLETION_INDEX": "9"})


def test_the_scheduler_record_names_the_job_and_its_nodes():
  env = _step("n[9-10]", "1(x2)", 0, "n9", 0, SLURM_JOB_NODELIST="n[9-10]")
  record = cluster.scheduler_record(env)
  assert record["name"] == "slurm" and record["job_id"] == "4242"
  assert record["nodes"] == ["n9", "n10"] and record["gpus_per_task"] == 0
  assert cluster.scheduler_record({}) is None


def test_the_batch_script_asks_for_the_topologys_tasks(tmp_path):
  run = slurm.Run(("--gin_file=F", "--workdir=D"), str(tmp_path / "run"))
  allocation = slurm.Allocation(nodes=2, tasks_per_node=2, cpus_per_task=4, gpus_per_task=1,
                                partition="gpu", account="proj", container_image="nvcr.io/x:1",
                                python="/venv/bin/python")
  text = slurm.batch_script(allocation, slurm.Shape(3, 1), [run], "rb-x", "replibench ...",
                            run.slurm_dir)
  for line in ("#SBATCH --ntasks=5", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
               "#SBATCH --cpus-per-task=4", "#SBATCH --gpus-per-task=1",
               "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --exclusive",
               f"export {cluster.SLURM_PS_ENV}=1 {cluster.SLURM_TASKS_ENV}=5"):
    assert line in text, line
  assert "--container-image=nvcr.io/x:1" in text and " python -m replibench" in text
  assert "--kill-on-bad-exit=0" in text   # The servers end with the chief, not on exit.


def test_an_allocation_that_cannot_hold_the_tasks_is_refused():
  with pytest.raises(UserError, match=r"gives 2 task\(s\), but the topology asks for 3"):
    slurm.check_allocation(slurm.Allocation(nodes=1, tasks_per_node=2), slurm.Shape(1, 1))


def _launch(capsys, tmp_path, *flags, env=None):
  return inprocess_cli.cli(capsys, "launch", "--backend=slurm", "--workers=2", *flags, "--",
                           "run", f"--gin_file={CONFIG}", f"--gin_file={WORKERS}",
                           f"--workdir={tmp_path / 'run'}", env=env)


def _refused(run, tmp_path, *words):
  assert run.returncode == 2, run
  message = run.stderr.strip()
  assert message.count("\n") == 0 and all(w in message for w in words), message
  assert not (tmp_path / "run").exists()


def test_slurm_with_the_local_network_is_refused(capsys, tmp_path):
  _refused(_launch(capsys, tmp_path, "--network=1gbit"), tmp_path, "--network", "local")


def test_slurm_without_sbatch_is_refused(capsys, tmp_path):
  _refused(_launch(capsys, tmp_path, env={"PATH": str(tmp_path)}), tmp_path, "sbatch",
           "login node")


def test_a_topology_the_allocation_does_not_fit_is_refused(capsys, tmp_path):
  run = inprocess_cli.cli(capsys, "launch", "--backend=slurm", "--workers=3", "--dry_run",
                          "--", "run", f"--gin_file={CONFIG}", f"--gin_file={WORKERS}",
                          "--gin_bindings=topology.MultiWorker.workers = 2",
                          f"--workdir={tmp_path / 'run'}")
  _refused(run, tmp_path, "workers = 2", "3")


def test_slurm_flags_without_the_slurm_backend_are_refused(capsys, tmp_path):
  run = inprocess_cli.cli(capsys, "launch", "--partition=gpu", "--", "run",
                          f"--gin_file={CONFIG}", f"--workdir={tmp_path / 'run'}")
  _refused(run, tmp_path, "--partition", "--backend=slurm")


def test_dry_run_prints_the_script_and_writes_nothing(capsys, tmp_path):
  run = _launch(capsys, tmp_path, "--dry_run", "--time=00:30:00")
  assert run.returncode == 0, run
  assert run.stdout.startswith("#!/bin/bash") and "#SBATCH --time=00:30:00" in run.stdout
  assert "#SBATCH --ntasks=2" in run.stdout and os.path.join("run", "slurm") in run.stdout
  assert not (tmp_path / "run").exists()
