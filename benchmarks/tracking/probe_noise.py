"""The throughput probe's estimators, measured: which one has the lowest paired noise.

Runs the A/B's throughput probe (replibench/tracking/probe.py) of --base against
--head (default HEAD against itself: an A/A, every difference is noise) --runs times,
and prints for every estimator the paired noise (the residual sd of log(head/base),
the pair order modelled) over all runs' pairs, beside the within-process spread of
the windows and the between-process spread of each side. The estimator to judge is
the one with the lowest paired noise: set probe.JUDGED to it and record the table in
results/tracking/README.md. Run it alone on a quiet machine:

  .venv/bin/python benchmarks/tracking/probe_noise.py --suite=resnet --runs=3 --processes=6 \\
      --steps=300 --window_steps=20 --warmup_windows=3 --out=runs/probe_noise

Writes --out/probe_noise.json (every pair's estimator values and the table).
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from replibench.tracking import ab, probe, revisions, suites  # noqa: E402


def spreads(workdir: str, design: probe.Design) -> dict:
  """Within a process (sd of log window examples/s after the warm-up, averaged over
  processes) and between processes (sd of log median examples/s over the processes of
  one side and configuration, averaged), from the probe's result.json files."""
  from replibench import results
  within, by_group = [], {}
  for root, _, files in os.walk(workdir):
    if results.FILE not in files:
      continue
    result = results.read(root)
    w = probe.steady(result.windows, design.warmup_windows)
    if w.shape[0] < 2:
      continue
    rates = np.log(w[:, 0] / w[:, 1])
    within.append(float(rates.std(ddof=1)))
    side_config = os.path.dirname(os.path.dirname(root))   # .../<side>/<config>/seed=s/round=r
    by_group.setdefault(side_config, []).append(float(np.median(rates)))
  between = [float(np.std(v, ddof=1)) for v in by_group.values() if len(v) >= 2]
  return {"within_process_sd": float(np.mean(within)) if within else None,
          "between_process_sd": float(np.mean(between)) if between else None,
          "processes": len(within)}


def sd_uncertainty(sd: float, n: int) -> float:
  """Approximate standard error of a residual sd over n pairs (normal errors,
  n - 2 degrees of freedom with the order modelled): sd / sqrt(2 (n - 2))."""
  return sd / math.sqrt(2 * max(n - 2, 1))


def choose(noise: dict[str, dict], judged: str = probe.JUDGED) -> tuple[str, str]:
  """(the estimator with the lowest paired noise, the sentence that says what to do):
  only the probe's estimators compete ('run', the trial's own, is for comparison)."""
  ranked = sorted(((v["sd"], name) for name, v in noise.items()
                   if name in probe.ESTIMATORS and v.get("sd") is not None))
  if not ranked:
    return judged, "no estimator had two pairs with values: nothing to choose"
  (best_sd, best), rest = ranked[0], ranked[1:]
  n = noise[best]["n"]
  margin = ""
  if rest:
    second_sd, second = rest[0]
    close = second_sd - best_sd < sd_uncertainty(best_sd, n)
    margin = (f"; {second} next at {second_sd:.4f}" + (
        f", within the sd's uncertainty (+-{sd_uncertainty(best_sd, n):.4f}): "
        f"more runs would separate them" if close else ""))
  action = ("probe.JUDGED already names it" if best == judged else
            f"set JUDGED = \"{best}\" in replibench/tracking/probe.py (now \"{judged}\")")
  return best, (f"lowest paired noise: {best} (sd {best_sd:.4f} over {n} pairs{margin}): "
                f"{action}, and record this table in results/tracking/README.md")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite", default="resnet")
  parser.add_argument("--base", default="HEAD")
  parser.add_argument("--head", default="HEAD")
  parser.add_argument("--configs", default=None, help="comma-separated (default: the suite's "
                      "probe configurations, suites.py)")
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--processes", type=int, default=6)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--window_steps", type=int, default=probe.WINDOW_STEPS)
  parser.add_argument("--warmup_windows", type=int, default=3)
  parser.add_argument("--out", default="runs/probe_noise")
  args = parser.parse_args()
  repo = revisions.repo_root()
  base = revisions.resolve(repo, args.base, "--base")
  head = revisions.resolve(repo, args.head, "--head")
  suite = suites.parse(args.suite)[0]
  design = probe.Design(args.processes, args.steps, args.window_steps, args.warmup_windows,
                        configs=suite.probe.configs if suite.probe else None)
  options = ab.Options(configs=tuple(args.configs.split(",")) if args.configs else None)
  sides = ab.prepare_sides(repo, base, head)
  pairs, per_run = [], []
  for i in range(args.runs):
    workdir = os.path.join(args.out, f"run{i + 1}")
    start = time.monotonic()
    outcome = probe.run(suite, sides, workdir, options, design)
    pairs += outcome.pairs
    per_run.append({"minutes": round((time.monotonic() - start) / 60, 2),
                    "noise": outcome.noise, **spreads(workdir, design)})
    print(f"run {i + 1}: {per_run[-1]['minutes']:.1f} min; " + "; ".join(
        f"{k} sd {v['sd']:.4f}" for k, v in outcome.noise.items() if v["sd"] is not None),
        flush=True)
  pooled = probe.judge(pairs, design)
  print(f"\n{suite.name}, {base.short} vs {head.short}, {len(pairs)} pairs over {args.runs} "
        f"run(s); design {dataclasses.asdict(design)}")
  print("| estimator | pairs | paired sd | +- | ratio | model | what |\n" + "|---" * 7 + "|")
  ranked = sorted(pooled.noise.items(), key=lambda kv: kv[1]["sd"] or math.inf)
  for name, v in ranked:
    what = (probe.ESTIMATORS[name][0] if name in probe.ESTIMATORS
            else "the process's own examples/s (for comparison)")
    sd = f"{v['sd']:.4f}" if v["sd"] is not None else "-"
    pm = f"{sd_uncertainty(v['sd'], v['n']):.4f}" if v["sd"] is not None else "-"
    ratio = f"{v['ratio']:.3f}" if v["ratio"] is not None else "-"
    print(f"| {name} | {v['n']} | {sd} | {pm} | {ratio} | {v['model'] or '-'} | {what} |")
  best, sentence = choose(pooled.noise)
  print(sentence)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "probe_noise.json"), "w") as f:
    json.dump({"design": dataclasses.asdict(design), "base": base.sha, "head": head.sha,
               "runs": per_run, "pooled": pooled.noise, "lowest": best,
               "judged": probe.JUDGED,
               "pairs": [dataclasses.asdict(p) for p in pairs]}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
