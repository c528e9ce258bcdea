"""The timed span of a run: seconds since run_start, less what the rules leave out.

    span = TimedSpan(base=seconds_from_earlier_sessions)
    span()                       # timed seconds so far (every session together)
    with span.untimed():         # e.g. an RL evaluation: the clock stops
      play_episodes()            # span() inside reads the value at the pause

MLPerf Training times evaluation for supervised benchmarks (ResNet, the GAN's
FID here) but not for reinforcement learning, whose evaluation games are
played apart from training and are not part of time to train (MiniGo). A
workload says which it is (Workload.timed_evaluation); the harness wraps each
evaluation in untimed() where it is not timed. XLA's compilation of a compiled step,
which happens in a session's first training call, is left out too, once measured
(XlaCompilation: init's work, as the step's tracing is). What a span leaves out is
kept out for good: the harness saves span() in every checkpoint and a resumed
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

  def leave_out(self, seconds: float) -> None:
    """Takes seconds already spent (and measured apart) out of the span."""
    self.untimed_s += max(0.0, seconds)


class XlaCompilation:
  """XLA's compilation, measured and left out of the timed span.

  XLA compiles each piece of a compiled step (engine/compilation.py) on its first run:
  inside a session's first training call, which the span would otherwise time (the
  harness traces the step in init, but XLA offers no compilation short of running it).
  The harness counts tracing in init (before MLPerf's run_start); XLA's compilation is
  the rest of building the step, and is left out alike. The session's second
  call runs the same program, compiled: once it has, the first call's excess over it
  is XLA's compilation, left out of the span (TimedSpan.leave_out) and kept in
  `seconds` (result.json xla_compile_s). A call the profiler traced is not a fair
  second (tracing slows it): the next untraced one is taken. Graph-mode runs
  (enabled False) are unchanged, and a session of one call keeps its compilation in.
  """

  def __init__(self, enabled: bool):
    self.enabled = enabled
    self.first_call_s: float | None = None
    self.seconds: float | None = None   # Left out of the span; None until measured.

  def call_ended(self, seconds: float, span: TimedSpan, traced: bool = False) -> None:
    """After each training call of the session: seconds it took (host wall time)."""
    if not self.enabled or self.seconds is not None:
      return
    if self.first_call_s is None:
      self.first_call_s = seconds
    elif not traced:
      self.seconds = max(0.0, self.first_call_s - seconds)
      span.leave_out(self.seconds)
