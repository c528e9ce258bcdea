"""A TensorFlow profile of chosen training steps: `run --profile_steps=A,B`
(or the binding `Experiment.profile_steps = (A, B)`; the flag is that binding).

Steps are counted from 1, as the run's log counts them: a run trains in calls of
`Experiment.steps_per_call` steps, and call k trains steps (k-1)*spc + 1 .. k*spc.
A profile covers whole calls, every call that trains at least one step of A..B:
tf.profiler.experimental.start before the first of them and stop after the last,
so with steps_per_call = 10, --profile_steps=15,25 traces the calls of steps 11-20
and 21-30. The first call of a session also optimizes the step's graph (and, with
XLA, compiles it): profile later steps to see the steady state.

Where: into the run's TensorBoard directory, as TensorBoard's profile plugin
(tensorboard-plugin-profile, `make install`) reads it: the chief writes
WORKDIR/plugins/profile/<start time>/<host>.xplane.pb (TensorBoard's run '.');
every other worker process of a launched cluster WORKDIR/worker<k>/plugins/...
(run 'worker<k>'), as the processes of one machine share one host name. result.json
records the trace's directory (results.Profile).

What it costs, and how the run's figures leave it out: tracing slows the calls it
covers, so they count in no examples/s (progress.Meter); start and stop (which
writes the trace: seconds) run outside the timed calls and are taken out of the
timed span (time to target), and the record says how long they took. A resumed
session profiles what is left of A..B; one that starts past B writes none.
"""

import os
import time

import tensorflow as tf
from absl import logging

from replibench import cluster, results

PLUGIN_DIR = os.path.join("plugins", "profile")


def logdir(workdir: str) -> str:
  """Where this process writes its profile (see the module docstring)."""
  if not cluster.present() or cluster.current().is_chief:
    return workdir
  return os.path.join(workdir, f"worker{cluster.current().worker_index}")


class StepProfiler:
  """Starts and stops tf.profiler around the calls that train steps first..last."""

  def __init__(self, steps: tuple[int, int] | None, workdir: str, steps_per_call: int):
    self.steps, self.workdir, self.steps_per_call = steps, workdir, steps_per_call
    self.logdir = logdir(workdir)
    self.active, self.traced, self.calls, self.overhead_s = False, None, 0, 0.0
    self.trace_dir = None
    self._before = set()

  def before_call(self, done: int) -> bool:
    """Called with the steps done before a call; True if this call is traced."""
    if self.steps is None:
      return False
    first, last = done + 1, done + self.steps_per_call
    wanted = first <= self.steps[1] and last >= self.steps[0]
    if wanted and not self.active:
      self._start()
    if self.active:
      self.calls += 1
      self.traced = [self.traced[0] if self.traced else first, last]
    return self.active

  def after_call(self, done: int) -> None:
    """Called with the steps done after a call: stops once step B is done."""
    if self.active and done >= self.steps[1]:
      self.stop()

  def _start(self) -> None:
    started = time.monotonic()
    plugin = os.path.join(self.logdir, PLUGIN_DIR)
    self._before = set(os.listdir(plugin)) if os.path.isdir(plugin) else set()
    try:
      tf.profiler.experimental.start(self.logdir)
      self.active = True
    except tf.errors.OpError as e:   # Another profiler runs in this process: train on.
      logging.warning("--profile_steps: the profiler did not start (%s); no profile.", e)
      self.steps = None
    self.overhead_s += time.monotonic() - started

  def stop(self) -> None:
    """Stops and writes the trace (also when the run ends early); a no-op if not tracing."""
    if not self.active:
      return
    started = time.monotonic()
    self.active = False
    tf.profiler.experimental.stop()
    plugin = os.path.join(self.logdir, PLUGIN_DIR)
    new = sorted(set(os.listdir(plugin)) - self._before) if os.path.isdir(plugin) else []
    self.trace_dir = os.path.join(plugin, new[-1]) if new else None
    self.overhead_s += time.monotonic() - started
    logging.info("Profiled steps %d-%d (%d call(s)) into %s (start and stop %.1f s, left "
                 "out of the timed span).", *self.traced, self.calls, self.trace_dir,
                 self.overhead_s)

  def record(self) -> results.Profile | None:
    """result.json's profile record (None: no profile asked for)."""
    if self.steps is None:
      return None
    relative = lambda p: os.path.relpath(p, self.workdir) if p else None  # noqa: E731
    return results.Profile(
        steps=list(self.steps), traced_steps=self.traced, calls=self.calls,
        logdir=relative(self.logdir), trace_dir=relative(self.trace_dir),
        overhead_s=round(self.overhead_s, 3))


def xplane_files(directory: str) -> list[str]:
  """The .xplane.pb files under directory (a workdir, logdir or trace directory)."""
  found = []
  for root, _, files in os.walk(directory):
    found += [os.path.join(root, f) for f in files if f.endswith(".xplane.pb")]
  return sorted(found)
