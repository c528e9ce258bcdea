"""How many A/B pairs a paired noise needs: power and false alarms, by simulation or by
resampling measured A/A runs.

The paired noise is the standard deviation of log(head/base) over the pairs of A/A
runs (both sides the same code: every difference is noise). Two ways in:

- **Simulated** (--noise=SD,...): for each noise and each number of pairs, the share of
  simulated A/B runs that call a regression for a true loss of --effect and for no
  change (replibench.tracking.paired.simulate: the tracker's own interval and verdict,
  at the Bonferroni level of --rows judged rows and its minimum effect). --order_effect=G
  draws pairs alternating base-first and head-first, the ratio of the first G times
  the second's (the measured ResNet A/A: ~1.12), and judges them with the tracker's
  order model (paired.order_estimate); --plain judges them with the plain interval
  instead, to see what modelling the order gains.

      python benchmarks/tracking/tracking_budget.py --noise=0.03,0.06,0.1 --pairs=4,6,10,15,30

- **Measured** (AB_JSON ...: the ab.json of A/A runs, as
  `benchmarks/tracking/tracking_power.py --kind=aa` or `replibench ab --aa` write them;
  with --throughput_from, also runs whose change cannot move examples/s, such as a
  learning-rate change): prints per configuration and metric the paired noise of
  their pairs, then resamples those measured log ratios (with replacement,
  configuration by configuration: no normal assumption) into simulated A/B runs of
  --pairs pairs a configuration, adds the true effect, and judges each with the
  tracker's own verdict (replibench.tracking.verdicts.rows): the share that calls a
  regression for the effect (power) and for none (false alarms).

      python benchmarks/tracking/tracking_budget.py runs/power/aa/run*/ab.json \\
          --throughput_from='runs/power/lr/run*/ab.json' --pairs=3,6 --effect=0.1 [--suite=sngan]
"""

import argparse
import collections
import glob
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.

from replibench.tracking import paired, verdicts  # noqa: E402

METRICS = ("examples_per_s", "time_to_target_s", "steps_to_target")
# Flags of the simulated noise only (a measured run refuses them off their defaults).
SIMULATED_ONLY = ("noise", "rows", "min_effect", "order_effect", "plain")


# ----------------------------------------------------------------- simulated noise
def simulated_table(args) -> None:
  """Power / false alarms for each --noise (rows) and --pairs (columns), printed."""
  design = dict(order_effect=args.order_effect, model_order=not args.plain)
  level = paired.bonferroni(0.95, args.rows)
  print(f"power (a {args.effect:.0%} loss of throughput called a regression) / false alarms "
        f"(A/A called a regression), {args.runs} simulated A/B runs each, interval level "
        f"{level:.1%}, minimum effect {args.min_effect:.0%}")
  pairs = [int(p) for p in args.pairs.split(",")]
  print("noise \\ pairs " + "".join(f"{p:>14}" for p in pairs))
  for noise in (float(x) for x in args.noise.split(",")):
    cells = []
    for n in pairs:
      power = paired.simulate(1 - args.effect, noise, n, args.runs, False, args.min_effect,
                              level, seed=1, **design)[paired.REGRESSION]
      alarm = paired.simulate(1.0, noise, n, args.runs, False, args.min_effect, level,
                              seed=2, **design)[paired.REGRESSION]
      cells.append(f"{power:6.0%} / {alarm:4.1%}")
    print(f"{noise:>13.3f} " + "".join(f"{c:>14}" for c in cells))


# ----------------------------------------------------------------- measured A/A pairs
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


def measured_table(args) -> None:
  """Each configuration's measured paired noise, then power / false alarms resampled."""
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


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("ab_json", nargs="*", help="measured: A/A runs' ab.json files")
  parser.add_argument("--noise", default=None, help="simulated: paired noises, e.g. 0.02,0.06")
  parser.add_argument("--pairs", default="3,4,6,10,15,30",
                      help="pairs (a configuration, when measured)")
  parser.add_argument("--effect", type=float, default=0.1, help="loss of throughput")
  parser.add_argument("--runs", type=int, default=4000, help="A/B runs simulated a cell")
  parser.add_argument("--rows", type=int, default=3, help="simulated: rows judged together")
  parser.add_argument("--min_effect", type=float, default=0.05, help="simulated")
  parser.add_argument("--order_effect", type=float, default=1.0, help="simulated")
  parser.add_argument("--plain", action="store_true",
                      help="simulated: judge without the order model")
  parser.add_argument("--throughput_from", default=None,
                      help="measured: a glob of ab.json files read for examples/s only")
  parser.add_argument("--suite", default="resnet", help="measured: the suite whose pairs to read")
  args = parser.parse_args()
  if bool(args.ab_json) == bool(args.noise):
    parser.error("give either --noise=SD,... (simulated) or A/A runs' ab.json files "
                 "(measured), not both and not neither")
  if args.ab_json:
    wrong = [f"--{k}" for k in SIMULATED_ONLY if getattr(args, k) != parser.get_default(k)]
    if wrong:
      parser.error(f"{', '.join(wrong)}: flags of the simulated noise; measured pairs are "
                   "judged by the tracker's own verdict (its levels and order model)")
    missing = [p for p in args.ab_json if not os.path.isfile(p)]
    if missing:
      parser.error(f"no such ab.json: {', '.join(missing)} (an A/B's workdir has one)")
    measured_table(args)
  else:
    simulated_table(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
