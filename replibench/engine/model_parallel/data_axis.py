"""The data axis of a tensor-parallel mesh: tf.distribute's reductions, one per model slot.

Under tensor parallelism the MirroredStrategy has a replica per device, D x M of
them, and device (d, m) holds slot m's share of every split layer. Every reduction
tf.distribute makes (the gradient all-reduce, a cross-replica batch norm's moments,
a variable's mean-aggregated update, the step outputs) must combine the D devices
that hold the same share, never the M shares of one replica. `DataAxisOps` is the
strategy's cross-device ops: it reduces the D values of each slot as TensorFlow's
ReductionToOneDevice does (one add on the slot's first device, copies back) and gives
each destination device its slot's result; a reduction to one device (the host)
gives slot 0's, which is every slot's for values a model group holds alike (a
loss, a count). `DataAxisView` is what a step_fn sees through the engine's
collectives: D replicas, its own index d.
"""

import tensorflow as tf

from replibench import internals
from replibench.engine import collectives


class DataAxisOps(tf.distribute.CrossDeviceOps):
  """Reductions over the data axis of a D x M mesh of devices (replica r = d * M + m)."""

  def __init__(self, devices: list[str], model: int):
    super().__init__()
    self._devices = [internals.canonical_device(d) for d in devices]
    self._model = model

  def _slot(self, device: str) -> int:
    device = internals.canonical_device(device)
    return self._devices.index(device) % self._model if device in self._devices else 0

  def _by_slot(self, per_replica, combine) -> list:
    """combine(values of slot m) for each slot m; a value that does not come from every
    device of the mesh (one made in cross-replica context) is combined whole."""
    values = per_replica.values
    if len(values) != len(self._devices):
      with tf.device(values[0].device):
        return [combine(list(values))] * self._model
    out = []
    for m in range(self._model):
      with tf.device(self._devices[m]):
        out.append(combine(list(values[m::self._model])))
    return out

  def _to(self, results: list, destinations, per_replica):
    devices = internals.destination_devices(destinations, per_replica)
    placed = []
    for device in devices:
      with tf.device(device):
        placed.append(tf.identity(results[self._slot(device)]))
    return placed[0] if len(placed) == 1 else internals.mirrored(placed)

  def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
    del options
    def combine(values):
      total = tf.add_n(values)
      return total / len(values) if reduce_op == tf.distribute.ReduceOp.MEAN else total

    return self._to(self._by_slot(per_replica_value, combine), destinations, per_replica_value)

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
    return [self.reduce_implementation(reduce_op, v, d, options)
            for v, d in value_destination_pairs]

  def _gather_implementation(self, per_replica_value, destinations, axis, options):
    del options
    results = self._by_slot(per_replica_value, lambda values: tf.concat(values, axis))
    return self._to(results, destinations, per_replica_value)


class DataAxisView(collectives.ReplicaGroup):
  """The replicas a step_fn sees on a tensor-parallel mesh: the D data-parallel ones.
  Reductions go through the strategy (DataAxisOps); the count and the index are d's."""

  def __init__(self, data: int, model: int):
    self.data, self.model = data, model

  def num_replicas(self) -> int:
    return self.data

  def replica_id(self) -> tf.Tensor:
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica, tf.int32) // self.model
