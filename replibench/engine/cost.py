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
  return int(sum(np.prod(v.shape) * v.dtype.size if hasattr(v.dtype, "size")
                 else np.prod(v.shape) * tf.as_dtype(v.dtype).size
                 for v in model.trainable_variables))
