"""Compressed gradients: quantize or sparsify, send the compressed format, with error feedback.

Each replica compresses its gradient share plus its residual (what earlier
compressions dropped), keeps the new residual, and the replicas sum their
compressed values through the engine's collectives in the compressed format
itself; the optimizer (and its clipnorm / global_clipnorm) then sees that
global sum, as under Sync. Per tensor x = g + e:

  bits=b (1..16)  stochastic rounding to the 2**b-point grid on [-s, s],
                  s = max |x| over all replicas (one gathered max of a [T]
                  vector, T tensors, so every replica uses the same grid).
                  Unbiased: E[C(x)] = x. bits=32 means no quantization.
  top_k=f         keep the round(f * size) (at least 1) largest-magnitude
                  entries, zero the rest. f = 1.0 keeps everything.
  error feedback  e <- x - C(x), C(x) this replica's own dequantized (or
                  sparsified) value; a per-replica variable (ON_READ: each
                  replica keeps its own).

The wire formats (tf.distribute has only dense sums and gathers, so these are
built from those and TF's all-to-all, through the engine's collectives):

  bits   each entry is an integer level l in [0, L], L = 2**b - 1, with value
         l * 2s/L - s. With one s for all replicas the sum dequantizes exactly:
         sum_i value_i = (2s/L) * sum_i l_i - n*s. So the levels of all tensors
         are summed as integers, packed into int64 words: a field of
         b + ceil(log2 n) bits holds a sum of n levels without carrying into
         its neighbour, 63 // that many fields a word (the sign bit stays
         clear). One all-reduce sum of ceil(entries / fields) words: 8 bytes a
         word, 1.14 bytes an entry at b=8 and n=2 against Sync's 4. Why not an
         all-gather of int8 levels: a ring all-gather costs each replica (n-1)
         times its payload, an all-reduce 2(n-1)/n times, so at 1 byte an entry
         the gather sends (n-1) bytes an entry against <= 2 x 8/fields (2.0 at
         b=8, n=4) and grows with n, the packed sum only by its log2(n) headroom
         bits; and TF's CollectiveGatherV2 takes no int8 (float16/32/64, int32,
         int64 only), so int8 levels would need packing anyway. This is
         wire='packed_sum', the default: the optimizer sees exactly the sum of
         the replicas' C(x).
  bits,  wire='two_pass' (two_pass.py): an all-to-all sends each replica's block
         of b-bit levels to its owner, which sums them, rounds the sum again to
         b bits (with error feedback of its own) and all-gathers it back: b bits
         an entry both ways, 0.25x Sync's bytes at b=8 whatever n (packed_sum:
         0.29x at n=2, 0.33x at n=4), for a second rounding and one more
         collective.
  top_k  each replica sends its k kept values (float32) and their flat indices
         into all its tensors concatenated (int32), bit-cast into one int32
         tensor: ONE all-gather, (n-1) x 8k bytes a replica on a ring (sparse
         sets from different replicas do not line up, so a sum cannot carry
         them). Every replica scatter-adds all n sets into a dense zero vector.
         (On local GPUs, MirroredStrategy's NCCL ops have no gather: TF gathers
         on one device and broadcasts, with a warning.)

'regime/bytes_communicated' is the payload one replica contributes per step
(wire_bytes: 8 bytes a packed word plus 4 a tensor for the scales; 8 bytes a
kept entry), the unit Sync reports 4 bytes an entry in
('regime/compression_ratio' = Sync bytes / these); the communication ledger
(engine/measure/communication.py) records the same collectives and applies the ring
algorithms' factors. bits=32 and top_k=1.0 are lossless and run exactly as Sync.

Sparse (IndexedSlices, embedding) gradients are compressed as dense tensors.
The residuals are not checkpointed (a per-replica variable has no single saved
value): a resumed run restarts error feedback from zero.
"""

import itertools

import gin
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.regimes import two_pass
from replibench.engine.regimes.base import Regime
from replibench.engine.regimes.quantization import (
    dequantize, field_bits, flatten, pack, packed_words, split_like, stochastic_levels, unpack)
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError
from replibench.inputs import shown

LOSSLESS_BITS = 32
PACKED_SUM, TWO_PASS = "packed_sum", "two_pass"
WIRES = (PACKED_SUM, TWO_PASS)


# --- Packed sums: all replicas' levels summed in one all-reduce. ---

def packed_level_sum(levels: list, bits: int, kind: str = "gradients") -> list:
  """Each tensor's levels summed over replicas (int64, same shapes), in ONE all-reduce
  of packed int64 words (call in replica context)."""
  width = field_bits(bits, collectives.num_replicas())
  flat = flatten(levels)
  summed = collectives.all_reduce(pack(flat, width), "sum", kind=kind)
  return split_like(unpack(summed, width, flat.shape[0]), levels)


# --- Sparsification: k (index, value) pairs per tensor. ---

def kept_entries(size: int, fraction: float) -> int:
  """How many entries of a size-entry tensor top_k=fraction keeps."""
  return max(1, min(size, int(round(fraction * size))))


def top_k_entries(x: tf.Tensor, k: int) -> tuple:
  """x's k largest-magnitude entries: (flat indices int32 [k], their values [k])."""
  flat = tf.reshape(x, [-1])
  _, index = tf.math.top_k(tf.abs(flat), k=k, sorted=False)
  return index, tf.gather(flat, index)


def densify(index: tf.Tensor, values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  """A tensor shaped like `like`, zero but for values at the flat positions index."""
  return tf.reshape(tf.scatter_nd(index[:, None], values, [like.shape.num_elements()]),
                    like.shape)


def top_k_sparsify(x: tf.Tensor, k: int) -> tf.Tensor:
  """x with all but its k largest-magnitude entries set to zero (same shape)."""
  return densify(*top_k_entries(x, k), x)


def sparse_sum(index: tf.Tensor, values: tf.Tensor, size: int, kind: str = "gradients"):
  """The dense float32 [size] sum over replicas of each one's (index, value) pairs.

  index: int32 [K] into [0, size); values: float32 [K] (K equal on all replicas).
  The values are bit-cast to int32 beside the indices so ONE all-gather of int32
  [1, 2K] carries both (call in replica context)."""
  k = index.shape[0]
  payload = tf.concat([index, tf.bitcast(tf.cast(values, tf.float32), tf.int32)], axis=0)
  gathered = collectives.all_gather(payload[None], axis=0, kind=kind)     # [n, 2K]
  all_index = tf.reshape(gathered[:, :k], [-1, 1])
  all_values = tf.reshape(tf.bitcast(gathered[:, k:], tf.float32), [-1])
  return tf.tensor_scatter_nd_add(tf.zeros([size], tf.float32), all_index, all_values)


@gin.configurable(module="regimes")
class Compressed(Regime):
  """Sync with quantized (bits) or sparsified (top_k) gradients and error feedback."""

  name = "compressed"

  def __init__(self, bits: int | None = None, top_k: float | None = None, seed: int = 0,
               wire: str = PACKED_SUM):
    if (bits is None) == (top_k is None):
      raise UserError(
          "regimes.Compressed needs exactly one of `bits` (1..16, or 32 for no quantization) "
          f"and `top_k` (a fraction in (0, 1]); got bits={shown(bits)}, top_k={shown(top_k)}.")
    if bits is not None and (not isinstance(bits, int) or isinstance(bits, bool)
                             or not (1 <= bits <= 16 or bits == LOSSLESS_BITS)):
      raise UserError(
          f"regimes.Compressed.bits must be an integer in 1..16 (or 32: no quantization), "
          f"got {shown(bits)}.")
    if top_k is not None and (not isinstance(top_k, (int, float)) or isinstance(top_k, bool)
                              or not 0 < top_k <= 1):
      raise UserError(
          f"regimes.Compressed.top_k must be the fraction of entries kept per tensor, in "
          f"(0, 1], got {shown(top_k)}.")
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise UserError(f"regimes.Compressed.seed must be an integer, got {shown(seed)}.")
    if wire not in WIRES or (wire == TWO_PASS and bits is None):
      raise UserError(
          f"regimes.Compressed.wire must be one of {WIRES} ('{TWO_PASS}' with `bits` only: "
          f"top_k always gathers its pairs), got wire={shown(wire)} with bits={shown(bits)}, "
          f"top_k={shown(top_k)}.")
    self.bits, self.top_k, self.seed, self.wire = bits, top_k, seed, wire
    self._residuals = {}   # id(variable) -> (variable, its residual)
    self._servers = {}     # two_pass: id(optimizer) -> (optimizer, BlockLayout, server residual)

  @property
  def lossless(self) -> bool:
    """bits=32 or top_k=1.0: C is the identity and every residual stays zero."""
    return self.bits == LOSSLESS_BITS or self.top_k == 1.0

  def build_optimizer(self, optimizer, variables):
    super().build_optimizer(optimizer, variables)
    if self.lossless:
      return
    for v in variables:
      self._residuals[id(v)] = (v, _per_replica_zeros(v.shape, v.dtype, "compression_residual"))
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if self.wire == TWO_PASS and num_replicas > 1:
      layout = two_pass.BlockLayout(tuple(v.shape.num_elements() for v in variables),
                                    num_replicas, self.bits)
      self._servers[id(optimizer)] = (optimizer, layout, _per_replica_zeros(
          [layout.block], tf.float32, "compression_server_residual"))

  def _residual(self, variable) -> tf.Variable:
    found = self._residuals.get(id(variable))
    if found is None or found[0] is not variable:
      raise RuntimeError(
          f"No compression residual for {getattr(variable, 'path', variable)}: build the "
          "optimizer with engine.build_optimizer under Replicator.scope() first.")
    return found[1]

  def exchange(self, values: list, step: tf.Tensor, kind: str = "gradients") -> tuple:
    """(C(x) for this replica's tensors values, the sum over replicas of their C(x)),
    the sum sent in the compressed format (call in replica context); kind names
    the collectives in the communication account."""
    if self.top_k is not None:
      return self._exchange_sparse(values, kind)
    return self._exchange_quantized(values, step, kind)

  def _quantized_levels(self, values, step, kind):
    """(shared per-tensor scales float32 [T], this replica's levels, its C(x), its seed)."""
    # The scales are part of the payload (wire_bytes counts them): one gathered [T] vector.
    scales = collectives.all_reduce(
        tf.stack([tf.cast(tf.reduce_max(tf.abs(x)), tf.float32) for x in values]), "max",
        kind=kind)
    base = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
    base = tf.random.experimental.stateless_fold_in(base, collectives.replica_id())
    levels = [stochastic_levels(x, tf.cast(scales[i], x.dtype), self.bits,
                                tf.random.experimental.stateless_fold_in(base, i))
              for i, x in enumerate(values)]
    own = [dequantize(l, scales[i], self.bits, dtype=x.dtype)
           for i, (l, x) in enumerate(zip(levels, values))]
    return scales, levels, own, base

  def _exchange_quantized(self, values, step, kind):
    # The levels go in one packed all-reduce of their sums.
    scales, levels, own, _ = self._quantized_levels(values, step, kind)
    n = collectives.num_replicas()
    summed = [dequantize(s, scales[i], self.bits, count=n, dtype=x.dtype)
              for i, (s, x) in enumerate(zip(packed_level_sum(levels, self.bits, kind), values))]
    return own, summed

  def _two_pass_server(self, optimizer):
    """(BlockLayout, server residual) built for optimizer, or None (packed sum)."""
    found = self._servers.get(id(optimizer))
    return found[1:] if found and found[0] is optimizer else None

  def _exchange_two_pass(self, values, step, server):
    """Like exchange, the sum through two_pass (each owner rounds its block's sum again)."""
    layout, residual = server
    if tuple(x.shape.num_elements() for x in values) != layout.sizes:
      raise RuntimeError(
          "regimes.Compressed(wire='two_pass') got gradients for other variables than it "
          "built its blocks for (a None gradient?): build_optimizer's variables must all "
          "have gradients.")
    scales, levels, own, base = self._quantized_levels(values, step, "gradients")
    seed = tf.random.experimental.stateless_fold_in(base, len(values))
    flat = two_pass.two_pass_sum(levels, scales, layout, residual, seed)
    return own, [tf.cast(s, x.dtype) for s, x in zip(split_like(flat, values), values)]

  def _exchange_sparse(self, values, kind):
    # Indices are flat over all tensors concatenated, so one gather carries them all.
    sizes = [x.shape.num_elements() for x in values]
    if sum(sizes) >= 2**31:
      raise ValueError(f"{sum(sizes)} gradient entries do not fit int32 indices.")
    offsets = [0] + list(itertools.accumulate(sizes))[:-1]
    picks = [top_k_entries(x, kept_entries(size, self.top_k)) for x, size in zip(values, sizes)]
    own = [densify(i, v, x) for (i, v), x in zip(picks, values)]
    index = tf.concat([i + offset for (i, _), offset in zip(picks, offsets)], axis=0)
    kept = tf.concat([tf.cast(v, tf.float32) for _, v in picks], axis=0)
    dense = sparse_sum(index, kept, sum(sizes), kind)
    return own, [tf.cast(s, x.dtype) for s, x in zip(split_like(dense, values), values)]

  def apply_gradients(self, optimizer, grads, variables):
    pairs = [(tf.convert_to_tensor(g), v) for g, v in zip(grads, variables) if g is not None]
    corrected = [g for g, _ in pairs]
    if self.lossless:
      # No residual (it would stay exactly zero): the arithmetic is then Sync's
      # to the bit. Adding the zeros would not change a value, but Grappler's
      # arithmetic optimizer regroups the sums and moves the result by an ulp.
      reduced = collectives.all_reduce(corrected, "sum", kind="gradients")
    else:
      residuals = [self._residual(v) for _, v in pairs]
      corrected = [g + r for g, r in zip(corrected, residuals)]
      server = self._two_pass_server(optimizer)
      own, reduced = (self._exchange_two_pass(corrected, optimizer.iterations, server)
                      if server else self.exchange(corrected, optimizer.iterations))
      for r, x, c in zip(residuals, corrected, own):
        r.assign(x - c)
    aggregation.apply_reduced(optimizer, reduced, [v for _, v in pairs])
    sizes = [x.shape.num_elements() for x in corrected]
    sent = self.wire_bytes(sizes, collectives.num_replicas())
    # The ratio of a step's sums: sync's bytes over the bytes sent.
    return StepMetrics({"regime/bytes_communicated": float(sent),
                        "regime/sync_bytes": float(4 * sum(sizes))},
                       {"regime/compression_ratio": (_compression_ratio, ("regime/sync_bytes",))})

  def wire_bytes(self, sizes, num_replicas):
    """Bytes one replica contributes per step for float32 tensors of these sizes
    (entries) among num_replicas: 8 per packed int64 word plus 4 per tensor for the
    scales (bits), 8 per kept entry (value + index; top_k), 4 per entry (lossless).
    The step's one all-gather (the scales', or top_k's entries) also gathers its
    [1, m] payload's shape first: 8 bytes (collectives.all_gather)."""
    shape = 8   # int32 [2]: a gathered [1, m] tensor's shape.
    if self.lossless:
      return float(4 * sum(sizes))
    if self.top_k is not None:
      return float(sum(8 * kept_entries(n, self.top_k) for n in sizes) + shape)
    scales = 4 * len(sizes) + shape
    if self.wire == TWO_PASS and num_replicas > 1:
      scattered, gathered = two_pass.BlockLayout(tuple(sizes), num_replicas,
                                                 self.bits).payload_bytes()
      return float(scales + scattered + gathered + shape)
    return float(8 * packed_words(sum(sizes), self.bits, num_replicas) + scales)

  def setting(self):
    if self.top_k is not None:
      return f"{self.name}(top_k={self.top_k:g})"
    return f"{self.name}(bits={self.bits}{', two_pass' if self.wire == TWO_PASS else ''})"

  def hparams(self):
    return {"regime": self.name, "bits": self.bits or 0, "top_k": self.top_k or 0.0,
            "wire": self.wire}


def _compression_ratio(sums: dict) -> tf.Tensor:
  return sums["regime/sync_bytes"] / sums["regime/bytes_communicated"]


def _per_replica_zeros(shape, dtype, name: str) -> tf.Variable:
  """A variable each replica keeps its own value of (a residual), starting at zero."""
  return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name,
                     synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.SUM)
