"""A small Fashion-MNIST CNN for GAN metrics, trained here and cached on disk.

TF-GAN's MNIST metrics fetch weights from a hub and no weights can be
downloaded here, so the suite trains its own classifier: two conv/pool stages,
a `feature_dim` dense layer and a 10-way linear head. It sees images as float32
[N, 28, 28, 1] in [-1, 1], the generator's tanh range. The features for
Frechet distance and KID are the dense layer's pre-activations (all units vary,
unlike post-ReLU units that can be dead, which would make the covariance
singular); probabilities for the classifier score come from the head.

Training is reproducible: seeded initializers, a numpy-seeded example order, no
dropout or augmentation, CPU ops (deterministic for a fixed thread count). The
weights are cached under $REPLIBENCH_CACHE (default ~/.cache/replibench) in
fmnist_classifier/<hash>.weights.h5, the hash covering every ClassifierConfig
field and ARCH_VERSION, with a JSON sidecar holding the config and test accuracy.
Build and load outside any tf.distribute strategy scope.
"""

import dataclasses
import hashlib
import json
import os
import time

from absl import logging
import gin
import keras
import numpy as np
import scipy.special
import tensorflow as tf

from replibench import atomic
from replibench.data import fashion_mnist

CACHE_ENV = "REPLIBENCH_CACHE"
# Bump when the architecture or training code changes in a way the config misses.
ARCH_VERSION = 1
IMAGE_SHAPE = (28, 28, 1)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
  """Everything that determines the trained weights (hashed into the cache key)."""
  conv_widths: tuple = (32, 64)
  feature_dim: int = 128
  epochs: int = 3
  batch_size: int = 128
  learning_rate: float = 1e-3
  seed: int = 0
  num_train_examples: int = 0  # 0: the whole train split; else its first N examples.

  def cache_key(self) -> str:
    fields = dict(dataclasses.asdict(self), arch_version=ARCH_VERSION,
                  data="fashion_mnist")
    blob = json.dumps(fields, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def to_model_range(images_uint8):
  """uint8 [N, 28, 28] -> float32 [N, 28, 28, 1] in [-1, 1]."""
  return (np.asarray(images_uint8, np.float32) / 127.5 - 1.0)[..., None]


def build_model(config: ClassifierConfig) -> keras.Model:
  """Functional model: images [N, 28, 28, 1] -> (features [N, d], logits [N, 10])."""
  seeds = iter(range(config.seed * 100, config.seed * 100 + 100))
  init = lambda: keras.initializers.GlorotUniform(seed=next(seeds))
  images = keras.Input(IMAGE_SHAPE, name="images")
  h = images
  for i, width in enumerate(config.conv_widths):
    h = keras.layers.Conv2D(width, 3, padding="same", activation="relu",
                            kernel_initializer=init(), name=f"conv{i}")(h)
    h = keras.layers.MaxPooling2D(2, name=f"pool{i}")(h)
  h = keras.layers.Flatten()(h)
  features = keras.layers.Dense(config.feature_dim, kernel_initializer=init(),
                                name="features")(h)
  logits = keras.layers.Dense(fashion_mnist.NUM_CLASSES, kernel_initializer=init(),
                              name="logits")(keras.layers.ReLU()(features))
  return keras.Model(images, [features, logits], name="fmnist_classifier")


def _training_batches(images, labels, config):
  """tf.data of (float [-1, 1] images, labels), a fresh seeded permutation per epoch."""
  rng = np.random.default_rng(config.seed)
  order = np.concatenate([rng.permutation(len(labels)) for _ in range(config.epochs)])
  ds = tf.data.Dataset.from_tensor_slices(order).batch(config.batch_size, drop_remainder=True)
  images, labels = tf.constant(images), tf.constant(labels.astype(np.int32))
  scale = lambda idx: (tf.cast(tf.gather(images, idx), tf.float32)[..., None] / 127.5 - 1.0,
                       tf.gather(labels, idx))
  return ds.map(scale).prefetch(2)


def train(config: ClassifierConfig, data_dir=None) -> keras.Model:
  """Trains build_model(config) on the train split; returns the model."""
  images, labels = fashion_mnist.load("train", data_dir)
  if config.num_train_examples:
    images, labels = images[:config.num_train_examples], labels[:config.num_train_examples]
  model = build_model(config)
  train_model = keras.Model(model.input, model.output[1])
  train_model.compile(
      optimizer=keras.optimizers.Adam(config.learning_rate),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      jit_compile=False)
  # One pass over a pre-permuted stream of all epochs keeps the order seeded.
  train_model.fit(_training_batches(images, labels, config), epochs=1, shuffle=False,
                  verbose=0)
  return model


class Classifier:
  """A trained classifier: features and class probabilities of [-1, 1] images."""

  def __init__(self, model: keras.Model, config: ClassifierConfig, test_accuracy=None):
    self.model = model
    self.config = config
    self.test_accuracy = test_accuracy
    self._forward = tf.function(
        lambda x: model(x, training=False),
        input_signature=[tf.TensorSpec((None,) + IMAGE_SHAPE, tf.float32)])

  @property
  def feature_dim(self) -> int:
    return self.config.feature_dim

  def predict(self, images, batch_size=1000):
    """images float [N, 28, 28(, 1)] in [-1, 1] -> (features float64 [N, d],
    probabilities float64 [N, 10])."""
    x = np.asarray(images, np.float32)
    if x.ndim == 3:
      x = x[..., None]
    if x.shape[1:] != IMAGE_SHAPE:
      raise ValueError(f"Classifier expects images [N, 28, 28, 1], got {x.shape}")
    if x.size and (x.min() < -1.001 or x.max() > 1.001):
      raise ValueError(f"Classifier expects pixels in [-1, 1], got [{x.min()}, {x.max()}]; "
                       f"scale uint8 images with to_model_range().")
    outputs = [self._forward(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]
    features = np.concatenate([f.numpy() for f, _ in outputs]).astype(np.float64)
    logits = np.concatenate([l.numpy() for _, l in outputs]).astype(np.float64)
    return features, scipy.special.softmax(logits, axis=1)

  def accuracy(self, images, labels) -> float:
    return float(np.mean(self.predict(images)[1].argmax(axis=1) == np.asarray(labels)))


def cache_dir() -> str:
  root = os.environ.get(CACHE_ENV) or os.path.expanduser("~/.cache/replibench")
  return os.path.join(root, "fmnist_classifier")


@gin.configurable
def fashion_mnist_classifier(config: ClassifierConfig | None = None,
                             data_dir=None) -> Classifier:
  """Loads the classifier for config from the cache, training and caching it if absent.

  config None means ClassifierConfig() as gin binds it at call time.
  """
  config = config or ClassifierConfig()
  directory = cache_dir()
  key = config.cache_key()
  weights_path = os.path.join(directory, f"{key}.weights.h5")
  meta_path = os.path.join(directory, f"{key}.json")
  if os.path.exists(weights_path) and os.path.exists(meta_path):
    model = build_model(config)
    model.load_weights(weights_path)
    with open(meta_path) as f:
      meta = json.load(f)
    logging.info("Loaded Fashion-MNIST classifier %s from %s", key, weights_path)
    return Classifier(model, config, meta.get("test_accuracy"))

  logging.info("Training Fashion-MNIST classifier %s (%s)", key, config)
  start = time.perf_counter()
  model = train(config, data_dir)
  seconds = time.perf_counter() - start
  classifier = Classifier(model, config)
  test_images, test_labels = fashion_mnist.load("test", data_dir)
  classifier.test_accuracy = classifier.accuracy(to_model_range(test_images), test_labels)
  meta = dict(config=dataclasses.asdict(config), arch_version=ARCH_VERSION,
              test_accuracy=classifier.test_accuracy, train_seconds=seconds)
  # Concurrent processes may train the same key: each writes private temp files
  # and renames them, so readers never see a partial file. Weights first: a
  # reader loads only when the sidecar exists too.
  with atomic.atomic_path(weights_path, suffix=".weights.h5") as tmp:
    model.save_weights(tmp)
  atomic.write_text(meta_path, json.dumps(meta, indent=2, sort_keys=True))
  logging.info("Classifier %s: test accuracy %.4f after %.0f s", key,
               classifier.test_accuracy, seconds)
  return classifier
