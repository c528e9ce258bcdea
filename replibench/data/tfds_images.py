"""TFDS image classification pipelines: imagenet2012 (ResNet-50) and cifar10.

Nothing is downloaded: tfds.load(..., download=False). A dataset that is not
prepared in data_dir is a UserError naming it and the directory looked in.
ImageNet preprocessing is the standard ResNet one (Goyal et al.; TF Model
Garden): training takes a random-resized crop (area 8-100%, aspect 3/4-4/3)
resized to image_size, and a random flip; evaluation resizes the shorter side to
image_size * 256/224 and takes the central image_size square. CIFAR-10 trains on
4-pixel-padded random crops + flips. Images are standardised per channel.
Training input is sharded by file (InputContext), shuffled, repeated; the
evaluation split is read whole by each pipeline, split at example level.
"""

from __future__ import annotations

import os

import tensorflow as tf

from replibench.errors import UserError

SUPPORTED = ("imagenet2012", "cifar10")
_MEAN_STD = {
    "imagenet2012": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


def _normalize(image, name):
  mean, std = _MEAN_STD[name]
  return (tf.cast(image, tf.float32) / 255.0 - mean) / std


def _imagenet_train(image, size, seed):
  bbox = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bbox, seed=seed, min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  image = tf.slice(image, begin, crop_size)
  image = tf.image.resize(image, [size, size], method="bilinear")
  return tf.image.stateless_random_flip_left_right(image, seed=seed + 1)


def _imagenet_eval(image, size):
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  scale = size * 256 / 224 / tf.minimum(h, w)
  new_h = tf.cast(tf.round(h * scale), tf.int32)
  new_w = tf.cast(tf.round(w * scale), tf.int32)
  image = tf.image.resize(image, [new_h, new_w], method="bilinear")
  top, left = (new_h - size) // 2, (new_w - size) // 2
  return tf.slice(image, [top, left, 0], [size, size, 3])


def _cifar_train(image, size, seed):
  image = tf.image.resize_with_crop_or_pad(image, size + 8, size + 8)
  image = tf.image.stateless_random_crop(image, [size, size, 3], seed=seed)
  return tf.image.stateless_random_flip_left_right(image, seed=seed + 1)


def dataset(name: str, split: str, *, per_replica_batch_size: int, input_pipeline_id: int = 0,
            num_input_pipelines: int = 1, training: bool, seed: int,
            image_size: int | None = None, data_dir: str | None = None) -> tf.data.Dataset:
  """One input pipeline's (images float32 [b,s,s,3], labels int32 [b]) batches."""
  if name not in SUPPORTED:
    raise UserError(f"tfds_images.dataset: dataset {name!r} is not supported; use one of "
                    f"{SUPPORTED}.")
  size = image_size or (224 if name == "imagenet2012" else 32)
  import tensorflow_datasets as tfds  # Heavy import: only when used.

  read_config = tfds.ReadConfig(
      shuffle_seed=seed,
      input_context=tf.distribute.InputContext(num_input_pipelines, input_pipeline_id,
                                               num_input_pipelines) if training else None)
  try:
    ds = tfds.load(name, split=split, data_dir=data_dir, download=False, as_supervised=True,
                   shuffle_files=training, read_config=read_config)
  except (AssertionError, tfds.core.registered.DatasetNotFoundError, FileNotFoundError,
          ValueError) as e:
    where = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser(
        "~/tensorflow_datasets")
    raise UserError(
        f"TFDS dataset {name!r} (split {split!r}) is not prepared in {where}, and nothing is "
        f"downloaded at run time (download=False). Prepare it there first (e.g. `tfds build "
        f"{name} --data_dir={where}`; imagenet2012 needs its manual download in "
        f"{where}/downloads/manual), or pass the data_dir where it is. ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''})") from e

  base_seed = int(seed) * 1_000_003 + int(input_pipeline_id)
  if training:
    ds = ds.shuffle(16 * per_replica_batch_size, seed=base_seed).repeat()
    ds = ds.enumerate()

    def train_map(i, example):
      image, label = example
      s = tf.stack([tf.constant(base_seed, tf.int64), i])
      if name == "imagenet2012":
        image = _imagenet_train(image, size, s)
      else:
        image = _cifar_train(image, size, s)
      return _normalize(image, name), tf.cast(label, tf.int32)

    ds = ds.map(train_map, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(per_replica_batch_size, drop_remainder=True)
  else:
    ds = ds.shard(num_input_pipelines, input_pipeline_id)

    def eval_map(image, label):
      if name == "imagenet2012":
        image = _imagenet_eval(image, size)
      return _normalize(image, name), tf.cast(label, tf.int32)

    ds = ds.map(eval_map, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(per_replica_batch_size, drop_remainder=False)
  return ds.prefetch(tf.data.AUTOTUNE)
