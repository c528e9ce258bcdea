"""Gradient aggregation across replicas: the paper's optimizer wrapper.

The engine owns the reduction so that replication does not change the math:
gradients are summed over replicas once, and the optimizer then sees the
global-batch gradient on every replica. Keras 3 optimizers would otherwise sum
gradients themselves *after* applying clipnorm/global_clipnorm to each
replica's share, which changes the math as soon as clipping is active.
"""

import tensorflow as tf

from replibench.engine import collectives, regimes


def average_loss(per_example_loss: tf.Tensor, global_batch_size: int) -> tf.Tensor:
  """Loss whose gradients, summed over replicas, are those of the global mean.

  per_example_loss: [per_replica_batch] float. Returns a scalar.
  """
  return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def all_reduce_gradients(grads: list) -> list:
  """Sums gradients over replicas in one collective (None entries pass through).

  Sparse gradients (tf.IndexedSlices, from embedding lookups) are made dense
  first, so they join the one packed all-reduce: tf.distribute would otherwise
  reduce each with two all-gathers (values and indices), 20 latency-bound
  collectives per SN-GAN step for its class embeddings. For an embedding table
  far larger than the rows a step touches, that trades bytes for latency.
  """
  present = [tf.convert_to_tensor(g) for g in grads if g is not None]
  if not present:
    return list(grads)
  reduced = iter(collectives.all_reduce(present, "sum"))
  return [None if g is None else next(reduced) for g in grads]


def _take_over_reduction(optimizer) -> None:
  # Keras 3's TF optimizer all-reduces in `_all_reduce_sum_gradients`; the
  # gradients we pass are already reduced, so that hook becomes the identity.
  if not hasattr(optimizer, "_all_reduce_sum_gradients"):
    raise TypeError(
        f"{type(optimizer).__name__} is not a Keras 3 TensorFlow optimizer; the engine "
        "cannot take over its gradient reduction.")
  optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars  # pylint: disable=protected-access


def apply_gradients(optimizer, grads: list, variables: list) -> None:
  """Applies one replica's gradients the way the active training regime says.

  Call inside a replicated step with per-replica gradients of a loss scaled by
  `average_loss` (their sum is the global-batch gradient). Under the default
  `Sync` regime that is `sync_apply_gradients`.
  """
  regimes.active().apply_gradients(optimizer, grads, variables)


def apply_gradients_jointly(updates: list) -> None:
  """Applies several optimizers' gradients from one step: [(optimizer, grads, vars), ...].

  For updates computed from the same forward pass (an actor-critic's two losses):
  under Sync all their gradients are summed in one collective instead of one per
  optimizer; other regimes apply them one after the other.
  """
  regimes.active().apply_gradients_jointly(updates)


def build_optimizer(optimizer, variables: list) -> None:
  """Creates the optimizer's slots (and the regime's state) under Replicator.scope().

  Keras 3 optimizers must be built before the first traced step.
  """
  regimes.active().build_optimizer(optimizer, variables)


def sync_apply_gradients(optimizer, grads: list, variables: list) -> None:
  """All-reduces grads over replicas, then applies them with optimizer.

  Call inside a replicated step with per-replica gradients of a loss scaled by
  `average_loss` (their sum is the global-batch gradient). The optimizer's own
  clipnorm / global_clipnorm then act on that full gradient.
  """
  sync_apply_gradients_jointly([(optimizer, grads, variables)])


def sync_apply_gradients_jointly(updates: list) -> None:
  """sync_apply_gradients for several (optimizer, grads, vars): one all-reduce for all."""
  sizes = [len(grads) for _, grads, _ in updates]
  reduced = iter(all_reduce_gradients([g for _, grads, _ in updates for g in grads]))
  for (optimizer, _, variables), size in zip(updates, sizes):
    _take_over_reduction(optimizer)
    grads = [next(reduced) for _ in range(size)]
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
