"""Decentralised data: each replica trains on its own fixed shard for the whole run.

`FashionMNIST.partition` (gin) splits the training split into one disjoint
shard per replica, drawn once from the run's seed; their union is the split:

  'iid'        a random permutation cut into equal shards
  'dirichlet'  per class, the class's examples divided among the replicas in
               proportions drawn from Dirichlet(alpha); small alpha (0.1) gives
               each replica a few dominant classes (Hsu et al. 2019)
  'by_class'   examples sorted by class and cut into equal contiguous shards:
               each replica sees about num_classes / num_replicas classes

Replica i's stream is endless: per epoch of its shard a permutation seeded by
(seed, i, epoch), batched at the per-replica batch size. One input pipeline
serves replicas [p*R, (p+1)*R) (R = replicas per pipeline) and yields their
batches in turn, the order in which tf.distribute hands a pipeline's elements
to its replicas. Without a partition (None) every replica draws from the
whole split, the default and what synchronous training assumes.
"""

import numpy as np
import tensorflow as tf

from replibench.errors import UserError
from replibench.inputs import shown

SCHEMES = ("iid", "dirichlet", "by_class")
_REDRAWS = 100


def check(scheme, alpha, binding: str = "FashionMNIST") -> None:
  """Raises UserError unless scheme is None or one of SCHEMES and alpha is positive."""
  if scheme is not None and scheme not in SCHEMES:
    raise UserError(f"{binding}.partition = {shown(scheme)}: must be None (every replica reads the "
                    f"whole split) or one of {', '.join(map(repr, SCHEMES))}.")
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
    raise UserError(f"{binding}.dirichlet_alpha = {shown(alpha)}: must be a positive number "
                    f"(the Dirichlet concentration; 0.1 is strongly non-IID).")


def shards(labels: np.ndarray, num_shards: int, scheme: str, alpha: float = 0.1,
           seed: int = 0) -> list[np.ndarray]:
  """num_shards disjoint, sorted int64 index arrays into labels [N] whose union is range(N),
  none empty. Deterministic in (scheme, alpha, seed)."""
  n = len(labels)
  if num_shards > n:
    raise UserError(f"{num_shards} replicas cannot each hold a shard of {n} examples.")
  rng = np.random.default_rng([seed, num_shards, SCHEMES.index(scheme)])
  if scheme == "iid":
    parts = np.array_split(rng.permutation(n), num_shards)
  elif scheme == "by_class":
    order = rng.permutation(n)
    parts = np.array_split(order[np.argsort(labels[order], kind="stable")], num_shards)
  else:
    parts = _dirichlet(labels, num_shards, alpha, rng)
  return [np.sort(p).astype(np.int64) for p in parts]


def _dirichlet(labels, num_shards, alpha, rng) -> list:
  for _ in range(_REDRAWS):   # A draw that leaves a replica empty is drawn again.
    parts = [[] for _ in range(num_shards)]
    for c in np.unique(labels):
      members = rng.permutation(np.flatnonzero(labels == c))
      cuts = (np.cumsum(rng.dirichlet([alpha] * num_shards))[:-1] * len(members)).astype(int)
      for part, piece in zip(parts, np.split(members, cuts)):
        part.append(piece)
    parts = [np.concatenate(p) for p in parts]
    if min(map(len, parts)) > 0:
      return parts
  raise UserError(f"Dirichlet(alpha={alpha}) left a replica without examples in "
                  f"{_REDRAWS} draws of {num_shards} shards; raise dirichlet_alpha.")


def replica_stream(indices: np.ndarray, batch: int, seed: int, replica: int,
                   skip_batches: int) -> tf.data.Dataset:
  """Endless (example indices [batch], batch number) of one replica's shard."""
  shard = tf.constant(indices)

  def epoch_order(epoch):
    key = tf.stack([tf.constant(seed, tf.int64) * 1_000_003 + replica, epoch])
    return tf.random.experimental.stateless_shuffle(shard, seed=key)

  ds = tf.data.Dataset.counter().map(epoch_order).unbatch().batch(batch, drop_remainder=True)
  return tf.data.Dataset.zip(ds, tf.data.Dataset.counter()).skip(skip_batches)


def pipeline_streams(labels: np.ndarray, ctx, scheme: str, alpha: float, seed: int,
                     skip_batches: int) -> tf.data.Dataset:
  """This pipeline's (indices, batch number, replica) elements: its replicas' batches in turn.

  ctx: the engine's InputContext; replica ids are global (pipeline p serves
  [p*R, (p+1)*R)); skip_batches counts each replica's own batches."""
  first, per_pipeline = ctx.replica_range()   # With ctx.keep: the kept replicas.
  parts = shards(labels, ctx.num_replicas, scheme, alpha, seed)
  streams = [replica_stream(parts[r], ctx.per_replica_batch_size, seed, r, skip_batches)
             .map(lambda idx, step, r=r: (idx, step, tf.constant(r, tf.int64)))
             for r in range(first, first + per_pipeline)]
  order = tf.data.Dataset.range(per_pipeline).repeat()
  return tf.data.Dataset.choose_from_datasets(streams, order)
