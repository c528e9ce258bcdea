"""2 worker processes through `replibench launch` == 2 replicas in one process."""

import pytest

from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
# A small learning rate: the two topologies sum gradients in different orders
# (ring all-reduce across processes vs. one device), and a tiny BN net at a large
# rate amplifies that float32 rounding within a few steps. Augmentation stays on:
# each worker keeps its replica's batches of the one-process input, draws included.
BINDINGS = [*helpers.TINY[CONFIG], "ImageClassification.base_lr_per_256 = 0.01"]
# The config's own cross-replica batch norm, and the scaling configs' per-replica one
# (whose math depends on which examples each replica gets, not only on the global batch).
NORMS = {"cross_replica": [],
         "per_replica": ["small_resnet.norm_layer = @engine.per_replica_batch_norm",
                         "Experiment.train_epochs = 0.25"]}


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_two_workers_match_two_local_replicas(tmp_path, norm):
  flags = [f"--gin_file={CONFIG}", *(f"--gin_bindings={b}" for b in BINDINGS + NORMS[norm])]
  local = helpers.cli("run", *flags, "--gin_file=configs/topology/local2.gin",
                      f"--workdir={tmp_path / 'local'}")
  assert local.returncode == 0, local.stderr[-3000:]
  launched = helpers.cli("launch", "--workers=2", "--timeout=500", "--", "run", *flags,
                         "--gin_file=configs/topology/workers.gin",
                         "--gin_bindings=topology.MultiWorker.workers = 2",
                         f"--workdir={tmp_path / 'workers'}")
  assert launched.returncode == 0, helpers.failure_report(launched)
  assert "[worker 0]" in launched.stdout and "[worker 1]" in launched.stdout
  a, b = helpers.result(tmp_path / "local"), helpers.result(tmp_path / "workers")
  assert (a.num_replicas, b.num_replicas, b.num_workers) == (2, 2, 2)
  assert b.scaling_kind == "worker_processes"
  helpers.assert_same_training(tmp_path / "local", tmp_path / "workers")
  helpers.assert_same_losses(tmp_path / "local", tmp_path / "workers")
  if norm == "cross_replica":
    # Its account against the wire (test_network checks the other configs that launch).
    helpers.check_wire_account(launched, tmp_path / "workers")
    assert not list(tmp_path.glob("workers/.scratch-*")), "non-chief scratch checkpoints left"


def test_a_failing_worker_stops_the_launch(tmp_path):
  run = helpers.cli("launch", "--workers=2", "--timeout=300", "--", "run",
                    f"--gin_file={CONFIG}", "--gin_file=configs/topology/workers.gin",
                    "--gin_bindings=topology.MultiWorker.workers = 3",
                    f"--workdir={tmp_path}")
  assert run.returncode == 2, run.stdout[-3000:]
  assert "exited with code 2" in run.stderr
