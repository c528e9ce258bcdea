"""The throughput probe's power, resampled from real A/A pairs: how each way of pooling
the pairs (mean, order model, trimmed mean) does on the noise this machine really has.

tracking_budget.py simulates normal (or Student t) noise; the probe's is neither: most
pairs of identical code agree within 2-3%, and now and then a process runs 10-30% slow
for its whole life (the machine, not the code). This takes the real A/A pairs of the
judged estimator (probe.JUDGED) from probe_noise.py's output and from A/A `replibench ab`
directories, symmetrizes them (an A/A pair read the other way round, head as base, is as
likely: the order flips with it), and for each pooling rule and number of pairs draws
--runs A/B runs of that many pairs with a true loss added to every pair, judged as the
A/B judges the probe's pooled row (the Bonferroni level of --rows rows, a minimum effect
of probe.MIN_EFFECT). It prints the share of runs called a regression: the false-alarm
rate at no loss, the power at each loss.

  .venv/bin/python benchmarks/tracking/probe_power.py --probe_noise=runs/probe_noise/probe_noise.json \\
      --ab_dirs='runs/power_real/*/aa-0-k0/*' --pairs=8,12 --losses=0,0.05,0.10

No process is run: seconds, on what earlier runs wrote.
"""

import argparse
import glob
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from replibench import results  # noqa: E402
from replibench.suite import sweep_file  # noqa: E402
from replibench.tracking import paired, probe, suites  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))

RULES = {
    "mean": lambda logs, orders, level: paired.estimate(logs, level),
    "order model": lambda logs, orders, level: paired.order_estimate(logs, orders, None, level),
    "trimmed": lambda logs, orders, level: paired.trimmed_estimate(logs, level, orders=orders),
}


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


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--probe_noise", action="append", default=[],
                      help="a probe_noise.py output (repeatable)")
  parser.add_argument("--ab_dirs", action="append", default=[],
                      help="A/A `replibench ab` workdirs, a glob (repeatable)")
  parser.add_argument("--suite", default="resnet", help="the suite the A/A runs probed")
  parser.add_argument("--pairs", default="8,12")
  parser.add_argument("--losses", default="0,0.05,0.10")
  parser.add_argument("--rows", type=int, default=4, help="rows judged together (Bonferroni)")
  parser.add_argument("--runs", type=int, default=4000)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  design = probe.Design()
  found = [x for path in args.probe_noise for x in from_probe_noise(path, design.judged)]
  for pattern in args.ab_dirs:
    for d in sorted(glob.glob(pattern)):
      found += from_ab_dir(d, design, config_order(args.suite))
  if len(found) < 8:
    print(f"probe_power.py: {len(found)} A/A pairs found; need at least 8 (--probe_noise, "
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


if __name__ == "__main__":
  sys.exit(main())
