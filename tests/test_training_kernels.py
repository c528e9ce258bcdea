"""engine/training_kernels: the fused (and, for AsyncPS, locking) updates compute Keras' own math."""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench.engine import training_kernels
from replibench.errors import UserError

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-2, beta_1=0.5, beta_2=0.9),
    "adam_beta1_0": lambda: keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9),
    "amsgrad": lambda: keras.optimizers.Adam(1e-2, amsgrad=True),
    "adamw_clipped": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1, global_clipnorm=0.5),
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "momentum_schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5), momentum=0.9),
}


def _trained(make_optimizer, rewire=None, steps: int = 5) -> list:
  """Variables and slots after `steps` updates of two variables with fixed gradients."""
  rng = np.random.default_rng(0)
  variables = [keras.Variable(rng.normal(size=shape).astype(np.float32))
               for shape in ((3, 4), (4,))]
  optimizer = make_optimizer()
  optimizer.build(variables)
  if rewire:
    rewire(optimizer)
  for step in range(steps):
    grads = [tf.constant(rng.normal(size=v.shape) * (step + 1), tf.float32) for v in variables]
    optimizer.apply_gradients(zip(grads, variables))
  return [v.numpy() for v in [*variables, *optimizer.variables]]


def _locking_flags(optimizer, rewire=training_kernels.make_updates_atomic) -> list:
  """use_locking of each ResourceApply* op in one traced apply_gradients of a rewired
  optimizer."""
  variable = keras.Variable(np.zeros(3, np.float32))
  optimizer.build([variable])
  rewire(optimizer)
  update = tf.function(lambda: optimizer.apply_gradients([(tf.ones(3), variable)]))
  ops = update.get_concrete_function().graph.get_operations()
  return [op.get_attr("use_locking") for op in ops if op.type.startswith("ResourceApply")]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_locking_kernels_compute_keras_updates(name):
  # The rewired optimizer does update through a locking kernel...
  assert _locking_flags(OPTIMIZERS[name]()) == [True]
  # ...and computes what Keras' own update computes.
  keras_values = _trained(OPTIMIZERS[name])
  locked_values = _trained(OPTIMIZERS[name], training_kernels.make_updates_atomic)
  assert len(keras_values) == len(locked_values) > 3
  # The kernels order the same float32 arithmetic differently (AMSGrad's the most).
  for keras_value, locked_value in zip(keras_values, locked_values):
    np.testing.assert_allclose(locked_value, keras_value, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_kernels_compute_keras_updates(name):
  """Synchronous regimes' rewiring: one kernel a variable, no lock, Keras' values."""
  assert _locking_flags(OPTIMIZERS[name](), training_kernels.use_training_kernels) == [False]
  keras_values = _trained(OPTIMIZERS[name])
  fused_values = _trained(OPTIMIZERS[name], training_kernels.use_training_kernels)
  for keras_value, fused_value in zip(keras_values, fused_values):
    np.testing.assert_allclose(fused_value, keras_value, rtol=2e-5, atol=1e-7)


def test_fused_kernels_reach_inside_a_loss_scale_optimizer_and_skip_others():
  scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
  assert _locking_flags(scaled, training_kernels.use_training_kernels) == [False]
  other = keras.optimizers.RMSprop(1e-3)
  other.build([keras.Variable(np.zeros(2, np.float32))])
  assert not training_kernels.use_training_kernels(other)
  assert "update_step" not in vars(other)


def test_concurrent_updates_lose_nothing():
  """Threads updating one Adam concurrently: every update counted, slots exact.

  With a constant gradient g, Adam's slots after n updates are m = g(1 - b1^n),
  v = g^2(1 - b2^n) whatever the interleaving, if no update is lost.
  """
  variable = keras.Variable(np.zeros(1000, np.float32))
  optimizer = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9)
  optimizer.build([variable])
  training_kernels.make_updates_atomic(optimizer)
  grad = tf.fill([1000], 0.5)
  update = tf.function(lambda: optimizer.apply_gradients([(grad, variable)]))
  update()
  threads, per_thread = 4, 25

  def work():
    for _ in range(per_thread):
      update()

  workers = [threading.Thread(target=work) for _ in range(threads)]
  for t in workers:
    t.start()
  for t in workers:
    t.join()
  n = 1 + threads * per_thread
  assert int(optimizer.iterations.numpy()) == n
  slots = optimizer._momentums + optimizer._velocities   # pylint: disable=protected-access
  m, v = (slot.numpy() for slot in slots)
  np.testing.assert_allclose(m, 0.5 * (1 - 0.5**n), rtol=1e-5)
  np.testing.assert_allclose(v, 0.25 * (1 - 0.9**n), rtol=1e-5)


@pytest.mark.parametrize("optimizer", [keras.optimizers.RMSprop, keras.optimizers.Nadam])
def test_unwired_optimizers_are_refused(optimizer):
  opt = optimizer(1e-3)
  opt.build([keras.Variable(np.zeros(2, np.float32))])
  with pytest.raises(UserError, match=f"optimizer is {optimizer.__name__}.*SGD or Adam"):
    training_kernels.make_updates_atomic(opt)


@pytest.mark.parametrize("option", [{"use_ema": True}, {"gradient_accumulation_steps": 2}])
def test_racing_optimizer_options_are_refused(option):
  opt = keras.optimizers.Adam(1e-3, **option)
  opt.build([keras.Variable(np.zeros(2, np.float32))])
  with pytest.raises(UserError, match="use_ema or gradient_accumulation_steps"):
    training_kernels.make_updates_atomic(opt)
