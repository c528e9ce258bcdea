"""The paired noise of measured A/B runs, and what it means for a design's power.

Reads the ab.json of A/B runs whose two sides ran the same per-step computation (A/A
runs; with --throughput_from, also runs whose change cannot move examples/s, such as
a learning-rate change), and prints per configuration and metric the standard
deviation of log(head/base) over their pairs. Then it resamples those measured log
ratios (with replacement, configuration by configuration: no normal assumption) into
simulated A/B runs of a design (--pairs per configuration), adds a true effect, and
judges each with the tracker's own verdict (replibench.tracking.verdicts.rows): the
share that calls a regression for the effect (power) and for none (false alarms).

  python benchmarks/tracking/tracking_noise.py runs/power/aa/run*/ab.json \\
      --throughput_from='runs/power/lr/run*/ab.json' --pairs=3 --effect=0.1 [--suite=sngan]
"""

import argparse
import collections
import glob
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from replibench.tracking import paired, verdicts  # noqa: E402

METRICS = ("examples_per_s", "time_to_target_s", "steps_to_target")


def pair_logs(paths, metrics, suite_name=None, orders=None) -> dict:
  """{(config, metric): [log(head/base), ...]} over every pair of these A/B files (of
  one suite's, if suite_name is given); orders, a dict, gets each pair's order ('AB'
  or 'BA') under the same keys."""
  out = collections.defaultdict(list)
  orders = orders if orders is not None else collections.defaultdict(list)
  for path in paths:
    for suite in json.load(open(path))["suites"]:
      if suite_name and suite["suite"] != suite_name:
        continue
      for p in suite["pairs"]:
        for m in metrics:
          b, h = p["base"]["metrics"].get(m), p["head"]["metrics"].get(m)
          if b and h and b > 0 and h > 0:
            out[(p["config"], m)].append(math.log(h / b))
            orders.setdefault((p["config"], m), []).append(p.get("order", "AB"))
  return out


def simulate(logs: dict, metric: str, configs: list, pairs: int, effect: float,
             runs: int, seed: int, orders: dict | None = None) -> float:
  """Share of resampled A/B runs (pairs per configuration) judged a regression; each
  drawn pair keeps its order (orders: as pair_logs fills it), so the tracker's order
  model sees the measured order effect."""
  rng = np.random.default_rng(seed)
  lower = metric != "examples_per_s"
  shift = math.log(1 / (1 - effect)) if lower else math.log(1 - effect)
  hits = 0
  for _ in range(runs):
    ps = []
    for config in configs:
      pool = logs[(config, metric)]
      drawn = rng.integers(0, len(pool), pairs)
      order = (orders or {}).get((config, metric)) or ["AB"] * len(pool)
      ps += [verdicts.Pair(config, i, 0, order[j], verdicts.Side("reached", {metric: 1.0}),
                           verdicts.Side("reached", {metric: math.exp(pool[j] + shift)}))
             for i, j in enumerate(drawn)]
    rows = verdicts.rows(ps, METRICS, True)   # Bonferroni over the suite's 3 metrics.
    hits += any(r.verdict == paired.REGRESSION and r.metric == metric for r in rows)
  return hits / runs


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("ab_json", nargs="+")
  parser.add_argument("--throughput_from", default=None)
  parser.add_argument("--pairs", default="3,6")
  parser.add_argument("--effect", type=float, default=0.1)
  parser.add_argument("--runs", type=int, default=2000)
  parser.add_argument("--suite", default="resnet", help="the suite whose pairs to read")
  args = parser.parse_args()
  orders: dict = {}
  logs = pair_logs(args.ab_json, METRICS, args.suite, orders)
  if args.throughput_from:
    extra_orders: dict = {}
    extra = pair_logs(glob.glob(args.throughput_from), ("examples_per_s",), args.suite,
                      extra_orders)
    for key, values in extra.items():
      logs[key] += values
      orders.setdefault(key, []).extend(extra_orders[key])
  print("paired noise: sd of log(head/base) over A/A pairs")
  for (config, metric), values in sorted(logs.items()):
    v = np.array(values)
    print(f"  {config:12s} {metric:18s} n={v.size:3d}  sd={v.std(ddof=1):.4f}  "
          f"mean={v.mean():+.4f}  max |x|={np.abs(v).max():.3f}")
  for metric in ("examples_per_s", "time_to_target_s"):
    configs = sorted({c for c, m in logs if m == metric})
    for n in (int(x) for x in args.pairs.split(",") if configs):
      power = simulate(logs, metric, configs, n, args.effect, args.runs, 1, orders)
      alarms = simulate(logs, metric, configs, n, 0.0, args.runs, 2, orders)
      print(f"{metric}: {n} pairs x {len(configs)} configs: a {args.effect:.0%} loss called a "
            f"regression in {power:.0%} of resampled A/B runs; A/A in {alarms:.1%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
