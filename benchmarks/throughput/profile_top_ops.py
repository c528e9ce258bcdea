"""Where a profiled run's time went, as text: the top ops of its TensorFlow profile.

    .venv/bin/python benchmarks/throughput/profile_top_ops.py RUN_DIR [--top=20] [--out=FILE.md]

RUN_DIR: a `replibench run --profile_steps=A,B` workdir (its result.json says which
trace and how many calls; the newest trace is read), a TensorBoard logdir, or one
trace directory (LOGDIR/plugins/profile/<start time>). Prints markdown tables: the
TensorFlow op types and ops by self time on the host and on each device, and where
XLA compiled the step, its HLO op categories and ops, with each one's share of the
busy time (idle left out), per traced call. The tables are those of TensorBoard's
profile plugin (Framework Op Stats, HLO Op Stats), made by the converter TensorFlow
ships for it, so no TensorBoard or browser is needed (the accelerator run uses this).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from replibench.harness import profiling  # noqa: E402


def traces(directory: str) -> tuple[list[str], int]:
  """(the .xplane.pb files of directory's newest trace, traced calls (1 if unknown))."""
  result_path = os.path.join(directory, "result.json")
  calls = 1
  if os.path.exists(result_path):
    record = (json.load(open(result_path)).get("profile") or {})
    if record.get("trace_dir"):
      return (profiling.xplane_files(os.path.join(directory, record["trace_dir"])),
              max(record.get("calls") or 1, 1))
  files = profiling.xplane_files(directory)
  newest = max((os.path.dirname(f) for f in files), default=None)
  return [f for f in files if os.path.dirname(f) == newest], calls


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("directory")
  parser.add_argument("--top", type=int, default=20)
  parser.add_argument("--out", default="", help="also write the tables to this file")
  args = parser.parse_args()
  files, calls = traces(args.directory)
  if not files:
    print(f"profile_top_ops.py: no .xplane.pb under {args.directory} (was the run given "
          f"--profile_steps?)", file=sys.stderr)
    return 2
  text = (f"Trace: {os.path.dirname(files[0])} ({len(files)} host file(s), {calls} "
          f"traced call(s))\n\n" + profiling.format_top_ops(profiling.top_ops(files, args.top),
                                                           calls))
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
