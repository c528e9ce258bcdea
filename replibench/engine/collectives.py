"""MPI-style primitives callable inside a replicated `step_fn`.

These are the TF-Replicator primitives, each a thin call into the current
tf.distribute ReplicaContext. Outside a replicated step (no strategy, or the
default strategy) they behave as on a single replica, so model code can be run
and tested on one device unchanged.

Under regimes.AsyncPS a step runs on one of W workers with no peers in it, so
there is nothing to communicate with: the collectives act on the worker's own
values as if every worker held the same ones (what its update assumes). Then
num_replicas() is W, replica_id() the worker's index, a sum is W times the
worker's value (a loss scaled by average_loss reads on the global-batch scale;
cross-replica batch norm's moments are the worker's own), and a mean, max,
min, gather or broadcast is the worker's value.
"""

import tensorflow as tf

from replibench.engine import regimes

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


def _async_workers() -> int:
  """W when the step runs on one of W asynchronous workers (see above), else 0."""
  return regimes.active().asynchronous_workers


def num_replicas() -> int:
  """Replicas taking part in the current step (Python int)."""
  return _context().num_replicas_in_sync * max(1, _async_workers())


def replica_id() -> tf.Tensor:
  """This replica's index in [0, num_replicas()), an int32 scalar tensor."""
  ctx = _context()
  local = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
  if _async_workers():
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    return tf.cast(worker, tf.int32) * ctx.num_replicas_in_sync + local
  return local


def all_reduce(x, op: str = "sum"):
  """Reduces a (nest of) tensor(s) over replicas; every replica gets the result.

  op is 'sum', 'mean', 'max' or 'min'. Sum and mean go through the strategy's
  all-reduce; max and min (which tf.distribute.ReduceOp lacks) gather one
  value per replica and reduce locally, which is exact for every dtype.
  """
  if op in _REDUCE_OPS:
    # tf.identity gives each value a device: with one replica, reducing a
    # step's input tensor directly fails with "destinations can not be empty".
    reduced = _context().all_reduce(_REDUCE_OPS[op], tf.nest.map_structure(tf.identity, x))
    if op == "sum" and _async_workers():
      return tf.nest.map_structure(lambda t: t * _async_workers(), reduced)
    return reduced
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
  if _async_workers():
    return tf.nest.map_structure(tf.identity, x)
  return _context().all_reduce(tf.distribute.ReduceOp.SUM,
                               tf.nest.map_structure(masked, x))


def permute(x, source):
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
  gathered = all_gather(expanded, axis=0)   # Each leaf: [num_replicas, ...].
  return tf.nest.map_structure(lambda t: tf.gather(t, source, axis=0), gathered)
