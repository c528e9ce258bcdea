"""What each device of a replica spanning devices holds and computes (engine/model_parallel).

Held state: `VariableRecorder`, a variable creator inside a replicator's strategy
scope, keeps a weak reference to every variable the scope makes, so that each
device's bytes are read from where the variables' components are (`held_bytes`),
split into parameters (trainable), optimizer state (made beside a variable: Keras'
slots) and other state (batch-norm statistics, counters).

Activations: the forward pass's tensors that its backward pass reads (the inputs
of gradient ops made by a GradientTape, named under 'gradient_tape/'), counted once
each and grouped by the device of the op that made them. Tensors that are
variables' values, constants, or views of another tensor (identity, reshape) are
left out. An estimate from the graph: TensorFlow's allocator may free, reuse or
fuse buffers, so it says what a step keeps, not the allocator's peak.

FLOPs: TensorFlow's registered cost of each op (the profiler's float_ops), grouped
by device, forward, backward and update alike.

Ops with no device (only when planning) belong to '', the replica's own device.
"""

import collections
import weakref

import numpy as np
import tensorflow as tf

from replibench import internals

PARAMETERS, OPTIMIZER, OTHER, ACTIVATIONS = "parameters", "optimizer", "other", "activations"
HELD = (PARAMETERS, OPTIMIZER, OTHER)

_NOT_ACTIVATIONS = {"ReadVariableOp", "Const", "VarHandleOp", "Placeholder", "Identity",
                    "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "Cast"}


class VariableRecorder:
  """A variable creator (inside a strategy's scope) recording what each variable is."""

  def __init__(self):
    self._made: list = []   # [(weakref to the variable, category)]

  def __call__(self, next_creator, **kwargs):
    trainable = kwargs.get("trainable")
    if trainable is None:   # tf.Variable's default.
      trainable = kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ
    if kwargs.get("colocate_with") is not None:
      category = OPTIMIZER
    else:
      category = PARAMETERS if trainable else OTHER
    variable = next_creator(**kwargs)
    self._made.append((weakref.ref(variable), category))
    return variable

  def held_bytes(self, strategy) -> dict[str, dict[str, int]]:
    """{device: {category: bytes}} of the live variables' components in this process."""
    found: dict = collections.defaultdict(collections.Counter)
    for ref, category in self._made:
      variable = ref()
      if variable is None:
        continue
      for component in strategy.experimental_local_results(variable):
        size = int(np.prod(component.shape)) * component.dtype.size
        found[internals.canonical_device(component.device)][category] += size
    return {device: dict(counts) for device, counts in sorted(found.items())}


def per_device(held: dict, graph: tf.Graph, devices: list[str]) -> dict[str, dict[str, int]]:
  """{device: {parameters, optimizer, other, activations, total}} bytes for each of
  devices: held (VariableRecorder.held_bytes) and the activations graph (a traced
  step) keeps there."""
  kept = activation_bytes(graph)
  rows = {}
  for device in devices:
    name = internals.canonical_device(device)
    row = {kind: held.get(name, {}).get(kind, 0) for kind in HELD}
    row[ACTIVATIONS] = kept.get(name, 0)
    row["total"] = sum(row.values())
    rows[name] = row
  return rows


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
