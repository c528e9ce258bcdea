"""Optimizer updates through TensorFlow's fused training kernels.

Keras 3 optimizers update a variable and its slots with separate ops: Adam
takes ~28 kernels a variable (power, casts, two slot updates, the step), each
with a fixed cost in the executor. Rewired here, a Keras SGD or Adam updates
each variable with one of TensorFlow's training kernels (ResourceApplyAdam,
ResourceApplyKerasMomentum, ...), whose arithmetic is Keras' own: the same
formulas in the same order on the same slots, so a checkpoint is
interchangeable and results agree to float32 rounding (tests/test_training_kernels.py).

Synchronous regimes use them for speed (`use_training_kernels`): a SN-GAN step
makes 64 variable updates (two discriminator steps and a generator step) on
every replica, and under MirroredStrategy every replica's copy is updated and
traced on its own, so Adam's ops were 35% of a replica's step graph (1,792 of
5,183 non-constant ops) and 4.3 s of the 4-replica trace. Any other optimizer
keeps its own update.

Asynchronous workers need them for correctness (`make_updates_atomic`): Keras
Adam computes `v += (g^2 - v) * (1 - beta_2)` from a read of v, then adds. When
W workers update the same parameter-server variables at once, another worker's
write lands between that read and the add, and the update is computed from a
stale slot: with W = 4, Adam's v is decayed several times over and can approach
zero, so m / sqrt(v) explodes and the run diverges (the SN-GAN did, within 20
steps). The iteration counter has the same race (KerasVariable.assign_add is a
read and an assign), so counts were lost. There each kernel runs with
use_locking=True: it holds the locks of the variable and its slots while it
reads and writes them (TF1 optimizers' use_locking option), and the iteration
counter is incremented with one atomic add. Keras' weight decay is already an
atomic assign_sub. Gradients are still computed from parameters read before
other workers' updates: that is the staleness asynchronous training has by
design, not a race.
"""

import keras
import tensorflow as tf

from replibench import internals
from replibench.errors import UserError


def _slot_handles(optimizer, variable, *slot_lists: str) -> list:
  """Resource handles of this variable's slots in the optimizer's named slot lists."""
  return [internals.optimizer_slot(optimizer, variable, name).value.handle
          for name in slot_lists]


def _adam_update(optimizer, locking: bool):
  """Keras Adam's update_step (AMSGrad too) as one ResourceApplyAdam* kernel per variable;
  locking: the kernel's use_locking."""

  def update_step(gradient, variable, learning_rate):
    dtype = variable.dtype
    cast = lambda x: tf.cast(x, dtype)
    step = cast(optimizer.iterations + 1)
    beta_1, beta_2 = cast(optimizer.beta_1), cast(optimizer.beta_2)
    kwargs = dict(var=variable.handle, beta1_power=beta_1**step, beta2_power=beta_2**step,
                  lr=cast(learning_rate), beta1=beta_1, beta2=beta_2,
                  epsilon=cast(optimizer.epsilon), grad=cast(tf.convert_to_tensor(gradient)),
                  use_locking=locking)
    if optimizer.amsgrad:
      m, v, v_hat = _slot_handles(optimizer, variable, "_momentums", "_velocities",
                                  "_velocity_hats")
      return tf.raw_ops.ResourceApplyAdamWithAmsgrad(m=m, v=v, vhat=v_hat, **kwargs)
    m, v = _slot_handles(optimizer, variable, "_momentums", "_velocities")
    return tf.raw_ops.ResourceApplyAdam(m=m, v=v, **kwargs)

  return update_step


def _sgd_update(optimizer, locking: bool):
  """Keras SGD's update_step (momentum, Nesterov) as one kernel per variable."""

  def update_step(gradient, variable, learning_rate):
    dtype = variable.dtype
    lr, grad = tf.cast(learning_rate, dtype), tf.cast(tf.convert_to_tensor(gradient), dtype)
    if optimizer.momentum == 0:
      return tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=lr, delta=grad,
                                                     use_locking=locking)
    # Keras' SGD: m = momentum * m - lr * g; var += m (or the Nesterov form).
    accum, = _slot_handles(optimizer, variable, "momentums")
    return tf.raw_ops.ResourceApplyKerasMomentum(
        var=variable.handle, accum=accum, lr=lr, grad=grad,
        momentum=tf.cast(optimizer.momentum, dtype), use_locking=locking,
        use_nesterov=optimizer.nesterov)

  return update_step


def _atomic_increment(counter):
  """KerasVariable.assign_add reads and then assigns; the tf.Variable's is one atomic op."""
  return lambda delta: counter.value.assign_add(tf.cast(delta, counter.dtype))


def _rewire(optimizer, locking: bool) -> bool:
  """Points a Keras SGD or Adam (or a subclass keeping their update_step) at a kernel.

  A subclass that overrides update_step computes something else: not wired (False).
  """
  update = type(optimizer).update_step
  if update is keras.optimizers.Adam.update_step:
    optimizer.update_step = _adam_update(optimizer, locking)
  elif update is keras.optimizers.SGD.update_step:
    optimizer.update_step = _sgd_update(optimizer, locking)
  else:
    return False
  return True


def use_training_kernels(optimizer) -> bool:
  """Rewires a built Keras SGD or Adam (also inside a LossScaleOptimizer) to update each
  variable with one training kernel; returns False (and changes nothing) for others."""
  return _rewire(getattr(optimizer, "inner_optimizer", optimizer), locking=False)


def make_updates_atomic(optimizer) -> None:
  """Rewires a built Keras SGD or Adam (AdamW, ...) to update with locking kernels.

  Raises UserError for other optimizers (and subclasses with their own
  update_step), and for EMA or gradient accumulation, whose read-then-write
  updates this module does not replace: they would race between workers.
  """
  if optimizer.use_ema or optimizer.gradient_accumulation_steps:
    raise UserError(
        f"Experiment.regime = @regimes.AsyncPS(): the workload's {type(optimizer).__name__} "
        f"uses use_ema or gradient_accumulation_steps, whose updates would race between "
        f"workers; turn them off or use a synchronous regime.")
  if not _rewire(optimizer, locking=True):
    raise UserError(
        f"Experiment.regime = @regimes.AsyncPS() applies each worker's update with "
        f"TensorFlow's locking training kernels, which replibench wires for Keras SGD and "
        f"Adam (and their subclasses, e.g. AdamW); the workload's optimizer is "
        f"{type(optimizer).__name__}, whose read-then-write update would race between "
        f"workers. Use SGD or Adam, or a synchronous regime.")
  counter = internals.optimizer_iterations(optimizer)
  counter.assign_add = _atomic_increment(counter)
