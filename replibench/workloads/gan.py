"""Class-conditional SN-GAN (Miyato & Koyama 2018) as a replicated workload.

One harness step is one generator update preceded by n_dis discriminator
updates, each on its own real batch: every replica's input element is n_dis
per-replica batches, images float32 [n_dis, b, H, W, C] in [-1, 1] and labels
int32 [n_dis, b]. The global batch B = N * b is the batch of each update.

Replication does not change the math: the latent z and the fake labels of every
update are drawn for the whole global batch from a stateless seed of (seed,
generator step, update index) and each replica takes its slice, so the noise
does not depend on the replica count; the hinge losses are scaled with
engine.average_loss and applied with engine.apply_gradients (global-batch
gradients); the generator's batch norm must be cross-replica (the configs bind
sngan_generator.norm_layer = @engine.cross_replica_batch_norm). Each
discriminator call with training=True advances its spectral-norm u vectors
once: real and fake go through one call per discriminator update (one power
iteration per update, both halves normalised by the same sigma), and the
generator update makes one more call.

Evaluation scores a fixed set of generated samples (fixed z, labels balanced
over the classes) with a scorer (Fashion-MNIST classifier or Inception
features): FID (the target, lower is better), classifier score and KID, next to
the same scores of real held-out images at the same N, plus a per-class grid.
"""

import concurrent.futures
import dataclasses
import os

import gin
import keras
import numpy as np
import tensorflow as tf

from models.sngan import build_models
from replibench import engine
from replibench.engine import cost
from replibench.errors import UserError
from replibench.eval import classifier as classifier_lib
from replibench.eval import evaluate as evaluate_lib
from replibench.eval import metrics
from replibench.workloads.base import TrainSpec, Workload

GRID_CLASSES = 10   # Rows of the per-class sample grid (classes evenly spaced).


def _outside_strategy(fn, *args):
  """Runs fn(*args) with no tf.distribute strategy in force; returns its result.

  build() runs under the replicator's scope, but the evaluation classifier must
  be built (and possibly trained) outside any strategy, or its variables would
  be mirrored and Model.fit distributed. A strategy scope is per thread, so a
  helper thread sees none.
  """
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(fn, *args).result()


# ---------------------------------------------------------------- scorers ---


@gin.configurable
class FashionMNISTScorer:
  """Scores 28x28x1 images with the suite's Fashion-MNIST classifier.

  The reference is the first num_reference train images; the real-data scores
  are the first N test images against it (the floor a generator can reach at N).
  classifier_config None means ClassifierConfig() as gin binds it.
  """

  def __init__(self, num_reference: int = 10000,
               classifier_config: classifier_lib.ClassifierConfig | None = None):
    self.num_reference = num_reference
    self.classifier_config = classifier_config
    self.classifier = self.reference = None

  def prepare(self, data, num_samples: int) -> dict:
    """Loads the classifier and the reference; returns the real-data scores at N."""
    if tuple(data.image_shape) != classifier_lib.IMAGE_SHAPE:
      raise UserError(f"FashionMNISTScorer scores 28x28x1 images; the data source gives "
                      f"{tuple(data.image_shape)}. Use a scorer for that data set.")
    data_dir = getattr(data, "data_dir", None)
    self.classifier = classifier_lib.fashion_mnist_classifier(self.classifier_config, data_dir)
    self.reference = evaluate_lib.real_reference(self.classifier, "train", data_dir,
                                                 self.num_reference)
    return evaluate_lib.real_data_scores(self.classifier, self.reference, num_samples,
                                         "test", data_dir)

  def featurize(self, images) -> tuple:
    """images float [n, 28, 28, 1] in [-1, 1] -> (features [n, d], probabilities [n, 10])."""
    return self.classifier.predict(np.clip(images, -1.0, 1.0))

  def score(self, features, probabilities) -> dict:
    return evaluate_lib.score_outputs(features, probabilities, self.reference)


@gin.configurable
class InceptionScorer:
  """Scores RGB images with Keras' InceptionV3 (pool features, 1000-way softmax).

  weights: a local Keras InceptionV3 weights file (include_top, e.g.
  inception_v3_weights_tf_dim_ordering_tf_kernels.h5); nothing downloads at run
  time. Images are resized to 299x299. The reference is the first num_reference
  images of the data's train split; the real-data scores are the first N images
  of its held-out split. Keras' InceptionV3 is not the TF-GAN FID graph, so the
  values track published FIDs without being equal to them.
  """

  def __init__(self, weights: str | None = None, num_reference: int = 50000,
               batch_size: int = 100):
    self.weights, self.num_reference, self.batch_size = weights, num_reference, batch_size
    self.model = self.reference = None

  def _features_of(self, batches, limit):
    outputs, count = [], 0
    for images in batches:
      outputs.append(self.featurize(images[:limit - count]))
      count += len(outputs[-1][0])
      if count >= limit:
        break
    if count < limit:
      raise UserError(f"InceptionScorer: the split holds {count} images, fewer than {limit}.")
    return (np.concatenate([f for f, _ in outputs]), np.concatenate([p for _, p in outputs]))

  def prepare(self, data, num_samples: int) -> dict:
    reference = data.reference_batches("train", self.batch_size)   # Fails first without data.
    held_out = data.reference_batches("held_out", self.batch_size)
    if not self.weights or not os.path.isfile(self.weights):
      raise UserError(
          f"InceptionScorer.weights = {self.weights!r}: set it to a local Keras InceptionV3 "
          f"weights file (inception_v3_weights_tf_dim_ordering_tf_kernels.h5, include_top); "
          f"nothing is downloaded at run time.")
    inception = keras.applications.InceptionV3(weights=self.weights)
    self.model = keras.Model(inception.input,
                             [inception.get_layer("avg_pool").output, inception.output])
    self._forward = tf.function(lambda x: self.model(
        tf.image.resize(x, (299, 299), method="bilinear"), training=False))
    features, _ = self._features_of(reference, self.num_reference)
    self.reference = evaluate_lib.RealReference("train", features,
                                                *metrics.gaussian_statistics(features))
    return self.score(*self._features_of(held_out, num_samples))

  def featurize(self, images) -> tuple:
    """images float [n, h, w, 3] in [-1, 1] (Inception's own input range) -> float64
    (features [n, 2048], probabilities [n, 1000])."""
    features, probabilities = self._forward(tf.clip_by_value(images, -1.0, 1.0))
    return features.numpy().astype(np.float64), probabilities.numpy().astype(np.float64)

  def score(self, features, probabilities) -> dict:
    return evaluate_lib.score_outputs(features, probabilities, self.reference)


# ----------------------------------------------------------- ImageNet data ---


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
    skip = ctx.start_step * ctx.num_replicas // ctx.num_input_pipelines
    return ds.batch(ctx.per_replica_batch_size, drop_remainder=True).skip(skip).prefetch(2)

  def reference_batches(self, split: str, batch_size: int):
    """Unshuffled, unflipped numpy batches [n, s, s, 3] in [-1, 1] of 'train' or
    'held_out' (the validation split)."""
    ds = self._load("validation" if split == "held_out" else "train")
    ds = ds.map(lambda image, _: self._square(image), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(2).as_numpy_iterator()


# ----------------------------------------------------------------- workload ---


@gin.configurable
class ConditionalGAN(Workload):
  """Hinge-loss conditional GAN; target metric eval/fid (lower is better)."""

  target_metric = "eval/fid"
  higher_is_better = False

  def __init__(self, generator=gin.REQUIRED, discriminator=gin.REQUIRED, data=gin.REQUIRED,
               scorer=gin.REQUIRED, name: str = "sngan", n_dis: int = 5,
               learning_rate: float = 2e-4, beta_1: float = 0.0, beta_2: float = 0.9,
               epsilon: float = 1e-8, z_dim: int = 128, eval_num_samples: int = 5000,
               eval_batch_size: int = 500, grid_samples_per_class: int = 10):
    if n_dis < 1 or eval_num_samples < 2:
      raise UserError(f"ConditionalGAN: n_dis ({n_dis}) must be >= 1 and eval_num_samples "
                      f"({eval_num_samples}) >= 2.")
    self.name = name
    self.generator_fn, self.discriminator_fn = generator, discriminator
    self.data, self.scorer = data, scorer
    self.n_dis, self.z_dim = n_dis, z_dim
    self.lr, self.beta_1, self.beta_2, self.epsilon = learning_rate, beta_1, beta_2, epsilon
    self.eval_num_samples, self.eval_batch_size = eval_num_samples, eval_batch_size
    self.grid_samples_per_class = grid_samples_per_class
    self.spec = self.generator = self.discriminator = None
    self.real_scores = {}

  def examples_per_epoch(self) -> int:
    # An epoch is train_examples / B generator steps; the discriminator sees
    # n_dis times as many real images (n_dis passes over the data).
    return self.data.train_examples()

  def _make_models(self):
    num_classes = self.data.num_classes
    generator = self.generator_fn(num_classes=num_classes, z_dim=self.z_dim)
    discriminator = self.discriminator_fn(num_classes=num_classes)
    if tuple(generator.image_shape) != tuple(self.data.image_shape):
      raise UserError(f"The generator makes {generator.image_shape} images but the data "
                      f"source gives {tuple(self.data.image_shape)}; fix the sngan_generator "
                      f"bindings (widths, bottom_width, out_channels).")
    build_models(generator, discriminator)
    return generator, discriminator

  def _adam(self, name):
    return keras.optimizers.Adam(self.lr, beta_1=self.beta_1, beta_2=self.beta_2,
                                 epsilon=self.epsilon, name=name)

  def build(self, spec: TrainSpec) -> None:
    self.spec = spec
    keras.utils.set_random_seed(spec.seed)
    self.generator, self.discriminator = self._make_models()
    self.g_optimizer, self.d_optimizer = self._adam("g_adam"), self._adam("d_adam")
    # Keras 3 optimizers must create their slots under the scope, before tracing.
    engine.build_optimizer(self.g_optimizer, self.generator.trainable_variables)
    engine.build_optimizer(self.d_optimizer, self.discriminator.trainable_variables)
    self._noise_seed = tf.constant([spec.seed, 0x5A6A], tf.int64)
    self._make_eval_inputs(spec.seed)
    # Outside the timed span: classifier, reference statistics, real-data scores.
    self.real_scores = _outside_strategy(self.scorer.prepare, self.data, self.eval_num_samples)

  def _make_eval_inputs(self, seed: int) -> None:
    """Fixed z and labels, so successive evaluations differ only by the weights."""
    rng = np.random.default_rng([seed, 2018])
    num_classes = self.data.num_classes
    self._eval_z = rng.standard_normal((self.eval_num_samples, self.z_dim)).astype(np.float32)
    self._eval_labels = (np.arange(self.eval_num_samples) % num_classes).astype(np.int32)
    classes = np.unique(np.linspace(0, num_classes - 1, min(num_classes, GRID_CLASSES))
                        .round().astype(np.int32))
    self._grid_labels = np.repeat(classes, self.grid_samples_per_class)
    self._grid_z = rng.standard_normal((len(self._grid_labels), self.z_dim)).astype(np.float32)
    self._grid_rows = len(classes)
    self._sample = tf.function(lambda z, y: self.generator(z, y, training=False),
                               reduce_retracing=True)

  def input_fn(self, ctx: engine.InputContext) -> tf.data.Dataset:
    """Per replica: (images [n_dis, b, H, W, C] in [-1, 1], labels int32 [n_dis, b]).

    The source's per-replica batches are regrouped so that discriminator update
    k of step s uses the same global batch of real images for any replica count:
    this pipeline's R replicas take turns on its batches, so R * n_dis
    consecutive batches [k, r] become R elements [r][k].
    """
    replicas_here = ctx.num_replicas // ctx.num_input_pipelines
    source_ctx = dataclasses.replace(ctx, start_step=ctx.start_step * self.n_dis)
    ds = self.data.train(source_ctx, self.spec.seed)

    def regroup(images, labels):
      def split(x):
        x = tf.reshape(x, [self.n_dis, replicas_here] + x.shape[1:].as_list())
        return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
      return split(images), split(labels)

    ds = ds.batch(self.n_dis * replicas_here, drop_remainder=True).map(regroup).unbatch()
    # unbatch() loses the source's infinite cardinality; without it
    # MultiWorkerMirroredStrategy all-reduces a "has data" flag on every step.
    ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    return ds.prefetch(tf.data.AUTOTUNE)

  def _noise(self, step, update: int, per_replica: int):
    """This replica's slice of the global-batch z [b, z_dim] and fake labels [b]."""
    batch = self.spec.global_batch_size
    seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(self._noise_seed, step), update)
    z_seed, y_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    z = tf.random.stateless_normal([batch, self.z_dim], z_seed)
    labels = tf.random.stateless_uniform([batch], y_seed, 0, self.data.num_classes,
                                         dtype=tf.int32)
    start = engine.replica_id() * per_replica
    return tf.slice(z, [start, 0], [per_replica, self.z_dim]), tf.slice(labels, [start],
                                                                         [per_replica])

  def _discriminator_update(self, real, real_labels, step, update):
    b = real.shape[0]
    z, fake_labels = self._noise(step, update, b)
    fake = self.generator(z, fake_labels, training=True)
    variables = self.discriminator.trainable_variables
    with tf.GradientTape() as tape:
      logits = self.discriminator(tf.concat([real, fake], 0),
                                  tf.concat([real_labels, fake_labels], 0), training=True)
      # Hinge loss: mean(relu(1 - D(x))) + mean(relu(1 + D(G(z)))) over the global batch.
      per_example = tf.nn.relu(1.0 - logits[:b]) + tf.nn.relu(1.0 + logits[b:])
      loss = engine.average_loss(per_example, self.spec.global_batch_size)
    engine.apply_gradients(self.d_optimizer, tape.gradient(loss, variables), variables)
    return loss

  def _generator_update(self, step, b):
    z, labels = self._noise(step, self.n_dis, b)
    variables = self.generator.trainable_variables
    with tf.GradientTape() as tape:
      logits = self.discriminator(self.generator(z, labels, training=True), labels,
                                  training=True)
      loss = engine.average_loss(-logits, self.spec.global_batch_size)
    engine.apply_gradients(self.g_optimizer, tape.gradient(loss, variables), variables)
    return loss

  def step_fn(self, batch) -> dict:
    images, labels = batch
    # The generator's Adam counts generator steps (and is checkpointed with it).
    step = tf.convert_to_tensor(self.g_optimizer.iterations)
    d_loss = tf.add_n([self._discriminator_update(images[k], labels[k], step, k)
                       for k in range(self.n_dis)]) / self.n_dis
    g_loss = self._generator_update(step, images.shape[1])
    # Each loss is this replica's share (1/N of its local mean): times N the local mean,
    # which the engine averages over replicas (no collective of its own).
    d_loss, g_loss = d_loss * engine.num_replicas(), g_loss * engine.num_replicas()
    return {"loss": d_loss, "d_loss": d_loss, "g_loss": g_loss}

  def _generated_outputs(self):
    outputs = []
    for i in range(0, self.eval_num_samples, self.eval_batch_size):
      j = i + self.eval_batch_size
      images = self._sample(self._eval_z[i:j], self._eval_labels[i:j]).numpy()
      outputs.append(self.scorer.featurize(images))
    return (np.concatenate([f for f, _ in outputs]), np.concatenate([p for _, p in outputs]))

  def evaluate(self, replicator: engine.Replicator) -> dict:
    del replicator  # Sampling runs on the host from the (identical) replica-0 weights.
    scores = self.scorer.score(*self._generated_outputs())
    grid = self._sample(self._grid_z, self._grid_labels).numpy()
    result = {"eval/num_samples": scores["num_samples"],
              "samples/per_class": evaluate_lib.image_grid(grid, self._grid_rows)}
    for key in ("fid", "classifier_score", "kid"):
      result[f"eval/{key}"] = scores[key]
      result[f"eval/real_{key}"] = self.real_scores[key]
    return result

  def checkpoint_items(self) -> dict:
    return {"generator": self.generator, "discriminator": self.discriminator,
            "g_optimizer": self.g_optimizer, "d_optimizer": self.d_optimizer}

  def learning_rate(self, step: int) -> float:
    del step
    return self.lr

  def hparams(self) -> dict:
    return {"n_dis": self.n_dis, "adam_lr": self.lr, "adam_beta_1": self.beta_1,
            "adam_beta_2": self.beta_2, "z_dim": self.z_dim,
            "eval_num_samples": self.eval_num_samples}

  def describe(self, spec: TrainSpec) -> dict:
    del spec
    generator, discriminator = self._make_models()
    with_labels = lambda model: (lambda x, training=False: model(  # noqa: E731
        x, tf.zeros([tf.shape(x)[0]], tf.int32), training=training))
    g_flops = cost.forward_flops(with_labels(generator), (self.z_dim,))
    d_flops = cost.forward_flops(with_labels(discriminator), tuple(self.data.image_shape))
    # Per example of the global batch and generator step: each D update runs G
    # forward and D forward + backward (~3x forward) on a real and a fake image;
    # the G update runs G and D forward + backward.
    train_flops = self.n_dis * (g_flops + 6 * d_flops) + 3 * g_flops + 3 * d_flops
    return {
        "parameters": cost.parameter_count(generator) + cost.parameter_count(discriminator),
        "forward_flops_per_example": g_flops + d_flops,
        "train_flops_per_example": train_flops,
        "allreduce_bytes_per_step": (self.n_dis * cost.gradient_bytes(discriminator)
                                     + cost.gradient_bytes(generator)),
        "learning_rate": {"generator": self.lr, "discriminator": self.lr,
                          "adam_betas": (self.beta_1, self.beta_2), "n_dis": self.n_dis},
    }
