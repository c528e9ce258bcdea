"""Shared helpers for the end-to-end tests: tiny overrides and reading run outputs."""

import glob
import json
import os
import subprocess
import sys

from tensorboard.backend.event_processing import event_accumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every workload config must appear here: its tiny override for the tests.
TINY = {
    "configs/resnet/fashion_mnist.gin": [
        "Experiment.train_epochs = 0.02", "Experiment.eval_every_epochs = 0.01",
        "Experiment.log_every_steps = 1", "small_resnet.widths = (4, 8, 8)"],
}


def workload_configs() -> list[str]:
  """Every .gin under configs/ that declares an experiment (not topology fragments)."""
  paths = sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.gin")))
  return [os.path.relpath(p, REPO) for p in paths
          if "Experiment.workload" in open(p).read()]


def runs_on_cpu(config: str) -> bool:
  return "@topology.Tpu()" not in open(os.path.join(REPO, config)).read()


def cli(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
  """Runs `python -m replibench.cli ARGS` from the repo root."""
  return subprocess.run([sys.executable, "-m", "replibench.cli", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})


def result(workdir) -> dict:
  with open(os.path.join(workdir, "result.json")) as f:
    return json.load(f)


def event_tags(workdir) -> dict:
  """{tag: [(step, value), ...]} for every summary in workdir, read by TensorBoard."""
  acc = event_accumulator.EventAccumulator(
      str(workdir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:
    out[tag] = [(e.step, e.tensor_proto) for e in acc.Tensors(tag)]
  return out
