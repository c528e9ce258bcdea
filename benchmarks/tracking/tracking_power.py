"""The regression tracker's power and false-alarm rate, measured with real A/B runs.

Makes throwaway commits on top of HEAD (branches under tracking/, never checked out
here) that change one thing a real change could, then runs `replibench ab` of HEAD
against each, again and again, and counts the verdicts:

  slowdown   Experiment.inject_slowdown = F in the suite's gin file: examples/s x (1 - F)
             (matmul work after each call, replibench/harness/slowdown.py; a real code
             change calibrated to a cost: benchmarks/tracking/tracking_power_real.py)
  lr         the learning rate x F in the suite's gin file (more steps to target)
  aa         HEAD against itself (every regression is a false alarm)

  python benchmarks/tracking/tracking_power.py --kind=aa --runs=20 --suite=resnet [--configs=...]
  python benchmarks/tracking/tracking_power.py --kind=slowdown --factor=0.1 --runs=10 --suite=resnet

Prints one line per A/B (verdict of each judged metric's pooled row, ratio and
interval, minutes) and a summary; writes every A/B's ab.json under --out and the
summary to --out/summary.json. Run it alone on the machine.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
GIN = {"resnet": "configs/resnet/scaling.gin", "sngan": "configs/sngan/batch_scaling.gin",
       "d4pg": "configs/d4pg/learner_scaling.gin"}
LR = {"resnet": ("ImageClassification.base_lr_per_256", 0.2),
      "sngan": ("ConditionalGAN.learning_rate", 2e-4)}


def git(*args: str, cwd: str = REPO) -> str:
  return subprocess.run(["git", "-C", cwd, *args], check=True, capture_output=True,
                        text=True).stdout.strip()


def change_commit(base: str, kind: str, suite: str, factor: float) -> str:
  """A commit on top of base whose suite gin file carries the change; returns its sha."""
  if kind == "aa":
    return base
  if kind == "slowdown":
    line = f"Experiment.inject_slowdown = {factor}"
  else:
    name, value = LR[suite]
    line = f"{name} = {value * factor:.6g}"
  branch = f"tracking/{kind}-{suite}-{factor}"
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "wt")
    git("worktree", "add", "--detach", path, base)
    with open(os.path.join(path, GIN[suite]), "a") as f:
      f.write(f"\n# Injected by benchmarks/tracking/tracking_power.py ({kind}).\n{line}\n")
    git("commit", "-q", "-am", f"tracking power test: {line}", cwd=path)
    sha = git("rev-parse", "HEAD", cwd=path)
    git("branch", "-f", branch, sha)
    git("worktree", "remove", "--force", path)
  return sha


def pooled_rows(ab: dict) -> dict:
  out = {}
  for suite in ab["suites"]:
    for row in suite["rows"]:
      if row["config"] in ("all configs",) or len({p["config"] for p in suite["pairs"]}) == 1:
        if row["metric"] != "converged":
          out[row["metric"]] = row
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kind", choices=("aa", "slowdown", "lr"), required=True)
  parser.add_argument("--factor", type=float, default=0.1)
  parser.add_argument("--runs", type=int, default=10)
  parser.add_argument("--suite", default="resnet")
  parser.add_argument("--configs", default=None)
  parser.add_argument("--seeds", type=int, default=None)
  parser.add_argument("--new_seeds", action="store_true",
                      help="each A/B its own seeds (run i: seeds i*K+1 .. i*K+K): power over "
                      "seed draws, for metrics that are deterministic given the seed")
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--out", default=None)
  parser.add_argument("--base", default="HEAD", help="the revision the change is made on")
  parser.add_argument("--first_run", type=int, default=1,
                      help="the number of the first run (its directory, and with --new_seeds "
                      "its seeds), to spread runs over several calls")
  args = parser.parse_args()
  base = git("rev-parse", args.base)
  head = change_commit(base, args.kind, args.suite, args.factor)
  out = args.out or os.path.join(REPO, "runs", "power", f"{args.kind}-{args.suite}-{args.factor}")
  os.makedirs(out, exist_ok=True)
  summary = {"kind": args.kind, "factor": args.factor, "suite": args.suite, "base": base,
             "head": head, "configs": args.configs, "runs": []}
  for i in range(args.first_run - 1, args.first_run - 1 + args.runs):
    workdir = os.path.join(out, f"run{i + 1}")
    command = [sys.executable, "-m", "replibench.cli", "ab", f"--base={base}",
               f"--head={head}", f"--suite={args.suite}", f"--workdir={workdir}", "--norecord"]
    command += ["--aa"] if head == base else []   # An A/A is asked for, never defaulted.
    command += [f"--configs={args.configs}"] if args.configs else []
    command += [f"--seeds={args.seeds}"] if args.seeds else []
    command += [f"--first_seed={i * args.seeds + 1}"] if args.new_seeds and args.seeds else []
    command += [f"--rounds={args.rounds}"] if args.rounds else []
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    minutes = (time.monotonic() - start) / 60
    if done.returncode not in (0, 1) or not os.path.exists(os.path.join(workdir, "ab.json")):
      print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
      return done.returncode
    ab = json.load(open(os.path.join(workdir, "ab.json")))
    rows = pooled_rows(ab)
    summary["runs"].append({"exit_code": done.returncode, "minutes": round(minutes, 2),
                            "rows": rows})
    print(f"run {i + 1}: exit {done.returncode}, {minutes:.1f} min; " + "; ".join(
        f"{m} {r['verdict']} {r['estimate']['ratio']:.3f} "
        f"[{r['estimate']['low'] or 0:.3f}, {r['estimate']['high'] or 0:.3f}]"
        for m, r in rows.items() if r["estimate"]), flush=True)
    with open(os.path.join(out, f"summary-{args.first_run}.json"), "w") as f:
      json.dump(summary, f, indent=1)
  caught = sum(r["exit_code"] == 1 for r in summary["runs"])
  print(f"{args.kind} x{args.factor} on {args.suite}: a regression called in {caught} of "
        f"{args.runs} A/B runs; {sum(r['minutes'] for r in summary['runs']) / args.runs:.1f} "
        f"min per A/B")
  return 0


if __name__ == "__main__":
  sys.exit(main())
