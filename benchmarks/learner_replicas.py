"""D4PG's learner replicated, paired against one replica: steady-state learner examples/s.

    .venv/bin/python benchmarks/learner_replicas.py --pairs=8 --steps=4000
    .venv/bin/python benchmarks/learner_replicas.py --setups=replicas=2,workers=2 \
        --gin_bindings="D4PG.actor_cores = 1"

Issue 44's question: do learner replicas at least match one replica's learner
examples/s on this machine? The bench's own trials stop at their target (1,500-4,000
learner steps, evaluations between), and their examples/s scatter by ~10% a trial, so
this runs configs/d4pg/learner_scaling.gin (the bench's trial: cartpole-balance, 2
actors running, one intra-op thread) for a fixed number of learner steps with no
evaluation before the last step, and pairs each setup with a replicas=1 run back to
back, the order alternating from pair to pair (ABBA), so a drift of the machine falls
on both. Prints each pair's examples/s and ratio, then per setup the geometric mean of
the ratios with a 95% t interval; writes every run to --out as JSON. Run it alone.
"""

import argparse
import json
import os
import time

import bench_runs   # benchmarks/bench_runs.py (this script's directory is on sys.path)
from replibench.tracking import paired   # The A/B's own paired estimate.

CONFIG = "configs/d4pg/learner_scaling.gin"
# No evaluation or checkpoint inside the run: the learner and its actors only.
QUIET = ["Experiment.eval_every_epochs = 1000", "Experiment.checkpoint_every_epochs = 1000"]


def _setup(label: str) -> tuple[str, int]:
  kind, _, n = label.partition("=")
  if kind not in ("replicas", "workers") or not n.isdigit() or int(n) < 1:
    raise SystemExit(f"--setups: {label!r} is not replicas=N or workers=N")
  return kind, int(n)


def _examples_per_s(label: str, steps: int, bindings: list[str]) -> float:
  kind, n = _setup(label)
  cmd = bench_runs.command(CONFIG, kind, n, [*QUIET, *bindings], steps, "WORKDIR")
  result, _ = bench_runs.run(cmd, label)
  return float(result["examples_per_s"])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--setups", default="replicas=2", help="each paired with replicas=1")
  parser.add_argument("--pairs", type=int, default=8)
  parser.add_argument("--steps", type=int, default=4000, help="learner steps a run")
  parser.add_argument("--gin_bindings", action="append", default=[])
  parser.add_argument("--out", default="runs/learner_replicas.json")
  args = parser.parse_args()
  setups = args.setups.split(",")
  for label in setups:
    _setup(label)
  runs, started = [], time.monotonic()
  for i in range(args.pairs):
    for label in setups:
      order = ["replicas=1", label] if i % 2 == 0 else [label, "replicas=1"]
      rates = {side: _examples_per_s(side, args.steps, args.gin_bindings) for side in order}
      runs.append({"pair": i, "setup": label, "order": order, **rates})
      print(f"[pair {i + 1}/{args.pairs}] {label}: {rates[label]:,.0f} ex/s, replicas=1 "
            f"{rates['replicas=1']:,.0f} ({' then '.join(order)}): ratio "
            f"{rates[label] / rates['replicas=1']:.3f}; {time.monotonic() - started:.0f} s",
            flush=True)
  for label in setups:
    pairs = [r for r in runs if r["setup"] == label]
    est = paired.estimate(paired.log_ratios([r["replicas=1"] for r in pairs],
                                            [r[label] for r in pairs]))
    print(f"{label} / replicas=1 learner examples/s: {est.text()} "
          f"(geometric mean of {est.n} pairs, 95% t interval)")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump({"config": CONFIG, "steps": args.steps, "bindings": args.gin_bindings,
               "runs": runs}, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
