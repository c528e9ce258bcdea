"""The exchanged model quantized: what SwarmSGD sends between neighbours.

`regimes.Gossip.compression = @regimes.Compressed()` with `regimes.Compressed.bits = b`
makes every copy of the model state a replica receives a stochastic b-bit
rounding of its sender's (Compressed's unbiased quantizer, one grid per tensor),
while each replica keeps its own copy exact: x_i <- (x_i + sum_p Q(x_p)) / (1 + k).
There is no error feedback (a model, unlike a gradient, is not a sum of
increments: what rounding drops from a copy is not owed to a later one). The
mean of the replicas is kept in expectation, not exactly.

Wire format, per partner p (a group of two, collectives.pair_all_reduce):
  scales  float32 [2, T]: row 0 the lower replica id's per-tensor max |x|, row 1
          the higher's, the other row zero, so the pair's sum carries both
          exactly; both ends then quantize on the shared grid max(s_i, s_p).
  levels  the b-bit levels of all T tensors packed into int64 words with b + 1
          bits a field (a sum of two levels cannot carry), summed in one pair
          all-reduce; l_p = (l_i + l_p) - l_i is exact in integers.
So a replica sends 8 * ceil(entries / (63 // (b + 1))) + 8 T bytes a partner
(1.14 bytes an entry at b = 8, against 4 for float32).

With @regimes.Complete() the copies of all replicas arrive through one packed
all-reduce of levels (Compressed's own exchange, shared grid over all replicas).
"""

import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.regimes import compressed, quantization


def split(flat: tf.Tensor, sizes: list[int]) -> list:
  return tf.split(flat, sizes)


class StateQuantizer:
  """Quantizes the copies of one flat state vector (tensors of `sizes` entries, in order)."""

  def __init__(self, compression: compressed.Compressed, sizes: list[int]):
    self.bits, self.seed, self.sizes = compression.bits, compression.seed, list(sizes)
    self._compression = compression

  def _seed(self, step: tf.Tensor, replica: tf.Tensor, slot: int) -> tf.Tensor:
    base = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
    base = tf.random.experimental.stateless_fold_in(base, tf.cast(replica, tf.int64))
    return tf.random.experimental.stateless_fold_in(base, slot)

  def partner_copy(self, flat: tf.Tensor, replica: tf.Tensor, partner: tf.Tensor,
                   step: tf.Tensor, slot: int) -> tf.Tensor:
    """Q(x_partner), float [entries]; zeros when partner is this replica (it sits out).

    Both ends must call this in the same call order (slot numbers a replica's
    partners, for distinct random draws per neighbour)."""
    values = split(flat, self.sizes)
    scales = tf.stack([tf.reduce_max(tf.abs(x)) for x in values])
    zero = tf.zeros_like(scales)
    table = tf.stack([tf.where(replica <= partner, scales, zero),
                      tf.where(replica > partner, scales, zero)])
    shared = tf.reduce_max(collectives.pair_all_reduce(table, partner), axis=0)
    seed = self._seed(step, replica, slot)
    levels = [quantization.stochastic_levels(x, shared[i], self.bits,
                                             tf.random.experimental.stateless_fold_in(seed, i))
              for i, x in enumerate(values)]
    mine = tf.concat([tf.reshape(l, [-1]) for l in levels], axis=0)
    width = quantization.field_bits(self.bits, 2)
    words = collectives.pair_all_reduce(quantization.pack(mine, width), partner)
    theirs = quantization.unpack(words, width, mine.shape[0]) - mine
    copy = tf.concat([quantization.dequantize(l, shared[i], self.bits, dtype=flat.dtype)
                      for i, l in enumerate(split(theirs, self.sizes))], axis=0)
    return tf.where(tf.not_equal(partner, replica), copy, tf.zeros_like(copy))

  def others_sum(self, flat: tf.Tensor, replica: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """sum over the other replicas j of Q(x_j), float [entries], in one packed all-reduce
    over all replicas (Compressed's exchange; call every step, not under a condition)."""
    del replica
    own, total = self._compression.exchange(split(flat, self.sizes), step, kind="parameters")
    return tf.concat([tf.reshape(t - o, [-1]) for t, o in zip(total, own)], axis=0)

  def bytes_per_copy(self, num_replicas: int, complete: bool) -> float:
    """Bytes a replica sends per copy it exchanges (per partner; Complete: per all-reduce)."""
    entries = sum(self.sizes)
    if complete:
      return self._compression.wire_bytes(self.sizes, num_replicas)
    return float(8 * quantization.packed_words(entries, self.bits, 2) + 8 * len(self.sizes))
