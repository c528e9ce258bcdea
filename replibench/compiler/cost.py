"""Static costs of a model for the plan: parameters, FLOPs and bytes all-reduced."""

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.profiler import model_analyzer, option_builder  # pylint: disable=g-direct-tensorflow-import


def parameter_count(model: keras.Model) -> int:
  return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def forward_flops(model: keras.Model, input_shape: tuple) -> int:
  """FLOPs of one example's forward pass (a multiply-add counts 2), from the graph."""
  spec = tf.TensorSpec((1,) + tuple(input_shape), tf.float32)
  graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
  options = option_builder.ProfileOptionBuilder(
      option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build()
  verbosity = tf.get_logger().level
  tf.get_logger().setLevel("ERROR")   # The v1 profiler logs deprecation warnings.
  try:
    return int(model_analyzer.profile(graph, options=options).total_float_ops)
  finally:
    tf.get_logger().setLevel(verbosity)


def gradient_bytes(model: keras.Model) -> int:
  """Bytes one replica contributes to the gradient all-reduce each step."""
  return int(sum(np.prod(v.shape) * v.dtype.size if hasattr(v.dtype, "size")
                 else np.prod(v.shape) * tf.as_dtype(v.dtype).size
                 for v in model.trainable_variables))
