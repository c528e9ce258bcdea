"""Runs shared by the tests that each check a different output of the same run.

test_configs_end_to_end runs every workload config at its tiny size (helpers.TINY) on
1 and 2 replicas; test_gan_workload checks the SN-GAN's scores and sample grid, and
test_predict the noise-scale record, of runs that are the same experiments. The
short ResNet on two replicas in one process is what test_multiworker's launched
workers and test_slurm_local's SLURM job are compared with.

One run serves them all in a test run, not only in a process: `make test` runs the
tests in two pytest-xdist workers, and the first to ask makes the run under a file lock
in the run's shared temporary directory while the other waits, then both read the same
workdir (the tests only read it). A run that fails leaves no mark, so the next test
to ask runs it again and fails the same way, in its own report.
"""

import fcntl
import os
import pathlib
import pickle
import shutil

import pytest

from tests import helpers

RESNET = "configs/resnet/fashion_mnist.gin"
# The short ResNet of the launched-cluster comparisons: a small learning rate (the
# two topologies sum gradients in different orders, ring all-reduce across processes
# vs. one device, and a tiny BN net at a large rate amplifies that float32 rounding
# within a few steps). Augmentation stays on: each worker keeps its replica's batches
# of the one-process input, draws included. Two blocks, not the tiny config's three,
# and 200 evaluation images, not 1,000: each launched worker traces the replicated
# step, and what is compared, the same training on either topology, needs no depth.
SHORT_RESNET = [*helpers.TINY[RESNET], "ImageClassification.base_lr_per_256 = 0.01",
                "Experiment.jit_compile = False", "small_resnet.widths = (4, 8)",
                "small_resnet.blocks_per_stage = (1, 1)", "FashionMNIST.num_eval_examples = 200",
                "ImageClassification.eval_batch_size = 200"]
# The config's own cross-replica batch norm, and the scaling configs' per-replica one
# (whose math depends on which examples each replica gets, not only on the global batch).
NORMS = {"cross_replica": [],
         "per_replica": ["small_resnet.norm_layer = @engine.per_replica_batch_norm",
                         "Experiment.train_epochs = 0.25"]}

_RUNS = {}


def run(tmp_path_factory, config: str, topology: str) -> tuple:
  """(RunResult, workdir) of config with its tiny overrides on configs/topology/topology,
  made on first use in this test run; later calls return the same run. The RunResult
  is the one run_experiment returned (kept beside the workdir for the other worker).
  The classifier that scores GAN samples is trained into this test run's own cache
  (as on a fresh clone), not taken from ~/.cache."""
  key = (config, topology)
  if key not in _RUNS:
    def make(workdir):
      from replibench.config import load_experiment  # pylint: disable=C0415
      from replibench.eval import classifier  # pylint: disable=import-outside-toplevel
      from replibench.harness.loop import run_experiment  # pylint: disable=C0415
      files = [os.path.join(helpers.REPO, config),
               os.path.join(helpers.REPO, "configs", "topology", topology)]
      with pytest.MonkeyPatch.context() as patch:
        patch.setenv(classifier.CACHE_ENV, str(_shared_root(tmp_path_factory) / "cache"))
        returned = run_experiment(load_experiment(files, helpers.TINY[config]), str(workdir))
      (workdir.parent / f"{workdir.name}.returned").write_bytes(pickle.dumps(returned))

    name = f"{config.removeprefix('configs/')[:-4].replace('/', '-')}-{topology[:-4]}"
    workdir = _shared(tmp_path_factory, name, make)
    returned = pickle.loads((workdir.parent / f"{workdir.name}.returned").read_bytes())
    _RUNS[key] = (returned, workdir)
  return _RUNS[key]


def short_resnet_on_two_replicas(tmp_path_factory, norm: str) -> pathlib.Path:
  """The workdir of SHORT_RESNET with NORMS[norm] trained on two replicas in one process
  (run_experiment, as `replibench run` calls it; test_cli runs the CLI itself)."""
  def make(workdir):
    from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
    from replibench.harness.loop import run_experiment  # pylint: disable=C0415
    files = [os.path.join(helpers.REPO, f) for f in (RESNET, "configs/topology/local2.gin")]
    run_experiment(load_experiment(files, SHORT_RESNET + NORMS[norm]), str(workdir))

  return _shared(tmp_path_factory, f"short-resnet-local2-{norm}", make)


def _shared_root(tmp_path_factory) -> pathlib.Path:
  """This test run's directory that its xdist workers share: each worker's basetemp
  (popen-gwN) is below it; without xdist, the basetemp itself."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _shared(tmp_path_factory, name: str, make) -> pathlib.Path:
  """The shared root's workdir `name`, made by make(workdir) here unless a process of
  this test run made it already; the lock makes the other askers wait for it."""
  root = _shared_root(tmp_path_factory) / "shared-runs"
  root.mkdir(exist_ok=True)
  workdir, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # Released when the file is closed.
    if not done.exists():
      shutil.rmtree(workdir, ignore_errors=True)
      workdir.mkdir()
      make(workdir)
      done.touch()
  return workdir
