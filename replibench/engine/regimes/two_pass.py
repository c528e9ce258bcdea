"""Compressed's two-pass wire: b-bit levels out to their owners, b-bit sums back.

`regimes.Compressed.wire = "two_pass"` (with `bits`) replaces the one packed
all-reduce of level sums with the scheme of DoubleSqueeze (Tang et al., 2019)
and 1-bit Adam's compressed all-reduce (Tang et al., 2021), on n replicas:

  1. scatter   every replica's levels (Compressed's per-tensor stochastic b-bit
               levels on the grid all replicas share) are cut into n blocks, one
               per owner replica, packed b bits a field into all 64 bits of
               int64 words; ONE all-to-all sends each block to its owner.
  2. requantize the owner sums the n copies of its block exactly (integers,
               locally: no headroom bits on the wire), dequantizes, adds its
               server residual, and rounds the result again, stochastically, to
               b bits on one grid per tensor segment of its block (scale: the
               segment's max |v|), keeping what the rounding drops as its new
               server residual (error feedback on the second pass too).
  3. gather    ONE all-gather of every owner's packed levels and segment scales
               gives every replica the whole sum, bit-identical everywhere.

Wire, per replica at b = 8: (n-1)/n bytes an entry out and as many back,
2(n-1)/n, against Sync's 8(n-1)/n: 0.25x at every n (the packed all-reduce's
fields grow by log2(n) headroom bits: 0.33x at n = 4). The price: a second
rounding (unbiased, its error fed back by the owner, so the optimizer sees the
sum of the replicas' quantized gradients only up to that rounding) and one more
collective a step. The server residual is per replica (the block it owns) and,
like the workers', not checkpointed.
"""

import dataclasses
import math

import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.regimes import quantization as q


@dataclasses.dataclass(frozen=True)
class BlockLayout:
  """A flat vector of tensors of `sizes` entries cut into one block per replica.

  Block j holds entries [j * block, (j + 1) * block) of the vector padded with
  zeros to num_replicas * block entries; `block` is a whole number of int64
  words of EXCHANGE_BITS // bits fields.
  """
  sizes: tuple
  num_replicas: int
  bits: int

  @property
  def entries(self) -> int:
    return sum(self.sizes)

  @property
  def fields(self) -> int:
    return q.EXCHANGE_BITS // self.bits

  @property
  def words(self) -> int:
    """int64 words a block: each replica's share of the entries, rounded up to words."""
    share = math.ceil(self.entries / self.num_replicas)
    return math.ceil(share / self.fields)

  @property
  def block(self) -> int:
    """Entries a block (padding included)."""
    return self.words * self.fields

  @property
  def scale_words(self) -> int:
    """int64 words that carry a float32 scale per tensor (two a word)."""
    return math.ceil(len(self.sizes) / 2)

  def tensor_index(self) -> tf.Tensor:
    """int32 [num_replicas, block]: each entry's tensor; len(sizes) for padding."""
    counts = list(self.sizes) + [self.num_replicas * self.block - self.entries]
    return tf.reshape(tf.repeat(tf.range(len(counts)), counts), [self.num_replicas, -1])

  def pack(self, levels: tf.Tensor) -> tf.Tensor:
    """int64 levels [rows * block] -> packed int64 words [rows, words]."""
    words = q.pack(levels, self.bits, q.EXCHANGE_BITS)
    return tf.reshape(words, [-1, self.words])

  def unpack(self, words: tf.Tensor) -> tf.Tensor:
    """int64 words [rows, words] -> int64 levels [rows, block]."""
    rows = words.shape[0]
    flat = q.unpack(tf.reshape(words, [-1]), self.bits, rows * self.block, q.EXCHANGE_BITS)
    return tf.reshape(flat, [rows, self.block])

  def payload_bytes(self) -> tuple[int, int]:
    """(all-to-all payload, all-gather payload) one replica contributes, bytes."""
    return 8 * self.num_replicas * self.words, 8 * (self.words + self.scale_words)


def _scales_as_words(scales: tf.Tensor, layout: BlockLayout) -> tf.Tensor:
  """float32 [T] -> int64 [scale_words] (bit-cast two at a time; exact)."""
  padded = tf.pad(scales, [[0, 2 * layout.scale_words - scales.shape[0]]])
  return tf.bitcast(tf.reshape(padded, [layout.scale_words, 2]), tf.int64)


def _words_as_scales(words: tf.Tensor, count: int) -> tf.Tensor:
  """int64 [rows, scale_words] -> float32 [rows, count]."""
  rows = words.shape[0]
  return tf.reshape(tf.bitcast(words, tf.float32), [rows, -1])[:, :count]


def two_pass_sum(levels: list, scales: tf.Tensor, layout: BlockLayout,
                 residual: tf.Variable, seed: tf.Tensor, kind: str = "gradients") -> tf.Tensor:
  """The sum over replicas of their dequantized levels, float32 [entries], the same
  on every replica (call in replica context).

  levels: this replica's int64 level tensors (layout.sizes entries); scales:
  float32 [T], the grid of each tensor, shared by all replicas; residual: this
  replica's float32 [layout.block] server residual (read and updated); seed:
  int [2], this replica's stateless seed for the second rounding.
  """
  n, count = layout.num_replicas, len(layout.sizes)
  index = layout.tensor_index()
  own_index = tf.gather(index, collectives.replica_id())                 # [block]
  flat = tf.pad(q.flatten(levels), [[0, n * layout.block - layout.entries]])
  received = tf.reshape(collectives.all_to_all(layout.pack(flat), kind), [n, layout.words])
  level_sum = tf.reduce_sum(layout.unpack(received), axis=0)             # [block]
  padded_scales = tf.concat([scales, [0.0]], axis=0)
  owned = q.dequantize(level_sum, tf.gather(padded_scales, own_index), layout.bits,
                       count=n) + residual
  segment_scales = tf.maximum(   # An empty segment's max is the lowest float.
      tf.math.unsorted_segment_max(tf.abs(owned), own_index, count + 1), 0.0)[:count]
  entry_scales = tf.gather(tf.concat([segment_scales, [0.0]], axis=0), own_index)
  requantized = q.stochastic_levels(owned, entry_scales, layout.bits, seed)
  residual.assign(owned - q.dequantize(requantized, entry_scales, layout.bits))
  payload = tf.concat([layout.pack(requantized)[0], _scales_as_words(segment_scales, layout)],
                      axis=0)
  # A multi-worker gather's result has no static first dimension: give it back.
  gathered = tf.reshape(collectives.all_gather(payload[None], axis=0, kind=kind),
                        [n, layout.words + layout.scale_words])
  all_scales = tf.pad(_words_as_scales(gathered[:, layout.words:], count), [[0, 0], [0, 1]])
  values = q.dequantize(layout.unpack(gathered[:, :layout.words]),
                        tf.gather(all_scales, index, batch_dims=1), layout.bits)
  return tf.reshape(values, [-1])[:layout.entries]
