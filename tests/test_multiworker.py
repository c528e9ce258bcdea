"""2 worker processes through `replibench launch` == 2 replicas in one process.

Three launches, each compared with a two-replica run in one process (tests/tiny_runs.py:
one run a norm in a test run, which test_slurm_local's SLURM job is compared with too):
the config's own cross-replica batch norm, the scaling configs' per-replica one, and the
per-replica one with the step compiled by XLA on the workers (moved here from
test_compile so that the two per-replica launches share one reference run: compilation
recorded, the ring all-reduce between compiled pieces, variables within test_compile's
tolerance).
"""

import numpy as np
import pytest

from tests import helpers, tiny_runs
from tests.test_compile import VARIABLE_TOLERANCE

CONFIG = tiny_runs.RESNET
# The short ResNet and its two norms (tests/tiny_runs.py says why they are short).
BINDINGS, NORMS = tiny_runs.SHORT_RESNET, tiny_runs.NORMS


def _launch(workdir, norm: str, *bindings: str):
  flags = [f"--gin_file={CONFIG}", *(f"--gin_bindings={b}" for b in BINDINGS + NORMS[norm])]
  launched = helpers.cli("launch", "--workers=2", "--timeout=500", "--", "run", *flags,
                         "--gin_file=configs/topology/workers.gin",
                         "--gin_bindings=topology.MultiWorker.workers = 2",
                         *(f"--gin_bindings={b}" for b in bindings), f"--workdir={workdir}")
  assert launched.returncode == 0, helpers.failure_report(launched)
  assert "[worker 0]" in launched.stdout and "[worker 1]" in launched.stdout
  # Both left through the cluster's exit barrier (harness/cluster_exit.py), and the
  # callers' checks of every output show that nothing was lost by it.
  assert launched.stdout.count("exit: every task of the cluster has finished") == 2, (
      helpers.failure_report(launched))
  return launched


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_two_workers_match_two_local_replicas(tmp_path, tmp_path_factory, norm):
  local = tiny_runs.short_resnet_on_two_replicas(tmp_path_factory, norm)
  launched = _launch(tmp_path / "workers", norm)
  a, b = helpers.result(local), helpers.result(tmp_path / "workers")
  assert (a.num_replicas, b.num_replicas, b.num_workers) == (2, 2, 2)
  assert b.scaling_kind == "worker_processes"
  helpers.assert_same_training(local, tmp_path / "workers")
  helpers.assert_same_losses(local, tmp_path / "workers")
  if norm == "cross_replica":
    # Its account against the wire (test_network checks the other configs that launch).
    helpers.check_wire_account(launched, tmp_path / "workers")
    assert not list(tmp_path.glob("workers/.scratch-*")), "non-chief scratch checkpoints left"


@pytest.mark.slow
def test_two_compiled_workers_match_two_graph_replicas(tmp_path, tmp_path_factory):
  """MultiWorkerMirroredStrategy's ring all-reduce between the compiled pieces of two
  launched workers trains as one process's uncompiled step (the small learning rate
  above keeps the ring's other summation order small; test_compile's tolerance for
  variables: XLA may reorder float32 sums, batch norm amplifies it)."""
  local = tiny_runs.short_resnet_on_two_replicas(tmp_path_factory, "per_replica")
  _launch(tmp_path / "xla", "per_replica", "Experiment.jit_compile = True")
  graph, xla = helpers.result(local), helpers.result(tmp_path / "xla")
  assert (graph.jit_compile, xla.jit_compile, xla.num_workers) == (False, True, 2)
  assert xla.hparams["jit_compile"] is True and "jit_compile" not in graph.hparams
  assert graph.final_step == xla.final_step
  np.testing.assert_allclose(xla.final_metric, graph.final_metric, atol=1e-2)
  want = helpers.checkpoint_variables(local)
  got = helpers.checkpoint_variables(tmp_path / "xla")
  assert want.keys() == got.keys() and len(want) > 10
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=VARIABLE_TOLERANCE,
                               atol=VARIABLE_TOLERANCE, err_msg=name)


def test_a_failing_worker_stops_the_launch(tmp_path):
  run = helpers.cli("launch", "--workers=2", "--timeout=300", "--", "run",
                    f"--gin_file={CONFIG}", "--gin_file=configs/topology/workers.gin",
                    "--gin_bindings=topology.MultiWorker.workers = 3",
                    f"--workdir={tmp_path}")
  assert run.returncode == 2, run.stdout[-3000:]
  assert "exited with code 2" in run.stderr
