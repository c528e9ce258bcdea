"""Replication must not change the math: N replicas at global batch B == 1 replica at B."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from tests import helpers

GLOBAL_BATCH = 16
STEPS = 4


def _mlp():
  return keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Flatten(),
      keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


def _convnet():
  return keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, use_bias=False),
      engine.CrossReplicaBatchNorm(momentum=0.9), keras.layers.ReLU(),
      keras.layers.Conv2D(8, 3, strides=2, use_bias=False),
      engine.CrossReplicaBatchNorm(momentum=0.9), keras.layers.ReLU(),
      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])


def _train(build_model, num_replicas):
  """Trains STEPS steps; returns the replicator, model and optimizer."""
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"))
  with replicator.scope():
    keras.utils.set_random_seed(1)
    model = build_model()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=2.0)
    optimizer.build(model.trainable_variables)
  x, y = helpers.random_images(GLOBAL_BATCH * STEPS)

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    # No autotuning thread: a freed autotuned iterator waits for it (conftest says).
    return ds.batch(ctx.per_replica_batch_size, drop_remainder=True).with_options(
        helpers.no_autotune())

  def step_fn(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
      loss = engine.average_loss(per_example, GLOBAL_BATCH)
    replicator.regime.apply_gradients(optimizer, tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables)
    return {"loss": engine.all_reduce(loss, "sum")}

  train = replicator.compile(step_fn, input_fn, GLOBAL_BATCH, steps_per_call=STEPS)
  metrics = train()
  assert np.isfinite(metrics["loss"])
  return replicator, model, optimizer


def _per_replica_bn_convnet():
  from models.resnet import batch_norm  # pylint: disable=import-outside-toplevel
  return keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, use_bias=False),
      batch_norm(name="bn"), keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(),
      keras.layers.Dense(10)])


def _replica_values(replicator, variable):
  return [v.numpy() for v in replicator.strategy.experimental_local_results(variable.value)]


@pytest.mark.parametrize("build_model", [_mlp, _convnet], ids=["mlp", "convnet_crossbn"])
def test_replicas_match_single_replica_and_each_other(build_model):
  reference = None
  for n in (1, 2, 4):
    replicator, model, optimizer = _train(build_model, n)
    assert replicator.num_replicas == n
    variables = model.variables + optimizer.variables
    assert any("moving_mean" in v.path for v in variables) == (build_model is _convnet)
    assert any("momentum" in v.path for v in optimizer.variables)
    finals = []
    for v in variables:
      copies = _replica_values(replicator, v)
      for copy in copies[1:]:
        np.testing.assert_array_equal(copies[0], copy, err_msg=f"{v.path} differs across replicas")
      finals.append(copies[0])
    if reference is None:
      reference = finals
      continue
    for v, want, got in zip(variables, reference, finals):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{v.path}: {n} replicas != 1 replica")


def test_training_actually_moves_the_variables():
  _, before, _ = _train(_mlp, 1)
  keras.utils.set_random_seed(1)
  fresh = _mlp()
  assert not np.allclose(before.layers[-1].kernel.numpy(), fresh.layers[-1].kernel.numpy())


def test_per_replica_batch_norm_keeps_moving_statistics_identical():
  """Batch statistics differ per replica; the stored moving ones must not: each replica
  keeps its own copy (on-read, models/layers.py) and every read outside a replica (the
  host, a checkpoint) gives their mean; every other variable is identical."""
  replicator, model, optimizer = _train(_per_replica_bn_convnet, 2)
  for v in model.variables + optimizer.variables:
    copies = _replica_values(replicator, v)
    if "moving_" in v.path:
      np.testing.assert_allclose(tf.convert_to_tensor(v.value), np.mean(copies, axis=0),
                                 rtol=1e-6, err_msg=v.path)
      continue
    np.testing.assert_array_equal(copies[0], copies[1], err_msg=f"{v.path} differs")


def test_a_call_holds_one_copy_of_the_replicated_step():
  """The k steps of a call loop over one instance of the replicated step: the graph that
  TensorFlow optimises and partitions at the first call holds it once (a copy before
  the loop, as it once had, doubled the first call's time)."""
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))

  def input_fn(ctx):
    return tf.data.Dataset.range(10**6).map(lambda i: tf.cast(i, tf.float32)).batch(
        ctx.per_replica_batch_size).with_options(helpers.no_autotune())

  train = replicator.compile(lambda x: {"loss": tf.reduce_mean(x)}, input_fn, 4,
                             steps_per_call=3)
  train.trace()
  graph = train._fn.get_concrete_function().graph.as_graph_def()  # pylint: disable=protected-access
  step = train._replicated.get_concrete_function(train.iterator.element_spec).name  # pylint: disable=protected-access
  nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
  calls = [n for n in nodes if n.op in ("PartitionedCall", "StatefulPartitionedCall")
           and n.attr["f"].func.name.encode() == step]
  assert len(calls) == 1
  # Steps 0-2 read [0..3], [4..7], [8..11]: the call returns the mean of their means.
  assert train()["loss"] == pytest.approx(5.5)
  assert train()["loss"] == pytest.approx(17.5)


def test_both_batch_norm_kinds_take_the_one_setting_and_refuse_their_own():
  """engine.batch_norm_setting is the recipe of cross-replica and per-replica batch norm
  alike (the noise-scale sweep once ran the per-replica kind at Keras' defaults while
  the batch-size sweep's cross-replica kind ran the config's 0.9 / 1e-5)."""
  import gin  # pylint: disable=import-outside-toplevel
  from replibench.errors import UserError  # pylint: disable=import-outside-toplevel
  gin.parse_config("engine.batch_norm_setting.momentum = 0.9\n"
                   "engine.batch_norm_setting.epsilon = 1e-5")
  with engine.layers.recording() as made:
    norms = [engine.cross_replica_batch_norm(name="a"), engine.per_replica_batch_norm(name="b")]
  assert [(n.momentum, n.epsilon) for n in norms] == [(0.9, 1e-5)] * 2
  assert made == {"cross_replica_batch_norm", "per_replica_batch_norm"}
  gin.parse_config("engine.per_replica_batch_norm.momentum = 0.99")
  with pytest.raises(UserError, match="bind engine.batch_norm_setting.momentum instead"):
    engine.per_replica_batch_norm(name="c")


@pytest.mark.parametrize("pipelines", [1, 2, 4])
def test_a_worker_keeps_its_replicas_batches_of_the_one_process_stream(pipelines):
  """Element k of the one-process stream is replica k % 4's batch; a worker's local
  replicas (ids p*R ... p*R+R-1) take its kept elements in turn, the stream stays endless."""
  from replibench.engine.spec import keep_replicas
  whole = tf.data.Dataset.range(1000).repeat()
  per = 4 // pipelines
  for p in range(pipelines):
    kept = keep_replicas(whole, 4, p, pipelines)
    assert kept.cardinality() == tf.data.INFINITE_CARDINALITY
    got = [int(x) for x in kept.take(3 * per)]
    assert got == [4 * s + p * per + r for s in range(3) for r in range(per)]
