"""The same 2-worker ResNet run through `launch --backend=slurm` and the local `launch`.

Starts the tests' one-node SLURM (tests/slurm_local.py: Debian's munged, slurmctld and
slurmd under a private directory, stopped by PID; root), then runs configs/resnet/
scaling.gin's workers=2 point (2 worker processes, 1 CPU each, to 85% top-1) for each
seed in turn as: a SLURM job (2 tasks, --cpus_per_task=1; task/none binds no core), a
local launch unpinned, and a local launch pinned to a core a worker (the scaling
sweep's setting). Rounds alternate the three, so a drift of the machine's speed falls
on all. Prints each run's steps to target, time to target and examples/s, and the
ratios of the SLURM job's means to each local launch's; --json writes them too.

  .venv/bin/python benchmarks/cluster/slurm_vs_launch.py --seeds 3 --json results/cluster/slurm_vs_launch.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)
from tests import slurm_local  # noqa: E402  pylint: disable=wrong-import-position

RB = [sys.executable, "-m", "replibench.cli"]
CONFIG = ("--gin_file=configs/resnet/scaling.gin", "--gin_file=configs/topology/workers.gin")
SETUPS = {
    "slurm": ("launch", "--backend=slurm", "--workers=2", "--cpus_per_task=1", "--noexclusive"),
    "launch": ("launch", "--workers=2"),
    "launch pinned": ("launch", "--workers=2", "--cpus_per_worker=1"),
}
KEYS = ("steps_to_target", "time_to_target_s", "examples_per_s")


def run_once(setup: str, seed: int, workdir: str, env: dict) -> dict:
  """One run's result.json fields (KEYS, status, wall seconds of the whole command)."""
  command = [*RB, *SETUPS[setup], "--", "run", *CONFIG,
             f"--gin_bindings=Experiment.seed = {seed}", f"--workdir={workdir}"]
  start = time.monotonic()
  proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=1800)
  wall = time.monotonic() - start
  if proc.returncode != 0:
    raise SystemExit(f"{setup} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  with open(os.path.join(workdir, "result.json")) as f:
    result = json.load(f)
  return {"status": result["status"], "command_s": wall, **{k: result[k] for k in KEYS}}


def summarise(runs: dict) -> dict:
  """Per setup, each metric's mean; and the SLURM job's mean over each local setup's."""
  means = {setup: {k: statistics.fmean(r[k] for r in rows) for k in (*KEYS, "command_s")}
           for setup, rows in runs.items()}
  ratios = {local: {k: means["slurm"][k] / means[local][k] for k in means["slurm"]}
            for local in means if local != "slurm"}
  return {"means": means, "slurm_over": ratios}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--json", help="also write the runs and ratios here")
  args = parser.parse_args()
  reason = slurm_local.unavailable()
  if reason:
    print(f"slurm_vs_launch: {reason}", file=sys.stderr)
    return 2
  runs = {setup: [] for setup in SETUPS}
  with tempfile.TemporaryDirectory(prefix="slurm-vs-launch-") as tmp:
    slurm = slurm_local.LocalSlurm(os.path.join(tmp, "slurm")).start()
    try:
      env = {**os.environ, **slurm.env()}
      for seed in range(1, args.seeds + 1):
        for setup in SETUPS:
          row = run_once(setup, seed, os.path.join(tmp, f"{setup}-{seed}"), env)
          runs[setup].append({"seed": seed, **row})
          print(f"{setup:14s} seed {seed}: {row['status']}, {row['steps_to_target']} steps, "
                f"{row['time_to_target_s']:.1f} s to target, {row['examples_per_s']:.0f} "
                f"examples/s ({row['command_s']:.1f} s the whole command)", flush=True)
    finally:
      slurm.stop()
  summary = summarise(runs)
  for local, ratios in summary["slurm_over"].items():
    print(f"slurm / {local}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"runs": runs, **summary}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
