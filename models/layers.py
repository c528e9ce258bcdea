"""Layers shared by the models."""

import keras
import tensorflow as tf

_MOVING = ("moving_mean", "moving_variance")


class MeanAggregatedBatchNorm(keras.layers.BatchNormalization):
  """BatchNormalization whose moving statistics are the mean over replicas.

  Batch statistics are per replica (plug a cross-replica BN into the norm factory for
  global ones). Keras 3 makes the moving mean and variance with aggregation 'none', so
  under tf.distribute every replica would silently keep, and evaluate with, its own
  copy. Here they are on-read variables aggregated by 'mean': each replica updates
  its own copy from its batch, with no communication inside the training step (so the
  step compiles with XLA: a write-averaged update would go through tf.distribute's
  merge_call, which no XLA cluster holds), and a read outside a replica (a
  checkpoint, the host) gives the replicas' mean. The moving average is linear in the
  batch moments, so that mean is exactly what averaging every update over the replicas
  (tf.keras' aggregation) gives, up to float rounding. Inference inside a replicated
  step (evaluation) averages the two statistics over the replicas first (one
  all-reduce), so that every replica evaluates with the same, checkpointed, values.
  """

  def add_weight(self, *args, name=None, **kwargs):
    if name not in _MOVING:
      return super().add_weight(*args, name=name, **kwargs)
    return keras.Variable(
        initializer=keras.initializers.get(kwargs.get("initializer")), shape=kwargs.get("shape"),
        dtype=kwargs.get("dtype") or self.variable_dtype, trainable=False,
        autocast=False, aggregation="mean", synchronization="on_read", name=name)

  def call(self, inputs, training=None, mask=None):
    context = tf.distribute.get_replica_context()
    if training or context is None or context.num_replicas_in_sync == 1:
      return super().call(inputs, training=training, mask=mask)
    # tf.identity places each statistic on this replica's device (what all_reduce needs).
    mean, variance = context.all_reduce(
        tf.distribute.ReduceOp.MEAN,
        [tf.identity(self.moving_mean.value), tf.identity(self.moving_variance.value)])
    shape = [1] * len(inputs.shape)
    axis = self.axis if isinstance(self.axis, int) else self.axis[0]
    shape[axis] = inputs.shape[axis]
    # In float32 like Keras' own batch norm, whatever the compute dtype (mixed precision).
    reshape = lambda t: tf.cast(tf.reshape(t, shape), tf.float32)  # noqa: E731
    outputs = tf.nn.batch_normalization(
        tf.cast(inputs, tf.float32), reshape(mean), reshape(variance),
        reshape(self.beta) if self.center else None,
        reshape(self.gamma) if self.scale else None, self.epsilon)
    return tf.cast(outputs, self.compute_dtype)


# Where a model may be split across devices. A model built with `conv_layer` (a factory
# with Keras Conv2D's arguments and one more, `split`) names, per convolution, which of
# its channels could be divided among the devices of one model replica; the factory
# decides whether to divide them. Megatron's pairing (Shoeybi et al. 2019): a layer
# divided by its output channels, then only per-channel layers (normalisation,
# activation), then a layer divided by its input channels, whose partial results are
# summed. The models know nothing of devices: this default keeps every layer whole.
SPLIT_OUTPUT, SPLIT_INPUT = "output", "input"


def conv2d(*args, split: str | None = None, **kwargs) -> keras.layers.Conv2D:
  """keras.layers.Conv2D(*args, **kwargs), whole; split ('output', 'input' or None)
  says how a model-parallel factory may divide it (see above)."""
  if split not in (None, SPLIT_OUTPUT, SPLIT_INPUT):
    raise ValueError(f"conv2d(split={split!r}): must be 'output', 'input' or None.")
  return keras.layers.Conv2D(*args, **kwargs)
