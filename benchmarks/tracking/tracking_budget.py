"""How many A/B pairs a given paired noise needs: power and false alarms by simulation.

For each paired noise (the standard deviation of log(head/base) over A/A pairs, as
measured by benchmarks/tracking/tracking_power.py --kind=aa) and each number of pairs, the
share of simulated A/B runs that call a regression for a true loss of --effect and
for no change (replibench.tracking.paired.simulate: the tracker's own interval and
verdict, at the Bonferroni level of --rows judged rows and its minimum effect).

  python benchmarks/tracking/tracking_budget.py --noise=0.03,0.06,0.1 --pairs=4,6,10,15,30

--order_effect=G draws pairs alternating base-first and head-first, the ratio of the
first G times the second's (the measured ResNet A/A: ~1.12), and judges them with the
tracker's order model (paired.order_estimate); --plain judges them with the plain
interval instead, to see what modelling the order gains.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from replibench.tracking import paired  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--noise", default="0.02,0.04,0.06,0.1")
  parser.add_argument("--pairs", default="3,4,6,10,15,30")
  parser.add_argument("--effect", type=float, default=0.1, help="loss of throughput")
  parser.add_argument("--rows", type=int, default=3, help="rows judged together")
  parser.add_argument("--min_effect", type=float, default=0.05)
  parser.add_argument("--runs", type=int, default=4000)
  parser.add_argument("--order_effect", type=float, default=1.0)
  parser.add_argument("--plain", action="store_true", help="judge without the order model")
  args = parser.parse_args()
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
  return 0


if __name__ == "__main__":
  sys.exit(main())
