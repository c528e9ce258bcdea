"""Image classification data sources, selected in gin by reference.

    ImageClassification.data = @FashionMNIST()

Each source builds one input pipeline from the engine's InputContext, so the
same config shards correctly over 1 replica, N local replicas or N workers; a
context's `keep` (worker processes) is honoured by every source (ctx.kept or
ctx.replica_range), which the classification workload's engine.keeps_replicas says.
"""

import dataclasses

import gin
import tensorflow as tf

from replibench.data import fashion_mnist, partition, tfds_images
from replibench.data.resume import batches_consumed
from replibench.errors import UserError
from replibench.inputs import shown


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FashionMNIST:
  """Fashion-MNIST: 60k train / 10k test, 28x28x1, 10 classes (Debian files or TFDS)."""

  data_dir: str | None = None
  augment: bool = True
  shuffle: bool = True
  # 'standardized' (train mean 0, std 1: classifiers) or 'tanh' ([-1, 1]: the
  # range of a tanh generator, for GAN discriminators).
  pixels: str = "standardized"
  num_train_examples: int | None = None   # A prefix of each split (quick tries, tests);
  num_eval_examples: int | None = None    # None = all 60,000 / 10,000.
  # Decentralised data (data/partition.py): None, every replica reads the whole split;
  # 'iid' | 'dirichlet' | 'by_class', each replica its own fixed shard for the run.
  partition: str | None = None
  dirichlet_alpha: float = 0.1
  num_classes = 10
  image_shape = (28, 28, 1)

  def __post_init__(self):
    partition.check(self.partition, self.dirichlet_alpha)
    if self.pixels not in ("standardized", "tanh"):
      raise UserError(f"FashionMNIST.pixels = {shown(self.pixels)}: must be 'standardized' or "
                      f"'tanh'.")
    for name, limit in (("num_train_examples", 60_000), ("num_eval_examples", 10_000)):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                or not 1 <= value <= limit):
        raise UserError(f"FashionMNIST.{name} = {shown(value)}: must be None (the whole split) "
                        f"or a whole number of examples from 1 to {limit:,}.")

  def _rescale(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    if self.pixels == "standardized":
      return ds
    # Undo the standardisation: x * STD + MEAN is in [0, 1]; clip the rounding.
    scale, shift = 2.0 * fashion_mnist.STD, 2.0 * fashion_mnist.MEAN - 1.0
    return ds.map(lambda x, y: (tf.clip_by_value(x * scale + shift, -1.0, 1.0), y))

  def train_examples(self) -> int:
    return len(fashion_mnist.load("train", self.data_dir)[1][:self.num_train_examples])

  def train(self, ctx, seed: int) -> tf.data.Dataset:
    """Endless (images [b,28,28,1] float32, labels [b] int32) at ctx's batch size."""
    if self.partition is not None:
      return self._rescale(fashion_mnist.partitioned_dataset(
          ctx, scheme=self.partition, alpha=self.dirichlet_alpha, seed=seed,
          augment=self.augment, data_dir=self.data_dir, num_examples=self.num_train_examples))
    ds = fashion_mnist.dataset(
        "train", per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=True, seed=seed, augment=self.augment, shuffle=self.shuffle,
        data_dir=self.data_dir, num_examples=self.num_train_examples,
        skip_batches=batches_consumed(ctx), keep=ctx.kept)
    return self._rescale(ds)

  def eval_examples(self) -> int:
    return self.num_eval_examples or 10_000

  def eval(self, ctx) -> tf.data.Dataset:
    """The whole test split once, sharded over pipelines."""
    return self._rescale(fashion_mnist.dataset(
        "test", per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=False, seed=0, data_dir=self.data_dir, num_examples=self.num_eval_examples))


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
  num_eval_examples: int = 50_000
  image_size: int = 224
  train_split: str = "train"
  eval_split: str = "validation"

  def __post_init__(self):
    for name in ("num_classes", "num_train_examples", "num_eval_examples", "image_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"TfdsImages.{name} = {shown(value)}: must be a positive integer.")

  @property
  def image_shape(self) -> tuple:
    return (self.image_size, self.image_size, 3)

  def train_examples(self) -> int:
    return self.num_train_examples

  def eval_examples(self) -> int:
    return self.num_eval_examples

  def _dataset(self, ctx, split: str, training: bool, seed: int) -> tf.data.Dataset:
    ds = tfds_images.dataset(
        self.name, split, per_replica_batch_size=ctx.per_replica_batch_size,
        input_pipeline_id=ctx.input_pipeline_id, num_input_pipelines=ctx.num_input_pipelines,
        training=training, seed=seed, image_size=self.image_size, data_dir=self.data_dir)
    return ds

  def train(self, ctx, seed: int) -> tf.data.Dataset:
    # TFDS file-level shuffling cannot seek: a resumed run skips the consumed batches.
    return ctx.kept(self._dataset(ctx, self.train_split, True, seed).skip(batches_consumed(ctx)))

  def eval(self, ctx) -> tf.data.Dataset:
    return self._dataset(ctx, self.eval_split, False, 0)
