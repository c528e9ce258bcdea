"""XLA compilation of the replicated step, around its exchange (TrainSpec.jit_compile).

A replicated step is three parts: each replica's forward and backward pass, the
exchange between replicas (the regime's all-reduce, gossip, parameter-server
transfer...), and the optimizer update. The exchange is a collective, and on CPU
(and under MultiWorkerMirroredStrategy anywhere) a collective cannot live inside an
XLA cluster; a nested tf.function that reaches a replica context's merge_call is
refused by tf.distribute. So the step is compiled AROUND the exchange, on every
device kind alike, as Keras 2 compiled its optimizers and as TensorFlow's
auto-clustering partitions a graph:

  gradients = spec.compiled(forward_backward)(batch)   # one XLA cluster per replica
  regime.apply_gradients(optimizer, gradients, vars)   # exchange: not compiled
    -> optimizer.update_step(grad, var, lr)            # one XLA cluster per variable
                                                       #   and device (compile_updates)

The workload writes its forward and backward pass as one function and calls it
through `TrainSpec.compiled`; `TrainSpec.build_optimizer` compiles the update.
Neither changes the math: XLA fuses and may reorder float operations, so a compiled
step matches the uncompiled one to float32 rounding, not bit for bit
(tests/test_compile.py states the tolerance).
"""

import contextlib
import functools
import threading

import tensorflow as tf

from replibench.engine import collectives
from replibench.errors import UserError


def compiled(fn, jit_compile: bool, what: str = "the workload's forward and backward pass"):
  """fn as one XLA cluster (tf.function(jit_compile=True)) when jit_compile, else fn.

  fn must not reach a collective (the exchange stays outside): one met while tracing
  it is the identity on one replica and a UserError naming `what` on several
  (collectives.compiled_piece). One tf.function, called by every replica:
  MirroredStrategy traces step_fn once per replica, under the replica's device, and
  the function traces (and XLA compiles) once per replica and input signature.
  Inside per_device_pieces() (a pipeline's step, whose pass spans devices) fn runs as
  it is, and the model compiles its per-device parts (device_piece).
  """
  if not jit_compile:
    return fn
  jitted = device_piece(fn, what)

  def call(*args, **kwargs):
    if getattr(_PER_DEVICE, "on", False):
      return fn(*args, **kwargs)
    return jitted(*args, **kwargs)

  return call


def device_piece(fn, what: str):
  """fn as one XLA cluster, placed on the device it is called under (see compiled)."""
  dense_shapes = []   # Per output leaf: a sparse gradient's static dense shape, or None.

  def piece(*args, **kwargs):
    with collectives.compiled_piece(what):
      outputs = fn(*args, **kwargs)
    dense_shapes[:] = [tf.get_static_value(t.dense_shape) if isinstance(t, tf.IndexedSlices)
                       else None for t in tf.nest.flatten(outputs)]
    return outputs

  jitted = tf.function(piece, jit_compile=True)

  def call(*args, **kwargs):
    try:
      outputs = jitted(*args, **kwargs)
    except RuntimeError as e:
      if "merge_call" not in str(e):
        raise
      raise UserError(_synchronises(what)) from None
    # A function's outputs lose a sparse gradient's constant dense shape (an embedding's):
    # restored, so that regimes size it as before.
    flat = [t if shape is None else tf.IndexedSlices(t.values, t.indices,
                                                    tf.constant(shape, t.dense_shape.dtype))
            for t, shape in zip(tf.nest.flatten(outputs), dense_shapes)]
    return tf.nest.pack_sequence_as(outputs, flat)

  return call


_PER_DEVICE = threading.local()   # Per thread: MirroredStrategy traces each replica in its own.


@contextlib.contextmanager
def per_device_pieces():
  """While a step is traced inside: `compiled` pieces run uncompiled, and
  compiles_per_device() is True, so that a model whose pass spans devices (a
  pipeline: engine/model_parallel/pipeline.py) compiles each device's part instead (an
  XLA cluster is one device's program)."""
  previous = getattr(_PER_DEVICE, "on", False)
  _PER_DEVICE.on = True
  try:
    yield
  finally:
    _PER_DEVICE.on = previous


def compiles_per_device() -> bool:
  """Whether the step being traced compiles its per-device parts (per_device_pieces)."""
  return getattr(_PER_DEVICE, "on", False)


def _synchronises(what: str) -> str:
  """Why a piece that reached tf.distribute's merge_call cannot be one XLA cluster."""
  return (f"Experiment.jit_compile: {what} synchronises the replicas while it runs "
          f"(tf.distribute's merge_call), which an XLA cluster cannot hold. The usual cause "
          f"is a layer whose non-trainable variables are aggregated across replicas on every "
          f"write (a tf.Variable with aggregation 'mean' or 'sum' and synchronization "
          f"'on_write' or 'auto', e.g. a keras BatchNormalization subclass that sets "
          f"aggregation='mean' on its moving statistics). Make those variables "
          f"synchronization='on_read' (each replica updates its own copy; a read outside a "
          f"replica gives their mean), as the models' default batch norm (models/layers.py "
          f"MeanAggregatedBatchNorm) and @engine.per_replica_batch_norm do, or set "
          f"Experiment.jit_compile = False.")


def compile_updates(optimizer) -> None:
  """Compiles a built Keras optimizer's per-variable update with XLA.

  Keras applies update_step once per variable and device, in cross-replica context
  (strategy.extended.update), after the exchange: each call becomes one XLA cluster
  (Keras 2's jit_compile optimizers did the same). Inside a LossScaleOptimizer the
  inner optimizer's update is compiled. Idempotent.
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  update = inner.update_step
  if getattr(update, "_replibench_compiled", False):
    return

  def update_in_place(gradient, variable, learning_rate, key) -> None:
    del key
    update(gradient, variable, learning_rate)   # A training kernel returns an Operation.

  jitted = tf.function(update_in_place, jit_compile=True)

  @functools.wraps(update)
  def update_step(gradient, variable, learning_rate):
    # One trace per variable (the Python key): a trace captures the optimizer slots it
    # looks up for its variable, so variables of one shape must not share a trace
    # (Keras 2's jit_compile optimizers passed the same key).
    # A constant learning rate comes as the optimizer's Keras variable: read it here.
    return jitted(gradient, variable, tf.convert_to_tensor(learning_rate), id(variable))

  update_step._replibench_compiled = True   # pylint: disable=protected-access
  inner.update_step = update_step
