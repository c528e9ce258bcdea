"""Cross-replica ("global") batch normalization.

Batch statistics come from the whole global batch rather than each replica's
share: every replica all-reduces [sum x, sum x^2, count] in one collective and
derives mean = E[x], var = E[x^2] - E[x]^2. With this layer N replicas at global
batch B compute exactly what one replica computes at batch B. Models receive it
through gin (`norm_layer = @engine.cross_replica_batch_norm`), never by import.
"""

import gin
import keras
import tensorflow as tf

from replibench.engine import collectives


class CrossReplicaBatchNorm(keras.layers.BatchNormalization):
  """keras BatchNormalization whose training moments span all replicas."""

  def _moments(self, inputs, mask):
    if mask is not None:
      raise ValueError("CrossReplicaBatchNorm does not support masks.")
    axes = list(self._reduction_axes)
    x = tf.cast(inputs, tf.float32)
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
    sums = tf.reduce_sum(x, axes)
    local = tf.stack([sums, tf.reduce_sum(tf.square(x), axes), tf.ones_like(sums) * count])
    total = collectives.all_reduce(local, "sum")
    mean = total[0] / total[2]
    variance = tf.maximum(total[1] / total[2] - tf.square(mean), 0.0)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


# gin's class decorator hides __init__'s signature from Keras's Layer.__new__,
# so configs reference this factory instead of the class.
@gin.configurable(module="engine")
def cross_replica_batch_norm(**kwargs) -> CrossReplicaBatchNorm:
  """Factory for models' `norm_layer` argument: CrossReplicaBatchNorm(**kwargs)."""
  return CrossReplicaBatchNorm(**kwargs)
