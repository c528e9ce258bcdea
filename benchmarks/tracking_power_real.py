"""The tracker's power with real slowdowns: a commit that adds work to ResNet's step,
calibrated to cost what it says, then N A/B and N A/A runs with their verdicts.

Not the project's knob (Experiment.inject_slowdown): the change is code, as a real
regression is. The commit (a branch under tracking/, never checked out here) adds,
after ResNet's stem, K constant 1x1 projections of the stem's activations multiplied
by a zero computed at run time (so the numerics, steps to target and final metric,
are unchanged and no graph optimisation can drop the work): forward and backward
pass grow by K small convolutions.

  calibrate  For each target cost (--targets, fractions of examples/s), finds K by
             alternated measurement: the throughput probe (replibench/tracking/probe.py:
             interleaved processes of base and head, steady windows) of the base
             against the commit with K, K scaled by target / measured cost (the cost
             is near linear in K) until the measured cost is within --tolerance;
             writes --out/calibration.json (K, the measured cost and its interval).
  runs       For each calibrated target: --runs A/B runs of `replibench ab` (the suite's
             default design) of the base against its commit, and --aa_runs A/A runs
             (base against itself); prints and writes each run's verdict and the
             pooled rows' ratios and intervals, and the counts (--out/power.json,
             --out/power.md).

On a quiet machine, nothing else running (~10 h for both targets at 10 + 10 + 20 runs):

  .venv/bin/python benchmarks/tracking_power_real.py calibrate --targets=0.10,0.05 \\
      --out=runs/power_real
  .venv/bin/python benchmarks/tracking_power_real.py runs --targets=0.10,0.05 --runs=10 \\
      --aa_runs=20 --out=runs/power_real
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tracking_power  # noqa: E402

from replibench.tracking import ab, probe, revisions, suites  # noqa: E402

REPO = tracking_power.REPO
MODEL = "models/resnet.py"
ANCHOR = '    return keras.layers.ReLU(name="stem_relu")(x)\n'
PATCH = '''    x = keras.layers.ReLU(name="stem_relu")(x)

    def extra_work(t):   # benchmarks/tracking_power_real.py: a real slowdown of the step
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


def calibrate(args) -> int:
  base = tracking_power.git("rev-parse", args.base)
  design = probe.Design(processes=args.processes, steps=args.steps)
  configs = tuple(args.configs.split(","))
  out = {"base": base, "design": vars(args), "targets": {}}
  for target in (float(t) for t in args.targets.split(",")):
    k, tries = args.start_k, []
    for attempt in range(args.max_tries):
      head = work_commit(base, k)
      cost, low, high = measure_cost(base, head, design, configs,
                                     os.path.join(args.out, f"calibrate-{target}-{k}"))
      tries.append({"k": k, "head": head, "cost": cost, "low": low, "high": high})
      print(f"target {target:.0%}: K={k} costs {cost:.1%} [{low:.1%}, {high:.1%}]", flush=True)
      if abs(cost - target) <= args.tolerance:
        break
      k = max(1, round(k * target / max(cost, 0.002)))
    best = min(tries, key=lambda t: abs(t["cost"] - target))
    out["targets"][str(target)] = {"k": best["k"], "head": best["head"],
                                   "cost": best["cost"], "tries": tries}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "calibration.json"), "w") as f:
      json.dump(out, f, indent=1)
  return 0


def ab_run(base: str, head: str, workdir: str, args) -> dict:
  command = [sys.executable, "-m", "replibench.cli", "ab", f"--base={base}", f"--head={head}",
             f"--suite={args.suite}", f"--workdir={workdir}", "--norecord"]
  start = time.monotonic()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  minutes = (time.monotonic() - start) / 60
  if done.returncode not in (0, 1):
    raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
  rows = tracking_power.pooled_rows(json.load(open(os.path.join(workdir, "ab.json"))))
  return {"exit_code": done.returncode, "minutes": round(minutes, 2), "rows": rows}


def _line(run: dict) -> str:
  cells = []
  for metric, row in run["rows"].items():
    est = row["estimate"]
    if est and est.get("low") is not None:
      cells.append(f"{metric} {est['ratio']:.3f} [{est['low']:.3f}, {est['high']:.3f}] "
                   f"{row['verdict']}")
  return "; ".join(cells)


def runs(args) -> int:
  calibration = json.load(open(os.path.join(args.out, "calibration.json")))
  base = calibration["base"]
  kinds = [("aa", base, 0.0, args.aa_runs)]
  kinds += [(f"slow{t}", c["head"], float(t), args.runs)
            for t, c in calibration["targets"].items() if float(t) in
            {float(x) for x in args.targets.split(",")}]
  table, md = {}, ["| kind | cost (calibrated) | run | minutes | verdict | rows |", "|---|---|---|---|---|---|"]
  for kind, head, cost, n in kinds:
    table[kind] = []
    for i in range(n):
      run = ab_run(base, head, os.path.join(args.out, kind, f"run{i + 1}"), args)
      table[kind].append(run)
      verdict = "REGRESSION" if run["exit_code"] == 1 else "none"
      print(f"{kind} run {i + 1}: {verdict}, {run['minutes']:.1f} min; {_line(run)}", flush=True)
      md.append(f"| {kind} | {cost:.1%} | {i + 1} | {run['minutes']:.1f} | {verdict} | "
                f"{_line(run)} |")
      with open(os.path.join(args.out, "power.json"), "w") as f:
        json.dump({"base": base, "calibration": calibration, "runs": table}, f, indent=1)
    caught = sum(r["exit_code"] == 1 for r in table[kind])
    md.append(f"| **{kind}** | | **{caught} of {n} called a regression** | | | |")
    print(f"{kind}: a regression called in {caught} of {n} A/B runs", flush=True)
  with open(os.path.join(args.out, "power.md"), "w") as f:
    f.write("\n".join(md) + "\n")
  return 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("step", choices=("calibrate", "runs"))
  parser.add_argument("--targets", default="0.10,0.05")
  parser.add_argument("--base", default="HEAD")
  parser.add_argument("--out", default=os.path.join(REPO, "runs", "power_real"))
  parser.add_argument("--configs", default="replicas=1,replicas=2,workers=2",
                      help="calibrate: the configurations the probe measures")
  parser.add_argument("--processes", type=int, default=6, help="calibrate: per side")
  parser.add_argument("--steps", type=int, default=300, help="calibrate: per process")
  parser.add_argument("--start_k", type=int, default=8)
  parser.add_argument("--tolerance", type=float, default=0.01)
  parser.add_argument("--max_tries", type=int, default=4)
  parser.add_argument("--suite", default="resnet", help="runs: the suite A/B'd (ResNet's "
                      "model carries the change)")
  parser.add_argument("--runs", type=int, default=10)
  parser.add_argument("--aa_runs", type=int, default=20)
  args = parser.parse_args()
  if not math.isfinite(args.tolerance) or args.tolerance <= 0:
    raise SystemExit("--tolerance: a positive fraction")
  return calibrate(args) if args.step == "calibrate" else runs(args)


if __name__ == "__main__":
  sys.exit(main())
