"""The engine on one GPU: collectives, and one GPU replica against one CPU replica.

Marked gpu: CI (no GPU) skips them with the reason shown. A machine with one GPU
holds one GPU replica (Local places one replica per GPU), so N-replica equivalence
on GPUs needs N GPUs; here the GPU replica is checked against the CPU engine, whose
N-replica equivalence the CPU tests hold.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import devices
from tests import helpers
from tests.test_engine_replication import _convnet
from tests.test_precision import STEPS, _Run

pytestmark = pytest.mark.gpu


@contextlib.contextmanager
def _ieee_float32():
  """Float32 matmuls and convolutions in float32: TensorFlow runs them in TF32 on
  Ampere and later GPUs by default (10-bit mantissa, relative error ~1e-3)."""
  was = tf.config.experimental.tensor_float_32_execution_enabled()
  tf.config.experimental.enable_tensor_float_32_execution(False)
  try:
    yield
  finally:
    tf.config.experimental.enable_tensor_float_32_execution(was)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_all_reduce_all_gather_and_broadcast_on_a_gpu_replica(op):
  value = np.arange(6, dtype=np.float32).reshape(2, 3)
  got = helpers.replicated(1, lambda x: tf.stack([engine.all_reduce(x, op),
                                                  engine.broadcast(x, source_replica=0)]),
                           [value], device="gpu")[0]
  np.testing.assert_array_equal(got, np.stack([value, value]))
  gathered = helpers.replicated(1, lambda x: engine.all_gather(x, axis=0), [value],
                                device="gpu")[0]
  np.testing.assert_array_equal(gathered, value)


def test_a_gpu_replica_holds_its_variables_on_the_gpu():
  run = _Run(_convnet, 1, "float32", device="gpu")
  devices = {v.value.device for v in run.model.variables}
  assert devices and all("GPU" in d for d in devices), devices


def test_one_gpu_replica_trains_like_one_cpu_replica_in_float32():
  """Same data, seed and global batch: after STEPS steps every variable (batch-norm
  statistics included) agrees to 1e-4 relative; convolution algorithms differ
  between cuDNN and oneDNN, so bitwise equality is not expected."""
  x, y = helpers.random_images(16 * STEPS)
  with _ieee_float32():
    gpu, cpu = (_Run(_convnet, 1, "float32", device=d) for d in ("gpu", "cpu"))
    losses = [float(run.train(x, y, STEPS)["loss"]) for run in (gpu, cpu)]
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  for g, c in zip(gpu.state(), cpu.state()):
    np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=1e-4, atol=1e-5, err_msg=g.path)


def test_auto_takes_gpus_only_when_there_is_one_per_replica():
  gpus = len(tf.config.list_physical_devices("GPU"))
  assert devices.resolve_kind(gpus, "auto") == "gpu"
  assert devices.resolve_kind(gpus + 1, "auto") == "cpu"
  assert "GPU" not in engine.Local(num_replicas=gpus + 1).describe_devices()
