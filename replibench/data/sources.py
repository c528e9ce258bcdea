"""Image classification data sources, selected in gin by reference.

    ImageClassification.data = @FashionMNIST()

Each source builds one input pipeline from the engine's InputContext, so the
same config shards correctly over 1 replica, N local replicas or N workers.
"""

import dataclasses

import gin
import tensorflow as tf

from replibench.data import fashion_mnist, tfds_images


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


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TfdsImages:
  """A prepared TFDS image dataset (imagenet2012, cifar10); nothing is downloaded.

  The example and class counts are declared in the config, so a run can be
  planned on a machine that does not hold the data.
  """

  name: str = "imagenet2012"
  data_dir: str | None = None
  num_classes: int = 1000
  num_train_examples: int = 1_281_167
  image_size: int = 224
  train_split: str = "train"
  eval_split: str = "validation"

  @property
  def image_shape(self) -> tuple:
    return (self.image_size, self.image_size, 3)

  def train_examples(self) -> int:
    return self.num_train_examples

  def _dataset(self, ctx, split: str, training: bool, seed: int) -> tf.data.Dataset:
    ds = tfds_images.dataset(
        self.name, split, per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=training, seed=seed, image_size=self.image_size, data_dir=self.data_dir)
    return ds

  def train(self, ctx, seed: int) -> tf.data.Dataset:
    # TFDS file-level shuffling cannot seek: a resumed run skips the consumed batches.
    batches_done = ctx.start_step * ctx.num_replicas // ctx.num_input_pipelines
    return self._dataset(ctx, self.train_split, True, seed).skip(batches_done)

  def eval(self, ctx) -> tf.data.Dataset:
    return self._dataset(ctx, self.eval_split, False, 0)
