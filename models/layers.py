"""Layers shared by the models."""

import keras


class MeanAggregatedBatchNorm(keras.layers.BatchNormalization):
  """BatchNormalization whose moving statistics stay identical across replicas.

  Keras 3 creates the moving mean/variance with aggregation 'none', so under
  tf.distribute every replica silently keeps its own copy. With 'mean' each
  update is averaged over replicas (what tf.keras did). Batch statistics are
  still per replica; plug a cross-replica BN into the norm factory for global ones.
  """

  def add_weight(self, *args, trainable=True, aggregation="none", **kwargs):
    if not trainable and aggregation == "none":
      aggregation = "mean"
    return super().add_weight(*args, trainable=trainable, aggregation=aggregation, **kwargs)
