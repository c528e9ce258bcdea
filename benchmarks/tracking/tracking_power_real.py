"""The tracker's power with real slowdowns: a commit that adds work to ResNet's step,
calibrated to cost what it says, then N A/B and N A/A runs with their verdicts,
accumulated across sessions in one committed file.

Not the project's knob (Experiment.inject_slowdown): the change is code, as a real
regression is. The commit (a branch under tracking/, never checked out here) adds,
after ResNet's stem, K constant 1x1 projections of the stem's activations multiplied
by a zero computed at run time (so the numerics, steps to target and final metric,
are unchanged and no graph optimisation can drop the work): forward and backward
pass grow by K small convolutions.

The runs take ~10 h (10 A/B runs at each of two targets and 20 A/A runs at ~13 min
each) and no session holds that, so every finished step appends one line to the
ledger, results/tracking/power_real/runs.jsonl (--ledger; commit it), and a re-run
skips what this machine (machine.fingerprint) has done and goes on:

  calibrate  For each target cost (--targets, fractions of examples/s) this machine has
             no calibration for (or all, with --recalibrate): finds K by alternated
             measurement, the throughput probe (replibench/tracking/probe.py:
             interleaved processes of base and head, steady windows) of the base
             against the commit with K, K scaled by target / measured cost (the cost is
             near linear in K) until it is within --tolerance; appends a
             `calibration` line (base, K, the measured cost and its interval).
  runs       Until this machine has --runs A/B runs of each calibrated target (the
             newest calibration's base against its commit with K, `replibench ab` of
             the suite's default design) and --aa_runs A/A runs (that base against
             itself): runs the missing ones, each appending a line (kind aa/slowdown,
             target, K, verdict, the judged throughput row's ratio and interval, every
             pooled row, machine, commit, date, minutes). A run whose A/B failed (a
             failed trial) is recorded as `failed` and not counted: it is run again.
             Each A/B gets a fresh directory (an interrupted A/B is not resumed: its
             pairs' two trials would not run back to back).
             An A/A needs no calibration: `runs --targets= --aa_runs=N` runs A/As
             alone, of HEAD, on a machine that has none.
  report     The power table per machine from the ledger: caught k of n (slowdowns),
             alarms k of n (A/A), each run's interval; --markdown for the README.

On a quiet machine, nothing else running; each command may be stopped and run again:

  .venv/bin/python benchmarks/tracking/tracking_power_real.py calibrate --targets=0.10,0.05
  .venv/bin/python benchmarks/tracking/tracking_power_real.py runs --targets=0.10,0.05 --runs=10 --aa_runs=20
  .venv/bin/python benchmarks/tracking/tracking_power_real.py report
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.

from benchmarks.tracking import tracking_power  # noqa: E402
from replibench import machine  # noqa: E402
from replibench.tracking import ab, probe, revisions, suites  # noqa: E402

REPO = tracking_power.REPO
LEDGER = os.path.join(REPO, "results", "tracking", "power_real", "runs.jsonl")
MAX_FAILED_IN_A_ROW = 3   # A failed A/B is recorded and run again, up to this many in a row.
# Issue 43's goals: (word, k, of n) by kind or target.
GOALS = {"aa": ("alarms", 1, 20), "0.1": ("caught", 9, 10), "0.05": ("caught", 8, 10)}
MODEL = "models/resnet.py"
ANCHOR = '    return keras.layers.ReLU(name="stem_relu")(x)\n'
PATCH = '''    x = keras.layers.ReLU(name="stem_relu")(x)

    def extra_work(t):   # benchmarks/tracking/tracking_power_real.py: a real slowdown of the step
      import tensorflow as tf
      k = tf.ones((1, 1, t.shape[-1], t.shape[-1]), t.dtype) / t.shape[-1]
      e = t
      for _ in range({k}):
        e = tf.nn.conv2d(e, k, 1, "SAME")
      # 0 at run time (t is a ReLU's output), unknown to any graph rewrite.
      zero = tf.stop_gradient(tf.minimum(tf.reduce_min(t), 0.0))
      return t + e * zero

    return keras.layers.Lambda(extra_work, name="tracking_extra_work")(x)
'''


def work_commit(base: str, k: int) -> str:
  """A commit on top of base whose ResNet stem does K extra projections; its sha."""
  if k <= 0:
    return base
  branch = f"tracking/work-resnet-{k}"
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "wt")
    tracking_power.git("worktree", "add", "--detach", path, base)
    try:
      file = os.path.join(path, MODEL)
      text = open(file).read()
      if text.count(ANCHOR) != 1:
        raise SystemExit(f"{MODEL} at {base[:10]} has no single stem ReLU line to patch "
                         f"({ANCHOR.strip()!r}); update ANCHOR in {__file__}.")
      with open(file, "w") as f:
        f.write(text.replace(ANCHOR, PATCH.replace("{k}", str(k))))
      tracking_power.git("commit", "-q", "-am", f"tracking power test: {k} extra 1x1 "
                         f"projections in ResNet's stem (x 0)", cwd=path)
      sha = tracking_power.git("rev-parse", "HEAD", cwd=path)
      tracking_power.git("branch", "-f", branch, sha)
    finally:
      tracking_power.git("worktree", "remove", "--force", path)
  return sha


def measure_cost(base: str, head: str, design: probe.Design, configs: tuple, workdir: str):
  """(cost, low, high): 1 - examples/s head/base by the probe, with its interval."""
  repo = REPO
  sides = ab.prepare_sides(repo, revisions.resolve(repo, base, "--base"),
                           revisions.resolve(repo, head, "--head"), log=lambda line: None)
  outcome = probe.run(suites.SUITES["resnet"], sides, workdir, ab.Options(configs=configs),
                      design, log=lambda line: None)
  est = outcome.rows[0].estimate
  return 1 - est.ratio, 1 - est.high, 1 - est.low


# The ledger: one JSON object a line, appended (never rewritten), committed.

def read_ledger(path: str) -> list[dict]:
  """Every line of the ledger (none when it does not exist); a damaged line is skipped
  with a warning naming it (an interrupted append)."""
  if not os.path.exists(path):
    return []
  lines = []
  with open(path) as f:
    for i, text in enumerate(f, 1):
      if text.strip():
        try:
          lines.append(json.loads(text))
        except json.JSONDecodeError:
          print(f"warning: {path}:{i} is not JSON; skipped", file=sys.stderr)
  return lines


def append(path: str, line: dict) -> None:
  """Appends one line and flushes it to disk (a stopped session loses no finished run)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as f:
    f.write(json.dumps(line, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())


def _stamp() -> dict:
  return {"machine": machine.fingerprint(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def target_key(target: float) -> str:
  """A target as the ledger writes it: 0.1 and 0.10 are one target."""
  return f"{float(target):g}"


def calibrations(lines: list[dict], fingerprint: str) -> dict[str, dict]:
  """{target: the newest calibration line of this machine}."""
  out = {}
  for line in lines:
    if line.get("kind") == "calibration" and line.get("machine") == fingerprint:
      out[line["target"]] = line   # Appended in time order: the last one wins.
  return out


def calibrate(args) -> int:
  base = tracking_power.git("rev-parse", args.base)
  design = probe.Design(processes=args.processes, steps=args.steps)
  configs = tuple(args.configs.split(","))
  fingerprint = machine.fingerprint()
  done = calibrations(read_ledger(args.ledger), fingerprint)
  for target in (float(t) for t in args.targets.split(",")):
    if target_key(target) in done and not args.recalibrate:
      c = done[target_key(target)]
      print(f"target {target:.0%}: calibrated on this machine already (K={c['k']}, cost "
            f"{c['cost']:.1%}, {c['date']}); --recalibrate to redo it", flush=True)
      continue
    k, tries, start = args.start_k, [], time.monotonic()
    for _ in range(args.max_tries):
      head = work_commit(base, k)
      cost, low, high = measure_cost(base, head, design, configs,
                                     os.path.join(args.out, f"calibrate-{target}-{k}-"
                                                  f"{int(time.time())}"))
      tries.append({"k": k, "head": head, "cost": cost, "low": low, "high": high})
      print(f"target {target:.0%}: K={k} costs {cost:.1%} [{low:.1%}, {high:.1%}]", flush=True)
      if abs(cost - target) <= args.tolerance:
        break
      k = max(1, round(k * target / max(cost, 0.002)))
    best = min(tries, key=lambda t: abs(t["cost"] - target))
    append(args.ledger, {"kind": "calibration", "target": target_key(target), "k": best["k"],
                         "commit": base, "head": best["head"], "cost": best["cost"],
                         "low": best["low"], "high": best["high"], "tries": tries,
                         "design": {"processes": design.processes, "steps": design.steps,
                                    "configs": list(configs)},
                         "minutes": round((time.monotonic() - start) / 60, 2), **_stamp()})
  return 0


def ab_run(base: str, head: str, workdir: str, args) -> dict:
  """One `replibench ab` of the suite's default design: {exit_code, minutes, ab (ab.json)}."""
  command = [sys.executable, "-m", "replibench.cli", "ab", f"--base={base}", f"--head={head}",
             f"--suite={args.suite}", f"--workdir={workdir}"] + (["--aa"] if base == head else [])
  start = time.monotonic()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  minutes = (time.monotonic() - start) / 60
  if done.returncode not in (0, 1):
    raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
  with open(os.path.join(workdir, "ab.json")) as f:
    return {"exit_code": done.returncode, "minutes": round(minutes, 2), "ab": json.load(f)}


def judged_row(rows: dict) -> tuple[str, dict] | None:
  """The throughput row that decides: the probe's (its metric is probe.JUDGED's name),
  else the trials' examples/s."""
  for metric in (*probe.ESTIMATORS, "examples_per_s"):
    if metric in rows:
      return metric, rows[metric]
  return None


def run_line(kind: str, target: float, k: int, base: str, head: str, run: dict) -> dict:
  """The ledger's line for one finished A/B."""
  rows = tracking_power.pooled_rows(run["ab"])
  failed = [name for suite in run["ab"]["suites"] for name in suite.get("failed", [])]
  regression = any(r["verdict"] == "regression" for r in rows.values()) or (
      run["exit_code"] == 1 and not failed)
  verdict = "failed" if failed else "regression" if regression else "none"
  compact = {m: {"ratio": (r["estimate"] or {}).get("ratio"),
                 "low": (r["estimate"] or {}).get("low"),
                 "high": (r["estimate"] or {}).get("high"), "verdict": r["verdict"]}
             for m, r in rows.items()}
  judged = judged_row(compact)
  return {"kind": kind, "target": target_key(target), "k": k, "verdict": verdict,
          "judged": {"metric": judged[0], **judged[1]} if judged else None, "rows": compact,
          "called_by": called_by(run["ab"]),
          "failed": failed, "commit": base, "head": head, "exit_code": run["exit_code"],
          "minutes": run["minutes"], "suite": run["ab"]["suites"][0]["suite"],
          "design": design_key(run["ab"]["suites"][0]["suite"]), **_stamp()}


def called_by(ab_json: dict) -> list[dict]:
  """Every row of the A/B that called a regression, a configuration's as well as the
  pooled ones (the verdict counts any row, as the tracker's exit code does): config,
  metric, ratio and interval."""
  out = []
  for suite in ab_json["suites"]:
    for row in suite["rows"]:
      if row["verdict"] == "regression":
        e = row.get("estimate") or {}
        out.append({"config": row["config"], "metric": row["metric"],
                    **{k: e.get(k) for k in ("ratio", "low", "high")}})
  return out


def _called_text(line: dict) -> str:
  """" R" where the judged row called the regression; " R: <row> <interval>" where only
  other rows did (lines written before called_by existed: " R")."""
  if line["verdict"] != "regression":
    return ""
  judged = (line.get("judged") or {}).get("metric")
  rows = line.get("called_by") or []
  if not rows or any(r["config"] == "all configs" and r["metric"] == judged for r in rows):
    return " R"
  def one(r):
    interval = (f" {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
                if r.get("low") is not None else "")
    return f"{r['config']} {r['metric']}{interval}"
  return " R: " + ", ".join(one(r) for r in rows)


def design_key(suite: str) -> str:
  """The suite's default A/B design as the ledger records it (suites.SUITES): runs of
  one design are counted together, so changing the design starts a new count."""
  s = suites.SUITES[suite]
  seeds = ",".join(map(str, s.seeds)) if s.seeds else "the sweep's"
  # The probe's pooling is part of the design: its pairs judged by another rule are
  # another test (probe.TRIMMED; the ledger's first runs pooled by the order model).
  probe_text = (f"; probe {s.probe.processes} processes x "
                f"{','.join(s.probe.configs or ('the A/B configs',))}, {s.probe.steps} steps"
                f"{', trimmed' if probe.TRIMMED else ''}" if s.probe else "")
  return (f"{','.join(s.configs) if s.configs else 'all configs'} x seeds {seeds} x "
          f"{s.rounds} round(s){probe_text}")


def counted(lines: list[dict], fingerprint: str, kind: str, target: str, k: int,
            design: str) -> int:
  """Runs of this machine, kind, target, K and design already in the ledger (failed
  ones aside)."""
  return sum(line.get("machine") == fingerprint and line.get("kind") == kind
             and line.get("target") == target and line.get("k") == k
             and line.get("design") == design
             and line.get("verdict") != "failed" for line in lines)


def plan(lines: list[dict], fingerprint: str, targets: list[float], n_runs: int,
         n_aa: int, design: str) -> list[tuple[str, str, int, str, str, int]]:
  """(kind, target, K, base, head, runs left) for this machine: A/A first, then each
  target; a SystemExit when a target has no calibration here."""
  cals = calibrations(lines, fingerprint)
  missing = [target_key(t) for t in targets if target_key(t) not in cals]
  if missing:
    raise SystemExit(f"no calibration on this machine ({fingerprint}) for target(s) "
                     f"{', '.join(missing)} in the ledger: run `calibrate` first.")
  chosen = [cals[target_key(t)] for t in targets]
  base = chosen[-1]["commit"] if chosen else tracking_power.git("rev-parse", "HEAD")
  out = [("aa", "0", 0, base, base, n_aa - counted(lines, fingerprint, "aa", "0", 0, design))]
  for c in chosen:
    out.append(("slowdown", c["target"], c["k"], c["commit"], c["head"],
                n_runs - counted(lines, fingerprint, "slowdown", c["target"], c["k"],
                                 design)))
  return out


def slow_head(base: str, head: str, k: int) -> str:
  """The calibrated commit: its sha where this clone has it, else made again (same K on
  the same base: the same change)."""
  try:
    tracking_power.git("cat-file", "-e", f"{head}^{{commit}}")
    return head
  except subprocess.CalledProcessError:
    return work_commit(base, k)


def runs(args, ab_runner=ab_run) -> int:
  fingerprint = machine.fingerprint()
  targets = [float(t) for t in args.targets.split(",")] if args.targets else []
  todo = plan(read_ledger(args.ledger), fingerprint, targets, args.runs, args.aa_runs,
              design_key(args.suite))
  for kind, target, k, base, head, left in todo:
    if left <= 0:
      print(f"{kind} {target}: done on this machine", flush=True)
      continue
    if kind == "slowdown":
      head = slow_head(base, head, k)
    done, failed_in_a_row = 0, 0
    while done < left:
      stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
      workdir = os.path.join(args.out, fingerprint, f"{kind}-{target}-k{k}",
                             f"{stamp}-{uuid.uuid4().hex[:6]}")
      line = run_line(kind, float(target), k, base, head, ab_runner(base, head, workdir, args))
      append(args.ledger, line)
      j = line["judged"]
      shown = (f"{j['metric']} {j['ratio']:.3f} [{j['low']:.3f}, {j['high']:.3f}]"
               if j and j.get("low") is not None else "-")
      print(f"{kind} {target} K={k}: {line['verdict']}, {line['minutes']:.1f} min; {shown}"
            f" ({done + (line['verdict'] != 'failed')} of {left} to go)", flush=True)
      if line["verdict"] == "failed":
        failed_in_a_row += 1
        if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
          raise SystemExit(f"{kind} {target}: {failed_in_a_row} A/B runs in a row had failed "
                           f"trials ({'; '.join(line['failed'])[:500]}; see {workdir}): "
                           f"something is broken, not noisy; stopped.")
        continue
      done, failed_in_a_row = done + 1, 0
  return 0


def _interval(line: dict) -> str:
  j = line.get("judged") or {}
  if j.get("low") is None:
    return "-"
  return f"{j['ratio']:.3f} [{j['low']:.3f}, {j['high']:.3f}]"


def report(lines: list[dict], markdown: bool = False) -> str:
  """The power table of every machine in the ledger: per kind, target and K, runs that
  called a regression (caught for a slowdown, alarms for an A/A), each run's judged
  interval, the goal; failed runs counted apart."""
  out = []
  machines = list(dict.fromkeys(line["machine"] for line in lines if "machine" in line))
  for fp in machines:
    mine = [line for line in lines if line.get("machine") == fp]
    cals = calibrations(mine, fp)
    out.append(f"{'## ' if markdown else ''}machine {fp}")
    out.append("| kind | target | K (measured cost) | called a regression | goal | failed | "
               "minutes (median) | judged row: ratio [interval] of each run | design |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for line in mine:
      if line.get("kind") in ("aa", "slowdown"):
        groups.setdefault((line["kind"], line["target"], line["k"], line.get("design")),
                          []).append(line)
    for (kind, target, k, design), group in groups.items():
      ok = [g for g in group if g["verdict"] != "failed"]
      called = sum(g["verdict"] == "regression" for g in ok)
      _, need, of = GOALS.get("aa" if kind == "aa" else target, (None, None, None))
      word = "alarms" if kind == "aa" else "caught"
      goal = "-" if need is None else (f"<= {need} of {of}" if kind == "aa" else
                                       f">= {need} of {of}")
      cal = cals.get(target)
      cost = f"{k} ({cal['cost']:.1%})" if kind == "slowdown" and cal and cal["k"] == k \
          else (str(k) if kind == "slowdown" else "-")
      minutes = sorted(g["minutes"] for g in ok)
      median = f"{minutes[len(minutes) // 2]:.1f}" if minutes else "-"
      intervals = "; ".join(_interval(g) + _called_text(g) for g in ok)
      out.append(f"| {kind} | {target if kind != 'aa' else '-'} | {cost} | {word} {called} of "
                 f"{len(ok)} | {goal} | {len(group) - len(ok)} | {median} | {intervals} | "
                 f"{design or '-'} |")
    commits = sorted({line.get("commit", "")[:10] for line in mine})
    out.append(f"(base commit(s) {', '.join(commits)}; R: a regression called, by the "
               f"judged row unless the rows that called it follow)")
    out.append("")
  out += _aa_across_machines(lines, markdown)
  return "\n".join(out) if out else "the ledger holds no run yet"


def _aa_across_machines(lines: list[dict], markdown: bool) -> list[str]:
  """A/A alarms of each design summed over machines: a false alarm is the tracker's
  property on the fleet's 2-core machines (the goal's "these machines"), and an A/A
  needs no calibration, so every machine's A/As count; each machine's own count is in
  its table above. Empty when no design ran A/As on more than one machine."""
  by_design: dict[str, dict[str, list[dict]]] = {}
  for line in lines:
    if line.get("kind") == "aa" and line.get("verdict") != "failed" and "machine" in line:
      by_design.setdefault(line.get("design") or "-", {}).setdefault(
          line["machine"], []).append(line)
  rows = []
  for design, machines in by_design.items():
    if len(machines) < 2:
      continue
    runs = [line for group in machines.values() for line in group]
    called = sum(line["verdict"] == "regression" for line in runs)
    _, need, of = GOALS["aa"]
    each = "; ".join(f"{fp}: {sum(g['verdict'] == 'regression' for g in group)} of "
                     f"{len(group)}" for fp, group in machines.items())
    rows.append(f"| {design} | alarms {called} of {len(runs)} | <= {need} of {of} | {each} |")
  if not rows:
    return []
  return [f"{'## ' if markdown else ''}A/A across machines",
          "| design | called a regression | goal | per machine |", "|---|---|---|---|",
          *rows, ""]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("step", choices=("calibrate", "runs", "report"))
  parser.add_argument("--ledger", default=LEDGER, help="the committed JSONL of every run")
  parser.add_argument("--targets", default="0.10,0.05")
  parser.add_argument("--base", default="HEAD", help="calibrate: the base revision")
  parser.add_argument("--out", default=os.path.join(REPO, "runs", "power_real"),
                      help="where the A/B runs' directories go (not committed)")
  parser.add_argument("--configs", default="replicas=1,replicas=2,workers=2",
                      help="calibrate: the configurations the probe measures")
  parser.add_argument("--processes", type=int, default=6, help="calibrate: per side")
  parser.add_argument("--steps", type=int, default=300, help="calibrate: per process")
  parser.add_argument("--start_k", type=int, default=8)
  parser.add_argument("--tolerance", type=float, default=0.01)
  parser.add_argument("--max_tries", type=int, default=4)
  parser.add_argument("--recalibrate", action="store_true",
                      help="calibrate: again, where this machine has a calibration")
  parser.add_argument("--suite", default="resnet", help="runs: the suite A/B'd (ResNet's "
                      "model carries the change)")
  parser.add_argument("--runs", type=int, default=10, help="runs: A/B runs per target")
  parser.add_argument("--aa_runs", type=int, default=20)
  parser.add_argument("--markdown", action="store_true", help="report: headings for the README")
  args = parser.parse_args()
  if not math.isfinite(args.tolerance) or args.tolerance <= 0:
    raise SystemExit("--tolerance: a positive fraction")
  if args.step == "report":
    print(report(read_ledger(args.ledger), args.markdown))
    return 0
  return calibrate(args) if args.step == "calibrate" else runs(args)


if __name__ == "__main__":
  sys.exit(main())
