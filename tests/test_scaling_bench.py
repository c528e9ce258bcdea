"""benchmarks/scaling/scaling.py's machine ceiling: N independent pinned one-worker runs at once,
and each worker count's efficiency against it."""

import os

import pytest

from benchmarks.scaling import scaling
from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
# Two blocks and 200 evaluation images (the run's last step evaluates): the ceiling
# test reads examples/s of two runs at once, not the tiny config's depth.
TINY = scaling.Workload("resnet", CONFIG, 64, 2, (
    *helpers.TINY[CONFIG], "small_resnet.widths = (4, 8)", "small_resnet.blocks_per_stage = (1, 1)",
    "FashionMNIST.num_eval_examples = 200", "ImageClassification.eval_batch_size = 200"))


def test_each_ceiling_run_is_pinned_to_the_cores_its_worker_would_get():
  cores = sorted(os.sched_getaffinity(0))
  setup = scaling.Setup(scaling.ceiling_label(2), "independent", 2)
  cmds = scaling.independent_commands(TINY, setup, ["A", "B"], cpus_per_worker=1)
  assert [c[:3] for c in cmds] == [["taskset", "-c", str(cores[0])],
                                   ["taskset", "-c", str(cores[1 % len(cores)])]]
  assert all("launch" in c and "--workers=1" in c and "--cpus_per_worker=1" in c for c in cmds)
  assert [c[-1] for c in cmds] == ["--workdir=A", "--workdir=B"]


def test_worker_counts_bring_their_ceilings():
  labels = [s.label for s in scaling.worker_setups([1, 2, 4], strong_ceilings=True)]
  assert labels == ["workers=1", "workers=2", "workers=4", "workers=2 (weak, 2x batch)",
                    "workers=4 (weak, 4x batch)", "2 x workers=1, at once",
                    "4 x workers=1, at once", "2 x workers=1, batch/2, at once",
                    "4 x workers=1, batch/4, at once"]


def test_efficiency_against_n_and_against_the_ceiling():
  eps = {"workers=1": 100, "workers=4": 300, "workers=4 (weak, 4x batch)": 340,
         "4 x workers=1, at once": 360}
  lines = scaling.summarize_workers(TINY, {k: [{"examples_per_s": v}] for k, v in eps.items()},
                                    [1, 4])
  assert "strong 3.00x (efficiency 75% of 4x)" in lines[2]
  assert ("weak   3.40x (efficiency 85% of 4x, 94% of the machine's ceiling 3.60x: "
          "4 x workers=1, at once)") in lines[3]


@pytest.mark.slow
def test_the_ceiling_runs_two_tiny_workers_at_once():
  result = scaling.measure(TINY, scaling.Setup(scaling.ceiling_label(2), "independent", 2))
  runs = result["runs_examples_per_s"]
  assert len(runs) == 2 and min(runs) > 0
  assert result["examples_per_s"] == pytest.approx(sum(runs))
