"""Tensor-parallel convolutions in Megatron's pairing, and the factory models take.

Models build their convolutions with a `conv_layer` factory and name the ones that
may be split (models/layers.py: split='output' or 'input'). Bound in gin,

    basic_block.conv_layer = @model_parallel.tensor_parallel_conv

this factory builds, on a tensor-parallel mesh of M devices a replica, a layer split
by output channels (each device computes C/M of them from the whole input: the
input passes Megatron's f, whose gradient is all-reduced over the model group) and
one split by input channels (each device convolves its C/M input channels, and g
all-reduces the partial sums: the whole output on every device). Between them each
device holds and computes only its channels. Anywhere else (no mesh, or M = 1) it
builds keras.layers.Conv2D.

Each layer is a keras Conv2D computing on its part inside a replicated step; called
outside one (the host sampling from a trained generator) it computes the whole
layer from the whole kernel (sharded.py).
"""

import gin
import keras
import tensorflow as tf
from keras import ops

from replibench.engine.model_parallel import layout as layout_lib, model_axis, sharded
from replibench.errors import UserError

# The split hints a model passes its conv_layer factory (models/layers.py says what
# they mean; the engine does not import the models).
SPLIT_OUTPUT, SPLIT_INPUT = "output", "input"


class _SplitConv2D(keras.layers.Conv2D):
  """A Conv2D whose weights are split over the model group of `layout`."""

  split = None   # SPLIT_OUTPUT or SPLIT_INPUT.

  def __init__(self, *args, layout: layout_lib.Layout, **kwargs):
    super().__init__(*args, **kwargs)
    self._layout = layout
    self._axes = {}   # Weight name -> the axis it is split along.

  def add_weight(self, *args, name=None, **kwargs):
    axis = self._axes.get(name)
    if axis is None:
      return super().add_weight(*args, name=name, **kwargs)
    return sharded.split_weight(super().add_weight, self._layout, axis, name=name, **kwargs)

  def _whole_call(self, inputs):
    """The whole layer's math, outside a replicated step: the kernel and bias read as
    whole tensors first (a variable handed to an op would be read on this device,
    where its parts do not all live)."""
    outputs = self.convolution_op(inputs, tf.convert_to_tensor(self.kernel))
    return self._finish(outputs, tf.convert_to_tensor(self.bias) if self.use_bias else None)

  def _finish(self, outputs, bias):
    if bias is not None:
      outputs = ops.add(outputs, ops.reshape(bias, (1, 1, 1, -1)))
    return self.activation(outputs) if self.activation is not None else outputs

  def _check_channels(self, channels: int, which: str) -> None:
    m = self._layout.model_axis
    if channels % m:
      raise UserError(
          f"Tensor parallelism: layer {self.name!r} has {channels} {which} channels, which "
          f"topology.Mesh.model = {m} does not divide (each of the {m} devices of a replica "
          f"would hold an unequal share). Choose a model axis that divides the channels of "
          f"every split layer, or widths that M divides.")


class ColumnParallelConv2D(_SplitConv2D):
  """Split by output channels: kernel [k, k, C_in, C_out / M] and bias [C_out / M] a device."""

  split = SPLIT_OUTPUT

  def __init__(self, filters, *args, layout, **kwargs):
    super().__init__(filters, *args, layout=layout, **kwargs)
    self._check_channels(filters, "output")
    self.filters = filters // layout.model_axis
    self._axes = {"kernel": -1, "bias": 0}

  def build(self, input_shape):
    if self._layout.open_pair is not None:
      raise UserError(f"Tensor parallelism: layer {self.name!r} is split by output channels "
                      f"while {self._layout.open_pair!r}'s pair is still open (its layer split "
                      f"by input channels has not come yet).")
    super().build(input_shape)
    self._layout.open_pair = self.name
    self._layout.split_layers.append(self.name)

  def call(self, inputs):
    if not layout_lib.in_replica(layout_lib.current()):
      return self._whole_call(inputs)
    return super().call(model_axis.copy_to_group(inputs))


class RowParallelConv2D(_SplitConv2D):
  """Split by input channels: kernel [k, k, C_in / M, C_out] a device; the bias is whole,
  added once to the all-reduced sum."""

  split = SPLIT_INPUT

  def __init__(self, *args, layout, **kwargs):
    super().__init__(*args, layout=layout, **kwargs)
    self._axes = {"kernel": -2}

  def build(self, input_shape):
    if self._layout.open_pair is None:
      raise UserError(f"Tensor parallelism: layer {self.name!r} is split by input channels "
                      f"but no layer split by output channels comes before it; a model must "
                      f"name its splits in pairs (models/layers.py).")
    self._layout.open_pair = None
    super().build(input_shape)
    self.input_spec = None   # Outside a replicated step it takes the whole input.
    self._layout.split_layers.append(self.name)

  def call(self, inputs):
    if not layout_lib.in_replica(layout_lib.current()):
      return self._whole_call(inputs)
    partial = self.convolution_op(inputs, self.kernel)
    return self._finish(model_axis.reduce_from_group(partial),
                        self.bias if self.use_bias else None)


@gin.configurable(module="model_parallel")
def tensor_parallel_conv(*args, split: str | None = None, **kwargs) -> keras.layers.Layer:
  """A models' conv_layer factory: split layers on a tensor-parallel mesh, else Conv2D."""
  layout = layout_lib.current()
  if split is None or layout is None or layout.model_axis == 1:
    return keras.layers.Conv2D(*args, **kwargs)
  if split == SPLIT_OUTPUT:
    return ColumnParallelConv2D(*args, layout=layout, **kwargs)
  if split == SPLIT_INPUT:
    return RowParallelConv2D(*args, layout=layout, **kwargs)
  raise ValueError(f"tensor_parallel_conv(split={split!r}): must be 'output', 'input' or None.")
