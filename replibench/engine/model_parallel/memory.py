"""A traced training step's activation memory and FLOPs, per device.

Activations: the forward pass's tensors that its backward pass reads (the inputs
of gradient ops made by a GradientTape, named under 'gradient_tape/'), counted once
each and grouped by the device of the op that made them. Tensors that are
variables' values, constants, or views of another tensor (identity, reshape) are
left out. An estimate from the graph: TensorFlow's allocator may free, reuse or
fuse buffers, so it says what a step keeps, not the allocator's peak.

FLOPs: TensorFlow's registered cost of each op (the profiler's float_ops), grouped
by device, forward, backward and update alike.

Ops with no device (only when planning) belong to '' , the replica's own device.
"""

import collections

import tensorflow as tf

from replibench import internals

_NOT_ACTIVATIONS = {"ReadVariableOp", "Const", "VarHandleOp", "Placeholder", "Identity",
                    "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "Cast"}


def _is_gradient(op) -> bool:
  return "gradient_tape/" in op.name


def _device(op) -> str:
  return internals.canonical_device(op.device) if op.device else ""


def activation_bytes(graph: tf.Graph) -> dict[str, int]:
  """{device: bytes} of forward tensors the backward pass reads (see the docstring)."""
  kept, found = set(), collections.Counter()
  for op in graph.get_operations():
    if not _is_gradient(op):
      continue
    for tensor in op.inputs:
      producer = tensor.op
      if (tensor.ref() in kept or _is_gradient(producer) or producer.type in _NOT_ACTIVATIONS
          or not tensor.dtype.is_floating or not tensor.shape.is_fully_defined()):
        continue
      kept.add(tensor.ref())
      found[_device(producer)] += tensor.shape.num_elements() * tensor.dtype.size
  return dict(found)


def flops(graph: tf.Graph) -> dict[str, int]:
  """{device: FLOPs} of one run of the graph (a multiply-add counts 2)."""
  found = collections.Counter()
  for op in graph.get_operations():
    count = internals.op_flops(graph, op)
    if count:
      found[_device(op)] += count
  return dict(found)
