"""`launch --backend=slurm` and `sweep --executor=slurm` on a real one-node SLURM.

The module starts Debian's munged, slurmctld and slurmd under its own tmp directory
(tests/slurm_local.py: private slurm.conf and munge key, each daemon stopped by its
PID) and runs what a user on a SLURM cluster runs:
- a 2-task ResNet job, whose training matches the same config on two replicas in one
  process (the same steps, final metric, losses and variables, within
  test_multiworker's tolerance: the run its `launch --workers 2` is compared with);
- a parameter-server cluster (a chief, a worker and a ps: the servers end with it);
- a 2-trial sweep as one job array, one trial cancelled and then resumed.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from replibench import hostlist
from tests import helpers
from tests import slurm_local
from tests import tiny_runs

pytestmark = pytest.mark.skipif(slurm_local.unavailable() is not None,
                                reason=str(slurm_local.unavailable()))

CONFIG = tiny_runs.RESNET
# test_multiworker's short ResNet (a small learning rate: the ring sums in another order).
BINDINGS = tiny_runs.SHORT_RESNET + tiny_runs.NORMS["cross_replica"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  cluster = slurm_local.LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
  try:
    yield cluster
  finally:
    cluster.stop()


def _run_flags(topology: str, workdir, *extra: str) -> list[str]:
  return ["run", f"--gin_file={CONFIG}", f"--gin_file=configs/topology/{topology}",
          *(f"--gin_bindings={b}" for b in [*BINDINGS, *extra]), f"--workdir={workdir}"]


def _slurm_launch(slurm, *args):
  return helpers.cli("launch", "--backend=slurm", *args, env=slurm.env(), timeout=400)


def test_hostlists_expand_as_scontrol_expands_them(slurm):
  for expression in ("n[9-10]", "gpu[001-004,010]", "a,rack[1-2]n[08-09],b"):
    expected = slurm.run("scontrol", "show", "hostnames", expression).stdout.split()
    assert hostlist.expand_hosts(expression) == expected


def test_a_two_task_job_trains_as_two_local_replicas(slurm, tmp_path, tmp_path_factory):
  job = _slurm_launch(slurm, "--workers=2", "--", *_run_flags("workers.gin", tmp_path / "slurm"))
  assert job.returncode == 0, helpers.failure_report(job) + slurm.logs()
  # The run test_multiworker holds its local `launch --workers=2` to (made once a test run).
  local = tiny_runs.short_resnet_on_two_replicas(tmp_path_factory, "cross_replica")
  helpers.assert_same_training(local, tmp_path / "slurm")
  helpers.assert_same_losses(local, tmp_path / "slurm")
  result = helpers.result(tmp_path / "slurm")
  assert result.num_workers == 2 and result.final_step == result.budget["total_steps"]
  assert result.scheduler["name"] == "slurm" and result.scheduler["nodes"] == ["localhost"]
  job_id = result.scheduler["job_id"]
  assert int(job_id) >= slurm_local.first_job_id()   # Apart from another worker's cluster.
  assert f"submitted job {job_id}" in job.stderr and "ended: chief's exit code 0" in job.stderr
  assert json.loads(job.stdout.splitlines()[-1])["final_step"] == result.final_step
  files = os.listdir(tmp_path / "slurm" / "slurm")
  assert {"job.sbatch", f"{job_id}.out", f"chief-exit-{job_id}"} <= set(files)
  assert helpers.event_tags(tmp_path / "slurm")["train/loss"]


def test_a_parameter_server_job_ends_with_its_chief(slurm, tmp_path):
  job = _slurm_launch(slurm, "--workers=1", "--ps=1", "--overcommit", "--",
                      *_run_flags("ps.gin", tmp_path / "ps", "topology.MultiWorker.workers = 1"))
  assert job.returncode == 0, helpers.failure_report(job) + slurm.logs()
  result = helpers.result(tmp_path / "ps")
  assert result.regime["regime"] == "async_ps" and result.is_final
  assert result.scheduler["tasks_per_node"] == "3"
  output = (tmp_path / "ps" / "slurm" / f"{result.scheduler['job_id']}.out").read_text()
  assert "1: " in output and "ps 0 serving" in output   # Rank 2, the ps, served.
  assert not slurm.run("squeue", "--noheader").stdout.strip()   # Nothing left running.


SWEEP = """\
description = "two seeds on SLURM"
gin_files = ["{config}"]
seeds = [1, 2]
seed_binding = "Experiment.seed"
[[axes]]
name = "setup"
[[axes.points]]
label = "replicas=1"
gin_files = ["{topology}"]
"""


def _sweep(slurm, sweep_file, workdir, wait=True):
  args = [sys.executable, "-m", "replibench.cli", "sweep", f"--sweep={sweep_file}",
          f"--workdir={workdir}", "--executor=slurm", "--noexclusive",
          *(f"--gin_bindings={b}" for b in [*BINDINGS, "Experiment.train_epochs = 1",
                                            "Experiment.checkpoint_every_epochs = 0.25",
                                            "Experiment.inject_slowdown = 0.8"])]
  proc = subprocess.Popen(args, cwd=helpers.REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, **slurm.env()})
  if not wait:
    return proc
  out, _ = proc.communicate(timeout=400)
  return subprocess.CompletedProcess(args, proc.returncode, out, "")


def _wait_for_checkpoint(trial_dir, proc, timeout=300):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and proc.poll() is None:
    if (trial_dir / "checkpoints" / "checkpoint").exists():
      return
    time.sleep(0.1)
  raise AssertionError(f"no checkpoint in {trial_dir}: {proc.poll()}")


def test_a_sweep_runs_as_a_job_array_and_resumes_a_cancelled_trial(slurm, tmp_path):
  sweep_file = tmp_path / "s.sweep"
  sweep_file.write_text(SWEEP.format(config=os.path.join(helpers.REPO, CONFIG),
                                     topology=os.path.join(helpers.REPO,
                                                           "configs/topology/local1.gin")))
  workdir = tmp_path / "sweep"
  first = workdir / "replicas=1" / "seed=1"
  proc = _sweep(slurm, sweep_file, workdir, wait=False)
  _wait_for_checkpoint(first, proc)
  jobs = slurm.run("squeue", "--noheader", "--array", "--format=%i").stdout.split()
  assert len(jobs) == 2 and all(j.endswith(("_0", "_1")) for j in jobs), jobs
  slurm.run("scancel", next(j for j in jobs if j.endswith("_0")))   # A preemption.
  out, _ = proc.communicate(timeout=400)
  assert proc.returncode == 1, out
  assert "1 failed trial(s): replicas=1/seed=1" in out, out
  assert helpers.result(workdir / "replicas=1" / "seed=2").is_final
  assert "step " in (first / "trial.log").read_text()   # The chief's output, as locally.

  again = _sweep(slurm, sweep_file, workdir)
  assert again.returncode == 0, again.stdout
  assert "seed=2: budget_exhausted" in again.stdout and "skipped" in again.stdout
  resumed = helpers.result(first)
  second = helpers.result(workdir / "replicas=1" / "seed=2")
  assert second.scheduler["array_task_id"] == "1"   # Both trials were one array...
  assert resumed.is_final and resumed.resumed >= 1
  # ...and the one trial left ran as a job of its own, which resumed its checkpoint.
  assert resumed.scheduler["name"] == "slurm" and resumed.scheduler["array_task_id"] is None
  assert resumed.scheduler["job_id"] != second.scheduler["job_id"]
  assert resumed.final_step == second.final_step
