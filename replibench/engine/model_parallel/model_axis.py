"""Collectives along the model axis: among the M devices of one model replica.

Megatron-LM's two operators (Shoeybi et al. 2019, section 3): f is the identity
forward and an all-reduce of the gradient backward (before a layer split by output
channels, whose input every device holds whole); g is an all-reduce forward (the
partial sums of a layer split by input channels) and the identity backward. A
column-then-row pair so costs one all-reduce of activations forward and one
backward, inside the model group only.

Each all-reduce is TensorFlow's CollectiveReduceV2 over the replica's M devices,
with a group key per model group, as engine/collectives.py's pair exchanges use
(the data axis goes through tf.distribute: data_axis.py). A pipeline's stage
boundaries are device-to-device copies, which TensorFlow's executor makes; they are
recorded in the communication account here (`record_transfer`). Every collective
is recorded under the kind 'activations'; when planning, the collectives are
recorded and not built (the traced shapes are what matters).
"""

import threading

import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.measure import communication
from replibench.engine.model_parallel import layout as layout_lib

KIND = "activations"   # Model-axis traffic in the communication account.

# Group keys above those tf.distribute hands out (its strategies' key ranges start at
# multiples of 100_000: internals.fresh_collective_keys) and below the pair exchanges'
# (engine/collectives.py, from 2**30). A group key names a fixed set of devices for the
# life of the process, so each strategy takes a range of its own.
_GROUP_BASE = 1 << 29
_GROUPS_PER_STRATEGY = 1 << 10
_INSTANCE_BASE = 1 << 20


class _Keys:
  """One strategy's model-group keys: a group key per model group, and per device an
  instance counter taken when tracing (the devices of a group trace the same
  collectives in the same order, so the k-th gets the same key on each)."""

  def __init__(self, slot: int):
    self.base = _GROUP_BASE + slot * _GROUPS_PER_STRATEGY
    if self.base + _GROUPS_PER_STRATEGY > (1 << 30):
      raise RuntimeError("Too many model-parallel strategies in one process.")
    self._next: dict[tuple, int] = {}
    self._lock = threading.Lock()

  def group(self, d: int) -> int:
    if d >= _GROUPS_PER_STRATEGY:
      raise NotImplementedError(f"at most {_GROUPS_PER_STRATEGY} model groups, not {d + 1}.")
    return self.base + d

  def instance(self, device: tuple) -> int:
    with self._lock:
      key = self._next.get(device, _INSTANCE_BASE)
      self._next[device] = key + 1
    return key


_keys = collectives.PerStrategy(_Keys).current   # The current strategy's model-group keys.


def all_reduce(x: tf.Tensor) -> tf.Tensor:
  """Sums x over the current replica's model group (M devices); every one gets the sum."""
  layout = layout_lib.current()
  m = layout.model_axis
  if m == 1:
    return x
  communication.record(KIND, x, collective="all_reduce", group_size=m)
  if layout.planning:
    return tf.identity(x)
  d, slot = layout.coordinates()
  keys = _keys()
  x = tf.identity(x)   # On this device (the replica's device scope).
  return tf.raw_ops.CollectiveReduceV2(
      input=x, group_size=m, group_key=keys.group(d), instance_key=keys.instance((d, slot)),
      # A resource of its own as the ordering token, as the pair exchanges have: keeps
      # tf.function's automatic control dependencies from chaining the devices' collectives.
      ordering_token=[collectives._unordered_token(x.device)],  # pylint: disable=protected-access
      merge_op="Add", final_op="Id", communication_hint="auto", timeout_seconds=0)


@tf.custom_gradient
def copy_to_group(x):
  """Megatron's f: x as it is; its gradient all-reduced over the model group."""
  return tf.identity(x), all_reduce


@tf.custom_gradient
def reduce_from_group(x):
  """Megatron's g: x all-reduced over the model group; its gradient as it is."""
  return all_reduce(x), tf.identity


def record_transfer(tensors) -> None:
  """Records a pipeline boundary: these tensors copied from one stage's device to the
  next (one send, one receiver)."""
  floats = [t for t in tf.nest.flatten(tensors) if t.dtype.is_floating]
  if floats:
    communication.record(KIND, floats, collective="send", group_size=2)
