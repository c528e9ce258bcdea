"""Where a slow window's time goes: one training process traced against the machine.

The throughput probe's processes of identical code have windows ~35% slower than
their neighbours, in stretches of several windows, while the process keeps its CPU
share (results/tracking/README.md). This runs `replibench run` processes of one of
ResNet's A/B trials (the probe's bindings: no evaluation or checkpoint inside the
windows) and samples, every --interval seconds while each runs:

  threads    CPU seconds of each of the process's (and its children's) threads,
             grouped by thread name (TensorFlow names its pools: tf_Compute,
             tf_data_..., tf_inter_op...), from /proc/PID/task/*/stat
  machine    /proc/stat: user, system, iowait, steal (another guest on our cores)
  kernel     CPU of kernel threads that compete for the cores (kdamond: DAMON's
             proactive reclaim, kswapd, khugepaged, kcompactd)
  memory     /proc/vmstat: major faults, THP collapses and compaction stalls

Each window (its end time from the run's progress log) then gets the counters' rates
over its span, and the table compares the slowest quarter of windows with the
fastest quarter: a source that moves with the slowdown shows there.

  .venv/bin/python benchmarks/tracking/noise_trace.py --config=replicas=1 --processes=4 \\
      --steps=600 --out=runs/noise_trace

Writes --out/noise_trace.json (every sample and window) and prints the table. Run it
alone on a quiet machine.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import noise_budget  # noqa: E402

from replibench.suite import sweep as sweep_lib  # noqa: E402
from replibench.tracking import probe  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KERNEL_THREADS = ("kdamond", "kswapd", "khugepaged", "kcompactd")
VMSTAT = ("pgmajfault", "thp_collapse_alloc", "compact_stall", "thp_fault_alloc",
          "pgscan_direct")
# glog's prefix of the harness's progress lines (harness/loop.py): time and step.
PROGRESS = re.compile(r"^I\d{4} (\d\d:\d\d:\d\d\.\d+) .*\] step (\d+)/\d+ \|")


def _stat_fields(path: str) -> tuple[str, float] | None:
  """(thread name without its trailing number, CPU seconds) of a /proc stat file."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  name = text[text.index("(") + 1:text.rindex(")")]
  rest = text[text.rindex(")") + 2:].split()
  return re.sub(r"[-_.:/]?\d+$", "", name), (int(rest[11]) + int(rest[12])) / TICK


def _descendants(pid: int) -> list[int]:
  out, frontier = [pid], [pid]
  while frontier:
    parent = frontier.pop()
    try:
      with open(f"/proc/{parent}/task/{parent}/children") as f:
        kids = [int(c) for c in f.read().split()]
    except OSError:
      kids = []
    out += kids
    frontier += kids
  return out


def sample(pid: int) -> dict:
  """One snapshot: cumulative CPU seconds by thread group, machine and kernel threads,
  and the vmstat counters."""
  threads: dict[str, float] = {}
  for p in _descendants(pid):
    for tid in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else ():
      got = _stat_fields(f"/proc/{p}/task/{tid}/stat")
      if got:
        threads[got[0]] = threads.get(got[0], 0.0) + got[1]
  kernel: dict[str, float] = {}
  for p in os.listdir("/proc"):
    if p.isdigit():
      got = _stat_fields(f"/proc/{p}/stat")
      if got and got[0].startswith(KERNEL_THREADS):
        kernel[got[0]] = kernel.get(got[0], 0.0) + got[1]
  with open("/proc/stat") as f:
    cpu = [int(v) / TICK for v in f.readline().split()[1:]]
  with open("/proc/vmstat") as f:
    vm = {k: int(v) for k, v in (line.split() for line in f) if k in VMSTAT}
  machine = {"user": cpu[0] + cpu[1], "system": cpu[2] + cpu[5] + cpu[6], "iowait": cpu[4],
             "steal": cpu[7]}
  return {"t": time.time(), "threads": threads, "kernel": kernel, "machine": machine,
          "vmstat": vm}


def trace_process(trial, directory: str, steps: int, interval: float) -> dict:
  """Runs one process, sampling every `interval` s; returns its samples and windows."""
  os.makedirs(directory, exist_ok=True)
  command = sweep_lib.trial_command(trial, directory) + [f"--max_steps={steps}"]
  samples = []
  with open(os.path.join(directory, "trial.log"), "wb") as log:
    proc = subprocess.Popen(command, cwd=noise_budget.REPO, stdout=log,
                            stderr=subprocess.STDOUT)
    while proc.poll() is None:
      samples.append(sample(proc.pid))
      time.sleep(interval)
  return {"dir": directory, "exit": proc.returncode, "samples": samples,
          "windows": progress_windows(os.path.join(directory, "trial.log"),
                                      samples[0]["t"] if samples else time.time())}


def progress_windows(log_path: str, started: float) -> list[dict]:
  """[{start, end (epoch s), steps}] between consecutive progress lines of the log."""
  day = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).date()
  points = []
  with open(log_path, errors="replace") as f:
    for line in f:
      m = PROGRESS.match(line)
      if m:
        clock = datetime.datetime.strptime(m.group(1), "%H:%M:%S.%f").time()
        stamp = datetime.datetime.combine(day, clock, datetime.timezone.utc).timestamp()
        points.append((stamp, int(m.group(2))))
  return [{"start": a[0], "end": b[0], "steps": b[1] - a[1]}
          for a, b in zip(points, points[1:]) if b[0] > a[0]]


def _flat(s: dict) -> dict[str, float]:
  out = {f"thread {k}": v for k, v in s["threads"].items()}
  out.update({f"kernel {k}": v for k, v in s["kernel"].items()})
  out.update({f"machine {k}": v for k, v in s["machine"].items()})
  out.update({f"vmstat {k}": float(v) for k, v in s["vmstat"].items()})
  return out


def window_rates(process: dict) -> list[dict]:
  """Each window's steps/s and every counter's rate (per s) over the window's span,
  read off the samples nearest its start and end."""
  samples = process["samples"]
  if len(samples) < 2:
    return []
  times = np.array([s["t"] for s in samples])
  rows = []
  for w in process["windows"]:
    i, j = int(np.searchsorted(times, w["start"])), int(np.searchsorted(times, w["end"]))
    i, j = min(i, len(samples) - 1), min(j, len(samples) - 1)
    if j <= i:
      continue
    a, b, span = _flat(samples[i]), _flat(samples[j]), times[j] - times[i]
    row = {k: (b.get(k, 0.0) - a.get(k, 0.0)) / span for k in set(a) | set(b)}
    row["steps_per_s"] = w["steps"] / (w["end"] - w["start"])
    rows.append(row)
  return rows


def table(rows: list[dict], warmup: int) -> list[str]:
  """The slowest and fastest quarters of the steady windows, each counter's mean rate."""
  rows = rows[warmup:]
  if len(rows) < 8:
    return ["(too few windows)"]
  speed = np.array([r["steps_per_s"] for r in rows])
  low, high = np.quantile(speed, [0.25, 0.75])
  slow = [r for r, v in zip(rows, speed) if v <= low]
  fast = [r for r, v in zip(rows, speed) if v >= high]
  keys = sorted({k for r in rows for k in r if k != "steps_per_s"})
  lines = [f"{len(rows)} steady windows; steps/s slowest quarter {np.mean([r['steps_per_s'] for r in slow]):.2f}, "
           f"fastest quarter {np.mean([r['steps_per_s'] for r in fast]):.2f}",
           "| counter (rate per s) | slowest quarter | fastest quarter |", "|---|---|---|"]
  for k in keys:
    s, f = np.mean([r.get(k, 0.0) for r in slow]), np.mean([r.get(k, 0.0) for r in fast])
    if max(abs(s), abs(f)) >= 0.005:
      lines.append(f"| {k} | {s:.3f} | {f:.3f} |")
  return lines


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="replicas=1")
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--processes", type=int, default=4)
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--window_steps", type=int, default=20)
  parser.add_argument("--warmup_windows", type=int, default=2)
  parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
  parser.add_argument("--out", default="runs/noise_trace")
  args = parser.parse_args()
  design = probe.Design(processes=1, steps=args.steps, window_steps=args.window_steps,
                        warmup_windows=args.warmup_windows)
  (trial,) = noise_budget.trials([args.config], args.seed, design)
  processes, rows = [], []
  for i in range(args.processes):
    p = trace_process(trial, os.path.join(args.out, f"p{i}"), args.steps, args.interval)
    processes.append(p)
    got = window_rates(p)
    rows += got[args.warmup_windows:]
    speeds = " ".join(f"{r['steps_per_s']:.1f}" for r in got)
    print(f"p{i}: exit {p['exit']}, {len(p['windows'])} windows, steps/s {speeds}", flush=True)
  lines = table(rows, 0)
  print("\n".join(lines))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "noise_trace.json"), "w") as f:
    json.dump({"args": vars(args), "processes": processes, "table": lines}, f)
  return 0 if all(p["exit"] == 0 for p in processes) else 1


if __name__ == "__main__":
  sys.exit(main())
