"""replibench.data: IDX loading and validation, the sharding contract, augmentation, errors.

Most tests run on small synthetic IDX files whose images encode their own index,
so every batch can be traced back to the examples it holds.
"""

import dataclasses
import gzip
import os
import struct

import numpy as np
import pytest
import tensorflow as tf

from replibench.data import fashion_mnist, tfds_images
from replibench.errors import UserError

N_TRAIN, N_TEST = 100, 30


def _write_idx(path, array, magic, gz=True):
  header = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape)
  data = header + array.astype(np.uint8).tobytes()
  with (gzip.open if gz else open)(path, "wb") as f:
    f.write(data)


def _images(n):
  """Image i has i % 251 at (0,0), i // 251 at (0,1), a bright bar on the left otherwise."""
  x = np.zeros((n, 28, 28), np.uint8)
  x[:, 5:20, 3:6] = 200
  x[:, 0, 0] = np.arange(n) % 251
  x[:, 0, 1] = np.arange(n) // 251
  return x


def _make_dir(root, n_train=N_TRAIN, n_test=N_TEST):
  os.makedirs(root, exist_ok=True)
  for split, n in (("train", n_train), ("t10k", n_test)):
    _write_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"), _images(n), 0x803)
    _write_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"), np.arange(n) % 10, 0x801)
  return str(root)


@pytest.fixture
def fake_dir(tmp_path):
  return _make_dir(tmp_path / "fmnist")


def _ids(images):
  """Recovers example indices from normalised unaugmented images."""
  raw = np.rint((images[..., 0] * fashion_mnist.STD + fashion_mnist.MEAN) * 255).astype(int)
  return raw[:, 0, 0] + 251 * raw[:, 0, 1]


def _steps(ds, n):
  return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


# ---------------------------------------------------------------- load


def test_load_reads_idx_files(fake_dir):
  x, y = fashion_mnist.load("train", data_dir=fake_dir)
  assert x.shape == (N_TRAIN, 28, 28) and x.dtype == np.uint8
  assert y.shape == (N_TRAIN,) and y.dtype == np.int64
  np.testing.assert_array_equal(x, _images(N_TRAIN))
  np.testing.assert_array_equal(y, np.arange(N_TRAIN) % 10)
  xt, _ = fashion_mnist.load("test", data_dir=fake_dir)
  assert xt.shape == (N_TEST, 28, 28)


def test_load_reads_the_directory_the_environment_names(fake_dir, monkeypatch):
  """$REPLIBENCH_FASHION_MNIST_DIR (where tools/accelerator/run.sh unpacks the files it
  carries) before the Debian directory, when no data_dir is given."""
  monkeypatch.setenv(fashion_mnist.DIR_ENV, fake_dir)
  fashion_mnist._load_cached.cache_clear()  # pylint: disable=protected-access
  try:
    x, _ = fashion_mnist.load("test")
  finally:
    fashion_mnist._load_cached.cache_clear()  # pylint: disable=protected-access
  np.testing.assert_array_equal(x, _images(N_TEST))


def test_load_caches_read_only_arrays(fake_dir):
  a = fashion_mnist.load("train", data_dir=fake_dir)
  b = fashion_mnist.load("train", data_dir=fake_dir + "/")
  assert a[0] is b[0] and a[1] is b[1]
  with pytest.raises(ValueError):
    a[0][0, 0, 0] = 1


def test_load_accepts_uncompressed_files(tmp_path):
  root = tmp_path / "raw"
  root.mkdir()
  _write_idx(root / "t10k-images-idx3-ubyte", _images(7), 0x803, gz=False)
  _write_idx(root / "t10k-labels-idx1-ubyte", np.arange(7) % 10, 0x801, gz=False)
  x, y = fashion_mnist.load("test", data_dir=str(root))
  assert x.shape == (7, 28, 28) and list(y) == list(range(7))


@pytest.mark.parametrize("corrupt, match", [
    ("magic", "magic number"),
    ("truncated", "truncated"),
    ("count", "labels"),
    ("shape", "expected"),
    ("label_range", "out of range"),
])
def test_load_validates_idx_headers(tmp_path, corrupt, match):
  root = _make_dir(tmp_path / corrupt)
  images, labels = _images(N_TEST), np.arange(N_TEST) % 10
  img_path = os.path.join(root, "t10k-images-idx3-ubyte.gz")
  lab_path = os.path.join(root, "t10k-labels-idx1-ubyte.gz")
  if corrupt == "magic":
    _write_idx(img_path, images, 0x801)
  elif corrupt == "truncated":
    with gzip.open(img_path, "wb") as f:
      f.write(struct.pack(">IIII", 0x803, N_TEST, 28, 28) + images.tobytes()[:-5])
  elif corrupt == "count":
    _write_idx(lab_path, labels[:-1], 0x801)
  elif corrupt == "shape":
    _write_idx(img_path, np.zeros((N_TEST, 32, 32), np.uint8), 0x803)
  else:
    _write_idx(lab_path, labels + 5, 0x801)
  with pytest.raises(UserError, match=match):
    fashion_mnist.load("test", data_dir=root)


def test_missing_data_names_every_place_and_the_fix(tmp_path):
  empty = str(tmp_path / "nothing")
  with pytest.raises(UserError) as err:
    fashion_mnist.load("train", data_dir=empty)
  msg = str(err.value)
  for needle in ("train-images-idx3-ubyte.gz", empty, "TFDS", "fashion_mnist",
                 "apt-get install dataset-fashion-mnist", "data_dir"):
    assert needle in msg


def test_bad_split_is_a_user_error(fake_dir):
  with pytest.raises(UserError, match="split"):
    fashion_mnist.load("validation", data_dir=fake_dir)
  with pytest.raises(UserError, match="split"):
    fashion_mnist.dataset("val", per_replica_batch_size=4, training=False, seed=0,
                          data_dir=fake_dir)


@pytest.mark.skipif(not os.path.isdir(fashion_mnist.DEFAULT_DIR),
                    reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist():
  x, y = fashion_mnist.load("train")
  xt, yt = fashion_mnist.load("test")
  assert x.shape == (60_000, 28, 28) and xt.shape == (10_000, 28, 28)
  assert list(np.bincount(y)) == [6000] * 10 and list(np.bincount(yt)) == [1000] * 10
  sample = x[::6].astype(np.float32) / 255  # 10k images: enough for 3 decimals
  assert abs(sample.mean() - fashion_mnist.MEAN) < 2e-3
  assert abs(sample.std() - fashion_mnist.STD) < 2e-3


# ---------------------------------------------------------------- dataset


def _train(fake_dir, batch, pipe=0, pipes=1, **kw):
  kw.setdefault("augment", False)
  kw.setdefault("shuffle", False)
  return fashion_mnist.dataset("train", per_replica_batch_size=batch, input_pipeline_id=pipe,
                               num_input_pipelines=pipes, training=True, seed=kw.pop("seed", 7),
                               data_dir=fake_dir, **kw)


def test_training_batches_have_the_documented_types(fake_dir):
  (x, y), = _steps(_train(fake_dir, 8, augment=True, shuffle=True), 1)
  assert x.shape == (8, 28, 28, 1) and x.dtype == np.float32
  assert y.shape == (8,) and y.dtype == np.int32
  ds = _train(fake_dir, 8)
  assert ds.element_spec[0].shape.as_list() == [8, 28, 28, 1]  # drop_remainder: static batch


def test_unshuffled_single_pipeline_yields_examples_in_order_and_repeats(fake_dir):
  steps = _steps(_train(fake_dir, 8), 26)  # 200 examples: two passes over 100
  ids = np.concatenate([_ids(x) for x, _ in steps])
  np.testing.assert_array_equal(ids, np.arange(208) % N_TRAIN)
  np.testing.assert_array_equal(np.concatenate([y for _, y in steps]), ids % 10)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("pipes", [2, 4])
def test_pipelines_split_the_global_batch(fake_dir, shuffle, pipes):
  global_batch, n_steps = 8, 30
  single = _steps(_train(fake_dir, global_batch, shuffle=shuffle), n_steps)
  per_pipe = [_steps(_train(fake_dir, global_batch // pipes, p, pipes, shuffle=shuffle), n_steps)
              for p in range(pipes)]
  for s in range(n_steps):
    union = np.concatenate([_ids(per_pipe[p][s][0]) for p in range(pipes)])
    assert sorted(union) == sorted(_ids(single[s][0])), f"step {s}"
    if not shuffle:
      np.testing.assert_array_equal(np.sort(union), np.sort(np.arange(s * 8, s * 8 + 8) % N_TRAIN))


def test_shuffle_is_a_seeded_permutation_per_epoch(fake_dir):
  def first_two_epochs(seed):
    steps = _steps(_train(fake_dir, 10, shuffle=True, seed=seed), 20)
    ids = np.concatenate([_ids(x) for x, _ in steps])
    return ids[:100], ids[100:]

  e1, e2 = first_two_epochs(3)
  assert sorted(e1) == list(range(100)) and sorted(e2) == list(range(100))
  assert list(e1) != list(range(100)) and list(e1) != list(e2)
  again = first_two_epochs(3)
  np.testing.assert_array_equal(e1, again[0])
  np.testing.assert_array_equal(e2, again[1])
  assert list(first_two_epochs(4)[0]) != list(e1)


def test_augmentation_is_deterministic_and_changes_images(fake_dir):
  a = _steps(_train(fake_dir, 16, augment=True), 3)
  b = _steps(_train(fake_dir, 16, augment=True), 3)
  plain = _steps(_train(fake_dir, 16, augment=False), 3)
  for (xa, ya), (xb, yb), (xp, yp) in zip(a, b, plain):
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yp)  # labels untouched, order kept
  assert any(not np.array_equal(xa, xp) for (xa, _), (xp, _) in zip(a, plain))
  assert not np.array_equal(a[0][0], _steps(_train(fake_dir, 16, augment=True, seed=8), 1)[0][0])


def test_augment_batch_is_a_padded_shift_or_flip_of_each_image():
  rng = np.random.default_rng(0)
  images = rng.integers(1, 256, size=(64, 6, 5), dtype=np.uint8)
  out = fashion_mnist.augment_batch(tf.constant(images), tf.constant([1, 2], tf.int64),
                                    crop_padding=2).numpy()
  assert out.shape == images.shape and out.dtype == np.uint8
  seen = set()
  for img, got in zip(images, out):
    padded = np.pad(img, 2)
    matches = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (0, 1)
               if np.array_equal(got, (padded[dy:dy + 6, dx:dx + 5][:, ::-1] if f
                                       else padded[dy:dy + 6, dx:dx + 5]))]
    assert matches, "output is not a crop of the padded image (or its mirror)"
    seen.update(matches)
  assert len({m[2] for m in seen}) == 2 and len({m[:2] for m in seen}) > 5
  same = fashion_mnist.augment_batch(tf.constant(images[..., None]), tf.constant([1, 2], tf.int64),
                                     crop_padding=0, flip=False).numpy()
  np.testing.assert_array_equal(same[..., 0], images)


@pytest.mark.parametrize("pipes", [1, 2, 4])
def test_eval_reads_every_example_once_in_order(fake_dir, pipes):
  batches = [[(x.numpy(), y.numpy()) for x, y in fashion_mnist.dataset(
      "test", per_replica_batch_size=4, input_pipeline_id=p, num_input_pipelines=pipes,
      training=False, seed=p, data_dir=fake_dir)] for p in range(pipes)]
  ids = [np.concatenate([_ids(x) for x, _ in b]) for b in batches]
  np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(N_TEST))
  for p in range(pipes):
    np.testing.assert_array_equal(ids[p], np.arange(p, N_TEST, pipes))
  if pipes == 1:
    assert [len(y) for _, y in batches[0]] == [4] * 7 + [2]  # last batch smaller, kept
  again = [x for x, _ in fashion_mnist.dataset("test", per_replica_batch_size=4, training=False,
                                                seed=99, data_dir=fake_dir)]
  if pipes == 1:
    for a, (b, _) in zip(again, batches[0]):
      np.testing.assert_array_equal(a.numpy(), b)


def test_dataset_argument_errors(fake_dir):
  with pytest.raises(UserError, match="input_pipeline_id"):
    _train(fake_dir, 4, pipe=2, pipes=2)
  with pytest.raises(UserError, match="per_replica_batch_size"):
    _train(fake_dir, 0)
  with pytest.raises(UserError, match="larger than"):
    _train(fake_dir, 64, pipes=2)


def test_normalisation_uses_train_statistics(fake_dir):
  (x, _), = _steps(_train(fake_dir, 4), 1)
  black = (0 - fashion_mnist.MEAN) / fashion_mnist.STD
  assert x[0, 27, 27, 0] == pytest.approx(black)
  assert x[0, 10, 4, 0] == pytest.approx((200 / 255 - fashion_mnist.MEAN) / fashion_mnist.STD)


# ---------------------------------------------------------------- tfds_images


@pytest.mark.parametrize("name", ["imagenet2012", "cifar10"])
@pytest.mark.parametrize("training", [True, False])
def test_tfds_images_missing_data_is_a_user_error(tmp_path, name, training):
  with pytest.raises(UserError) as err:
    tfds_images.dataset(name, "train" if training else "validation" if name == "imagenet2012"
                        else "test", per_replica_batch_size=8, training=training, seed=0,
                        data_dir=str(tmp_path))
  assert name in str(err.value) and str(tmp_path) in str(err.value)
  assert "download" in str(err.value)


def test_tfds_images_rejects_unknown_datasets(tmp_path):
  with pytest.raises(UserError, match="not supported"):
    tfds_images.dataset("mnist", "train", per_replica_batch_size=8, training=True, seed=0,
                        data_dir=str(tmp_path))


def test_skip_batches_resumes_the_same_stream(fake_dir):
  full = _steps(_train(fake_dir, 8, augment=True, shuffle=True), 20)
  resumed = _steps(_train(fake_dir, 8, augment=True, shuffle=True, skip_batches=13), 7)
  for (xf, yf), (xr, yr) in zip(full[13:], resumed):
    np.testing.assert_array_equal(xf, xr)  # same examples and same augmentation
    np.testing.assert_array_equal(yf, yr)


def test_num_examples_takes_a_prefix_of_the_split(fake_dir):
  ids = np.concatenate([_ids(x) for x, _ in _steps(_train(fake_dir, 5, num_examples=20), 6)])
  np.testing.assert_array_equal(ids, np.arange(30) % 20)
  ev = fashion_mnist.dataset("test", per_replica_batch_size=4, training=False, seed=0,
                             data_dir=fake_dir, num_examples=10)
  assert sum(len(y) for _, y in ev) == 10


@pytest.mark.parametrize("source", ["fmnist", "fmnist_iid", "synthetic"])
def test_a_kept_pipeline_is_the_workers_share_of_the_one_process_stream(fake_dir, source):
  """A worker's context (the one-process pipeline's, with keep) makes exactly the
  batches InputContext.kept keeps of the whole stream: each source honours keep itself
  (before gathering and augmenting, for Fashion-MNIST), resumed (start_step) or not."""
  from replibench.data.sources import FashionMNIST  # pylint: disable=import-outside-toplevel
  from replibench.data.synthetic import SyntheticImages  # pylint: disable=import-outside-toplevel
  from replibench.engine import TrainSpec  # pylint: disable=import-outside-toplevel
  data = {"fmnist": FashionMNIST(data_dir=fake_dir),
          "fmnist_iid": FashionMNIST(data_dir=fake_dir, partition="iid"),
          "synthetic": SyntheticImages(image_size=4, num_classes=10)}[source]
  spec = TrainSpec(global_batch_size=8, num_replicas=4)
  for start_step, pipelines in ((0, 2), (3, 4)):
    whole = spec.input_context(0, 1, start_step)
    for pipeline in range(pipelines):
      ctx = dataclasses.replace(whole, keep=(pipeline, pipelines))
      want = list(ctx.kept(data.train(whole, seed=3)).take(6).as_numpy_iterator())
      got = list(data.train(ctx, seed=3).take(6).as_numpy_iterator())
      for (want_x, want_y), (got_x, got_y) in zip(want, got, strict=True):
        np.testing.assert_array_equal(got_y, want_y)
        np.testing.assert_array_equal(got_x, want_x)
