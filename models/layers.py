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
