"""The simple gradient noise scale, B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018).

Sigma is the per-example gradient covariance and G the true gradient. A batch of
size b gives an unbiased estimate G_b with E|G_b|^2 = |G|^2 + tr(Sigma) / b, so two
batch sizes give both unknowns (their appendix A.1). Synchronous data parallelism
has two for free: each replica's own gradient (the mean over its per-replica batch
b = B / N) and the all-reduced one (the mean over the global batch B). Recording
them costs two sums of squares a step and no extra collective beyond the
replica-mean the step's outputs already take.

The harness averages |G_b|^2 and |G_B|^2 over steps before dividing (the ratio of
noisy estimates is biased and |G|^2's estimate can be negative on one step).
"""

import dataclasses
import math

import tensorflow as tf

SMALL, BIG = "regime/noise_small_sq", "regime/noise_big_sq"


def squared_norm(tensors) -> tf.Tensor:
  """Sum of squares of every entry of tensors (None skipped), float32 scalar."""
  return tf.add_n([tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(t), tf.float32)))
                   for t in tensors if t is not None] or [tf.constant(0.0)])


def step_norms(local_grads: list, reduced_grads: list, num_replicas: int) -> dict:
  """{SMALL: |G_b|^2 of this replica, BIG: |G_B|^2}, for a replicated step.

  local_grads: this replica's gradients of an `average_loss`-scaled loss (1/N of
  its own batch-mean gradient); reduced_grads: their sum over replicas (the
  global-batch mean gradient).
  """
  return {SMALL: float(num_replicas) ** 2 * squared_norm(local_grads),
          BIG: squared_norm(reduced_grads)}


@dataclasses.dataclass(frozen=True)
class NoiseScale:
  """tr(Sigma) (squared gradient units x examples), |G|^2, and B_simple (examples)."""

  trace_sigma: float
  grad_sq: float
  b_simple: float | None   # None where |G|^2's estimate is not positive.


def estimate(small_sq: float, big_sq: float, b_small: float, b_big: float) -> NoiseScale:
  """B_simple from mean |G_b|^2 at batch b_small and mean |G_B|^2 at b_big > b_small."""
  if not 0 < b_small < b_big:
    raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}")
  grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
  trace_sigma = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
  ratio = trace_sigma / grad_sq if grad_sq > 0 and math.isfinite(grad_sq) else None
  return NoiseScale(trace_sigma=trace_sigma, grad_sq=grad_sq, b_simple=ratio)
