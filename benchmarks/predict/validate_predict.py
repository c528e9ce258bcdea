"""Predicted against measured time to target on this machine's worker topologies.

For each setup (1, 2 and 4 launched worker processes, and 2 workers over a
100 and a 50 Mbit/s link), runs `replibench predict` with this machine's calibrated profile
and the workload's statistical-efficiency file, then trains the same config to
its target (`replibench launch -- run`), and prints predicted and measured seconds
per step, steps to target, evaluation seconds and time to target, with their ratio
(goal: time within 15%), and how many runs fell inside the prediction interval for
one run (a run's steps scatter about the fitted mean: seeds, reduction order). Needs
a quiet machine (times are measured).

  .venv/bin/python benchmarks/predict/validate_predict.py \\
    --device_profile=configs/devices/epyc_avx512_core.gin \\
    --efficiency=results/predict/resnet_fashion_mnist.json [--seeds 1,2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
CONFIG = "configs/resnet/fashion_mnist.gin"
# The batch-size sweep's recipe (configs/resnet/batch_size.sweep) at its target.
BINDINGS = ("Experiment.target = 0.90", "Experiment.eval_every_epochs = 0.25",
            "Experiment.checkpoint_every_epochs = 12", "Experiment.log_every_steps = 100")
SETUPS = (("1 worker", 1, 1, "none"), ("2 workers", 2, 1, "none"),
          ("4 workers (2 cores)", 4, 0, "none"), ("2 workers, 100 Mbit/s", 2, 1, "100mbit"),
          ("2 workers, 50 Mbit/s", 2, 1, "50mbit"))


def _cli(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "replibench.cli", *args], cwd=REPO,
                        capture_output=True, text=True)


def predicted(args, workers: int, network: str) -> dict:
  out = _cli("predict", f"--gin_file={CONFIG}", *(f"--gin_bindings={b}" for b in BINDINGS),
             f"--device_profile={args.device_profile}", f"--efficiency={args.efficiency}",
             f"--workers={workers}", f"--network={network}", "--json")
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout)


def measured(workers: int, cpus: int, network: str, seed: int) -> dict:
  with tempfile.TemporaryDirectory() as workdir:
    out = _cli("launch", f"--workers={workers}", f"--cpus_per_worker={cpus}",
               f"--network={network}", "--", "run", f"--gin_file={CONFIG}",
               "--gin_file=configs/topology/workers.gin",
               *(f"--gin_bindings={b}" for b in (*BINDINGS, f"Experiment.seed = {seed}")),
               f"--workdir={workdir}")
    path = os.path.join(workdir, "result.json")
    if out.returncode or not os.path.exists(path):
      raise RuntimeError(f"{out.stdout[-2000:]}{out.stderr[-3000:]}")
    with open(path, encoding="utf-8") as f:
      return json.load(f)


def row(label: str, p: dict, runs: list[dict]) -> str:
  reached = [r for r in runs if r["status"] == "reached"]
  if not reached:
    return f"{label:24s} predicted {p['time_to_target_s']:7.1f} s; measured: target missed"
  mean = lambda key: sum(r[key] for r in reached) / len(reached)  # noqa: E731
  step_s = p["global_batch_size"] / mean("examples_per_s")
  time = mean("time_to_target_s")
  low, high = p["run_time_interval_s"]
  inside = sum(low <= r["time_to_target_s"] <= high for r in reached)
  return (f"{label:24s} step {p['step_s'] * 1e3:6.1f} / {step_s * 1e3:6.1f} ms "
          f"({p['step_s'] / step_s:.3f})   "
          f"steps {p['steps_to_target']:5.0f} / {mean('steps_to_target'):5.0f}   "
          f"eval {p['eval_s']:5.2f} / {mean('eval_s'):5.2f} s   "
          f"time {p['time_to_target_s']:6.1f} / {time:6.1f} s   "
          f"ratio {p['time_to_target_s'] / time:.3f}   ({len(reached)}/{len(runs)} reached; "
          f"{inside} inside one run's interval [{low:.1f}, {high:.1f}] s)")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--device_profile", required=True)
  parser.add_argument("--efficiency", required=True)
  parser.add_argument("--seeds", default="1")
  parser.add_argument("--setups", default="", help="semicolon-separated labels (default: all)")
  args = parser.parse_args()
  print("predicted / measured, per setup (global batch 256, ResNet to 90%)", flush=True)
  for label, workers, cpus, network in SETUPS:
    if args.setups and label not in args.setups.split(";"):
      continue
    p = predicted(args, workers, network)
    runs = [measured(workers, cpus, network, int(s)) for s in args.seeds.split(",")]
    print(row(label, p, runs), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
