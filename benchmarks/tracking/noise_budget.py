"""The noise budget: how the variance of identical code's examples/s splits, and what removes it.

Runs `replibench run` processes of identical code (this checkout) on one suite's
trials (default ResNet's replicas=1, seed 1), each training --steps steps in windows
of --window_steps (Experiment.log_every_steps; no evaluation or checkpoint inside the
windows; result.json `windows`: [steps, wall s, CPU s] each), and splits the variance
of log examples/s into

  within a process    window to window, after the warm-up windows
  between processes   the same command back to back (the processes' median windows)
  run order           first or second process of a back-to-back pair (the gap)
  configuration       between the configurations' means (with --configs=a,b)

Then it tries the sources one at a time: each condition below runs its processes
interleaved with the baseline's (baseline, condition, baseline, condition, ...: the
machine's drift hits both alike), and the table gives each condition's between-process
and paired sd beside the baseline's, for wall-clock examples/s and for examples per
process CPU second. Conditions (--conditions, comma-separated; default all; none: the
split alone):

  threads1     TF_NUM_INTEROP_THREADS=1, TF_NUM_INTRAOP_THREADS=<cores>, OMP_NUM_THREADS=<cores>
  pin          taskset -c 0..cores-1: every core there is, so a no-op, the table's A/A
               control (its ratio to its baseline is chance alone)
  onecore      taskset -c 0 and every TensorFlow/OMP pool one thread: a process that
               cannot spin on a sibling core (half the rate; its spread is what counts)
  onednn_off   TF_ENABLE_ONEDNN_OPTS=0
  norandom     setarch <arch> -R (no address-space randomisation)
  hashseed     PYTHONHASHSEED=0
  glibc        REPLIBENCH_MALLOC=glibc (glibc's malloc defaults, not replibench's)
  jemalloc     LD_PRELOAD=libjemalloc (skipped when not installed)
  tcmalloc     LD_PRELOAD=libtcmalloc (skipped when not installed)
  warmup       one throwaway process before each measured one (is the first slow?)
  together     two `onecore` processes at once, on cores 0 and 1, the pair's sd of
               log(core 0 / core 1) (a design that runs base and head side by side)

The split comes first: --processes baseline processes back to back in pairs, whose
table gives each source's sd and share of the between-process variance. Run it alone
on a quiet machine. Measured so (results/tracking/README.md, "The noise budget";
~40 min on the 2-core Zen 4, ~24 s a process, ~45 s for onecore's), then the
`together` pairs apart (~6 min):

  .venv/bin/python benchmarks/tracking/noise_budget.py --configs=replicas=1 --processes=6 \\
      --steps=300 --window_steps=20 \\
      --conditions=onecore,threads1,pin,norandom,hashseed,glibc,warmup --out=runs/noise_budget
  .venv/bin/python benchmarks/tracking/noise_budget.py --configs=replicas=1 --processes=8 \\
      --split_processes=0 --conditions=together --out=runs/noise_budget_together
  .venv/bin/python benchmarks/tracking/noise_budget.py \\
      --report=runs/noise_budget/noise_budget.json,runs/noise_budget_together/noise_budget.json

The split alone, for another configuration (results/tracking/README.md: workers=2,
12 processes, ~5 min):

  .venv/bin/python benchmarks/tracking/noise_budget.py --configs=workers=2 --processes=12 \\
      --conditions=none --out=runs/noise_budget_w2

A smoke of the bookkeeping (minutes, numbers meaningless on a busy machine):

  .venv/bin/python benchmarks/tracking/noise_budget.py --processes=2 --steps=40 --window_steps=10 \\
      --warmup_windows=1 --conditions=hashseed --out=/tmp/noise_budget_smoke

Writes --out/noise_budget.json (every process's windows, after each process) and
--out/noise_budget.md (the table for results/tracking/README.md); --report=A.json,B.json
writes the tables again from saved runs (several merged, an interrupted one included).
"""

import argparse
import glob
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from replibench import results  # noqa: E402
from replibench.suite import sweep as sweep_lib  # noqa: E402
from replibench.suite import sweep_file  # noqa: E402
from replibench.tracking import probe  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
SWEEP = "configs/resnet/scaling.sweep"
SPLIT = "split"   # the series of back-to-back baseline processes


def _library(name: str) -> str | None:
  found = sorted(glob.glob(f"/usr/lib/*/{name}.so*") + glob.glob(f"/usr/lib/{name}.so*")
                 + glob.glob(f"/usr/local/lib/{name}.so*"))
  return found[0] if found else None


def conditions(cores: int) -> dict[str, tuple[dict, list[str]] | None]:
  """name -> (environment changes, command prefix); None where it cannot run here."""
  jemalloc, tcmalloc = _library("libjemalloc"), _library("libtcmalloc")
  return {
      "baseline": ({}, []),
      "threads1": ({"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": str(cores),
                    "OMP_NUM_THREADS": str(cores)}, []),
      "pin": ({}, ["taskset", "-c", f"0-{cores - 1}"]),
      # One core, one thread everywhere: if the slow spells are TensorFlow's pool threads
      # spinning on each other, they vanish here; if they are the host's other tenants,
      # they stay (results/tracking/README.md, "What a slow window is").
      "onecore": ({"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                   "OMP_NUM_THREADS": "1"}, ["taskset", "-c", "0"]),
      "onednn_off": ({"TF_ENABLE_ONEDNN_OPTS": "0"}, []),
      "norandom": ({}, ["setarch", platform.machine(), "-R"]),
      "hashseed": ({"PYTHONHASHSEED": "0"}, []),
      "glibc": ({"REPLIBENCH_MALLOC": "glibc"}, []),
      "jemalloc": ({"LD_PRELOAD": jemalloc}, []) if jemalloc else None,
      "tcmalloc": ({"LD_PRELOAD": tcmalloc}, []) if tcmalloc else None,
      "warmup": ({}, []),   # the baseline's command, after a throwaway process
      "together": ({}, []) if cores >= 2 else None,   # run_together
  }


def trials(configs: list[str], seed: int, design: probe.Design) -> list:
  sweep = sweep_file.load(os.path.join(REPO, SWEEP))
  found = {t.config: t for t in sweep_file.expand(sweep, seeds=(seed,),
                                                  extra_bindings=design.bindings())}
  missing = [c for c in configs if c not in found]
  if missing:
    raise SystemExit(f"--configs: {missing} not in {SWEEP} (it has {sorted(found)})")
  return [found[c] for c in configs]


def _start(trial, directory: str, steps: int, condition: tuple[dict, list[str]]):
  env_changes, prefix = condition
  os.makedirs(directory, exist_ok=True)
  command = prefix + sweep_lib.trial_command(trial, directory) + [f"--max_steps={steps}"]
  with open(os.path.join(directory, "trial.log"), "ab") as log:
    proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, **env_changes}, stdout=log,
                            stderr=subprocess.STDOUT)
  return proc, directory, time.monotonic()


def _finish(started) -> dict:
  """A started process, waited for: its result's windows, examples/s and wall seconds."""
  proc, directory, start = started
  code = proc.wait()
  result = results.read(directory) if code == 0 else None
  return {"dir": directory, "exit": code, "seconds": round(time.monotonic() - start, 2),
          "windows": result.windows if result else [],
          "batch": result.global_batch_size if result else 0,
          "examples_per_s": result.examples_per_s if result else None}


def run_process(trial, directory: str, steps: int, condition: tuple[dict, list[str]]) -> dict:
  """One process: its result's windows, examples/s and the wall seconds it took."""
  return _finish(_start(trial, directory, steps, condition))


def run_together(trial, directory: str, steps: int) -> list[dict]:
  """Two one-core processes at once, on cores 0 and 1 (the `together` condition): does
  a slow spell hit both cores at once (the pair's ratio cancels it) or one at a time?"""
  env = conditions(2)["onecore"][0]
  started = [_start(trial, os.path.join(directory, f"core{c}"), steps,
                    (env, ["taskset", "-c", str(c)])) for c in (0, 1)]
  return [_finish(s) for s in started]


def _log_rates(process: dict, warmup: int, cpu: bool = False) -> np.ndarray:
  w = probe.steady(process["windows"], warmup)
  if w.shape[0] == 0:
    return np.zeros(0)
  return np.log(w[:, 0] * process["batch"] / (w[:, 2] if cpu else w[:, 1]))


def split(processes: list[dict], warmup: int, cpu: bool = False) -> dict:
  """The variance components of one series of back-to-back processes of one command
  (pairs: processes 0-1, 2-3, ...). sd in log units."""
  rates = [_log_rates(p, warmup, cpu) for p in processes]
  rates = [r for r in rates if r.size >= 2]
  if len(rates) < 2:
    return {"processes": len(rates)}
  medians = np.array([np.median(r) for r in rates])
  best = np.array([r.max() for r in rates])   # the probe's judged estimator (probe.JUDGED)
  within = float(np.sqrt(np.mean([r.var(ddof=1) for r in rates])))
  pairs = medians[: len(medians) // 2 * 2].reshape(-1, 2)
  gaps = pairs[:, 1] - pairs[:, 0]
  out = {"processes": len(rates), "within_sd": within,
         "between_sd": float(medians.std(ddof=1)),
         "best_between_sd": float(best.std(ddof=1)),
         "paired_sd": float(gaps.std(ddof=1)) if len(gaps) >= 2 else None,
         "order_gap": float(gaps.mean()) if len(gaps) else None,
         "warmup_gap": float(np.mean([np.median(_log_rates(p, 0, cpu)[:warmup]) - np.median(r)
                                      for p, r in zip(processes, rates)]))
         if warmup else None}
  return out


def _save(args, series: dict) -> None:
  """Written after every process, so an interrupted budget keeps what it measured."""
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "noise_budget.json"), "w") as f:
    json.dump({"args": vars(args), "series": {"/".join(k): v for k, v in series.items()}},
              f, indent=1)


def run_pairs_together(trial, args, series: dict) -> None:
  for i in range(args.processes):
    ps = run_together(trial, os.path.join(args.out, trial.config, "together", f"p{i}"),
                      args.steps)
    for core, p in enumerate(ps):
      series.setdefault((trial.config, "together", f"core{core}"), []).append(p)
    _save(args, series)
    print(f"{trial.config} together p{i}: exit {[p['exit'] for p in ps]}, "
          f"{[round(p['examples_per_s'] or 0) for p in ps]} ex/s", flush=True)


def wanted_conditions(flag: str | None, available: dict) -> list[str]:
  """--conditions: a comma-separated list, 'none' for the split alone, unset for all."""
  if flag is None:
    return [c for c in available if c != "baseline"]
  wanted = [] if flag == "none" else [c for c in flag.split(",") if c]
  unknown = [c for c in wanted if c not in available]
  if unknown or not (wanted or flag == "none"):
    raise SystemExit(f"--conditions: unknown {unknown or repr(flag)}; choose from "
                     f"{sorted(available)}, or 'none' for the split alone")
  return wanted


def run(args) -> dict:
  cores = os.cpu_count() or 1
  design = probe.Design(processes=2, steps=args.steps, window_steps=args.window_steps,
                        warmup_windows=args.warmup_windows)
  available = conditions(cores)
  wanted = wanted_conditions(args.conditions, available)
  series: dict = {}
  for trial in trials(args.configs.split(","), args.seed, design):
    # The split: baseline processes back to back, in pairs (0-1, 2-3, ...).
    split_processes = args.processes if args.split_processes is None else args.split_processes
    for i in range(2 * (split_processes // 2)):
      p = run_process(trial, os.path.join(args.out, trial.config, "split", f"p{i}"),
                      args.steps, available["baseline"])
      series.setdefault((trial.config, SPLIT, "baseline"), []).append(p)
      _save(args, series)
      print(f"{trial.config} split p{i}: exit {p['exit']}, {p['examples_per_s'] or 0:,.0f} "
            f"ex/s, {p['seconds']:.0f} s", flush=True)
    for name in wanted:
      if available[name] is None:
        print(f"{name}: skipped (not installed here)", flush=True)
        continue
      if name == "together":
        run_pairs_together(trial, args, series)
        continue
      for i in range(args.processes):
        for cond in ("baseline", name):   # interleaved: drift hits both alike
          directory = os.path.join(args.out, trial.config, name, cond, f"p{i}")
          if cond == "warmup":
            run_process(trial, directory + "-throwaway", args.steps, available["baseline"])
          spec = available["baseline" if cond == "warmup" else cond]
          p = run_process(trial, directory, args.steps, spec)
          series.setdefault((trial.config, name, cond), []).append(p)
          _save(args, series)
          print(f"{trial.config} {name}/{cond} p{i}: exit {p['exit']}, "
                f"{p['examples_per_s'] or 0:,.0f} ex/s, {p['seconds']:.0f} s", flush=True)
  return {"/".join(k): v for k, v in series.items()}


def budget(series: dict, warmup: int, steady_windows: int) -> list[str]:
  """The split of one configuration's back-to-back baseline processes: each source's
  sd and its share of the between-process variance of a process's median window."""
  fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
  lines = ["| config | metric | source | sd (log) | share of the between-process variance |",
           "|---|---|---|---|---|"]
  for key in sorted(k for k in series if k.split("/")[1] == SPLIT):
    config = key.split("/")[0]
    for cpu in (False, True):
      x = split(series[key], warmup, cpu)
      total = (x.get("between_sd") or 0) ** 2
      if not total:
        continue
      metric = "CPU examples/s" if cpu else "wall examples/s"
      # A median of k windows carries ~pi/2 x within^2 / k of the window-to-window noise.
      within = math.pi / 2 * x["within_sd"] ** 2 / max(steady_windows, 1)
      order = (x["order_gap"] / 2) ** 2 if x.get("order_gap") is not None else 0.0
      rest = max(total - within - order, 0.0)
      rows = (("between processes (all)", x["between_sd"], 1.0),
              ("between processes, the fastest window (the probe's `best`)",
               x["best_between_sd"], None),
              ("window to window, carried into the median", math.sqrt(within), within / total),
              ("run order (half the second-minus-first gap)", math.sqrt(order), order / total),
              ("process to process (the rest)", math.sqrt(rest), rest / total),
              ("first windows against the steady ones (warm-up gap)", x.get("warmup_gap"),
               None))
      lines += [f"| {config} | {metric} | {name} | {fmt(sd)} | "
                f"{'-' if share is None else f'{share:.0%}'} |" for name, sd, share in rows]
  return lines


def tail_lines(series: dict, warmup: int, slow: float = 0.07) -> list[str]:
  """Every baseline process of a configuration (the split's and each condition's), its
  fastest window against their median: the robust sd (1.4826 x the median absolute
  deviation), the plain sd, and the processes the machine slowed for their whole run
  (fastest window more than `slow` below the median)."""
  lines = []
  for config in sorted({k.split("/")[0] for k in series}):
    best = np.array([_log_rates(p, warmup).max() for k, v in series.items()
                     if k.startswith(config + "/") and k.endswith("/baseline") for p in v
                     if _log_rates(p, warmup).size])
    if best.size < 3:
      continue
    dev = best - np.median(best)
    slowed = np.exp(dev[dev < math.log(1 - slow)])
    lines.append(f"\n{config}, every baseline process ({best.size}): fastest window's robust "
                 f"sd {1.4826 * np.median(np.abs(dev)):.4f}, sd {best.std(ddof=1):.4f}; "
                 f"{slowed.size} slowed > {slow:.0%} for their whole run "
                 f"({', '.join(f'{x:.2f}x' for x in sorted(slowed)) or 'none'})")
  return lines


def together_lines(series: dict, warmup: int) -> list[str]:
  """The `together` pairs: sd of log(core 0 / core 1) per estimator, and how the two
  processes' windows co-move (their correlation, window by window, a pair at a time)."""
  lines = [""]
  for key in sorted(k for k in series if k.endswith("/together/core0")):
    config = key.split("/")[0]
    pairs = [(_log_rates(a, warmup), _log_rates(b, warmup))
             for a, b in zip(series[key], series[f"{config}/together/core1"])]
    pairs = [(a, b) for a, b in pairs if a.size >= 2 and b.size >= 2]
    if len(pairs) < 2:
      continue
    for name, f in (("median", np.median), ("best", np.max)):
      gaps = np.array([f(a) - f(b) for a, b in pairs])
      lines.append(f"{config} together ({len(pairs)} pairs, one core each, at once): "
                   f"paired sd of {name} {gaps.std(ddof=1):.4f}, core 0 / core 1 "
                   f"{math.exp(gaps.mean()):.3f}")
    n = [min(a.size, b.size) for a, b in pairs]
    corr = [float(np.corrcoef(a[:k], b[:k])[0, 1]) for (a, b), k in zip(pairs, n)]
    within = math.sqrt(np.mean([x.var(ddof=1) for pair in pairs for x in pair]))
    lines.append(f"{config} together: within sd {within:.4f}; window-by-window correlation "
                 f"of the two cores' examples/s, median over pairs {np.median(corr):+.2f} "
                 f"(range {min(corr):+.2f} to {max(corr):+.2f})")
  return lines if len(lines) > 1 else []


def table(series: dict, warmup: int) -> list[str]:
  fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
  lines = ["| config | condition | metric | processes | within sd | between sd | paired sd "
           "| order gap | first windows' gap | between sd vs its baseline | between sd: best |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for key in sorted(series):
    config, name, cond = key.split("/")
    if cond == "baseline" or name in (SPLIT, "together"):
      continue
    for cpu in (False, True):
      s = split(series[key], warmup, cpu)
      b = split(series[f"{config}/{name}/baseline"], warmup, cpu)
      ratio = (f"{(s['between_sd'] / b['between_sd']) ** 2:.2f} of the variance"
               if s.get("between_sd") and b.get("between_sd") else "-")
      for label, x in (("baseline", b), (cond, s)):
        lines.append(f"| {config} | {name}: {label} | {'CPU' if cpu else 'wall'} examples/s | "
                     f"{x.get('processes', 0)} | {fmt(x.get('within_sd'))} | "
                     f"{fmt(x.get('between_sd'))} | {fmt(x.get('paired_sd'))} | "
                     f"{fmt(x.get('order_gap'))} | {fmt(x.get('warmup_gap'))} | "
                     f"{ratio if label != 'baseline' else ''} | "
                     f"{fmt(x.get('best_between_sd'))} |")
  lines += tail_lines(series, warmup) + together_lines(series, warmup)
  configs = sorted({k.split("/")[0] for k in series})
  if len(configs) > 1:
    means = [np.mean([np.median(_log_rates(p, warmup)) for k, v in series.items()
                      if k.startswith(c + "/") for p in v if _log_rates(p, warmup).size])
             for c in configs]
    lines.append(f"\nbetween configurations ({', '.join(configs)}): sd of their mean log "
                 f"examples/s {np.std(means, ddof=1):.4f}")
  return lines


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--configs", default="replicas=1")
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--processes", type=int, default=8, help="per condition and its baseline")
  parser.add_argument("--split_processes", type=int, default=None,
                      help="back-to-back baseline processes of the split (default "
                           "--processes; 0: no split, the conditions only)")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--window_steps", type=int, default=20)
  parser.add_argument("--warmup_windows", type=int, default=3)
  parser.add_argument("--conditions", default=None)
  parser.add_argument("--out", default=os.path.join(REPO, "runs", "noise_budget"))
  parser.add_argument("--report", default=None,
                      help="comma-separated noise_budget.json files (an interrupted run's "
                           "too): write the tables from them, run nothing")
  args = parser.parse_args()
  if args.report:
    series = {}
    for path in args.report.split(","):
      with open(path) as f:
        series.update(json.load(f)["series"])
  else:
    series = run(args)
  steady_windows = args.steps // args.window_steps - args.warmup_windows
  lines = budget(series, args.warmup_windows, steady_windows) + [""] + table(
      series, args.warmup_windows)
  if not any(split(v, args.warmup_windows).get("processes", 0) >= 2 for v in series.values()):
    lines.append("\nNo series had 2 processes with 2 steady windows: raise --steps (the "
                 "first call is left out, and a window closes at --window_steps steps).")
  print("\n".join(lines))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "noise_budget.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
