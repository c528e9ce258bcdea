"""Quantization and bit packing, shared by the regimes that send integer levels.

A b-bit level l in [0, L], L = 2**b - 1, stands for l * 2s/L - s on the grid of
scale s (one s per tensor, or per entry: scales broadcast). Levels travel packed
into int64 words, `width` bits a field:

  sums       a field of b + ceil(log2 n) bits holds a sum of n levels without
             carrying into its neighbour, 63 // width fields a word (the sign bit
             stays clear, so an all-reduce sum of words never overflows);
  exchanges  levels that are moved, not summed, fill all 64 bits (64 // b fields:
             8 a word at b = 8, one byte an entry).
"""

import tensorflow as tf

WORD_BITS = 63       # Usable bits of an int64 word for sums: the sign bit stays clear.
EXCHANGE_BITS = 64   # All of a word's bits, for levels that are moved, not summed.


# --- Quantization: integer levels on a grid shared by all replicas. ---

def stochastic_levels(x: tf.Tensor, scale: tf.Tensor, bits: int, seed: tf.Tensor) -> tf.Tensor:
  """x's grid levels after unbiased stochastic rounding: int64, x's shape, in [0, 2**bits - 1].

  x: float tensor with |x| <= scale; scale: float scalar (or x's shape: a grid per
  entry); seed: int [2] for a stateless draw. Level l stands for l * 2*scale/L - scale (L = 2**bits - 1);
  each entry goes to one of its two neighbouring levels with probabilities
  that make its expected value x. With scale = 0 every level means 0.
  """
  intervals = float(2**bits - 1)
  safe = tf.where(scale > 0, scale, tf.ones_like(scale))
  position = (x / safe + 1.0) * (intervals / 2.0)          # In [0, intervals].
  noise = tf.random.stateless_uniform(tf.shape(x), seed=seed, dtype=x.dtype)
  level = tf.clip_by_value(tf.floor(position + noise), 0.0, intervals)
  return tf.cast(level, tf.int64)


def dequantize(levels: tf.Tensor, scale: tf.Tensor, bits: int, count: int = 1,
               dtype=tf.float32) -> tf.Tensor:
  """The value of levels (int64, any shape), or of a sum of count replicas' levels
  (each replica's value is l * 2s/L - s, so a sum of count is sum_l * 2s/L - count*s)."""
  scale = tf.cast(scale, dtype)
  step = scale * (2.0 / float(2**bits - 1))
  return tf.cast(levels, dtype) * step - float(count) * scale


def stochastic_quantize(x: tf.Tensor, scale: tf.Tensor, bits: int, seed: tf.Tensor) -> tf.Tensor:
  """x rounded at random to the 2**bits-point grid on [-scale, scale], unbiasedly
  (the dequantized stochastic_levels; same shape and dtype as x; scale = 0 gives zeros)."""
  return dequantize(stochastic_levels(x, scale, bits, seed), scale, bits, dtype=x.dtype)


# --- Packing: levels (or their sums) in the fields of int64 words. ---

def field_bits(bits: int, num_replicas: int) -> int:
  """Bits a field needs to hold a sum of num_replicas levels of bits bits each:
  n * (2**b - 1) < 2**(b + ceil(log2 n)). n <= 1 needs no headroom."""
  width = bits + (max(num_replicas, 1) - 1).bit_length()   # bit_length(n - 1) = ceil(log2 n).
  if width > WORD_BITS:
    raise ValueError(f"{num_replicas} replicas of {bits}-bit levels overflow an int64 field.")
  return width


def fields_per_word(bits: int, num_replicas: int) -> int:
  return WORD_BITS // field_bits(bits, num_replicas)


def packed_words(entries: int, bits: int, num_replicas: int) -> int:
  """int64 words that carry entries levels summed over num_replicas replicas."""
  return -(-entries // fields_per_word(bits, num_replicas))


def _shifts(width: int, word_bits: int) -> tf.Tensor:
  return tf.range(word_bits // width, dtype=tf.int64) * width   # Field j starts at bit j*width.


def pack(levels: tf.Tensor, width: int, word_bits: int = WORD_BITS) -> tf.Tensor:
  """levels int64 [m], each < 2**width -> int64 [ceil(m / F)] words, F = word_bits // width.

  Entry w*F + j sits in bits [j*width, (j+1)*width) of word w; the last word is
  padded with zeros. Fields do not overlap, so summing the shifted fields
  equals OR-ing them (TF has no OR-reduction over an axis); with word_bits =
  EXCHANGE_BITS the top field may set the sign bit, and adding that one negative
  field to the others' non-negative sum cannot overflow either."""
  per_word = word_bits // width
  words = -(-levels.shape[0] // per_word)
  padded = tf.pad(levels, [[0, words * per_word - levels.shape[0]]])
  fields = tf.reshape(padded, [words, per_word])
  return tf.reduce_sum(tf.bitwise.left_shift(fields, _shifts(width, word_bits)), axis=1)


def unpack(words: tf.Tensor, width: int, count: int, word_bits: int = WORD_BITS) -> tf.Tensor:
  """pack's inverse: int64 [words] -> int64 [count], the first count fields in order
  (the mask undoes the sign extension of an arithmetic right shift)."""
  mask = tf.constant((1 << width) - 1, tf.int64)
  shifted = tf.bitwise.right_shift(words[:, None], _shifts(width, word_bits))
  return tf.reshape(tf.bitwise.bitwise_and(shifted, mask), [-1])[:count]


def flatten(tensors: list) -> tf.Tensor:
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def split_like(flat: tf.Tensor, like: list) -> list:
  parts = tf.split(flat, [t.shape.num_elements() for t in like])
  return [tf.reshape(p, t.shape) for p, t in zip(parts, like)]
