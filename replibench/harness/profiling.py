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

import contextlib
import json
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

  def step(self, step_num: int):
    """A traced call's step marker (tf.profiler.experimental.Trace with step_num: the
    profile plugin's overview and step-time graph count steps by it); else nothing."""
    if not self.active:
      return contextlib.nullcontext()
    return tf.profiler.experimental.Trace("train", step_num=step_num, _r=1)

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


def top_ops(xplane_paths: list[str], top: int = 20) -> dict:
  """Where a trace's time went, as TensorBoard's profile plugin tabulates it.

  {'tf_op_types' / 'tf_ops': {'Host'|'Device': [row, ...]}, 'hlo_categories' / 'hlo_ops':
  [row, ...]}; each list the `top` largest by self time (microseconds, summed over the
  trace's calls), with its share of that side's busy time (idle left out). The HLO
  lists are empty where nothing ran compiled by XLA.
  """
  from replibench import internals  # pylint: disable=import-outside-toplevel
  # framework_op_stats holds two tables, with idle time and without: the last.
  rows = _rows(_last_table(internals.profile_tool_data(xplane_paths, "framework_op_stats")))
  out = {"tf_op_types": {}, "tf_ops": {}}
  for side in sorted({r["host_or_device"] for r in rows}):
    mine = [r for r in rows if r["host_or_device"] == side]
    out["tf_ops"][side] = _largest(mine, "operation", "type", top)
    out["tf_op_types"][side] = _largest(mine, "type", None, top)
  try:   # On a CPU, XLA's ops are not traced one by one: no rows.
    hlo = _rows(_last_table(internals.profile_tool_data(xplane_paths, "hlo_stats")))
  except ValueError:   # This TensorFlow has no such tool, or it returned no JSON.
    hlo = []
  out["hlo_ops"] = _largest(hlo, "hlo_op_name", "category", top)
  out["hlo_categories"] = _largest(hlo, "category", None, top)
  return out


def _last_table(data: bytes) -> dict:
  """A tool's JSON DataTable (the last, where it returns several); {} if none."""
  found = json.loads(data) if data.strip() else {}
  return (found[-1] if found else {}) if isinstance(found, list) else found


def _rows(table: dict) -> list[dict]:
  """A JSON DataTable's rows as {column id: value}."""
  ids = [c["id"] for c in table.get("cols", [])]
  return [{i: (c or {}).get("v") for i, c in zip(ids, row["c"])} for row in table.get("rows", [])]


def _largest(rows: list[dict], key: str, kind: str | None, top: int) -> list[dict]:
  """rows summed by key, largest self time first: [{name, kind, occurrences, self_us,
  share}]."""
  sums = {}
  for r in rows:
    name = r.get(key) or "?"
    entry = sums.setdefault(name, {"name": name, "kind": r.get(kind) if kind else None,
                                   "occurrences": 0, "self_us": 0.0})
    entry["occurrences"] += int(r.get("occurrences") or 0)
    entry["self_us"] += float(r.get("total_self_time") or 0.0)
  total = sum(e["self_us"] for e in sums.values()) or 1.0
  ranked = sorted(sums.values(), key=lambda e: -e["self_us"])[:top]
  return [{**e, "self_us": round(e["self_us"], 1), "share": round(e["self_us"] / total, 4)}
          for e in ranked]


def format_top_ops(found: dict, calls: int = 1) -> str:
  """top_ops' lists as markdown tables (times per traced call, in ms)."""
  lines = []
  sections = [(f"TensorFlow op types, {side}", found["tf_op_types"][side])
              for side in found["tf_op_types"]]
  sections += [(f"TensorFlow ops, {side}", found["tf_ops"][side]) for side in found["tf_ops"]]
  sections += [("XLA (HLO) op categories", found["hlo_categories"]),
               ("XLA (HLO) ops", found["hlo_ops"])]
  for title, rows in sections:
    if not rows:
      continue
    lines += [f"### {title}", "", "| # | name | kind | count | self ms a call | share |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {i} | `{_tail(r['name'])}` | {r['kind'] or ''} | {r['occurrences']} | "
              f"{r['self_us'] / 1e3 / max(calls, 1):,.2f} | {r['share']:.1%} |"
              for i, r in enumerate(rows, 1)]
    lines.append("")
  return "\n".join(lines)


def _tail(name: str, width: int = 90) -> str:
  """An op's name cut to its last characters (the layer and op; the scopes lead)."""
  return name if len(name) <= width else "..." + name[-(width - 3):]
