"""Experiment.intra_op_threads / inter_op_threads: TensorFlow's pools sized before its
runtime starts (engine/devices.py), shown by `plan` and recorded in result.json's
machine.threads; bad values are test_reliability's."""

import subprocess
import sys

from absl import logging

from replibench.config import load_experiment
from replibench.config.plan import threads
from replibench.engine import devices
from tests import helpers

_FRESH = """
from replibench.engine import devices
devices.set_thread_pools(1, 3)
import tensorflow as tf
tf.constant(1.0) + 1.0   # The runtime starts with the pools as set.
print(devices.thread_pools())
"""


def test_a_fresh_process_gets_the_pools_asked_for():
  run = subprocess.run([sys.executable, "-c", _FRESH], cwd=helpers.REPO, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.strip().splitlines()[-1] == "{'intra_op': 1, 'inter_op': 3}"


def test_a_default_pool_is_recorded_as_the_environment_sizes_it(monkeypatch):
  """TensorFlow sizes a default (0) pool from TF_NUM_*_THREADS where set (the noise
  budget's conditions set them), so the record must too, not claim one a core."""
  monkeypatch.setattr(devices.tf.config.threading, "get_intra_op_parallelism_threads",
                      lambda: 0)
  monkeypatch.setattr(devices.tf.config.threading, "get_inter_op_parallelism_threads",
                      lambda: 4)
  monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
  monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "3")
  assert devices.thread_pools() == {"intra_op": 1, "inter_op": 4}   # Configured wins.


def test_a_started_runtime_keeps_its_pools_and_says_so(monkeypatch):
  """In a process whose runtime has started (this one), asking for other sizes logs a
  warning naming the binding and changes nothing, so the record stays true."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.constant(1.0) + 1.0
  before, said = devices.thread_pools(), []
  monkeypatch.setattr(logging, "warning", lambda msg, *args: said.append(msg % args))
  devices.set_thread_pools(before["intra_op"] + 1, 0)
  assert devices.thread_pools() == before
  assert len(said) == 1 and "Experiment.intra_op_threads" in said[0], said


def test_plan_shows_the_pools():
  config = [f"{helpers.REPO}/configs/d4pg/cartpole_swingup.gin"]
  assert threads(load_experiment(config, ["Experiment.inter_op_threads = 2"])) == (
      "intra-op 1, inter-op 2")
  assert threads(load_experiment(config, ["Experiment.intra_op_threads = 0"])).startswith(
      "intra-op TensorFlow's default")


def test_plan_warns_that_one_inter_op_thread_undoes_gradient_buckets():
  """An explicit pool of one inter-op thread wins over the buckets' own raise to two
  (the regime is built before the run sizes the pools): legal, but plan says the
  buckets then overlap nothing."""
  config = [f"{helpers.REPO}/configs/resnet/scaling.gin"]
  buckets = "regimes.Sync.bucket_bytes = 65536"
  shown = threads(load_experiment(config, [buckets, "Experiment.inter_op_threads = 1"]))
  assert shown.startswith("intra-op TensorFlow's default (one a core), inter-op 1 (warning: "
                          "Experiment.inter_op_threads = 1 with regimes.Sync.bucket_bytes "
                          "= 65536"), shown
  assert "overlap nothing" in shown
  assert "warning" not in threads(load_experiment(config, [buckets,
                                                           "Experiment.inter_op_threads = 2"]))
  assert "warning" not in threads(load_experiment(config, ["Experiment.inter_op_threads = 1"]))
