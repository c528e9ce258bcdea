"""The throughput probe's estimators and power, measured: the study behind probe.JUDGED.

noise: runs the A/B's throughput probe (replibench/tracking/probe.py) of --base against
--head (default HEAD against itself: an A/A, every difference is noise) --runs times,
and prints for every estimator the paired noise (the residual sd of log(head/base),
the pair order modelled) over all runs' pairs, beside the within-process spread of
the windows and the between-process spread of each side. The estimator to judge is
the one with the lowest paired noise: set probe.JUDGED to it and record the table in
results/tracking/README.md. Run it alone on a quiet machine:

  .venv/bin/python benchmarks/tracking/probe_study.py noise --suite=resnet --runs=3 \\
      --processes=6 --steps=300 --window_steps=20 --warmup_windows=3 --out=runs/probe_noise

Writes --out/probe_noise.json (every pair's estimator values and the table).

power: resamples real A/A pairs into A/B runs, to see how each way of pooling the pairs
(mean, order model, trimmed mean) does on the noise this machine really has.
tracking_budget.py simulates normal (or Student t) noise; the probe's is neither: most
pairs of identical code agree within 2-3%, and now and then a process runs 10-30% slow
for its whole life (the machine, not the code). This takes the real A/A pairs of the
judged estimator (probe.JUDGED) from the noise step's output and from A/A `replibench ab`
directories, symmetrizes them (an A/A pair read the other way round, head as base, is as
likely: the order flips with it), and for each pooling rule and number of pairs draws
--runs A/B runs of that many pairs with a true loss added to every pair, judged as the
A/B judges the probe's pooled row (the Bonferroni level of --rows rows, a minimum effect
of probe.MIN_EFFECT). It prints the share of runs called a regression: the false-alarm
rate at no loss, the power at each loss. No process is run: seconds, on what earlier
runs wrote.

  .venv/bin/python benchmarks/tracking/probe_study.py power \\
      --probe_noise=runs/probe_noise/probe_noise.json \\
      --ab_dirs='runs/power_real/*/aa-0-k0/*' --pairs=8,12 --losses=0,0.05,0.10
"""

import argparse
import dataclasses
import glob
import json
import math
import os
import sys
import time

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)  # The checkout.

from replibench import results  # noqa: E402
from replibench.suite import sweep_file  # noqa: E402
from replibench.tracking import ab, paired, probe, revisions, suites  # noqa: E402

RULES = {
    "mean": lambda logs, orders, level: paired.estimate(logs, level),
    "order model": lambda logs, orders, level: paired.order_estimate(logs, orders, None, level),
    "trimmed": lambda logs, orders, level: paired.trimmed_estimate(logs, level, orders=orders),
}


# ----------------------------------------------------------------- noise: which estimator
def spreads(workdir: str, design: probe.Design) -> dict:
  """Within a process (sd of log window examples/s after the warm-up, averaged over
  processes) and between processes (sd of log median examples/s over the processes of
  one side and configuration, averaged), from the probe's result.json files."""
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


def add_noise_flags(parser: argparse.ArgumentParser) -> None:
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


def noise_main(args) -> int:
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


# ----------------------------------------------------------------- power: resampled A/A pairs
def from_probe_noise(path: str, estimator: str) -> list[tuple[float, str]]:
  """(log(head/base), order) of every pair in a probe_noise.json."""
  with open(path) as f:
    data = json.load(f)
  out = []
  for p in data["pairs"]:
    b, h = p["base"]["metrics"].get(estimator), p["head"]["metrics"].get(estimator)
    if b and h:
      out.append((math.log(h / b), p["order"]))
  return out


def config_order(suite: str) -> list[str]:
  """The suite's configurations in its sweep file's order: the order `ab` schedules them
  in, which sets each pair's order (ab.schedule)."""
  sweep = sweep_file.load(os.path.join(REPO, suites.SUITES[suite].sweep))
  return list(dict.fromkeys(t.config for t in sweep_file.expand(sweep, seeds=(1,))))


def from_ab_dir(workdir: str, design: probe.Design,
                order_of_configs: list[str]) -> list[tuple[float, str]]:
  """(log(head/base), order) of every probe pair under an A/A A/B's directory
  (probe/<suite>/<side>/<config>/seed=<s>/round=<r>/). One seed a configuration, so
  ab.schedule ran round r of the c-th probed configuration (order_of_configs, the
  sweep's order) base first when r + c is even."""
  out = []
  pattern = os.path.join(workdir, "probe", "*", "base", "*", "*", "round=*")
  found = sorted(glob.glob(pattern))
  probed = [c for c in order_of_configs
            if any(f"{os.sep}{c}{os.sep}" in d for d in found)]
  for base_dir in found:
    head_dir = base_dir.replace(f"{os.sep}base{os.sep}", f"{os.sep}head{os.sep}", 1)
    b, h = results.read(base_dir), results.read(head_dir)
    if not (b and h):
      continue
    vb, vh = probe.values(b, design)[design.judged], probe.values(h, design)[design.judged]
    config = os.path.basename(os.path.dirname(os.path.dirname(base_dir)))
    if vb and vh and config in probed:
      r = int(base_dir.rsplit("round=", 1)[1]) + probed.index(config)
      out.append((math.log(vh / vb), "AB" if r % 2 == 0 else "BA"))
  return out


def share_called(logs: np.ndarray, orders: np.ndarray, rule, pairs: int, loss: float,
                 runs: int, level: float, min_effect: float, rng) -> float:
  """Share of `runs` resampled A/B runs of `pairs` pairs, every pair slowed by `loss`,
  whose pooled row is a regression. Half the pairs are drawn from those that ran base
  first, half from the others, as ABBA balances them."""
  called = 0
  shift = math.log(1 - loss)
  first, second = np.flatnonzero(orders == "AB"), np.flatnonzero(orders == "BA")
  for _ in range(runs):
    pick = np.concatenate([rng.choice(first, pairs - pairs // 2),
                           rng.choice(second, pairs // 2)])
    est = rule(logs[pick] + shift, list(orders[pick]), level)
    called += paired.verdict(est, False, min_effect) == paired.REGRESSION
  return called / runs


def add_power_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--probe_noise", action="append", default=[],
                      help="the noise step's probe_noise.json (repeatable)")
  parser.add_argument("--ab_dirs", action="append", default=[],
                      help="A/A `replibench ab` workdirs, a glob (repeatable)")
  parser.add_argument("--suite", default="resnet", help="the suite the A/A runs probed")
  parser.add_argument("--pairs", default="8,12")
  parser.add_argument("--losses", default="0,0.05,0.10")
  parser.add_argument("--rows", type=int, default=4, help="rows judged together (Bonferroni)")
  parser.add_argument("--runs", type=int, default=4000)
  parser.add_argument("--seed", type=int, default=0)


def power_main(args) -> int:
  design = probe.Design()
  found = [x for path in args.probe_noise for x in from_probe_noise(path, design.judged)]
  for pattern in args.ab_dirs:
    for d in sorted(glob.glob(pattern)):
      found += from_ab_dir(d, design, config_order(args.suite))
  if len(found) < 8:
    print(f"probe_study.py power: {len(found)} A/A pairs found; need at least 8 (--probe_noise, "
          f"--ab_dirs)", file=sys.stderr)
    return 2
  logs = np.array([x for x, _ in found])
  flip = {"AB": "BA", "BA": "AB"}
  orders = np.array([o for _, o in found] + [flip[o] for _, o in found])
  logs = np.concatenate([logs, -logs])
  robust = 1.4826 * float(np.median(np.abs(logs)))
  print(f"{len(found)} real A/A pairs of '{design.judged}': sd {logs.std(ddof=1):.4f}, "
        f"robust sd (1.4826 MAD) {robust:.4f}, |log ratio| > 0.07 in "
        f"{np.mean(np.abs(logs) > 0.07):.0%}")
  level = paired.bonferroni(paired.LEVEL, args.rows)
  losses = [float(x) for x in args.losses.split(",")]
  header = " | ".join(f"{'A/A alarms' if x == 0 else f'{x:.0%} loss caught'}" for x in losses)
  print(f"\n| pooling | pairs | {header} |\n|---|---|" + "---|" * len(losses))
  rng = np.random.default_rng(args.seed)
  for name, rule in RULES.items():
    for n in (int(x) for x in args.pairs.split(",")):
      cells = [share_called(logs, orders, rule, n, loss, args.runs, level, probe.MIN_EFFECT,
                            rng) for loss in losses]
      print(f"| {name} | {n} | " + " | ".join(f"{c:.1%}" for c in cells) + " |", flush=True)
  return 0



def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  steps = parser.add_subparsers(dest="step", required=True)
  add_noise_flags(steps.add_parser("noise", help="run the probe: each estimator's paired noise"))
  add_power_flags(steps.add_parser("power", help="resample real A/A pairs: each rule's power"))
  args = parser.parse_args()
  return noise_main(args) if args.step == "noise" else power_main(args)


if __name__ == "__main__":
  sys.exit(main())
