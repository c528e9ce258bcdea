"""Image classification data sources, selected in gin by reference.

    ImageClassification.data = @FashionMNIST()

Each source builds one input pipeline from the engine's InputContext, so the
same config shards correctly over 1 replica, N local replicas or N workers.
"""

import dataclasses

import gin
import tensorflow as tf

from replibench.data import fashion_mnist


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FashionMNIST:
  """Fashion-MNIST: 60k train / 10k test, 28x28x1, 10 classes (Debian files or TFDS)."""

  data_dir: str | None = None
  augment: bool = True
  shuffle: bool = True
  num_classes = 10
  image_shape = (28, 28, 1)

  def train_examples(self) -> int:
    return len(fashion_mnist.load("train", self.data_dir)[1])

  def train(self, ctx, seed: int) -> tf.data.Dataset:
    """Endless (images [b,28,28,1] float32, labels [b] int32) at ctx's batch size."""
    batches_done = ctx.start_step * ctx.num_replicas // ctx.num_input_pipelines
    return fashion_mnist.dataset(
        "train", per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=True, seed=seed, augment=self.augment, shuffle=self.shuffle,
        data_dir=self.data_dir).skip(batches_done)

  def eval(self, ctx) -> tf.data.Dataset:
    """The whole test split once, sharded over pipelines."""
    return fashion_mnist.dataset(
        "test", per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=False, seed=0, data_dir=self.data_dir)
