"""Mixed precision for the workloads: Keras dtype policies and dynamic loss scaling.

`Experiment.precision` names a Keras mixed-precision policy:

  'float32'         everything in float32 (the default).
  'mixed_bfloat16'  layers compute in bfloat16; variables stay float32. No loss
                    scaling: bfloat16 has float32's exponent range.
  'mixed_float16'   layers compute in float16; variables stay float32; the
                    optimizer is wrapped in keras.optimizers.LossScaleOptimizer
                    (dynamic loss scaling: the loss is multiplied by a scale S
                    before differentiation, the gradients divided by S before
                    the update; a step whose gradients are not finite is skipped
                    and S halved; after 2,000 finite steps S doubles).

What stays float32 whatever the policy: variables and optimizer slots (Keras
policies keep the variable dtype float32), the gradients (differentiated with
respect to float32 variables; the engine all-reduces them in float32, so the
bytes a step sends do not change), the loss (the workloads cast model outputs
to float32 before it), batch-norm statistics (Keras BatchNormalization and the
engine's batch norms upcast to float32), spectral-norm power iterations
(models/spectral_norm.py) and D4PG's distributional projection (models/d4pg.py).

Skipping is consistent across replicas: under regimes.Sync the engine
all-reduces the (scaled) gradients before the optimizer sees them, so every
replica checks the same summed gradients for inf/NaN, and one replica's
overflow makes the sum non-finite on all of them (no extra collective). Regimes
that apply per-replica gradients could not agree without one, so float16 is
refused with them (Experiment validation).

The policy is in force only while models are built (`policy_scope`): Keras
layers take the global policy when they are constructed and keep it, and the
previous policy is restored afterwards, so nothing leaks into later builds.
"""

import contextlib

import keras
import tensorflow as tf

FLOAT32, BFLOAT16, FLOAT16 = "float32", "mixed_bfloat16", "mixed_float16"
PRECISIONS = (FLOAT32, BFLOAT16, FLOAT16)


@contextlib.contextmanager
def policy_scope(precision: str):
  """Keras' global dtype policy is `precision` inside, the previous one after.

  Keras keeps the policy per thread: build models in the thread that entered.
  """
  if precision not in PRECISIONS:
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, precision: str):
  """The optimizer a workload steps: a LossScaleOptimizer around it for float16.

  Its variables and slots are created by `regime.build_optimizer` like any
  optimizer's; the loss scale (float32 scalar) and its growth counter join them
  (and the checkpoint).
  """
  if precision == FLOAT16:
    return keras.optimizers.LossScaleOptimizer(optimizer, name=f"{optimizer.name}_loss_scale")
  return optimizer


def scaled(optimizer, loss: tf.Tensor) -> tf.Tensor:
  """loss times the optimizer's current loss scale (loss itself without one).

  Call inside the gradient tape; the optimizer unscales the gradients it applies.
  """
  return optimizer.scale_loss(loss)


def to_float32(x):
  """A model output in float32, for losses, metrics and the host."""
  return tf.cast(x, tf.float32)


def describe(precision: str) -> dict:
  """The plan's precision facts: dtypes and loss scaling."""
  policy = keras.DTypePolicy(precision)
  return {
      "policy": precision,
      "compute_dtype": policy.compute_dtype,
      "variable_dtype": policy.variable_dtype,
      # The engine all-reduces float32 gradients whatever the compute dtype (no
      # compute-dtype all-reduce): bytes per step are those of float32.
      "gradient_allreduce_dtype": "float32",
      "loss_scaling": ("dynamic (LossScaleOptimizer: initial 2^15, x2 every 2000 finite "
                       "steps, /2 and the step skipped on inf/NaN gradients)"
                       if precision == FLOAT16 else "none"),
  }
