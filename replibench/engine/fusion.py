"""Tensor fusion: many tensors reduced as one buffer per dtype (Horovod's tensor fusion).

A single-process MirroredStrategy reduces a nest tensor by tensor: on CPU its
cross-device ops (ReductionToOneDevice) copy each tensor of each replica to the
first device, add them there and copy the sum back: k gradients make 2k(N - 1)
small device-to-device transfers, each with a fixed cost far above its bytes. A
profile of SN-GAN at 4 logical replicas counted 568 sends a step; fused, 143
(results/scaling/README.md has the step times).
MultiWorkerMirroredStrategy packs on its own (CommunicationOptions.bytes_per_pack),
so it is left to do so (`fuses_in_engine`).

Fusing does not change the math: every element is reduced as before, by one AddN
over the same replicas, only in one buffer. (Neither path fixes the last bit with
three or more replicas: TensorFlow's CPU AddN starts from whichever input buffer it
can reuse, which depends on timing, so a sum's association varies between runs;
every replica still receives the same bits. tests/test_engine_collectives.py.)

`buckets` splits a gradient list into the all-reduces the engine issues one by one
(DDP's buckets): in reverse order, the order the backward pass produces them, so
the first bucket's collective can start while earlier layers' gradients are still
being computed (engine/aggregation.py).
"""

from typing import Callable

import tensorflow as tf


def fuses_in_engine(strategy: tf.distribute.Strategy) -> bool:
  """Whether the engine packs all-reduce nests itself under this strategy.

  True for a single-process MirroredStrategy (per-tensor reduction on CPU; on GPU
  NCCL packs too, so one buffer costs it nothing); False for
  MultiWorkerMirroredStrategy, whose CommunicationOptions own the packing, and
  for every other strategy.
  """
  return (isinstance(strategy, tf.distribute.MirroredStrategy)
          and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))


def buckets(tensors: list, bucket_bytes: int) -> list[list[int]]:
  """Indices of tensors grouped into all-reduce buckets of about bucket_bytes each.

  tensors: gradients in layer order (a model's trainable_variables order). Buckets
  are filled from the last tensor backwards, each closed once it holds at least
  bucket_bytes (tf.distribute's group_by_size rule: few, large buckets), so the
  first bucket holds the last layers' gradients, which the backward pass computes
  first. Within a bucket the indices stay ascending, so a single bucket (bucket_bytes
  0, or at least the total) is exactly the unbucketed list. A tensor of unknown shape
  puts everything in one bucket.
  """
  if not tensors:
    return []
  sizes = [t.shape.num_elements() for t in tensors]
  if bucket_bytes <= 0 or any(n is None for n in sizes):
    return [list(range(len(tensors)))]
  groups, filled = [], None
  for i in reversed(range(len(tensors))):
    if filled is None or filled >= bucket_bytes:
      groups.append([])
      filled = 0
    groups[-1].append(i)
    filled += sizes[i] * tf.as_dtype(tensors[i].dtype).size
  return [sorted(group) for group in groups]


def _fusible(t) -> bool:
  return isinstance(t, tf.Tensor) and t.shape.is_fully_defined()


def fused(reduce_fn: Callable[[list], list], x):
  """reduce_fn applied to x's leaves, with the dense ones packed into one vector per dtype.

  reduce_fn: a list of tensors -> a list of their reductions (same shapes), e.g. one
  ReplicaContext.all_reduce. x: a nest of tensors (IndexedSlices and tensors of
  unknown shape pass through unpacked). Returns x's structure, reduced.
  """
  leaves = tf.nest.flatten(x)
  if not leaves:
    return x
  groups: dict[tf.DType, list[int]] = {}
  for i, t in enumerate(leaves):
    if _fusible(t):
      groups.setdefault(t.dtype, []).append(i)
  packed = {i for members in groups.values() for i in members}
  loose = [i for i in range(len(leaves)) if i not in packed]
  buffers = [tf.concat([tf.reshape(leaves[i], [-1]) for i in members], 0)
             for members in groups.values()]
  reduced = reduce_fn(buffers + [leaves[i] for i in loose])
  out = [None] * len(leaves)
  for members, buffer in zip(groups.values(), reduced):
    sizes = [leaves[i].shape.num_elements() for i in members]
    for i, part in zip(members, tf.split(buffer, sizes)):
      out[i] = tf.reshape(part, leaves[i].shape)
  for i, value in zip(loose, reduced[len(buffers):]):
    out[i] = value
  return tf.nest.pack_sequence_as(x, out)
