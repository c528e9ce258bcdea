"""Compressed gradients: quantize or sparsify before the all-reduce, with error feedback.

Each replica compresses its gradient share plus its residual (what earlier
compressions dropped), keeps the new residual, and the compressed values are
summed over replicas; the optimizer (and its clipnorm / global_clipnorm) then
sees that global sum, as under Sync. Per tensor x = g + e:

  bits=b (1..16)  stochastic rounding to 2**b evenly spaced values on
                  [-s, s], s = max |x| over all replicas (one all-reduce max of
                  a scalar per tensor, so every replica uses the same grid).
                  Unbiased: E[C(x)] = x. bits=32 means no quantization.
  top_k=f         keep the round(f * size) (at least 1) largest-magnitude
                  entries, zero the rest. f = 1.0 keeps everything.
  error feedback  e <- x - C(x), a per-replica variable (ON_READ: each replica
                  keeps its own).

tf.distribute has no int8 or sparse all-reduce, so the compressed values are
summed as float32: this simulates the wire format. 'regime/bytes_communicated'
is what that format would send per replica and step: b/8 bytes per entry plus
a 4-byte float32 scale per tensor (bits), 8 bytes per kept entry (float32
value + int32 index; top_k), against 4 bytes per entry under Sync
('regime/compression_ratio' = Sync bytes / these).

Sparse (IndexedSlices, embedding) gradients are compressed as dense tensors.
The residuals are not checkpointed (a per-replica variable has no single saved
value): a resumed run restarts error feedback from zero.
"""

import math

import gin
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.regimes.base import Regime
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError

LOSSLESS_BITS = 32


def stochastic_quantize(x: tf.Tensor, scale: tf.Tensor, bits: int, seed: tf.Tensor) -> tf.Tensor:
  """x rounded at random to the 2**bits-point grid on [-scale, scale], unbiasedly.

  x: float tensor with |x| <= scale; scale: float scalar; seed: int [2] for a
  stateless draw. Each entry goes to one of its two neighbouring grid points
  with probabilities that make its expectation x. scale = 0 gives zeros.
  """
  intervals = float(2**bits - 1)
  safe = tf.where(scale > 0, scale, tf.ones_like(scale))
  position = (x / safe + 1.0) * (intervals / 2.0)          # In [0, intervals].
  noise = tf.random.stateless_uniform(tf.shape(x), seed=seed, dtype=x.dtype)
  level = tf.clip_by_value(tf.floor(position + noise), 0.0, intervals)
  return tf.where(scale > 0, level * (2.0 / intervals) * safe - safe, tf.zeros_like(x))


def kept_entries(size: int, fraction: float) -> int:
  """How many entries of a size-entry tensor top_k=fraction keeps."""
  return max(1, min(size, int(round(fraction * size))))


def top_k_sparsify(x: tf.Tensor, k: int) -> tf.Tensor:
  """x with all but its k largest-magnitude entries set to zero (same shape)."""
  flat = tf.reshape(x, [-1])
  _, index = tf.math.top_k(tf.abs(flat), k=k, sorted=False)
  kept = tf.scatter_nd(index[:, None], tf.gather(flat, index), tf.shape(flat))
  return tf.reshape(kept, tf.shape(x))


@gin.configurable(module="regimes")
class Compressed(Regime):
  """Sync with quantized (bits) or sparsified (top_k) gradients and error feedback."""

  name = "compressed"

  def __init__(self, bits: int | None = None, top_k: float | None = None, seed: int = 0):
    if (bits is None) == (top_k is None):
      raise UserError(
          "regimes.Compressed needs exactly one of `bits` (1..16, or 32 for no quantization) "
          f"and `top_k` (a fraction in (0, 1]); got bits={bits!r}, top_k={top_k!r}.")
    if bits is not None and (not isinstance(bits, int) or isinstance(bits, bool)
                             or not (1 <= bits <= 16 or bits == LOSSLESS_BITS)):
      raise UserError(
          f"regimes.Compressed.bits must be an integer in 1..16 (or 32: no quantization), "
          f"got {bits!r}.")
    if top_k is not None and (not isinstance(top_k, (int, float)) or isinstance(top_k, bool)
                              or not 0 < top_k <= 1):
      raise UserError(
          f"regimes.Compressed.top_k must be the fraction of entries kept per tensor, in "
          f"(0, 1], got {top_k!r}.")
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise UserError(f"regimes.Compressed.seed must be an integer, got {seed!r}.")
    self.bits, self.top_k, self.seed = bits, top_k, seed
    self._residuals = {}   # id(variable) -> (variable, its residual)
    self._metrics = StepMetrics()

  @property
  def lossless(self) -> bool:
    """bits=32 or top_k=1.0: C is the identity and every residual stays zero."""
    return self.bits == LOSSLESS_BITS or self.top_k == 1.0

  def build_optimizer(self, optimizer, variables):
    optimizer.build(variables)
    if self.lossless:
      return
    for v in variables:
      residual = tf.Variable(
          tf.zeros(v.shape, v.dtype), trainable=False, name="compression_residual",
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
      self._residuals[id(v)] = (v, residual)

  def _residual(self, variable) -> tf.Variable:
    found = self._residuals.get(id(variable))
    if found is None or found[0] is not variable:
      raise RuntimeError(
          f"No compression residual for {getattr(variable, 'path', variable)}: build the "
          "optimizer with engine.build_optimizer under Replicator.scope() first.")
    return found[1]

  def compress(self, values: list, step: tf.Tensor) -> list:
    """C(x) for this replica's tensors values (call in replica context)."""
    if self.lossless:
      return list(values)
    if self.top_k is not None:
      return [top_k_sparsify(x, kept_entries(x.shape.num_elements(), self.top_k))
              for x in values]
    scales = collectives.all_reduce(
        tf.stack([tf.reduce_max(tf.abs(x)) for x in values]), "max")
    base = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
    base = tf.random.experimental.stateless_fold_in(base, collectives.replica_id())
    return [stochastic_quantize(x, scales[i], self.bits,
                                tf.random.experimental.stateless_fold_in(base, i))
            for i, x in enumerate(values)]

  def apply_gradients(self, optimizer, grads, variables):
    pairs = [(tf.convert_to_tensor(g), v) for g, v in zip(grads, variables) if g is not None]
    corrected = [g for g, _ in pairs]
    if self.lossless:
      # No residual (it would stay exactly zero): the arithmetic is then Sync's
      # to the bit. Adding the zeros would not change a value, but Grappler's
      # arithmetic optimizer regroups the sums and moves the result by an ulp.
      compressed = corrected
    else:
      residuals = [self._residual(v) for _, v in pairs]
      corrected = [g + r for g, r in zip(corrected, residuals)]
      compressed = self.compress(corrected, optimizer.iterations)
      for r, x, c in zip(residuals, corrected, compressed):
        r.assign(x - c)
    reduced = collectives.all_reduce(compressed, "sum", kind="gradients")
    aggregation.apply_reduced(optimizer, reduced, [v for _, v in pairs])
    sizes = [x.shape.num_elements() for x in corrected]
    self._metrics.add("regime/bytes_communicated", float(self.wire_bytes(sizes, 0)))
    self._metrics.add("regime/sync_bytes", float(4 * sum(sizes)))

  def wire_bytes(self, sizes, num_replicas):
    """What the compressed format sends for float32 tensors of these sizes (entries):
    b/8 bytes per entry plus a 4-byte scale per tensor (bits), or 8 bytes per kept
    entry (value + index; top_k)."""
    del num_replicas
    if self.top_k is not None:
      return float(sum(8 * kept_entries(n, self.top_k) for n in sizes))
    if self.lossless:
      return float(sum(4 * n for n in sizes))
    return float(sum(math.ceil(n * self.bits / 8) + 4 for n in sizes))

  def step_metrics(self):
    metrics = self._metrics.take()
    if "regime/sync_bytes" in metrics:
      metrics["regime/compression_ratio"] = (
          metrics.pop("regime/sync_bytes") / metrics["regime/bytes_communicated"])
    return metrics

  def setting(self):
    return f"{self.name}({'bits=%d' % self.bits if self.bits is not None else 'top_k=%g' % self.top_k})"

  def hparams(self):
    return {"regime": self.name, "bits": self.bits or 0, "top_k": self.top_k or 0.0}
