"""Calibrates this machine's DeviceProfile: one worker process on one core.

Hardware efficiency is measured, not assumed, on the machine that validates the
predictions (results/predict/README.md):
- compute: one pinned worker (`launch --workers 1 --cpus_per_worker 1`) trains the
  config at two global batches; seconds per step t(b) = overhead_s + b F / A gives
  the per-step overhead and the achieved FLOP/s A (F: the plan's FLOPs per example);
- communication: two pinned workers at the larger batch; what their step takes
  beyond its compute is the step's collectives, whose count the plan gives: their
  per-hop latency over the cluster's (unlimited) loopback link;
- the loopback's own bandwidth (--loopback_mbit): what gRPC moves over the
  unlimited link, from benchmarks/predict/calibrate_collectives.py's fit (collectives of
  0.3-4.9 MB timed alone).
Training calls only (evaluation and checkpoints out of the way), median of --rounds.
Writes the profile (gin) with the figures in its header, and prints them.

  .venv/bin/python benchmarks/predict/calibrate_device.py --out=configs/devices/epyc_avx512_core.gin \\
    --loopback_mbit=7068
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from benchmarks.scaling.scaling import REPO, Setup, Workload, measure  # noqa: E402

CONFIG = "configs/resnet/fashion_mnist.gin"


def _plan() -> dict:
  out = subprocess.run([sys.executable, "-m", "replibench.cli", "plan", f"--gin_file={CONFIG}",
                        "--json"], cwd=REPO, capture_output=True, text=True, check=True)
  return json.loads(out.stdout)


def _step_s(batch: int, workers: int, rounds: int, steps: int) -> float:
  w = Workload("resnet", CONFIG, batch, steps)
  rates = [measure(w, Setup(f"workers={workers}", "workers", workers))["examples_per_s"]
           for _ in range(rounds)]
  return batch / statistics.median(rates)


def _flags() -> str:
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    flags = next(line for line in f if line.startswith("flags")).split()
  return " ".join(f for f in flags if f in ("avx2", "avx512f", "avx512bw", "avx512_vnni",
                                            "avx512_bf16", "fma"))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--batches", default="64,256")
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--loopback_mbit", type=float, required=True,
                      help="the unlimited loopback's bandwidth from calibrate_collectives.py")
  args = parser.parse_args()
  small, large = (int(b) for b in args.batches.split(","))
  plan = _plan()
  flops = plan["train_flops_per_example"]
  t_small, t_large = (_step_s(b, 1, args.rounds, args.steps) for b in (small, large))
  achieved = flops * (large - small) / (t_large - t_small)
  overhead = t_small - small * flops / achieved
  t_two = _step_s(large, 2, args.rounds, args.steps)
  compute_two = overhead + large / 2 * flops / achieved
  collectives = plan["communication"]["collectives_per_step"]
  latency = max(t_two - compute_two, 0.0) / (collectives * 2 * (2 - 1))
  figures = (f"1 worker: {t_small * 1e3:.2f} ms/step at batch {small}, {t_large * 1e3:.2f} at "
             f"{large}; 2 workers at {large}: {t_two * 1e3:.2f} ms/step ({compute_two * 1e3:.2f} "
             f"compute, {collectives:g} collectives a step)")
  print(figures)
  print(f"achieved {achieved / 1e9:.2f} GFLOP/s a core, overhead {overhead * 1e3:.2f} ms a step, "
        f"collective hop latency {latency * 1e6:.0f} us")
  measured = textwrap.fill(f"TensorFlow 2.21 CPU. Every number below was measured here "
                           f"(ResNet, {CONFIG}, training calls only): {figures}.",
                           width=86, initial_indent="#   ", subsequent_indent="#   ")
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(PROFILE.format(flags=_flags(), measured=measured, achieved=achieved,
                           overhead=overhead, latency=latency, cores=os.cpu_count(),
                           out=args.out, loopback_mbit=args.loopback_mbit,
                           loopback=args.loopback_mbit * 1e6 / 8))
  return 0


PROFILE = """\
# Device profile: one core of this 2-core AMD EPYC, as one worker process of
# `replibench launch` (one replica per worker), measured by benchmarks/predict/calibrate_device.py.
#
#   .venv/bin/python benchmarks/predict/calibrate_device.py --out={out} \\
#     --loopback_mbit={loopback_mbit:g}
#   replibench predict --gin_file=configs/resnet/fashion_mnist.gin \\
#     --gin_bindings="Experiment.target = 0.90" --workers=2 \\
#     --device_profile={out}
#
# Hardware: 2-core AMD EPYC, 24 GiB, no GPU; lscpu flags {flags}.
{measured}
# - peak_flops is the achieved rate (achieved_fraction 1): a CPU core's peak is not
#   what bounds these steps.
# - shared_cores: the machine's cores; more workers than cores share them.
# - inter_host_latency_s: the per-hop latency of a collective over the cluster's
#   loopback (gRPC); a launched cluster shares one link (shared_link).
# - inter_host_bytes_per_s: the unlimited loopback's bandwidth under gRPC,
#   {loopback_mbit:,.0f} Mbit/s (benchmarks/predict/calibrate_collectives.py's fit); `--network`
#   sets a slower rate.
# Target / result: results/predict/README.md (predicted against measured time to 90%).

predict.DeviceProfile.name = 'AMD EPYC core (one launch worker)'
predict.DeviceProfile.peak_flops = {achieved:.4g}
predict.DeviceProfile.achieved_fraction = 1.0
predict.DeviceProfile.overhead_s = {overhead:.4g}
predict.DeviceProfile.devices_per_host = 1
predict.DeviceProfile.shared_link = True
predict.DeviceProfile.shared_cores = {cores}
predict.DeviceProfile.inter_host_latency_s = {latency:.4g}
predict.DeviceProfile.inter_host_bytes_per_s = {loopback:.4g}
"""


if __name__ == "__main__":
  sys.exit(main())
