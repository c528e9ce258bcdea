"""The models' default batch norm (models/layers.py MeanAggregatedBatchNorm) under XLA.

Its moving statistics are on-read variables: each replica updates its own copy inside
the step (no merge_call, so the forward and backward pass compiles as one XLA cluster),
and a read outside a replica, or inference inside one, gives the replicas' mean. These
tests train a tiny convnet 3 steps on 2 replicas (logical CPU devices) and check that
the compiled step matches the uncompiled one, that the moving statistics are what
averaging every update (tf.keras' write-aggregated variables) gives, that evaluation
inside a replicated step and a checkpoint see that mean, and that a layer which still
averages on every write is refused with a UserError.

Tolerance: rtol 1e-5 (atol 1e-6). XLA's CPU convolution is Eigen's where the graph's
is oneDNN's, so the two differ by float32 rounding, amplified a little by batch norm
over 4 examples; a wrong update (a skipped or doubled one, one replica's statistics
instead of the mean) moves the moving statistics by 1e-2 or more.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import layers
from replibench import engine
from replibench.engine import compilation
from replibench.errors import UserError

STEPS, REPLICAS, PER_REPLICA = 3, 2, 4
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


class _WriteAveragedBatchNorm(keras.layers.BatchNormalization):
  """The layer as it was: moving statistics averaged over replicas on every write
  (aggregation 'mean', synchronised on write: tf.distribute's merge_call)."""

  def add_weight(self, *args, trainable=True, aggregation="none", **kwargs):
    if not trainable:
      aggregation = "mean"
    return super().add_weight(*args, trainable=trainable, aggregation=aggregation, **kwargs)


def _model(norm) -> keras.Model:
  keras.utils.set_random_seed(7)
  return keras.Sequential([
      keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3, use_bias=False, name="conv"),
      norm(momentum=0.5, epsilon=1e-3, name="bn"), keras.layers.ReLU(),
      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, name="dense")], name="net")


def _batches() -> tuple[np.ndarray, np.ndarray]:
  """Per step, per replica: images [STEPS, REPLICAS, PER_REPLICA, 6, 6, 3] drawn with a
  different mean per replica (so the replicas' batch statistics differ), labels."""
  rng = np.random.default_rng(0)
  shift = np.arange(REPLICAS, dtype=np.float32).reshape(1, REPLICAS, 1, 1, 1, 1)
  images = rng.normal(size=(STEPS, REPLICAS, PER_REPLICA, 6, 6, 3)).astype(np.float32) + shift
  labels = rng.integers(0, 3, size=(STEPS, REPLICAS, PER_REPLICA)).astype(np.int32)
  return images, labels


def _train(norm, jit: bool, replicas: int = REPLICAS):
  """(replicator, model) after STEPS steps of SGD, the forward and backward pass through
  compilation.compiled (one XLA cluster a replica when jit)."""
  replicator = engine.Replicator(engine.Local(num_replicas=replicas, device="cpu"))
  with replicator.scope():
    model = _model(norm)
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)

  def gradients(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)) / (PER_REPLICA * replicas)
    return tape.gradient(loss, model.trainable_variables)

  def step(images, labels):
    grads = compilation.compiled(gradients, jit, "the test's pass")(images, labels)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

  images, labels = _batches()
  run = tf.function(lambda x, y: replicator.run(step, x, y))
  distribute = replicator.strategy.experimental_distribute_values_from_function
  for s in range(STEPS):
    run(*(distribute(lambda ctx, a=array: tf.constant(a[s, ctx.replica_id_in_sync_group]))
          for array in (images, labels)))
  return replicator, model


def _values(model) -> dict:
  """{path: value} of every variable, read on the host (an on-read one: the mean)."""
  return {v.path: np.array(tf.convert_to_tensor(v.value)) for v in model.variables}


def test_compiled_default_batch_norm_matches_the_uncompiled_one_on_two_replicas():
  _, graph = _train(layers.MeanAggregatedBatchNorm, jit=False)
  _, xla = _train(layers.MeanAggregatedBatchNorm, jit=True)
  want, got = _values(graph), _values(xla)
  assert want.keys() == got.keys() and any("moving_mean" in p for p in want)
  for path, value in want.items():
    np.testing.assert_allclose(got[path], value, **TOLERANCE, err_msg=path)


def test_moving_statistics_are_the_mean_of_every_replicas_update():
  """The same math as averaging each update over the replicas on write (tf.keras'
  aggregation, the layer's old form), without the per-write merge_call; each replica's
  own copy differs (its own batches), their mean does not."""
  replicator, on_read = _train(layers.MeanAggregatedBatchNorm, jit=False)
  _, on_write = _train(_WriteAveragedBatchNorm, jit=False)
  want, got = _values(on_write), _values(on_read)
  for path, value in want.items():
    np.testing.assert_allclose(got[path], value, **TOLERANCE, err_msg=path)
  bn = on_read.get_layer("bn")
  copies = [c.numpy() for c in replicator.strategy.experimental_local_results(
      bn.moving_mean.value)]
  assert not np.allclose(copies[0], copies[1])
  np.testing.assert_allclose(np.mean(copies, axis=0), got[bn.moving_mean.path], rtol=1e-6)


def test_evaluation_inside_a_replicated_step_uses_the_replicas_mean(tmp_path):
  """Every replica evaluates with the mean statistics (what the host and a checkpoint
  see), and a checkpoint restores that mean into every replica's copy."""
  replicator, model = _train(layers.MeanAggregatedBatchNorm, jit=False)
  x = np.random.default_rng(1).normal(size=(PER_REPLICA, 6, 6, 3)).astype(np.float32)
  host = model(x, training=False).numpy()
  inside = replicator.strategy.experimental_local_results(
      tf.function(lambda: replicator.run(lambda: model(tf.constant(x), training=False)))())
  for replica in inside:
    np.testing.assert_allclose(replica.numpy(), host, rtol=1e-5, atol=1e-6)

  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  fresh_replicator = engine.Replicator(engine.Local(num_replicas=REPLICAS, device="cpu"))
  with fresh_replicator.scope():
    fresh = _model(layers.MeanAggregatedBatchNorm)
  tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
  mean = model.get_layer("bn").moving_mean
  for copy in fresh_replicator.strategy.experimental_local_results(
      fresh.get_layer("bn").moving_mean.value):
    np.testing.assert_allclose(copy.numpy(), tf.convert_to_tensor(mean.value), rtol=1e-6)


def test_a_layer_that_averages_on_every_write_is_refused_when_compiled():
  """The backstop (engine/compilation.py): a pass that reaches tf.distribute's
  merge_call (here a variable aggregated on write) is a UserError saying why, not
  TensorFlow's RuntimeError."""
  with pytest.raises(UserError, match="merge_call.*on_read"):
    _train(_WriteAveragedBatchNorm, jit=True)
