"""Collects a regime's per-step scalars between apply_gradients and step_metrics.

A step may call apply_gradients several times (a GAN's two optimizers), and
MirroredStrategy traces each replica's step in a thread of its own, so the
values are kept per thread and per graph and summed when the step asks for
them.
"""

import threading

import tensorflow as tf


class StepMetrics:
  """Per-replica-thread accumulator of named float32 scalars for the step being traced."""

  def __init__(self):
    self._local = threading.local()

  def _pending(self) -> dict:
    graph = tf.compat.v1.get_default_graph()
    if getattr(self._local, "graph", None) is not graph:
      self._local.graph, self._local.values = graph, {}
    return self._local.values

  def add(self, name: str, value) -> None:
    """Adds value (a scalar) to name's running sum for this step."""
    value = tf.cast(value, tf.float32)
    pending = self._pending()
    pending[name] = pending[name] + value if name in pending else value

  def take(self) -> dict:
    """The sums recorded in this thread's current graph since the last take()."""
    values = self._pending()
    self._local.values = {}
    return values


def payload_bytes(tensors) -> int:
  """Bytes of the dense tensors a replica sends as its share of a step (None skipped)."""
  return int(sum(t.shape.num_elements() * t.dtype.size for t in tensors if t is not None))
