"""Where a profiled run's step time went, per process: compute, exchange, waiting.

    .venv/bin/python benchmarks/scaling/step_split.py RUN_DIR [--json=FILE]

RUN_DIR: the workdir of `replibench run` or `replibench launch ... -- run` given
--profile_steps=A,B (the chief's trace in RUN_DIR/plugins/profile, worker k's in
RUN_DIR/worker<k>/plugins/profile: the newest of each is read). Prints a markdown
table per process: each traced call's wall time a step split into compute (ops that
are not collectives), exchange (collectives and sends between devices, not hidden
under compute) and waiting (covered by no op), in ms and as shares, and the exchange
hidden under compute (replibench/harness/step_split.py says how, from TensorFlow's own
Trace Viewer converter). Exit 2 if RUN_DIR holds no profile.
"""

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from replibench.harness import step_split  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("directory")
  parser.add_argument("--json", default="", help="also write each call's split to this file")
  args = parser.parse_args()
  splits = step_split.split_run(args.directory)
  if not any(splits.values()):
    print(f"step_split.py: no profiled step under {args.directory} (was the run given "
          f"--profile_steps?)", file=sys.stderr)
    return 2
  print(step_split.format_table(splits))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({name: {"calls": [dataclasses.asdict(c) for c in calls],
                        "mean": step_split.summary(calls)} for name, calls in splits.items()},
                f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
