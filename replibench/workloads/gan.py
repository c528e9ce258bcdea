"""Class-conditional SN-GAN (Miyato & Koyama 2018) as a replicated workload.

One harness step is one generator update preceded by n_dis discriminator
updates, each on its own real batch: every replica's input element is n_dis
per-replica batches, images float32 [n_dis, b, H, W, C] in [-1, 1] and labels
int32 [n_dis, b]. The global batch B = N * b is the batch of each update.

Replication does not change the math: the latent z and the fake labels of every
update are drawn for the whole global batch from a stateless seed of (seed,
generator step, update index) and each replica takes its slice, so the noise
does not depend on the replica count; the hinge losses are scaled with
engine.average_loss and applied with the regime's apply_gradients (global-batch
gradients); the generator's batch norm must be cross-replica (the configs bind
sngan_generator.norm_layer = @engine.cross_replica_batch_norm). Each
discriminator call with training=True advances its spectral-norm u vectors
once: real and fake go through one call per discriminator update (one power
iteration per update, both halves normalised by the same sigma), and the
generator update makes one more call.

Under a mixed precision (TrainSpec.precision) G and D compute in bfloat16 or
float16; generated images and D's logits are cast to float32 (so the hinge
losses, the concatenation with real images and the scorer see float32), and
spectral norm runs its power iteration in float32 (models/spectral_norm.py).

Evaluation scores a fixed set of generated samples (fixed z, labels balanced
over the classes) with a scorer (Fashion-MNIST classifier or Inception
features, replibench.eval.scorers): FID (the target, lower is better),
classifier score and KID, next to the same scores of real held-out images at
the same N, plus a per-class grid. The data sources are in replibench.data
(sources.FashionMNIST, imagenet_gan.Imagenet2012Gan, and synthetic.SyntheticImages,
which is never evaluated and needs no scorer: ConditionalGAN.scorer = None).
"""

import concurrent.futures
import dataclasses

import gin
import keras
import numpy as np
import tensorflow as tf

from models.sngan import build_models, d_hinge_loss, g_hinge_loss
from replibench import engine, errors, inputs
from replibench.engine.measure import cost
from replibench.errors import UserError
from replibench.eval import evaluate as evaluate_lib
from replibench.workloads import build_once, precision
from replibench.workloads.base import TrainSpec, Workload

GRID_CLASSES = 10   # Rows of the per-class sample grid (classes evenly spaced).


def _outside_strategy(fn, *args):
  """Runs fn(*args) with no tf.distribute strategy in force; returns its result.

  build() runs under the replicator's scope, but the scorer's model (the
  evaluation classifier, possibly trained here, or Inception) must be built
  outside any strategy, or its variables would be mirrored and Model.fit
  distributed. A strategy scope is per thread, so a helper thread sees none.
  """
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(fn, *args).result()


@gin.configurable
class ConditionalGAN(Workload):
  """Hinge-loss conditional GAN; target metric eval/fid (lower is better)."""

  target_metric = "eval/fid"
  higher_is_better = False
  target_range = (0.0, float("inf"))   # FID is a distance.

  def __init__(self, generator=gin.REQUIRED, discriminator=gin.REQUIRED, data=gin.REQUIRED,
               scorer=gin.REQUIRED, name: str = "sngan", n_dis: int = 5,
               learning_rate: float = 2e-4, beta_1: float = 0.0, beta_2: float = 0.9,
               epsilon: float = 1e-8, z_dim: int = 128, eval_num_samples: int = 5000,
               eval_batch_size: int = 500, grid_samples_per_class: int = 10):
    check = lambda key, value, *a, **k: inputs.number(  # noqa: E731
        f"ConditionalGAN.{key}", value, *a, **k)
    check("n_dis", n_dis, 1, integer=True, meaning="discriminator steps a generator step")
    check("eval_num_samples", eval_num_samples, 2, integer=True)
    check("eval_batch_size", eval_batch_size, 1, integer=True)
    check("grid_samples_per_class", grid_samples_per_class, 0, integer=True)
    check("z_dim", z_dim, 1, integer=True)
    check("learning_rate", learning_rate, 0, low_open=True)
    check("beta_1", beta_1, 0, 1, high_open=True)
    check("beta_2", beta_2, 0, 1, high_open=True)
    check("epsilon", epsilon, 0, low_open=True)
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

  def _build_models(self, policy: str):
    num_classes = self.data.num_classes
    with precision.policy_scope(policy):
      generator = self.generator_fn(num_classes=num_classes, z_dim=self.z_dim)
      discriminator = self.discriminator_fn(num_classes=num_classes)
      build_models(generator, discriminator)
    return generator, discriminator

  def _make_models(self, spec: TrainSpec | None = None):
    """G and D under spec's precision (float32 without one); one build per plan
    (build_once)."""
    policy = spec.precision if spec else precision.FLOAT32
    generator, discriminator = build_once.built(self, policy, lambda: self._build_models(policy))
    if tuple(generator.image_shape) != tuple(self.data.image_shape):
      raise UserError(f"The generator makes {generator.image_shape} images but the data "
                      f"source gives {tuple(self.data.image_shape)}; fix the sngan_generator "
                      f"bindings (widths, bottom_width, out_channels).")
    return generator, discriminator

  def _adam(self, name, spec: TrainSpec | None = None):
    adam = keras.optimizers.Adam(self.lr, beta_1=self.beta_1, beta_2=self.beta_2,
                                 epsilon=self.epsilon, name=name)
    return precision.wrap_optimizer(adam, spec.precision) if spec else adam

  def check_config(self, spec: TrainSpec) -> None:
    if self.scorer is None and not self.synthetic_data:
      raise UserError("ConditionalGAN.scorer = None: only synthetic data (which is never "
                      "evaluated) runs without a scorer; bind @InceptionScorer() or "
                      "@FashionMNISTScorer().")
    try:
      self._make_models(spec)
    except (ValueError, TypeError) as e:
      raise errors.build_failure("ConditionalGAN's generator or discriminator", e) from None

  def build_learner(self, spec: TrainSpec) -> None:
    self.spec = spec
    keras.utils.set_random_seed(spec.seed)
    self.generator, self.discriminator = self._make_models(spec)
    self.g_optimizer, self.d_optimizer = self._adam("g_adam", spec), self._adam("d_adam", spec)
    # Keras 3 optimizers must create their slots under the scope, before tracing.
    spec.build_optimizer(self.g_optimizer, self.generator.trainable_variables)
    spec.build_optimizer(self.d_optimizer, self.discriminator.trainable_variables)
    self._noise_seed = tf.constant([spec.seed, 0x5A6A], tf.int64)

  def element_spec(self, per_replica_batch_size: int):
    b = per_replica_batch_size
    return (tf.TensorSpec((self.n_dis, b, *self.data.image_shape), tf.float32),
            tf.TensorSpec((self.n_dis, b), tf.int32))

  def build(self, spec: TrainSpec) -> None:
    self.build_learner(spec)
    if self.synthetic_data:
      return   # Never evaluated: no samples to score, no reference statistics.
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
    self._sample = tf.function(
        lambda z, y: precision.to_float32(self.generator(z, y, training=False)),
        reduce_retracing=True)

  @engine.keeps_replicas   # The sources keep ctx.keep's replicas; regrouping follows.
  def input_fn(self, ctx: engine.InputContext) -> tf.data.Dataset:
    """Per replica: (images [n_dis, b, H, W, C] in [-1, 1], labels int32 [n_dis, b]).

    The source's per-replica batches are regrouped so that discriminator update
    k of step s uses the same global batch of real images for any replica count:
    this pipeline's R replicas take turns on its batches, so R * n_dis
    consecutive batches [k, r] become R elements [r][k]. A worker's context (keep)
    has its source keep its R replicas' batches of each update's turn (the whole
    stream's element i is replica i % N's), which regroup the same way.
    """
    if self.synthetic_data:   # Already [n_dis, b, ...] per replica, made once.
      return self.data.train(ctx, self.spec.seed, updates=self.n_dis)
    replicas_here = ctx.replica_range()[1]
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
    # Forward and backward: one XLA cluster under TrainSpec.jit_compile; the exchange
    # (in apply_gradients) stays outside it.
    # The noise outside the compiled pass: XLA's stateless random numbers are not the
    # graph's, and the same step must see the same z on either path.
    z, fake_labels = self._noise(step, update, real.shape[0])
    loss, grads = self.spec.compiled(self._discriminator_gradients)(real, real_labels, z,
                                                                      fake_labels)
    metrics = self.spec.regime.apply_gradients(self.d_optimizer, grads,
                                               self.discriminator.trainable_variables)
    return loss, metrics

  def _discriminator_gradients(self, real, real_labels, z, fake_labels):
    """This replica's discriminator loss share and its gradients."""
    b = real.shape[0]
    fake = precision.to_float32(self.generator(z, fake_labels, training=True))
    variables = self.discriminator.trainable_variables
    with tf.GradientTape() as tape:
      logits = precision.to_float32(self.discriminator(
          tf.concat([real, fake], 0), tf.concat([real_labels, fake_labels], 0), training=True))
      # Hinge loss: mean(relu(1 - D(x))) + mean(relu(1 + D(G(z)))) over the global batch.
      loss = engine.average_loss(d_hinge_loss(logits[:b], logits[b:]),
                                 self.spec.global_batch_size)
      scaled = precision.scaled(self.d_optimizer, loss)
    return loss, tape.gradient(scaled, variables)

  def _generator_update(self, step, b):
    z, labels = self._noise(step, self.n_dis, b)   # Outside, as for the discriminator.
    loss, grads = self.spec.compiled(self._generator_gradients)(z, labels)
    metrics = self.spec.regime.apply_gradients(self.g_optimizer, grads,
                                               self.generator.trainable_variables)
    return loss, metrics

  def _generator_gradients(self, z, labels):
    """This replica's generator loss share and its gradients."""
    variables = self.generator.trainable_variables
    with tf.GradientTape() as tape:
      logits = precision.to_float32(self.discriminator(
          self.generator(z, labels, training=True), labels, training=True))
      # Generator hinge loss: -mean(D(G(z))) over the global batch.
      loss = engine.average_loss(g_hinge_loss(logits), self.spec.global_batch_size)
      scaled = precision.scaled(self.g_optimizer, loss)
    return loss, tape.gradient(scaled, variables)

  def step_fn(self, batch) -> dict:
    images, labels = batch
    # The generator's Adam counts generator steps (and is checkpointed with it).
    step = tf.convert_to_tensor(self.g_optimizer.iterations)
    d_losses, d_metrics = zip(*(self._discriminator_update(images[k], labels[k], step, k)
                                for k in range(self.n_dis)))
    g_loss, g_metrics = self._generator_update(step, images.shape[1])
    # Each loss is this replica's share (1/N of its local mean): times N the local mean,
    # which the engine averages over replicas (no collective of its own).
    d_loss = tf.add_n(d_losses) / self.n_dis * engine.num_replicas()
    g_loss = g_loss * engine.num_replicas()
    metrics = sum((*d_metrics, g_metrics), engine.StepMetrics())   # In the updates' order.
    return {"loss": d_loss, "d_loss": d_loss, "g_loss": g_loss, **metrics}

  def _generated_outputs(self):
    outputs = []
    for i in range(0, self.eval_num_samples, self.eval_batch_size):
      j = i + self.eval_batch_size
      images = self._sample(self._eval_z[i:j], self._eval_labels[i:j]).numpy()
      outputs.append(self.scorer.featurize(images))
    return (np.concatenate([f for f, _ in outputs]), np.concatenate([p for _, p in outputs]))

  def prepare_evaluation(self, replicator: engine.BaseReplicator) -> None:
    del replicator   # Sampling runs on the host from the (identical) replica-0 weights.
    if self.synthetic_data:
      return
    for z, labels in ((self._eval_z[:self.eval_batch_size],
                       self._eval_labels[:self.eval_batch_size]),
                      (self._grid_z, self._grid_labels)):
      self._sample.get_concrete_function(z, labels)   # Traced in init, not in the timed span.

  def eval_examples(self) -> int:
    return self.eval_num_samples

  def mlperf_hyperparameters(self, spec: TrainSpec) -> dict:
    del spec
    return {"opt_name": "adam", "opt_base_learning_rate": self.lr,
            "opt_adam_beta_1": self.beta_1, "opt_adam_beta_2": self.beta_2,
            "opt_adam_epsilon": self.epsilon, "n_dis": self.n_dis}

  def evaluate(self, replicator: engine.BaseReplicator) -> dict:
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
        # n_dis discriminator updates and one generator update per step.
        "gradient_tensors": (self.n_dis * cost.sizes(discriminator.trainable_variables)
                             + cost.sizes(generator.trainable_variables)),
        "state_tensors": (cost.state_sizes(self._adam("g"), generator.trainable_variables)
                          + cost.state_sizes(self._adam("d"), discriminator.trainable_variables)),
        "learning_rate": {"generator": self.lr, "discriminator": self.lr,
                          "adam_betas": (self.beta_1, self.beta_2), "n_dis": self.n_dis},
    }
