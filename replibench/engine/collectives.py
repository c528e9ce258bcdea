"""MPI-style primitives callable inside a replicated `step_fn`.

These are the TF-Replicator primitives, each a thin call into the current
tf.distribute ReplicaContext. Outside a replicated step (no strategy, or the
default strategy) they behave as on a single replica, so model code can be run
and tested on one device unchanged.
"""

import tensorflow as tf

_REDUCE_OPS = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
_GATHER_OPS = {"max": tf.reduce_max, "min": tf.reduce_min}
OPS = tuple(_REDUCE_OPS) + tuple(_GATHER_OPS)


def _context() -> tf.distribute.ReplicaContext:
  ctx = tf.distribute.get_replica_context()
  if ctx is None:
    raise RuntimeError(
        "Collectives run inside a replicated step (Replicator.run / compile), "
        "not in cross-replica context.")
  return ctx


def num_replicas() -> int:
  """Replicas taking part in the current step (Python int)."""
  return _context().num_replicas_in_sync


def replica_id() -> tf.Tensor:
  """This replica's index in [0, num_replicas()), an int32 scalar tensor."""
  return tf.cast(_context().replica_id_in_sync_group, tf.int32)


def all_reduce(x, op: str = "sum"):
  """Reduces a (nest of) tensor(s) over replicas; every replica gets the result.

  op is 'sum', 'mean', 'max' or 'min'. Sum and mean go through the strategy's
  all-reduce; max and min (which tf.distribute.ReduceOp lacks) gather one
  value per replica and reduce locally, which is exact for every dtype.
  """
  if op in _REDUCE_OPS:
    # tf.identity gives each value a device: with one replica, reducing a
    # step's input tensor directly fails with "destinations can not be empty".
    return _context().all_reduce(_REDUCE_OPS[op], tf.nest.map_structure(tf.identity, x))
  if op in _GATHER_OPS:
    reduce = _GATHER_OPS[op]
    return tf.nest.map_structure(
        lambda t: reduce(all_gather(tf.expand_dims(t, 0), axis=0), axis=0), x)
  raise ValueError(f"all_reduce op must be one of {OPS}, got {op!r}.")


def all_gather(x, axis: int = 0):
  """Concatenates every replica's x along axis, in replica order."""
  return _context().all_gather(x, axis=axis)


def broadcast(x, source_replica: int = 0):
  """Every replica receives source_replica's value of x (a nest of tensors).

  Implemented as an all-reduce sum in which only the source contributes; the
  other replicas contribute exact zeros, so the result is bit-identical.
  """
  is_source = tf.equal(replica_id(), source_replica)

  def masked(t):
    t = tf.convert_to_tensor(t)
    return tf.where(is_source, t, tf.zeros_like(t))

  if tf.as_dtype(tf.nest.flatten(x)[0].dtype).is_bool:
    raise TypeError("broadcast does not take bool tensors; cast to int32 first.")
  return _context().all_reduce(tf.distribute.ReduceOp.SUM,
                               tf.nest.map_structure(masked, x))
