"""Fashion-MNIST (Xiao et al. 2017): 60,000 train / 10,000 test 28x28 grey images, 10 classes.

Where the data comes from, in order:
  1. the four IDX .gz files in `data_dir`, or when no data_dir is given in
     $REPLIBENCH_FASHION_MNIST_DIR if set (tools/accelerator/run.sh carries them there),
     else in /usr/share/datasets/fashion-mnist (Debian's `dataset-fashion-mnist`);
  2. TFDS `fashion_mnist`, already prepared in `data_dir` (or TFDS's default data
     dir), with download=False: nothing is fetched at run time.
Anything else is a UserError that names every place looked at.

`dataset()` is an input_fn for one input pipeline. Its sharding contract, which
the engine's replication tests rely on: pipelines split each *global* batch at
example level, so with N pipelines at per-replica batch B/N the union of what
they yield at step s is exactly what one pipeline at batch B yields at step s
(and, unshuffled, that is examples [sB, (s+1)B) of the split). Shuffling is a
seeded permutation of the whole split per epoch, identical in every pipeline, so
this holds with shuffling too; augmentation is per pipeline.
"""

from __future__ import annotations

import functools
import gzip
import os
import struct

import numpy as np
import tensorflow as tf

from replibench.data import partition
from replibench.errors import UserError

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
DIR_ENV = "REPLIBENCH_FASHION_MNIST_DIR"   # Where the IDX files are, if not DEFAULT_DIR.
SPLITS = ("train", "test")
NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)
# Per-pixel statistics of the training split (pixels scaled to [0, 1]).
MEAN, STD = 0.2860, 0.3530

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IMAGES_MAGIC, _LABELS_MAGIC = 0x00000803, 0x00000801  # ubyte, 3 dims / ubyte, 1 dim


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise UserError(f"Fashion-MNIST split {split!r}: must be one of {SPLITS}.")


def _find(directory: str, stem: str) -> str | None:
  for name in (stem + ".gz", stem):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  return None


def _read_idx(path: str, magic: int, dims: int) -> np.ndarray:
  """Reads one IDX file (optionally gzipped), checking its header against the payload."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise UserError(f"Cannot read Fashion-MNIST file {path}: {e}") from e
  header = 4 + 4 * dims
  if len(data) < header:
    raise UserError(f"{path}: {len(data)} bytes is too short for an IDX header.")
  (found,) = struct.unpack(">I", data[:4])
  if found != magic:
    raise UserError(f"{path}: IDX magic number 0x{found:08x}, expected 0x{magic:08x} "
                    f"(unsigned bytes, {dims} dimension(s)); the file is not what its name says.")
  shape = struct.unpack(">" + "I" * dims, data[4:header])
  if len(data) - header != int(np.prod(shape)):
    raise UserError(f"{path}: header says shape {shape} ({int(np.prod(shape))} bytes) but "
                    f"{len(data) - header} bytes follow it; the file is truncated or corrupt.")
  return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _load_idx(directory: str, split: str) -> tuple[np.ndarray, np.ndarray] | None:
  images_stem, labels_stem = _FILES[split]
  images_path, labels_path = _find(directory, images_stem), _find(directory, labels_stem)
  if images_path is None or labels_path is None:
    return None
  images = _read_idx(images_path, _IMAGES_MAGIC, 3)
  labels = _read_idx(labels_path, _LABELS_MAGIC, 1)
  if images.shape[1:] != IMAGE_SHAPE:
    raise UserError(f"{images_path}: images are {images.shape[1:]}, expected {IMAGE_SHAPE}.")
  if images.shape[0] != labels.shape[0]:
    raise UserError(f"{images_path} has {images.shape[0]} images but {labels_path} has "
                    f"{labels.shape[0]} labels.")
  if labels.size and labels.max() >= NUM_CLASSES:
    raise UserError(f"{labels_path}: label {int(labels.max())} is out of range 0..9.")
  return images, labels.astype(np.int64)


def _tfds_dir(data_dir: str | None) -> str:
  return data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def _load_tfds(split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray] | None:
  try:
    import tensorflow_datasets as tfds  # Slow to import: only when the IDX files are missing.
  except ImportError:
    return None
  try:
    images, labels = tfds.as_numpy(tfds.load(
        "fashion_mnist", split=split, data_dir=data_dir, download=False, batch_size=-1,
        as_supervised=True))
  except (AssertionError, tfds.core.registered.DatasetNotFoundError, FileNotFoundError):
    return None  # Not prepared there.
  return images[..., 0].astype(np.uint8), labels.astype(np.int64)


@functools.lru_cache(maxsize=8)
def _load_cached(split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
  idx_dir = data_dir or os.environ.get(DIR_ENV) or DEFAULT_DIR
  found = _load_idx(idx_dir, split) or _load_tfds(split, data_dir)
  if found is None:
    images_stem, labels_stem = _FILES[split]
    raise UserError(
        f"Fashion-MNIST {split!r} split not found. Looked for {images_stem}.gz and "
        f"{labels_stem}.gz in {idx_dir}, and for a prepared TFDS 'fashion_mnist' in "
        f"{_tfds_dir(data_dir)} (download=False). Fix: install the Debian package "
        f"(apt-get install dataset-fashion-mnist, which fills {DEFAULT_DIR}; `make data` does "
        f"this), or point data_dir at a directory holding the four IDX .gz files or a TFDS "
        f"data_dir where fashion_mnist is prepared.")
  images, labels = found
  images.setflags(write=False)
  labels.setflags(write=False)
  return images, labels


def load(split: str, data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N,28,28], labels int64 [N]) of `split`; cached per process, read-only."""
  _check_split(split)
  return _load_cached(split, os.path.abspath(data_dir) if data_dir else None)


def normalize(images: tf.Tensor) -> tf.Tensor:
  """uint8 [..., 28, 28] -> float32 [..., 28, 28, 1], standardised with the train statistics."""
  x = tf.cast(images, tf.float32)[..., None] * (1.0 / 255.0)
  return (x - MEAN) * (1.0 / STD)


def augment_batch(images: tf.Tensor, seed: tf.Tensor, crop_padding: int = 2,
                  flip: bool = True) -> tf.Tensor:
  """Random crop with zero padding + random horizontal flip, on a whole batch at once.

  images: [b, h, w] or [b, h, w, c], any dtype (the pipeline passes raw uint8, so
  padding is black); seed: int shape [2] (stateless RNG). Each example gets its
  own offsets and flip; two batched gathers do the crop, so the cost is about a
  copy of the batch (far cheaper on 2 cores than per-example tf.image ops).
  """
  b = tf.shape(images)[0]
  h, w = images.shape[1], images.shape[2]
  seeds = tf.random.experimental.stateless_split(seed, 2)
  if crop_padding:
    p = crop_padding
    pads = [[0, 0], [p, p], [p, p]] + [[0, 0]] * (images.shape.rank - 3)
    padded = tf.pad(images, pads)
    offsets = tf.random.stateless_uniform([b, 2], seeds[0], 0, 2 * p + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(h)[None]
    cols = offsets[:, 1:] + tf.range(w)[None]
    images = tf.gather(padded, rows, axis=1, batch_dims=1)
    images = tf.gather(images, cols, axis=2, batch_dims=1)
  if flip:
    mask = tf.random.stateless_uniform([b], seeds[1]) < 0.5
    mask = tf.reshape(mask, [-1] + [1] * (images.shape.rank - 1))
    images = tf.where(mask, tf.reverse(images, axis=[2]), images)
  return images


# Built with AutoGraph off: tf.data then traces its map functions unconverted (they use
# tf ops only; engine/regimes/base.py says what conversion costs each process).
@tf.autograph.experimental.do_not_convert
def dataset(split: str, *, per_replica_batch_size: int, input_pipeline_id: int = 0,
            num_input_pipelines: int = 1, training: bool, seed: int, augment: bool = True,
            shuffle: bool = True, crop_padding: int = 0, flip: bool = True,
            data_dir: str | None = None, num_examples: int | None = None,
            skip_batches: int = 0, keep=None) -> tf.data.Dataset:
  """One input pipeline's batches: (images float32 [b,28,28,1], labels int32 [b]).

  training=True: an endless stream; per epoch a permutation of the split seeded by
  (seed, epoch) when shuffle, the global batch (num_input_pipelines *
  per_replica_batch_size) split at example level between pipelines (pipeline i
  takes positions i, i+N, ...), partial global batches dropped, then (augment)
  a random horizontal flip (flip) and, if crop_padding > 0, a random crop of the
  image zero-padded by crop_padding. The default (flip only) is the tuned recipe's:
  in a ~10-epoch schedule the small ResNet underfits, and crops cost accuracy per
  epoch (deaceb2:benchmarks/tune_fmnist_recipe.py).
  training=False: every example of the split once, in order, pipeline i taking
  examples i, i+N, ...; the last batch may be smaller; never shuffled or augmented.
  keep (training): a function of the stream of batches (the engine's
  InputContext.kept) applied before any example is gathered or augmented, so a worker
  that keeps its replicas' batches of the one-process stream makes only those.
  """
  _check_split(split)
  n_pipes, pipe = int(num_input_pipelines), int(input_pipeline_id)
  if n_pipes < 1 or not 0 <= pipe < n_pipes:
    raise UserError(f"input_pipeline_id={pipe}, num_input_pipelines={n_pipes}: need "
                    f"0 <= input_pipeline_id < num_input_pipelines.")
  if per_replica_batch_size < 1:
    raise UserError(f"per_replica_batch_size={per_replica_batch_size}: must be >= 1.")
  images_np, labels_np = load(split, data_dir)
  if num_examples is not None:   # A prefix of the split, for quick tries and tests.
    images_np, labels_np = images_np[:num_examples], labels_np[:num_examples]
  n = len(labels_np)
  images = tf.constant(images_np)
  labels = tf.constant(labels_np.astype(np.int32))

  if not training:
    ds = tf.data.Dataset.range(n).shard(n_pipes, pipe)
    ds = ds.batch(per_replica_batch_size, drop_remainder=False)
    ds = ds.map(lambda idx: (normalize(tf.gather(images, idx)), tf.gather(labels, idx)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)

  global_batch = n_pipes * per_replica_batch_size
  if global_batch > n:
    raise UserError(f"Global batch {global_batch} is larger than the {n} examples of "
                    f"Fashion-MNIST {split!r}.")

  def epoch_order(epoch):
    order = tf.range(n, dtype=tf.int64)
    if shuffle:
      order = tf.random.experimental.stateless_shuffle(
          order, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
    return order

  # Endless stream of example indices, grouped into global batches; this pipeline
  # takes every n_pipes-th position of each (the same as shard() at example level).
  ds = tf.data.Dataset.counter().map(epoch_order).unbatch()
  ds = ds.batch(global_batch, drop_remainder=True)
  ds = tf.data.Dataset.zip(ds, tf.data.Dataset.counter())
  # A resumed run skips the batches it already trained on. Only indices are
  # skipped here (before gathering and augmenting), and the counter keeps each
  # batch's augmentation seed, so resuming is exact.
  ds = ds.skip(skip_batches)
  if keep is not None:
    ds = keep(ds)

  make_batch = _batch_maker(images, labels, seed, augment, crop_padding, flip)
  ds = ds.map(lambda idx, step: make_batch(idx[pipe::n_pipes], step, pipe),
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.prefetch(tf.data.AUTOTUNE)


def _batch_maker(images, labels, seed: int, augment: bool, crop_padding: int, flip: bool):
  """make_batch(idx int [b], step int64, stream) -> (images float32 [b,28,28,1], labels
  int32 [b]): the examples at idx, augmented with a seed of (seed, stream, step), so
  each pipeline (or replica) stream and batch has its own, and a resume repeats it."""

  def make_batch(idx, step, stream):
    x, y = tf.gather(images, idx), tf.gather(labels, idx)
    if augment:
      x = augment_batch(x, tf.stack([tf.constant(seed, tf.int64) * 1_000_003 + stream, step]),
                        crop_padding=crop_padding, flip=flip)
    return normalize(x), y

  return make_batch


def partitioned_dataset(ctx, *, scheme: str, alpha: float, seed: int, augment: bool = True,
                        crop_padding: int = 0, flip: bool = True, data_dir: str | None = None,
                        num_examples: int | None = None) -> tf.data.Dataset:
  """One pipeline's endless training batches when every replica owns a fixed shard of the
  train split (data/partition.py: scheme, alpha): (images float32 [b,28,28,1], labels
  int32 [b]) for its replicas in turn. ctx: the engine's InputContext; a resumed run
  (ctx.start_step) skips each replica's consumed batches."""
  images_np, labels_np = load("train", data_dir)
  images_np, labels_np = images_np[:num_examples], labels_np[:num_examples]
  images, labels = tf.constant(images_np), tf.constant(labels_np.astype(np.int32))
  ds = partition.pipeline_streams(labels_np, ctx, scheme, alpha, seed,
                                  skip_batches=ctx.start_step)

  ds = ds.map(_batch_maker(images, labels, seed, augment, crop_padding, flip),
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.prefetch(tf.data.AUTOTUNE)
