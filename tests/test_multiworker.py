"""2 worker processes through `replibench launch` == 2 replicas in one process."""

from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
# No augmentation: its random draws depend on how the batch is split into pipelines.
# A small learning rate: the two topologies sum gradients in different orders
# (ring all-reduce across processes vs. one device), and a tiny BN net at a large
# rate amplifies that float32 rounding within a few steps.
BINDINGS = [*helpers.TINY[CONFIG], "FashionMNIST.augment = False",
            "ImageClassification.base_lr_per_256 = 0.01"]


def test_two_workers_match_two_local_replicas(tmp_path):
  flags = [f"--gin_file={CONFIG}", *(f"--gin_bindings={b}" for b in BINDINGS)]
  local = helpers.cli("run", *flags, "--gin_file=configs/topology/local2.gin",
                      f"--workdir={tmp_path / 'local'}")
  assert local.returncode == 0, local.stderr[-3000:]
  launched = helpers.cli("launch", "--workers=2", "--timeout=500", "--", "run", *flags,
                         "--gin_file=configs/topology/workers.gin",
                         "--gin_bindings=topology.MultiWorker.workers = 2",
                         f"--workdir={tmp_path / 'workers'}")
  assert launched.returncode == 0, helpers.failure_report(launched)
  assert "[worker 0]" in launched.stdout and "[worker 1]" in launched.stdout
  # The config's own cross-replica batch norm: its account against the wire
  # (test_network checks the other configs that can launch).
  helpers.check_wire_account(launched, tmp_path / "workers")

  a, b = helpers.result(tmp_path / "local"), helpers.result(tmp_path / "workers")
  assert (a.num_replicas, b.num_replicas, b.num_workers) == (2, 2, 2)
  assert b.scaling_kind == "worker_processes"
  helpers.assert_same_training(tmp_path / "local", tmp_path / "workers")
  assert not list(tmp_path.glob("workers/.scratch-*")), "non-chief scratch checkpoints left"


def test_a_failing_worker_stops_the_launch(tmp_path):
  run = helpers.cli("launch", "--workers=2", "--timeout=300", "--", "run",
                    f"--gin_file={CONFIG}", "--gin_file=configs/topology/workers.gin",
                    "--gin_bindings=topology.MultiWorker.workers = 3",
                    f"--workdir={tmp_path}")
  assert run.returncode == 2, run.stdout[-3000:]
  assert "exited with code 2" in run.stderr
