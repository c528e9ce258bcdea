"""Batch normalization across replicas: the two choices a config makes explicitly.

  @engine.cross_replica_batch_norm  batch statistics of the whole global batch
      (every replica all-reduces [sum x, sum x^2, count] in one collective per
      layer, and the gradient needs one more on the backward pass). N replicas
      at global batch B compute exactly what one replica computes at batch B:
      replication does not change the math, and the equivalence tests hold for
      this choice. Cost: 2 latency-bound collectives per layer and step.
  @engine.per_replica_batch_norm  batch statistics of each replica's own share
      (Goyal et al. 2017, the MLPerf ResNet reference: "BN per GPU"). No
      collective on the training path; changes the math as soon as there is
      more than one replica (statistics over B/N examples), like any
      ghost-batch norm. The moving statistics are kept per replica and read as
      their replica mean, which by linearity of the moving average equals what
      averaging every update would give.

Models receive either through gin (`norm_layer = @engine.cross_replica_batch_norm`),
never by import. Both take their momentum and epsilon from one setting,
`engine.batch_norm_setting` (the config's recipe): switching norm_layer from one kind
to the other (as the noise-scale sweep does) changes where the statistics come from
and nothing else. `replibench plan` states the setting and the kinds the models use.
"""

import contextlib

import gin
import keras
import tensorflow as tf

from replibench import inputs, internals
from replibench.engine import collectives
from replibench.errors import UserError

_MOVING = ("moving_mean", "moving_variance")


class CrossReplicaBatchNorm(keras.layers.BatchNormalization):
  """keras BatchNormalization whose training moments span all replicas.

  The moving statistics are updated from the global moments, so every replica
  computes the same values: they are written per replica (Keras' default
  aggregation 'none') and stay identical with no communication.
  """


def _global_moments(layer, inputs, mask):
  """(mean, variance) over the global batch: one all-reduce of [sum x, sum x^2, n]."""
  if mask is not None:
    raise ValueError("CrossReplicaBatchNorm does not support masks.")
  axes = internals.batch_norm_reduction_axes(layer)
  x = tf.cast(inputs, tf.float32)
  count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
  sums = tf.reduce_sum(x, axes)
  local = tf.stack([sums, tf.reduce_sum(tf.square(x), axes), tf.ones_like(sums) * count])
  total = collectives.all_reduce(local, "sum", kind="batch_norm")
  mean = total[0] / total[2]
  variance = tf.maximum(total[1] / total[2] - tf.square(mean), 0.0)
  return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


internals.replace_batch_norm_moments(CrossReplicaBatchNorm, _global_moments)


class PerReplicaBatchNorm(keras.layers.BatchNormalization):
  """keras BatchNormalization on each replica's own batch, with no collective in training.

  Statistics and normalization are computed in float32 under a mixed-precision
  policy, the output cast to the compute dtype (as Keras' own batch norm does).
  The moving mean and variance are on-read replicated variables (each replica
  updates its own copy; a read outside a replica, as a checkpoint does, gives
  the replica mean). Inference inside a replicated step uses that mean too,
  through one all-reduce of both statistics, so every replica evaluates with
  the same, checkpointed values.
  """

  def add_weight(self, *args, name=None, **kwargs):
    if name not in _MOVING:
      return super().add_weight(*args, name=name, **kwargs)
    return keras.Variable(
        initializer=keras.initializers.get(kwargs.get("initializer")), shape=kwargs.get("shape"),
        dtype=kwargs.get("dtype") or self.variable_dtype, trainable=False,
        autocast=False, aggregation="mean", synchronization="on_read", name=name)

  def call(self, inputs, training=None, mask=None):
    if training or tf.distribute.get_replica_context() is None:
      return super().call(inputs, training=training, mask=mask)
    stats = collectives.all_reduce(
        tf.stack([self.moving_mean.value, self.moving_variance.value]), "mean",
        kind="batch_norm")
    shape = [1] * len(inputs.shape)
    axis = self.axis if isinstance(self.axis, int) else self.axis[0]
    shape[axis] = inputs.shape[axis]
    # In float32 like Keras' own batch norm, whatever the compute dtype (mixed precision).
    reshape = lambda t: tf.cast(tf.reshape(t, shape), tf.float32)  # noqa: E731
    outputs = tf.nn.batch_normalization(
        tf.cast(inputs, tf.float32), reshape(stats[0]), reshape(stats[1]),
        reshape(self.beta) if self.center else None,
        reshape(self.gamma) if self.scale else None, self.epsilon)
    return tf.cast(outputs, self.compute_dtype)


@gin.configurable(module="engine")
def batch_norm_setting(momentum: float = 0.99, epsilon: float = 1e-3) -> dict:
  """The momentum of the moving statistics and the epsilon of every batch norm the
  engine makes, cross-replica or per-replica (defaults: Keras')."""
  inputs.number("engine.batch_norm_setting.momentum", momentum, 0, 1, high_open=True)
  inputs.number("engine.batch_norm_setting.epsilon", epsilon, 0, low_open=True)
  return {"momentum": momentum, "epsilon": epsilon}


_MADE: list = []   # A stack of sets: the kinds made inside recording() blocks.


@contextlib.contextmanager
def recording():
  """Inside, the kinds of batch norm the factories make are added to the set yielded."""
  made = set()
  _MADE.append(made)
  try:
    yield made
  finally:
    _MADE.remove(made)


def _made(kind: str, cls, kwargs):
  """cls(**kwargs) with the engine's one momentum and epsilon (a binding of either on
  a factory would give one kind its own recipe: refused)."""
  own = sorted(k for k in ("momentum", "epsilon") if k in kwargs)
  if own:
    raise UserError(
        f"engine.{kind}.{own[0]} = {inputs.shown(kwargs[own[0]])}: batch norm's momentum and "
        f"epsilon are one setting for the cross-replica and per-replica kinds, so that "
        f"switching norm_layer keeps the recipe; bind engine.batch_norm_setting.{own[0]} "
        f"instead.")
  for made in _MADE:
    made.add(kind)
  return cls(**batch_norm_setting(), **kwargs)


# gin's class decorator hides __init__'s signature from Keras's Layer.__new__,
# so configs reference these factories instead of the classes.
@gin.configurable(module="engine")
def cross_replica_batch_norm(**kwargs) -> CrossReplicaBatchNorm:
  """Factory for models' `norm_layer` argument: CrossReplicaBatchNorm(**kwargs), with
  engine.batch_norm_setting's momentum and epsilon."""
  return _made("cross_replica_batch_norm", CrossReplicaBatchNorm, kwargs)


@gin.configurable(module="engine")
def per_replica_batch_norm(**kwargs) -> PerReplicaBatchNorm:
  """Factory for models' `norm_layer` argument: PerReplicaBatchNorm(**kwargs), with
  engine.batch_norm_setting's momentum and epsilon."""
  return _made("per_replica_batch_norm", PerReplicaBatchNorm, kwargs)
