"""Synthetic data at the paper's sizes: generated once, repeated (tf_cnn_benchmarks' way).

    ImageClassification.data = @SyntheticImages()        # 224x224x3, 1,000 classes
    ConditionalGAN.data = @SyntheticImages()             # with image_size 128, pixels 'tanh'
    D4PG.synthetic = @SyntheticTransitions()             # 84x84x3 x 3 stacked frames, no actors

The way data-parallel throughput has been measured for years (tf_cnn_benchmarks,
Horovod's synthetic benchmarks, NVIDIA DeepLearningExamples' `--data synthetic`):
one batch of tensors of the real shapes, made before training and fed again at
every step, so the step's time is the model's and the collectives', never the
input pipeline's. Each replica's batch is made once from the seed (numpy, at
pipeline build time) and the pipeline is `Dataset.from_tensors(batch)` per
replica, concatenated and repeated: no map, no random op and no Python run per
element; an element is the same tensor buffer each time (no copy on a CPU
replica; on a GPU, tf.distribute's prefetch copies it to the device, an
asynchronous copy of a ready buffer). Example g of the global batch is drawn from
its own generator (seed, g), so a replica's batch does not depend on how the
global batch is split: N replicas at global batch B see what one replica at B sees.

Time to target is undefined on such data (the model only fits one repeated batch):
a run on it never evaluates, ends when its budget is spent, and reports
throughput, step time and memory (result.json `throughput`, TensorBoard
`throughput/...`), saying so (workloads.base.SYNTHETIC_TIME_TO_TARGET).
"""

from __future__ import annotations

import dataclasses
import functools

import gin
import numpy as np
import tensorflow as tf

from replibench.errors import UserError

PIXELS = ("standardized", "tanh")


def repeated(ctx, make_batch) -> tf.data.Dataset:
  """This input pipeline's endless stream: its replicas' batches in turn, made once.

  ctx: the engine's InputContext (pipeline p serves global replicas [p*R, (p+1)*R)).
  make_batch(replica) -> a nest of numpy arrays: that replica's batch.
  """
  first, count = ctx.replica_range()   # With ctx.keep: the kept replicas only.
  parts = [tf.data.Dataset.from_tensors(make_batch(r)) for r in range(first, first + count)]
  ds = functools.reduce(tf.data.Dataset.concatenate, parts).repeat()
  options = tf.data.Options()
  options.autotune.enabled = False   # Nothing to tune; its thread only slows teardown.
  return ds.with_options(options)


def example_rows(seed: int, indices: np.ndarray, draw) -> np.ndarray:
  """np.stack([draw(rng_g) for g in indices]) with rng_g = default_rng([seed, g]): each
  global example from its own stream, whatever the split."""
  rows = np.stack([draw(np.random.default_rng([seed, int(g)])) for g in indices.reshape(-1)])
  return rows.reshape(indices.shape + rows.shape[1:])


def _positive_int(owner: str, **values) -> None:
  for name, value in values.items():
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise UserError(f"{owner}.{name} = {value!r}: must be a positive whole number.")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class SyntheticImages:
  """ImageNet-shaped images and labels, one fixed batch a replica, repeated.

  pixels: 'standardized' (a classifier's input: normal, truncated at 2 standard
  deviations, as tf_cnn_benchmarks draws) or 'tanh' (uniform in [-1, 1]: a tanh
  generator's range, for a GAN discriminator). num_train_examples is the epoch
  the budget, warmup and schedules are counted in (ImageNet's train split by
  default), not data held anywhere.
  """

  image_size: int = 224
  channels: int = 3
  num_classes: int = 1000
  num_train_examples: int = 1_281_167
  pixels: str = "standardized"
  synthetic = True

  def __post_init__(self):
    _positive_int("SyntheticImages", image_size=self.image_size, channels=self.channels,
                  num_classes=self.num_classes, num_train_examples=self.num_train_examples)
    if self.pixels not in PIXELS:
      raise UserError(f"SyntheticImages.pixels = {self.pixels!r}: must be one of {PIXELS}.")

  @property
  def image_shape(self) -> tuple:
    return (self.image_size, self.image_size, self.channels)

  def train_examples(self) -> int:
    return self.num_train_examples

  def eval_examples(self) -> int:
    return 0

  def _image(self, rng: np.random.Generator) -> np.ndarray:
    if self.pixels == "tanh":
      return rng.uniform(-1.0, 1.0, self.image_shape).astype(np.float32)
    return np.clip(rng.standard_normal(self.image_shape, np.float32), -2.0, 2.0)

  def batch(self, seed: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [*indices.shape, H, W, C], labels int32 [*indices.shape]) of the
    global examples `indices`."""
    images = example_rows(seed, indices, self._image)
    labels = example_rows(seed + 1, indices,
                          lambda rng: np.int32(rng.integers(self.num_classes)))
    return images, labels.astype(np.int32)

  def train(self, ctx, seed: int, updates: int = 0) -> tf.data.Dataset:
    """Endless per-replica (images [b, H, W, C], labels [b]); with updates = K > 0 each
    element holds K batches, [K, b, ...] (a GAN step's discriminator updates)."""
    b, total = ctx.per_replica_batch_size, ctx.per_replica_batch_size * ctx.num_replicas

    def make_batch(replica):
      own = np.arange(replica * b, (replica + 1) * b)
      if updates:
        own = np.arange(updates)[:, None] * total + own[None]
      return self.batch(seed, own)

    return repeated(ctx, make_batch)

  def eval(self, ctx) -> tf.data.Dataset:
    raise UserError(
        "SyntheticImages has no evaluation split: time to target is undefined on synthetic "
        "data. Use a real data source (FashionMNIST, TfdsImages, Imagenet2012Gan) to "
        "measure it.")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class SyntheticTransitions:
  """D4PG's learner input without actors or replay: n-step transitions of pixel (or
  state) observations, one fixed batch a replica, repeated.

  The observation's shape comes from the workload's EnvConfig (pixels: uint8
  [image_size, image_size, 3 * frame_stack]); the action's from action_dim and its
  bounds (cartpole-swingup: one dimension in [-1, 1]), so no environment is built.
  num_train_examples is unused by D4PG (its epoch is D4PG.epoch_size).
  """

  action_dim: int = 1
  action_low: float = -1.0
  action_high: float = 1.0
  state_dim: int = 5          # Observations when the EnvConfig is not pixels.
  discount: float = 0.99 ** 5  # gamma^n of a 5-step transition.
  synthetic = True

  def __post_init__(self):
    _positive_int("SyntheticTransitions", action_dim=self.action_dim,
                  state_dim=self.state_dim)
    if not self.action_low < self.action_high:
      raise UserError(f"SyntheticTransitions: action_low ({self.action_low}) must be below "
                      f"action_high ({self.action_high}).")

  def observation_shape(self, env_config) -> tuple:
    if env_config.pixels:
      size = env_config.image_size
      return (size, size, 3 * env_config.frame_stack)
    return (self.state_dim,)

  def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
    return (np.full(self.action_dim, self.action_low, np.float32),
            np.full(self.action_dim, self.action_high, np.float32))

  def _transition(self, rng: np.random.Generator, obs_shape: tuple, pixels: bool) -> dict:
    def observation():
      if pixels:
        return rng.integers(0, 256, obs_shape, dtype=np.uint8)
      return rng.standard_normal(obs_shape, np.float32)
    low, high = self.action_bounds()
    return {"observation": observation(), "next_observation": observation(),
            "action": rng.uniform(low, high).astype(np.float32),
            "reward": np.float32(rng.uniform(0.0, 1.0)), "discount": np.float32(self.discount)}

  def train(self, ctx, seed: int, env_config) -> tf.data.Dataset:
    """Endless per-replica dicts: observation/next_observation [b, *obs] (uint8 pixels or
    float32 states), action [b, action_dim], reward, discount, weight float32 [b],
    key int64 [b] (the global example index)."""
    b, obs_shape = ctx.per_replica_batch_size, self.observation_shape(env_config)

    def make_batch(replica):
      keys = np.arange(replica * b, (replica + 1) * b)
      rows = [self._transition(np.random.default_rng([seed, int(g)]), obs_shape,
                               env_config.pixels) for g in keys]
      batch = {k: np.stack([row[k] for row in rows]) for k in rows[0]}
      return {**batch, "key": keys.astype(np.int64), "weight": np.ones(b, np.float32)}

    return repeated(ctx, make_batch)
