"""Progress lines for long runs: step, loss, examples/s, latest eval, ETA."""

import collections


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Meter:
  """Counts training steps and their host time; formats progress lines.

  Throughput leaves out each session's first training call, which also builds
  the executor and optimizes the graph (seconds for a GAN step): it is reported
  apart as first_call_s, and still counts in the timed span (but for XLA's compilation,
  which the harness leaves out: timed_span.XlaCompilation). It leaves out the
  calls the profiler traced too (harness/profiling.py: tracing slows them).

  The calls after the first are also summed in windows of window_steps steps:
  windows holds [steps, wall seconds, process CPU seconds] per finished window, in
  order (result.json `windows`), so a throughput probe can leave out the warm-up and
  see the spread within a process (replibench/tracking/probe.py).
  """

  def __init__(self, start_step: int, limit: int, global_batch_size: int, window: int = 20,
               window_steps: int = 100):
    self.start_step, self.limit, self.batch = start_step, limit, global_batch_size
    self.steps, self.train_s = 0, 0.0      # Over the calls after the first.
    self.first_call_s = None
    self.recent = collections.deque(maxlen=window)   # (steps, seconds) per call
    self.last_eval = None
    self.window_steps = max(1, window_steps)
    self.windows: list[list] = []
    self._open = [0, 0.0, 0.0]             # The window being summed.

  def trained(self, steps: int, seconds: float, cpu_s: float = 0.0,
              traced: bool = False) -> None:
    self.recent.append((steps, seconds))
    if self.first_call_s is None:
      self.first_call_s = seconds
      return
    if traced:
      return
    self.steps += steps
    self.train_s += seconds
    self._open = [self._open[0] + steps, self._open[1] + seconds, self._open[2] + cpu_s]
    if self._open[0] >= self.window_steps:
      self.windows.append([self._open[0], round(self._open[1], 6), round(self._open[2], 6)])
      self._open = [0, 0.0, 0.0]

  def evaluated(self, step: int, value: float) -> None:
    self.last_eval = (step, value)

  def examples_per_s(self) -> float | None:
    """Training throughput this session (host time of the training calls after the
    first; None if there was only one)."""
    return round(self.steps * self.batch / self.train_s, 2) if self.train_s else None

  def recent_examples_per_s(self) -> float:
    steps = sum(s for s, _ in self.recent)
    seconds = sum(t for _, t in self.recent)
    return steps * self.batch / seconds if seconds else float("nan")

  def line(self, step: int, values: dict, elapsed: float) -> str:
    done = step - self.start_step
    per_step = elapsed / max(step, 1) if self.start_step == 0 else self.train_s / max(self.steps, 1)
    latest = (f"eval {self.last_eval[1]:.4f} @ {self.last_eval[0]}" if self.last_eval
              else "eval -")
    return (f"step {step}/{self.limit} | loss {values.get('train/loss', float('nan')):.4f} | "
            f"{values['train/examples_per_s']:.0f} ex/s | {latest} | "
            f"elapsed {_duration(elapsed)} | ETA {_duration(per_step * (self.limit - step))}")
