"""The timed span of a run: seconds since run_start, less what the rules leave out.

    span = TimedSpan(base=seconds_from_earlier_sessions)
    span()                       # timed seconds so far (every session together)
    with span.untimed():         # e.g. an RL evaluation: the clock stops
      play_episodes()            # span() inside reads the value at the pause

MLPerf Training times evaluation for supervised benchmarks (ResNet, the GAN's
FID here) but not for reinforcement learning, whose evaluation games are
played apart from training and are not part of time to train (MiniGo). A
workload says which it is (Workload.timed_evaluation); the harness wraps each
evaluation in untimed() where it is not timed. What a span leaves out is kept
out for good: the harness saves span() in every checkpoint and a resumed
session starts a new span from it.
"""

import contextlib
import time
from typing import Callable


class TimedSpan:
  """Timed seconds (float) of a run, starting at base; clock: seconds, monotonic."""

  def __init__(self, base: float = 0.0, clock: Callable[[], float] = time.monotonic):
    self.base, self.clock = base, clock
    self.start = clock()
    self.untimed_s = 0.0          # Seconds left out this session (closed pauses).
    self._paused_at = None        # clock() when the pause in progress began.

  def __call__(self) -> float:
    now = self._paused_at if self._paused_at is not None else self.clock()
    return self.base + now - self.start - self.untimed_s

  @contextlib.contextmanager
  def untimed(self):
    """Stops the clock for the block (nested blocks count once)."""
    if self._paused_at is not None:
      yield
      return
    self._paused_at = self.clock()
    try:
      yield
    finally:
      self.untimed_s += self.clock() - self._paused_at
      self._paused_at = None
