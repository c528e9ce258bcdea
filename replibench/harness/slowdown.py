"""Experiment.inject_slowdown: extra work after each training call, on the step's cores.

The regression tracker's own test of its power (results/tracking/README.md). A
slowdown of s removes s of examples/s: every call of t seconds is followed by
t * s / (1 - s) seconds of extra work, so a call and its work take t / (1 - s).

The work is compute, not a sleep. A sleep leaves the cores idle, and the next call
starts on cold cores and caches and its thread pool's workers parked: measured on a
2-core VM, a sleep of 1/9 of each call (asked: -10%) cost 13-16% of examples/s. The
work here is float32 matmuls (256 x 256) run by TensorFlow's own intra-op pool, the threads and
cores the training step uses, so the machine stays as busy as a step that grew by
that much. The work owed is carried from call to call (a debt), so the slowdown over
a run is exact to one matmul, however short the calls.
"""

import time

import tensorflow as tf

# A 256 x 256 matmul: 34 MFLOP, ~0.3-0.5 ms on 2 cores: big enough that TensorFlow
# splits it over its intra-op threads (every core the step uses), small enough that
# a 20 ms call's 10% is several of them (and the debt carries the remainder).
_SIZE = 256


class _Work:
  """The matrix the work multiplies, and the seconds of work still owed."""

  def __init__(self):
    self.matrix = None
    self.debt_s = 0.0

  def burn(self, seconds: float) -> float:
    """Runs matmuls until `seconds` (plus what earlier calls left owing) have passed;
    returns the seconds it ran."""
    if self.matrix is None:
      self.matrix = tf.random.stateless_uniform((_SIZE, _SIZE), seed=(0, 0)) / _SIZE
    self.debt_s += seconds
    if self.debt_s <= 0:   # Paid ahead by the last call's last matmul.
      return 0.0
    start = time.monotonic()
    while time.monotonic() - start < self.debt_s:
      # The same product each time (no chain whose values could shrink into denormals);
      # .numpy() waits for it where ops run asynchronously.
      tf.linalg.matmul(self.matrix, self.matrix).numpy()
    ran = time.monotonic() - start
    self.debt_s -= ran
    return ran


_WORK = _Work()


def owed_seconds(call_s: float, fraction: float) -> float:
  """Seconds of work after a call of call_s seconds that remove `fraction` of its rate:
  call_s / (call_s + w) = 1 - fraction."""
  if not 0 <= fraction < 1:
    raise ValueError(f"slowdown fraction {fraction!r} not in [0, 1)")
  return call_s * fraction / (1 - fraction)


def add_work(call_s: float, fraction: float) -> float:
  """The extra work after one training call of call_s seconds; returns its seconds."""
  return _WORK.burn(owed_seconds(call_s, fraction))
