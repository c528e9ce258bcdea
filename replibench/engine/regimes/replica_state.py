"""Per-replica copies of training state, for regimes whose replicas drift apart.

Under MirroredStrategy (and MultiWorkerMirroredStrategy) every variable is a
MirroredVariable: one component per replica. Sync keeps the components equal
by applying the same all-reduced gradient to each. Local SGD and gossip instead
let each replica update its own component with its own gradient, then mix the
components. Nothing here is private tf.distribute machinery:

* A local step: Keras 3's TF optimizer applies updates through
  `distribution.extended.update(var, fn, args=(grad, ...))` inside a merge
  call, so an un-reduced (per-replica) gradient updates each component with
  that replica's own gradient.
* Reading a MirroredVariable in replica context gives this replica's component.
* Writing one value per replica: `ReplicaContext.merge_call` regroups the
  replicas' values into one PerReplica, and `extended.update` assigns its
  i-th value to the i-th component.

With the default (no) strategy there is one replica and all of this reduces to
plain reads and assigns.
"""

import keras
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.measure import communication
from replibench.engine.measure.cost import optimizer_slots  # noqa: F401  (re-exported for regimes)


def tf_variable(variable) -> tf.Variable:
  """The tf.Variable (a MirroredVariable under a strategy) behind a Keras variable."""
  return variable.value if isinstance(variable, keras.Variable) else variable


def state_sizes(variables: list) -> list[int]:
  """Entries of each variable (all shapes fully defined), for Regime.wire_bytes."""
  return [v.shape.num_elements() for v in map(tf_variable, variables)]


def apply_local(optimizer, grads: list, variables: list) -> None:
  """One local optimizer step on this replica's copy, with its own gradient.

  grads are this replica's gradients of an `average_loss`-scaled loss, i.e.
  1/N of its local mean-loss gradient; they are scaled by N so a local step
  sees the mean gradient of its own batch (with N = 1, or averaged over
  replicas, that is the sync gradient). clipnorm / global_clipnorm act on
  this local gradient: a local step has no other.
  """
  n = float(collectives.num_replicas())
  aggregation.apply_reduced(optimizer, [None if g is None else _scaled(g, n) for g in grads],
                            variables)


def _scaled(grad, factor: float):
  if isinstance(grad, tf.IndexedSlices):   # Embedding gradients: scale the rows.
    return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
  return grad * factor


def read_flat(variables: list) -> tf.Tensor:
  """This replica's copy of all variables as one vector [total entries] (replica context).

  One concatenated copy, not a tensor per variable, for correctness as well as
  for one collective instead of many: a write that replaces this state must
  not start before the optimizer step has finished with *every* variable.
  The step reads a slot (momentum) and later adds it to the parameter; a
  write of the slot ordered only after the slot's own read can land before
  that add consumes the value. Every write here depends through the
  concatenation on the reads of all variables, which tf.function orders after
  their last update. (Separate reads joined only by control edges were seen
  to race under MirroredStrategy: Grappler's dependency optimizer dropped the
  edges as implied by a path it then removed.)
  """
  targets = [tf_variable(v) for v in variables]
  dtypes = {t.dtype for t in targets}
  if len(dtypes) != 1:
    raise TypeError(
        f"Replica state must share one dtype to be mixed, got {sorted(map(str, dtypes))}.")
  return tf.concat([tf.reshape(t, [-1]) for t in targets], axis=0)


def _slices(variables: list) -> list:
  """(variable, offset, size) of each variable within read_flat's vector."""
  out, offset = [], 0
  for v in map(tf_variable, variables):
    size = v.shape.num_elements()
    out.append((v, offset, size))
    offset += size
  return out


def _write_flat(strategy, variables: list, flat) -> None:
  """Cross-replica: sets replica i's copy of variables from the i-th value of flat."""
  for var, offset, size in _slices(variables):
    def assign(component, vector, offset=offset, size=size):
      return component.assign(tf.reshape(vector[offset:offset + size], component.shape))
    strategy.extended.update(var, assign, args=(flat,), group=False)


def assign_flat(variables: list, flat: tf.Tensor) -> None:
  """Sets this replica's copy of variables from a vector laid out as read_flat's.

  Every replica calls this with its own vector (replica context).
  """
  tf.distribute.get_replica_context().merge_call(
      lambda strategy, regrouped: _write_flat(strategy, variables, regrouped), args=(flat,))


def average_when(flag: tf.Tensor, variables: list) -> None:
  """If flag, sets every replica's copy of each variable to the replicas' mean.

  flag: bool scalar, equal on every replica. Every replica calls this each
  step; the reduction only runs when flag is true. MirroredStrategy forbids
  collectives and merge calls inside control flow in replica context, so the
  condition lives in the merge call (cross-replica context), around a
  cross-replica `reduce_to` and the per-component writes.
  """
  def merge(strategy, flags, local):
    def average():
      mean = strategy.extended.reduce_to(tf.distribute.ReduceOp.MEAN, local, destinations=local)
      _write_flat(strategy, variables, mean)
      return tf.constant(True)

    # Every replica's flag is the same; take the first local one.
    tf.cond(strategy.experimental_local_results(flags)[0], average,
            lambda: tf.constant(False))

  flat = read_flat(variables)
  communication.record("parameters", flat)   # Runs only when flag is true.
  tf.distribute.get_replica_context().merge_call(merge, args=(flag, flat))


def squared_consensus_distance(flat: tf.Tensor) -> tf.Tensor:
  """mean_i ||w_i - mean_j w_j||^2 for this replica's vector flat (float32 scalar, all replicas).

  Costs one all-reduce of flat (the mean) and one of a scalar.
  """
  mean = collectives.all_reduce(flat, "mean")
  local = tf.reduce_sum(tf.square(tf.cast(flat - mean, tf.float32)))
  return collectives.all_reduce(local, "mean")
