"""Where a profiled step's time goes: compute, exchange and waiting, from the trace
`run/launch --profile_steps=A,B` writes (harness/profiling.py).

The trace is read by the converter TensorFlow ships for TensorBoard's profile plugin
(its Trace Viewer tool, `trace_viewer@`: Chrome trace-event JSON, one event per traced
op on the thread that ran it), not by walking the protobuf by hand. Each traced call
is the `train` marker on the Python thread (profiling.StepProfiler.step); within its
wall span [start, end]:

- exchange: time covered by an op that moves data between replicas: the collectives
  (CollectiveReduceV2, CollectiveGatherV2, NcclAllReduce, ...: an asynchronous kernel
  counts from its start to its completion, so a collective waiting on its peer counts
  in full), and the sends between devices (_Send whose rendezvous key names two
  devices: how logical replicas in one process hand their gradients to the reducing
  device, tf.distribute.ReductionToOneDevice on a CPU). A _Recv's wait is not
  exchange: it spans the producing device's whole forward and backward pass, so it
  shows as waiting where no other op runs;
- compute: time covered by any other op on any executor thread (tf.data's threads and
  the Python thread left out: the input pipeline runs ahead, the Python thread only
  waits for the call);
- waiting: the rest of the span, covered by no op on any executor thread (dispatch,
  waiting for the input, for a peer that has not sent yet outside a traced op).

Time covered by compute and exchange at once is compute: the exchange there is hidden
behind the backward pass (`regimes.Sync.bucket_bytes`), and it is reported apart as
`exchange_hidden_ms`. So compute + exchange + waiting = the span, and the shares sum
to 1. Times are in ms a traced step (a call's figures over its steps_per_call).
"""

import collections
import dataclasses
import json
import os

from replibench.harness import profiling

# Ops that exchange data between replicas (their type, as the trace names it).
COLLECTIVE_TYPES = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveReduceScatterV2", "CollectiveAssignGroupV2", "NcclAllReduce", "NcclReduce",
    "NcclBroadcast", "_NcclReduceSend", "_NcclReduceRecv", "_NcclBroadcastSend",
    "_NcclBroadcastRecv"})
TRANSFER_TYPES = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv"})
# Threads whose ops are not the step's executors (thread-name prefixes).
NOT_EXECUTORS = ("python", "tf_data")
STEP_MARKER = "train"   # profiling.StepProfiler.step's tf.profiler Trace name.


@dataclasses.dataclass
class CallSplit:
  """One traced call, in ms a step (a call trains steps_per_call steps)."""
  step_num: int
  wall_ms: float
  compute_ms: float
  exchange_ms: float
  wait_ms: float
  exchange_hidden_ms: float   # Exchange under compute (counted in compute_ms).

  def shares(self) -> dict:
    total = self.wall_ms or 1.0
    return {k: getattr(self, f"{k}_ms") / total for k in ("compute", "exchange", "wait")}


def trace_events(xplane_paths: list[str]) -> dict:
  """The trace's events as Trace Viewer gets them ({'traceEvents': [...], ...}), every
  one: ValueError if the converter thinned them out (it may, by visibility at a
  resolution, for a browser; unasked, it returns all)."""
  from replibench import internals  # pylint: disable=import-outside-toplevel
  trace = json.loads(internals.profile_tool_data(xplane_paths, "trace_viewer@"))
  if trace.get("filteredByVisibility"):
    raise ValueError(f"the trace viewer converter left events out of {xplane_paths}: "
                     f"a split of what remains would be wrong")
  return trace


def split_trace(trace: dict, steps_per_call: int = 1) -> list[CallSplit]:
  """Each traced call of one process's trace (trace_events) split as the module
  docstring says; [] if the trace has no step markers."""
  events = trace.get("traceEvents", [])
  frames = trace.get("stackFrames", {})
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  spans = [e for e in events if e.get("ph") == "X"]
  calls = sorted((e for e in spans if e["name"] == STEP_MARKER and "step_num" in e.get("args", {})),
                 key=lambda e: e["ts"])
  executor = [e for e in spans
              if not threads.get((e["pid"], e["tid"]), "").startswith(NOT_EXECUTORS)]
  exchange, compute = _op_intervals(executor, frames)
  out = []
  for call in calls:
    start, end = call["ts"], call["ts"] + call["dur"]
    ex = _clip(exchange, start, end)
    co = _clip(compute, start, end)
    compute_us, exchange_all_us = _measure(co), _measure(ex)
    both_us = _measure(co + ex)
    exchange_us = both_us - compute_us          # Exchange not under compute.
    per = steps_per_call * 1e3
    out.append(CallSplit(
        step_num=int(call["args"]["step_num"]), wall_ms=call["dur"] / per,
        compute_ms=compute_us / per, exchange_ms=exchange_us / per,
        wait_ms=max(call["dur"] - both_us, 0.0) / per,
        exchange_hidden_ms=(exchange_all_us - exchange_us) / per))
  return out


def _op_intervals(events: list[dict], frames: dict) -> tuple[list, list]:
  """(exchange, compute) intervals [start, end) in µs of the executor threads' ops."""
  exchange, compute = [], []
  starts = collections.defaultdict(list)   # An asynchronous kernel's start, by its node.
  for e in sorted(events, key=lambda e: e["ts"]):
    args, end = e.get("args", {}), e["ts"] + e["dur"]
    if e["name"].startswith("ExecutorState::ProcessAsync::"):
      kind = args.get("kernel_type", "")
      if kind in COLLECTIVE_TYPES:
        if e["name"].endswith("::Start"):
          starts[args.get("name")].append(e["ts"])
        elif starts[args.get("name")]:
          exchange.append((starts[args.get("name")].pop(0), end))
      continue
    if not _is_op(e, frames):
      continue
    if e["name"] in COLLECTIVE_TYPES or (
        e["name"] in TRANSFER_TYPES and _between_devices(args.get("key", ""))):
      exchange.append((e["ts"], end))
    else:
      compute.append((e["ts"], end))
  return exchange, compute


def _is_op(event: dict, frames: dict) -> bool:
  """Whether a trace event is a TensorFlow op (its full name 'node:Type' is kept as the
  event's stack frame or long_name; the executor's own bookkeeping has neither)."""
  if "long_name" in event.get("args", {}):
    return True
  frame = frames.get(str(event.get("sf"))) if "sf" in event else None
  return bool(frame) and frame.get("name", "").endswith(":" + event["name"])


def _between_devices(key: str) -> bool:
  """Whether a rendezvous joins two devices (its key: 'src;incarnation;dst;edge;frame')."""
  parts = key.split(";")
  return len(parts) >= 3 and parts[0] != parts[2]


def _clip(intervals: list, start: float, end: float) -> list:
  return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


def _measure(intervals: list) -> float:
  """The length of the union of intervals."""
  total, reach = 0.0, float("-inf")
  for a, b in sorted(intervals):
    if b > reach:
      total += b - max(a, reach)
      reach = b
  return total


def summary(calls: list[CallSplit]) -> dict:
  """Mean over the traced calls, in ms a step, with shares of the wall span."""
  if not calls:
    return {}
  n = len(calls)
  mean = {k: sum(getattr(c, k) for c in calls) / n
          for k in ("wall_ms", "compute_ms", "exchange_ms", "wait_ms", "exchange_hidden_ms")}
  total = mean["wall_ms"] or 1.0
  return {**mean, "calls": n, "compute_share": mean["compute_ms"] / total,
          "exchange_share": mean["exchange_ms"] / total, "wait_share": mean["wait_ms"] / total}


def process_traces(run_dir: str) -> dict[str, tuple[list[str], int]]:
  """{'chief' | 'worker<k>': (the newest trace's .xplane.pb files, steps a call)} of a
  `run`/`launch` workdir with --profile_steps (profiling.logdir's layout)."""
  spc = 1
  record = {}
  path = os.path.join(run_dir, "result.json")
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f).get("profile") or {}
  if record.get("traced_steps") and record.get("calls"):
    first, last = record["traced_steps"]
    spc = max((last - first + 1) // record["calls"], 1)
  found = {}
  for name in ["chief", *sorted(d for d in os.listdir(run_dir) if d.startswith("worker")
                                and os.path.isdir(os.path.join(run_dir, d)))]:
    plugin = os.path.join(run_dir if name == "chief" else os.path.join(run_dir, name),
                          profiling.PLUGIN_DIR)
    if not os.path.isdir(plugin):
      continue
    newest = max(os.listdir(plugin), default=None)
    files = profiling.xplane_files(os.path.join(plugin, newest)) if newest else []
    if files:
      found[name] = (files, spc)
  return found


def split_run(run_dir: str) -> dict[str, list[CallSplit]]:
  """Every profiled process of a run: {process: its traced calls' splits}."""
  return {name: split_trace(trace_events(files), spc)
          for name, (files, spc) in process_traces(run_dir).items()}


def format_table(splits: dict[str, list[CallSplit]]) -> str:
  """A markdown table per process: each traced call and their mean."""
  lines = []
  for name, calls in splits.items():
    lines += [f"### {name}", "", "| call (last step) | step ms | compute ms | exchange ms | "
              "wait ms | exchange hidden ms | compute | exchange | wait |",
              "|---|---|---|---|---|---|---|---|---|"]
    rows = [(str(c.step_num), dataclasses.asdict(c), c.shares()) for c in calls]
    mean = summary(calls)
    if mean:
      rows.append(("mean", mean, {k: mean[f"{k}_share"] for k in ("compute", "exchange",
                                                                   "wait")}))
    for label, ms, share in rows:
      lines.append(f"| {label} | {ms['wall_ms']:.2f} | {ms['compute_ms']:.2f} | "
                   f"{ms['exchange_ms']:.2f} | {ms['wait_ms']:.2f} | "
                   f"{ms['exchange_hidden_ms']:.2f} | {share['compute']:.1%} | "
                   f"{share['exchange']:.1%} | {share['wait']:.1%} |")
    lines.append("")
  return "\n".join(lines)
