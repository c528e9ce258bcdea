"""Gradient buckets (regimes.Sync.bucket_bytes): the exchange overlaps the backward pass
without changing the math."""

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops

from replibench import engine
from replibench.engine import aggregation, fusion, regimes
from replibench.errors import UserError
from tests import helpers

GLOBAL_BATCH, STEPS = 16, 4


def _mlp():
  return keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])


def test_buckets_fill_from_the_last_layer_back():
  tensors = [tf.zeros([n]) for n in (100, 10, 50, 40, 5)]   # 400, 40, 200, 160, 20 bytes
  assert fusion.buckets(tensors, 0) == [[0, 1, 2, 3, 4]]
  assert fusion.buckets(tensors, 10_000) == [[0, 1, 2, 3, 4]]
  # Each bucket closes once it holds at least 150 bytes: [4, 3], [2], [1, 0].
  assert fusion.buckets(tensors, 150) == [[3, 4], [2], [0, 1]]
  assert fusion.buckets([], 150) == []


def test_a_negative_or_fractional_bucket_size_is_refused():
  for bad in (-1, 1.5):
    with pytest.raises(UserError, match="regimes.Sync.bucket_bytes"):
      regimes.Sync(bucket_bytes=bad)


def _train(bucket_bytes: int, num_replicas: int = 4) -> list:
  """STEPS steps of an MLP on num_replicas logical replicas; its variables after them."""
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"),
                                 regimes.Sync(bucket_bytes=bucket_bytes))
  with replicator.scope():
    keras.utils.set_random_seed(1)
    model = _mlp()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    replicator.regime.build_optimizer(optimizer, model.trainable_variables)
  x, y = helpers.random_images(GLOBAL_BATCH * STEPS)

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines,
                                                          ctx.input_pipeline_id)
    return ds.batch(ctx.per_replica_batch_size, drop_remainder=True)

  def step_fn(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = engine.average_loss(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True), GLOBAL_BATCH)
    return replicator.regime.apply_gradients(
        optimizer, tape.gradient(loss, model.trainable_variables), model.trainable_variables)

  train = replicator.compile(step_fn, input_fn, GLOBAL_BATCH, steps_per_call=STEPS)
  train.trace()
  assert train.communication(time_collectives=False)["by_kind"]["gradients"]["count"] == (
      len(fusion.buckets(model.trainable_variables, bucket_bytes)))
  train()
  return [v.numpy() for v in model.trainable_variables + optimizer.variables]


def test_bucketed_training_matches_one_all_reduce():
  """4 logical replicas, 4 steps: the same variables and momenta with 5 buckets as with one."""
  one = _train(0)
  bucketed = _train(64)   # Each of the 6 gradients (>= 40 bytes) a bucket but the two last.
  for want, got in zip(one, bucketed):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_buckets_all_reduce_waits_only_for_its_own_gradients():
  """In the traced step, with the collective ops worker processes run (tf.distribute's
  CollectiveAllReduce, here between 2 logical CPUs), the first bucket's all-reduce (the
  last layer's gradients) does not depend on the first layer's gradient, by data or by
  control edge: the executor can run it while the backward pass goes on."""
  devices = ["/cpu:0", "/cpu:1"]
  strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops.
                                            CollectiveAllReduce(
                                                devices, group_size=2, options=tf.distribute.
                                                experimental.CommunicationOptions()))
  with strategy.scope():
    keras.utils.set_random_seed(1)
    model = _mlp()
  first_layer = []

  def step(images):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    first_layer.append(grads[0].op)
    return aggregation.all_reduce_gradients(grads, bucket_bytes=64)

  fn = tf.function(lambda x: strategy.run(step, args=(x,)))
  graph = fn.get_concrete_function(tf.TensorSpec([2, 8, 8, 3])).graph
  reduces = [op for op in graph.get_operations() if op.type.startswith("CollectiveReduce")
             and op.device.endswith("CPU:0")]
  assert len(reduces) == len(fusion.buckets(model.trainable_variables, 64)) == 5
  assert not set(first_layer) & _ancestors(reduces[0])
  assert set(first_layer) & _ancestors(reduces[-1])


def _ancestors(op: tf.Operation) -> set:
  """Every op that must finish before op runs (data and control inputs, transitively)."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def test_buckets_give_a_one_core_process_a_second_inter_op_thread():
  """A worker pinned to one core gets one inter-op thread from TensorFlow, with which a
  ready bucket collective waits for the whole backward pass (results/scaling/README.md):
  a Sync regime with buckets asks for two before the runtime starts; without, unchanged."""
  script = ("import tensorflow as tf; from replibench.engine import regimes; "
            "regimes.Sync(bucket_bytes={}); "
            "print(tf.config.threading.get_inter_op_parallelism_threads())")
  for bucket_bytes, threads in ((131072, "2"), (0, "0")):
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", script.format(bucket_bytes)],
                         capture_output=True, text=True, check=True, cwd=helpers.REPO)
    assert out.stdout.strip().splitlines()[-1] == threads
