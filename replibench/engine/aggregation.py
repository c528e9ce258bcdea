"""Gradient aggregation across replicas: the paper's optimizer wrapper.

The engine owns the reduction so that replication does not change the math:
gradients are summed over replicas once, and the optimizer then sees the
global-batch gradient on every replica. Keras 3 optimizers would otherwise sum
gradients themselves *after* applying clipnorm/global_clipnorm to each
replica's share, which changes the math as soon as clipping is active.
"""

import tensorflow as tf

from replibench import internals
from replibench.engine import collectives, fusion


@tf.autograph.experimental.do_not_convert   # Engine code (regimes/base.py says why).
def average_loss(per_example_loss: tf.Tensor, global_batch_size: int) -> tf.Tensor:
  """Loss whose gradients, summed over replicas, are those of the global mean.

  per_example_loss: [per_replica_batch] float. Returns a scalar.
  """
  return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def all_reduce_gradients(grads: list, bucket_bytes: int = 0) -> list:
  """Sums gradients over replicas (None entries pass through): one all-reduce per bucket
  of about bucket_bytes (0: one for all), the last layers' first (fusion.buckets).

  Each bucket's all-reduce takes only its own gradients as inputs, so in the step's
  graph it can run as soon as they exist, while the backward pass computes the earlier
  layers' (DDP's gradient buckets); every element is summed over the same replicas as
  in one all-reduce (tests/test_gradient_buckets.py). Cross-replica batch norm's own
  collectives are ordered before the gradients' under MultiWorkerMirroredStrategy
  (its ordering token), so there the first bucket waits for the first layer's.

  Sparse gradients (tf.IndexedSlices, from embedding lookups) are made dense
  first, so they join the one packed all-reduce: tf.distribute would otherwise
  reduce each with two all-gathers (values and indices), 20 latency-bound
  collectives per SN-GAN step for its class embeddings. For an embedding table
  far larger than the rows a step touches, that trades bytes for latency.
  """
  present = [tf.convert_to_tensor(g) for g in grads if g is not None]
  if not present:
    return list(grads)
  reduced = [None] * len(present)
  for bucket in fusion.buckets(present, bucket_bytes):
    for i, value in zip(bucket, collectives.all_reduce([present[i] for i in bucket], "sum",
                                                       kind="gradients")):
      reduced[i] = value
  remaining = iter(reduced)
  return [None if g is None else next(remaining) for g in grads]


def apply_reduced(optimizer, grads: list, variables: list) -> None:
  """Applies gradients that are already what the optimizer should see, as they are.

  The optimizer's own cross-replica sum is switched off (internals), so its
  clipnorm / global_clipnorm act on these gradients.
  """
  internals.skip_optimizer_gradient_reduction(optimizer)
  optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])


def sync_apply_gradients(optimizer, grads: list, variables: list) -> None:
  """All-reduces grads over replicas, then applies them with optimizer.

  Call inside a replicated step with per-replica gradients of a loss scaled by
  `average_loss` (their sum is the global-batch gradient). The optimizer's own
  clipnorm / global_clipnorm then act on that full gradient.
  """
  sync_apply_gradients_jointly([(optimizer, grads, variables)])


def sync_apply_gradients_jointly(updates: list, bucket_bytes: int = 0) -> list:
  """sync_apply_gradients for several (optimizer, grads, vars): their gradients all-reduced
  together, in buckets of about bucket_bytes (0: one all-reduce for all).

  Returns the reduced gradients, every update's in order (None where grads had None).
  """
  sizes = [len(grads) for _, grads, _ in updates]
  reduced = all_reduce_gradients([g for _, grads, _ in updates for g in grads], bucket_bytes)
  remaining = iter(reduced)
  for (optimizer, _, variables), size in zip(updates, sizes):
    apply_reduced(optimizer, [next(remaining) for _ in range(size)], variables)
  return reduced
