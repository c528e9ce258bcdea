"""A tiny model trained under a regime on n logical replicas, for the regime tests."""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from replibench import engine
from tests import helpers

GLOBAL_BATCH = 16
STEPS = 4
# Binds (the initial gradient norm is above it, checked below): the compressed
# regime must clip the global gradient, as sync does.
TIGHT_CLIP = 0.2
# Does not bind. Local steps clip their own gradient, so local SGD and gossip
# equal sync only while clipping is inactive (like any nonlinearity in the update).
LOOSE_CLIP = 100.0


def mlp():
  keras.utils.set_random_seed(1)
  return keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Flatten(),
      keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])


class Run:
  """A tiny MLP trained with SGD + momentum under regime on n replicas (None: no strategy)."""

  def __init__(self, regime, n, clip=LOOSE_CLIP):
    self.replicator = (engine.Replicator(engine.Local(num_replicas=n, device="cpu"), regime)
                       if n is not None else None)
    self.regime = regime
    with self._scope():
      self.model = mlp()
      self.optimizer = keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=clip)
      regime.build_optimizer(self.optimizer, self.model.trainable_variables)
    x, y = helpers.random_images(GLOBAL_BATCH * STEPS)

    def input_fn(ctx):
      ds = tf.data.Dataset.from_tensor_slices((x, y))
      ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
      return ds.batch(ctx.per_replica_batch_size, drop_remainder=True).repeat().with_options(
          helpers.no_autotune())

    if self.replicator is not None:
      self.train = self.replicator.compile(self._step_fn, input_fn, GLOBAL_BATCH)
    else:
      batches = iter(input_fn(engine.InputContext(GLOBAL_BATCH, 0, 1, 1)))
      step = tf.function(self._step_fn)

      def train():
        outputs = step(next(batches))
        return {k: v.numpy() for k, v in outputs.items()}

      self.train = train

  def _scope(self):
    return self.replicator.scope() if self.replicator else contextlib.nullcontext()

  def _step_fn(self, batch):
    images, labels = batch
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
      loss = engine.average_loss(per_example, GLOBAL_BATCH)
    metrics = self.regime.apply_gradients(self.optimizer, tape.gradient(loss, variables),
                                          variables)
    return {"loss": engine.all_reduce(loss, "sum"), **metrics}

  def run(self, steps=STEPS) -> list:
    return [self.train() for _ in range(steps)]

  def variables(self) -> list:
    return self.model.trainable_variables + self.optimizer.variables

  def copies(self, variable) -> list:
    """Every replica's value of variable."""
    if self.replicator is None:
      return [variable.numpy()]
    return [c.numpy() for c in
            self.replicator.strategy.experimental_local_results(variable.value)]


def assert_replicas_equal(run):
  for v in run.variables():
    copies = run.copies(v)
    for c in copies[1:]:
      np.testing.assert_array_equal(c, copies[0], err_msg=f"{v.path} differs across replicas")


def assert_same_training(run, reference, exact):
  for v, ref in zip(run.variables(), reference.variables()):
    want = ref.numpy()
    for got in run.copies(v):
      if exact:
        np.testing.assert_array_equal(got, want, err_msg=v.path)
      else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=v.path)
