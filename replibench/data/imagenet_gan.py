"""TFDS imagenet2012 as a GAN data source (the class-conditional SN-GAN at 128x128).

Selected in gin by reference: ConditionalGAN.data = @Imagenet2012Gan(). Unlike
the classification pipeline in tfds_images (random-resized crops, per-channel
standardisation), images are a central square crop resized to image_size with
pixels in [-1, 1], the range of the generator's tanh output, and training adds
only a random flip.
"""

import dataclasses
import os

import gin
import tensorflow as tf

from replibench.data.resume import batches_consumed
from replibench.errors import UserError


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Imagenet2012Gan:
  """TFDS imagenet2012 for GANs: central square crop resized to image_size, random
  flip, pixels in [-1, 1]; nothing is downloaded (download=False).

  Counts are declared, so a run plans without the data.
  """

  data_dir: str | None = None
  image_size: int = 128
  num_classes: int = 1000
  num_train_examples: int = 1_281_167
  shuffle_buffer: int = 10_000

  @property
  def image_shape(self) -> tuple:
    return (self.image_size, self.image_size, 3)

  def train_examples(self) -> int:
    return self.num_train_examples

  def _load(self, split: str, **kwargs) -> tf.data.Dataset:
    import tensorflow_datasets as tfds  # Heavy import: only when the data is read.
    try:
      return tfds.load("imagenet2012", split=split, data_dir=self.data_dir, download=False,
                       as_supervised=True, **kwargs)
    except (AssertionError, tfds.core.registered.DatasetNotFoundError, FileNotFoundError,
            ValueError) as e:
      where = self.data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
      raise UserError(
          f"Imagenet2012Gan: TFDS 'imagenet2012' (split {split!r}) is not prepared in {where}, "
          f"and nothing is downloaded at run time. Prepare it (`tfds build imagenet2012 "
          f"--data_dir={where}` with the manual download in {where}/downloads/manual) or set "
          f"Imagenet2012Gan.data_dir. ({type(e).__name__})") from None

  def _square(self, image):
    shape = tf.shape(image)
    side = tf.minimum(shape[0], shape[1])
    image = tf.image.crop_to_bounding_box(image, (shape[0] - side) // 2,
                                          (shape[1] - side) // 2, side, side)
    image = tf.image.resize(image, (self.image_size, self.image_size), antialias=True)
    return tf.clip_by_value(image / 127.5 - 1.0, -1.0, 1.0)

  def train(self, ctx, seed: int) -> tf.data.Dataset:
    """Endless (images [b, s, s, 3] in [-1, 1], labels [b] int32), sharded by file."""
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    read_config = tfds.ReadConfig(shuffle_seed=seed, input_context=tf.distribute.InputContext(
        ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_input_pipelines))
    ds = self._load("train", shuffle_files=True, read_config=read_config)
    base = seed * 1_000_003 + ctx.input_pipeline_id

    def preprocess(i, example):
      image, label = example
      image = tf.image.stateless_random_flip_left_right(
          self._square(image), tf.stack([tf.constant(base, tf.int64), i]))
      return image, tf.cast(label, tf.int32)

    ds = ds.shuffle(self.shuffle_buffer, seed=base).repeat().enumerate()
    ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    # File shuffling cannot seek: a resumed run skips the batches consumed.
    ds = ds.batch(ctx.per_replica_batch_size, drop_remainder=True)
    return ctx.kept(ds.skip(batches_consumed(ctx))).prefetch(2)

  def reference_batches(self, split: str, batch_size: int):
    """Unshuffled, unflipped numpy batches [n, s, s, 3] in [-1, 1] of 'train' or
    'held_out' (the validation split)."""
    ds = self._load("validation" if split == "held_out" else "train")
    ds = ds.map(lambda image, _: self._square(image), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(2).as_numpy_iterator()
