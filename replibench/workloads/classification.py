"""Image classification (the paper's ResNet experiment) as a replicated workload.

The researcher's view: `step_fn` is a one-device training step (cross-entropy
with label smoothing, L2 weight decay, SGD with momentum); the engine's
`average_loss` and `apply_gradients` make it correct on any number of replicas.
The learning rate follows Goyal et al.: base_lr per 256 examples, scaled
linearly with the global batch, with linear warmup and cosine decay. Under a
mixed precision (TrainSpec.precision) the model computes in bfloat16/float16
and its logits are cast to float32 before the loss (workloads/precision.py).
"""

from typing import Callable

import gin
import keras
import tensorflow as tf

from replibench import engine, errors, inputs
from replibench.engine.measure import cost
from replibench.errors import UserError
from replibench.workloads import build_once, precision
from replibench.workloads.base import TrainSpec, Workload
from models.resnet import decayed_weights


@gin.configurable
class ImageClassification(Workload):
  """Supervised classification; target metric eval/top1 (fraction in [0, 1])."""

  target_metric = "eval/top1"
  target_range = (0.0, 1.0)       # A fraction of the test set.
  mlperf_benchmark = "resnet"     # The paper's (and MLPerf's) ResNet time-to-accuracy run.

  def __init__(self, model: Callable[..., keras.Model] = gin.REQUIRED,
               data=gin.REQUIRED, name: str = "image_classification",
               base_lr_per_256: float = 0.1, warmup_epochs: float = 1.0,
               momentum: float = 0.9, nesterov: bool = True, label_smoothing: float = 0.1,
               weight_decay: float = 5e-5, eval_batch_size: int = 1000):
    check = lambda key, value, *a, **k: inputs.number(  # noqa: E731
        f"ImageClassification.{key}", value, *a, **k)
    check("base_lr_per_256", base_lr_per_256, 0, low_open=True)
    check("warmup_epochs", warmup_epochs, 0, meaning="epochs")
    check("momentum", momentum, 0, 1, high_open=True)
    check("label_smoothing", label_smoothing, 0, 1, high_open=True)
    check("weight_decay", weight_decay, 0)
    check("eval_batch_size", eval_batch_size, 1, integer=True)
    self.name = name
    self.model_fn, self.data = model, data
    self.base_lr_per_256, self.warmup_epochs = base_lr_per_256, warmup_epochs
    self.momentum, self.nesterov = momentum, nesterov
    self.label_smoothing, self.weight_decay = label_smoothing, weight_decay
    self.eval_batch_size = eval_batch_size
    self.model = self.optimizer = self.spec = self.schedule = self._eval_fn = None

  def examples_per_epoch(self) -> int:
    return self.data.train_examples()

  def _schedule(self, spec: TrainSpec):
    peak = self.base_lr_per_256 * spec.global_batch_size / 256
    warmup = int(round(self.warmup_epochs * spec.steps_per_epoch))
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else peak, warmup_target=peak if warmup else None,
        warmup_steps=warmup, decay_steps=max(1, spec.total_steps - warmup))

  def _optimizer(self, schedule) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(schedule, momentum=self.momentum, nesterov=self.nesterov)

  def _model(self, policy: str) -> keras.Model:
    """The model under the dtype policy named policy (one build per plan: build_once)."""
    def make():
      with precision.policy_scope(policy):
        return self.model_fn(num_classes=self.data.num_classes)
    return build_once.built(self, policy, make)

  def check_config(self, spec: TrainSpec) -> None:
    name = inputs.shown(self.model_fn)
    try:
      model = self._model(spec.precision)
    except (ValueError, TypeError) as e:
      raise errors.build_failure(f"ImageClassification.model = {name}", e) from None
    expected = tuple(model.input_shape[1:])
    if expected != tuple(self.data.image_shape):
      raise UserError(f"ImageClassification.model = {name} takes images of shape {expected} "
                      f"but the data source gives {tuple(self.data.image_shape)}; make the "
                      f"model's input_shape and the data's image size agree.")

  def build(self, spec: TrainSpec) -> None:
    self.spec = spec
    keras.utils.set_random_seed(spec.seed)
    self.model = self._model(spec.precision)
    self.schedule = self._schedule(spec)
    self.optimizer = precision.wrap_optimizer(self._optimizer(self.schedule), spec.precision)
    # Keras 3 optimizers must create their slots under the scope, before tracing.
    spec.build_optimizer(self.optimizer, self.model.trainable_variables)

  def element_spec(self, per_replica_batch_size: int):
    return (tf.TensorSpec((per_replica_batch_size, *self.data.image_shape), tf.float32),
            tf.TensorSpec((per_replica_batch_size,), tf.int32))

  @engine.keeps_replicas   # Every classification source honours ctx.keep.
  def input_fn(self, ctx: engine.InputContext) -> tf.data.Dataset:
    return self.data.train(ctx, self.spec.seed)

  def step_fn(self, batch) -> dict:
    variables = self.model.trainable_variables
    # Forward and backward: one XLA cluster under TrainSpec.jit_compile; the exchange
    # (in apply_gradients) stays outside it.
    loss, grads = self.spec.compiled(self._loss_and_gradients)(batch)
    metrics = self.spec.regime.apply_gradients(self.optimizer, grads, variables)
    # `loss` is this replica's share (1/N of its local mean): times N it is the local
    # mean, and the engine averages outputs over replicas (no collective of its own).
    return {"loss": loss * engine.num_replicas(), **metrics}

  def _loss_and_gradients(self, batch):
    """This replica's loss share (scalar) and the gradients of its (scaled) loss."""
    images, labels = batch
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      logits = precision.to_float32(self.model(images, training=True))
      targets = tf.one_hot(labels, self.data.num_classes)
      per_example = keras.losses.categorical_crossentropy(
          targets, logits, from_logits=True, label_smoothing=self.label_smoothing)
      loss = engine.average_loss(per_example, self.spec.global_batch_size)
      # Each replica adds 1/N of the L2 term, so the summed gradient has it once.
      l2 = tf.add_n([tf.nn.l2_loss(w) for w in decayed_weights(self.model)])
      loss += self.weight_decay * l2 / engine.num_replicas()
      scaled = precision.scaled(self.optimizer, loss)   # loss itself unless float16
    return loss, tape.gradient(scaled, variables)

  def _eval_step(self, batch):
    images, labels = batch
    logits = precision.to_float32(self.model(images, training=False))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                                             labels), tf.float32))
    return correct, tf.cast(tf.shape(labels)[0], tf.float32)

  def prepare_evaluation(self, replicator: engine.BaseReplicator) -> None:
    if self.synthetic_data:
      return   # Never evaluated: synthetic data has no test split.
    data = replicator.distribute(self.data.eval, self.eval_batch_size)

    @tf.function
    def eval_all():
      correct, count = tf.constant(0.0), tf.constant(0.0)
      for batch in data:
        c, n = replicator.reduce(replicator.run(self._eval_step, batch), "sum")
        correct, count = correct + c, count + n
      return correct, count

    eval_all.get_concrete_function()   # Traced in init, not in the timed span.
    self._eval_fn = eval_all

  def evaluate(self, replicator: engine.BaseReplicator) -> dict:
    if self._eval_fn is None:
      self.prepare_evaluation(replicator)
    correct, count = self._eval_fn()
    return {"eval/top1": float(correct / count), "eval/examples": int(count)}

  def eval_examples(self) -> int:
    return self.data.eval_examples()

  def mlperf_hyperparameters(self, spec: TrainSpec) -> dict:
    schedule = self._schedule(spec)
    return {"opt_name": "sgd", "opt_base_learning_rate": self.base_lr_per_256 *
            spec.global_batch_size / 256, "opt_learning_rate_warmup_steps": schedule.warmup_steps,
            "opt_momentum": self.momentum, "opt_weight_decay": self.weight_decay,
            "label_smoothing": self.label_smoothing}

  def checkpoint_items(self) -> dict:
    return {"model": self.model, "optimizer": self.optimizer}

  def learning_rate(self, step: int) -> float:
    return float(self.schedule(step)) if self.schedule is not None else float("nan")

  def hparams(self) -> dict:
    return {"learning_rate": self.base_lr_per_256 * self.spec.global_batch_size / 256,
            "base_lr_per_256": self.base_lr_per_256, "warmup_epochs": self.warmup_epochs,
            "label_smoothing": self.label_smoothing, "weight_decay": self.weight_decay}

  def describe(self, spec: TrainSpec) -> dict:
    model = self._model(keras.config.dtype_policy().name)   # The global policy's.
    forward = cost.forward_flops(model, self.data.image_shape)
    schedule = self._schedule(spec)
    return {
        "parameters": cost.parameter_count(model),
        "forward_flops_per_example": forward,
        "train_flops_per_example": 3 * forward,   # forward + backward (about 2x forward)
        "allreduce_bytes_per_step": cost.gradient_bytes(model),
        "gradient_tensors": cost.sizes(model.trainable_variables),
        "state_tensors": cost.state_sizes(self._optimizer(schedule), model.trainable_variables),
        "learning_rate": {"peak": self.base_lr_per_256 * spec.global_batch_size / 256,
                          "warmup_steps": schedule.warmup_steps,
                          "decay": f"cosine over {schedule.decay_steps} steps"},
    }
