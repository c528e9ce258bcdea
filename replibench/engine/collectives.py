"""MPI-style primitives callable inside a replicated `step_fn`.

These are the TF-Replicator primitives, each a thin call into the current
tf.distribute ReplicaContext. Outside a replicated step (no strategy, or the
default strategy) they behave as on a single replica, so model code can be run
and tested on one device unchanged.

A replicator whose replicas do not step together (engine.ps: each worker
updates the parameter servers on its own) declares what its step_fn sees with
`replica_group(...)` while it builds the step; these functions then ask that
group instead of the ReplicaContext. Nothing here knows of training regimes.
Each call is recorded, with the kind its caller names, in the communication
account of the step being traced (engine/communication.py).
"""

import contextlib

import tensorflow as tf

from replibench.engine import communication

_REDUCE_OPS = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
_GATHER_OPS = {"max": tf.reduce_max, "min": tf.reduce_min}
OPS = tuple(_REDUCE_OPS) + tuple(_GATHER_OPS)


class ReplicaGroup:
  """The replicas a step_fn runs among, seen from inside one of them.

  The default is the current tf.distribute ReplicaContext. Methods take and
  return (nests of) tensors; num_replicas is a Python int.
  """

  def num_replicas(self) -> int:
    return _context().num_replicas_in_sync

  def replica_id(self) -> tf.Tensor:
    return tf.cast(_context().replica_id_in_sync_group, tf.int32)

  def all_reduce(self, x, op: str):
    # tf.identity gives each value a device: with one replica, reducing a
    # step's input tensor directly fails with "destinations can not be empty".
    return _context().all_reduce(_REDUCE_OPS[op], tf.nest.map_structure(tf.identity, x))

  def all_gather(self, x, axis: int):
    return _context().all_gather(x, axis=axis)

  def broadcast(self, x, source_replica: int):
    # An all-reduce sum in which only the source contributes; the others add
    # exact zeros, so the result is bit-identical to the source's value.
    is_source = tf.equal(self.replica_id(), source_replica)
    masked = tf.nest.map_structure(
        lambda t: tf.where(is_source, t, tf.zeros_like(t)), tf.nest.map_structure(
            tf.convert_to_tensor, x))
    return self.all_reduce(masked, "sum")


_GROUPS: list = []   # A stack; MirroredStrategy traces replicas in threads, so not thread-local.
_DEFAULT = ReplicaGroup()


@contextlib.contextmanager
def replica_group(group: ReplicaGroup):
  """Makes the collectives in step_fns built inside this block act through group."""
  _GROUPS.append(group)
  try:
    yield group
  finally:
    _GROUPS.remove(group)


def _group() -> ReplicaGroup:
  return _GROUPS[-1] if _GROUPS else _DEFAULT


def _context() -> tf.distribute.ReplicaContext:
  ctx = tf.distribute.get_replica_context()
  if ctx is None:
    raise RuntimeError(
        "Collectives run inside a replicated step (Replicator.run / compile), "
        "not in cross-replica context.")
  return ctx


def num_replicas() -> int:
  """Replicas taking part in the current step (Python int)."""
  return _group().num_replicas()


def replica_id() -> tf.Tensor:
  """This replica's index in [0, num_replicas()), an int32 scalar tensor."""
  return _group().replica_id()


def all_reduce(x, op: str = "sum", kind: str = "other"):
  """Reduces a (nest of) tensor(s) over replicas; every replica gets the result.

  op is 'sum', 'mean', 'max' or 'min'. Sum and mean go through the strategy's
  all-reduce (a nest is packed into one collective); max and min (which
  tf.distribute.ReduceOp lacks) gather one value per replica and reduce
  locally, which is exact for every dtype. kind names the collective in the
  step's communication account (engine/communication.py).
  """
  if op in _REDUCE_OPS:
    communication.record(kind, x)
    return _group().all_reduce(x, op)
  if op in _GATHER_OPS:
    reduce = _GATHER_OPS[op]
    return tf.nest.map_structure(
        lambda t: reduce(all_gather(tf.expand_dims(t, 0), axis=0, kind=kind), axis=0), x)
  raise ValueError(f"all_reduce op must be one of {OPS}, got {op!r}.")


def all_gather(x, axis: int = 0, kind: str = "other"):
  """Concatenates every replica's x along axis, in replica order."""
  communication.record(kind, x)
  return _group().all_gather(x, axis)


def broadcast(x, source_replica: int = 0, kind: str = "other"):
  """Every replica receives source_replica's value of x (a nest of tensors, not bool)."""
  if any(tf.as_dtype(t.dtype).is_bool for t in tf.nest.flatten(x)):
    raise TypeError("broadcast does not take bool tensors; cast to int32 first.")
  communication.record(kind, x)
  return _group().broadcast(x, source_replica)


def permute(x, source, kind: str = "parameters"):
  """Neighbour exchange: each replica receives x from the replica(s) it names.

  x: a nest of tensors (same shapes on every replica). source: this replica's
  choice, an int32 tensor in [0, num_replicas()), of shape [] (result: x's
  structure and shapes) or [k] (result: each leaf gets a leading axis k, one
  slice per named replica, in order). Replicas may name different sources,
  chosen at run time (e.g. a random matching drawn per step).

  tf.distribute has no point-to-point send/recv, so every replica all-gathers
  x and keeps the slices it named: this moves num_replicas() times the bytes
  a point-to-point transport would (which sends each replica only what its
  neighbours ask for). Count communication as the point-to-point bytes.
  """
  expanded = tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), x)
  gathered = all_gather(expanded, axis=0, kind=kind)   # Each leaf: [num_replicas, ...].
  return tf.nest.map_structure(lambda t: tf.gather(t, source, axis=0), gathered)
