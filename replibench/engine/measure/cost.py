"""Static costs for the plan: parameters, FLOPs of a traced graph, bytes all-reduced.

Used by workloads to describe themselves (`replibench plan`) and by the engine's
communication account; computed without devices or data.
"""

import keras
import numpy as np
import tensorflow as tf

from replibench import internals


def parameter_count(model: keras.Model) -> int:
  return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def graph_flops(fn, *specs: tf.TensorSpec) -> int:
  """Float ops of one call of fn on tensors of these specs (a multiply-add counts 2)."""
  return internals.count_graph_flops(tf.function(fn).get_concrete_function(*specs).graph)


def forward_flops(model: keras.Model, input_shape: tuple) -> int:
  """FLOPs of one example's forward pass (a multiply-add counts 2), from the graph."""
  spec = tf.TensorSpec((1,) + tuple(input_shape), tf.float32)
  return graph_flops(lambda x: model(x, training=False), spec)


def gradient_bytes(model: keras.Model) -> int:
  """Bytes one replica contributes to the gradient all-reduce each step."""
  return int(sum(np.prod(v.shape) * tf.as_dtype(v.dtype).size
                 for v in model.trainable_variables))


def sizes(variables: list) -> list[int]:
  """Entries of each variable (or tensor), in order."""
  return [int(np.prod(v.shape)) for v in variables]


def optimizer_slots(optimizer) -> list:
  """The optimizer's per-parameter state (momenta, moments): what a regime that
  exchanges model state (local SGD, gossip) sends besides the parameters.

  Floating variables only, and not those Keras keeps identical by construction
  (aggregation 'only_first_replica': the iteration counter, a constant learning
  rate).
  """
  return [v for v in optimizer.variables
          if tf.as_dtype(v.dtype).is_floating and v.aggregation != "only_first_replica"]


def state_sizes(optimizer, variables: list) -> list[int]:
  """Entries of the parameters and of the optimizer's slots for them (the optimizer is
  built on variables if it is not yet): the model state one replica holds."""
  if not optimizer.built:
    optimizer.build(variables)
  return sizes(variables) + sizes(optimizer_slots(optimizer))
