"""Variables split over a model group: made whole-valued, then each device given its part.

A tensor-parallel layer's kernel is one MirroredVariable of the mesh's strategy
whose component on device (d, m) holds part m of the whole kernel (internals.
shard_variable: read inside a replicated step, a device sees its part; read from
the host or saved in a checkpoint, the variable is the whole tensor). The whole
kernel is drawn with the layer's own initializer at the whole shape, so a split
model starts from exactly the weights one device would draw, and each part is
assigned to its devices.

Between the two layers of a Megatron pair only per-channel layers come; the
variables they make (a norm's scale, offset and moving statistics) are split along
their last axis, the channel axis, like the activations they apply to. Such a
variable must start uniform (ones, zeros): a drawn one would differ from one
device's. An optimizer's slots for a split variable are split alike. Such a layer
takes its channels' share inside a step and all channels outside one (the
replicator lifts its input-shape check: Layout.pair_layers).
"""

import contextlib
import threading

import keras
import numpy as np
import tensorflow as tf

from replibench import internals
from replibench.engine.model_parallel import layout as layout_lib
from replibench.errors import UserError

_PENDING = threading.local()   # The axis the variable being created is split along.


@contextlib.contextmanager
def _splitting(axis: int):
  _PENDING.axis = axis
  try:
    yield
  finally:
    _PENDING.axis = None


def split_weight(add_weight, layout: layout_lib.Layout, axis: int, *, name: str, shape,
                 initializer, dtype=None, **kwargs):
  """A layer's weight of local `shape`, split along axis over layout's model group.

  add_weight: the layer's own (Keras') add_weight. When planning, or with one
  device a group, the weight is made as Keras makes it.
  """
  m = layout.model_axis
  if layout.planning or m == 1:
    return add_weight(name=name, shape=shape, initializer=initializer, dtype=dtype, **kwargs)
  whole_shape = list(shape)
  whole_shape[axis] *= m
  whole = keras.initializers.get(initializer)(tuple(whole_shape), dtype=dtype or "float32")
  with _splitting(axis):
    variable = add_weight(name=name, shape=shape, initializer="zeros", dtype=dtype, **kwargs)
  parts = tf.split(tf.convert_to_tensor(whole), m, axis=axis)
  strategy = tf.distribute.get_strategy()
  for r, component in enumerate(strategy.experimental_local_results(variable.value)):
    component.assign(tf.cast(parts[r % m], component.dtype))
  return variable


class SplitCreator:
  """A variable creator (inside the strategy's scope) that splits what the module
  docstring says must be split: a split weight, a variable made between a pair's two
  layers, an optimizer slot of a split variable."""

  def __init__(self, layout: layout_lib.Layout):
    self.layout = layout

  def __call__(self, next_creator, **kwargs):
    reference = kwargs.get("colocate_with")
    axis = getattr(_PENDING, "axis", None)
    in_pair = axis is None and reference is None and self.layout.open_pair is not None
    if in_pair:
      axis = -1
    elif axis is None and reference is not None:
      axis = internals.shard_axis(reference)
    if axis is None or self.layout.model_axis == 1:
      return next_creator(**kwargs)
    if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
      # A batch norm's moving statistics kept per replica and read as their mean (the
      # models' default, engine.per_replica_batch_norm): read outside a step, such a
      # variable is reduced to one device, which would keep slot 0's channels only. Split,
      # it is written as the mean of its slot's D copies instead (DataAxisOps), which by
      # linearity of the moving average is the same mean.
      kwargs["synchronization"] = tf.VariableSynchronization.ON_WRITE
    variable = next_creator(**kwargs)
    if in_pair:
      layer = internals.building_keras_layer()
      if layer is not None and layer not in self.layout.pair_layers:
        self.layout.pair_layers.append(layer)
      first = tf.distribute.get_strategy().experimental_local_results(variable)[0].numpy()
      if first.size and np.ptp(first) != 0:
        raise UserError(self._message(kwargs, "starts from drawn values, which split over "
                                      "the devices would differ from one device's"))
    internals.shard_variable(variable, axis, self.layout.model_axis)
    return variable

  def _message(self, kwargs, problem: str) -> str:
    return (f"Tensor parallelism: the variable {kwargs.get('name')!r}, made between the "
            f"layers {self.layout.open_pair!r} (split by output channels) and the layer that "
            f"follows it split by input channels, {problem}. Between a pair only per-channel "
            f"layers with uniformly initialised variables may come (norms, activations).")
