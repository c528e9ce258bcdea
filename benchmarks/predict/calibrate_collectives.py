"""Collective time against bytes, participants and bandwidth, on launched workers.

The hardware model of `replibench predict` (replibench/predict/hardware.py) prices a
step's all-reduces on a launched cluster's one shared link as

  t = collectives * 2(n-1) * latency / core_share + 2(n-1) * M / bandwidth

(n workers, M bytes a replica; core_share < 1 where more workers than cores). This
measures t: each point is a short launched run (`replibench launch --workers N
--network RATE -- run --max_steps 2`) whose init replays the step's recorded
collectives alone (result.json `communication.collective_s_per_step`: the same
all-reduces in the same order and sizes, 10 times, back to back, no compute beside
them, so a token-bucket link's burst helps only the first). Payloads vary with the
ResNet's widths (one packed gradient all-reduce of 0.3 to 4.9 MB), participants with
--workers, bandwidth with --network. It prints every point against the predictor's
model with --device_profile, and fits latency and bandwidth by least squares per
network and worker count, and per network over all worker counts (the bandwidth
calibrate_device.py's --loopback_mbit takes).

  .venv/bin/python benchmarks/predict/calibrate_collectives.py \\
    --device_profile=configs/devices/epyc_avx512_core.gin --workers=2,4 --networks=none,100mbit

Needs a quiet machine (times are measured).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import gin
import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)  # The checkout.
from replibench.predict import hardware, predictor  # noqa: E402  pylint: disable=wrong-import-position

CONFIG = "configs/resnet/scaling.gin"
WIDTHS = {"1x": "(16, 32, 64)", "2x": "(32, 64, 128)", "4x": "(64, 128, 256)"}


def replay(workers: int, network: str, widths: str) -> dict:
  """result.json's communication account of a 2-step launched run."""
  bindings = ["small_resnet.norm_layer = @engine.per_replica_batch_norm",
              f"small_resnet.widths = {widths}", f"topology.MultiWorker.workers = {workers}",
              "Experiment.eval_every_epochs = 1000", "Experiment.checkpoint_every_epochs = 1000"]
  with tempfile.TemporaryDirectory() as workdir:
    command = [sys.executable, "-m", "replibench.cli", "launch", f"--workers={workers}",
               f"--cpus_per_worker={1 if workers <= os.cpu_count() else 0}",
               f"--network={network}", "--", "run", f"--gin_file={CONFIG}",
               "--gin_file=configs/topology/workers.gin",
               *(f"--gin_bindings={b}" for b in bindings), "--max_steps=2", f"--workdir={workdir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    path = os.path.join(workdir, "result.json")
    if done.returncode or not os.path.exists(path):
      raise SystemExit(f"workers={workers} network={network}: exit {done.returncode}\n"
                       f"{done.stderr[-3000:]}")
    with open(path, encoding="utf-8") as f:
      return json.load(f)["communication"]


def modelled(account: dict, n: int, profile) -> float:
  """The predictor's all-reduce seconds for the replayed collectives (outputs, reduced
  once per call, are not in the replay); the replay's link idles only before its first
  repeat, so no burst."""
  collectives = sum(v["count"] for k, v in account["by_kind"].items() if k != "outputs")
  payload = sum(v["bytes"] for k, v in account["by_kind"].items() if k != "outputs")
  return hardware.allreduce_seconds(profile, payload, collectives, n, idle_s=0.0)


def load_profile(path: str, network: str):
  """The DeviceProfile in gin file `path`, with its link at `network`."""
  gin.clear_config()
  gin.parse_config_file(path)
  return predictor.with_network(hardware.DeviceProfile(), network)


def fit(points) -> tuple[float, float]:
  """Least squares t = hops * latency + link_bytes / bandwidth: (latency s, bytes/s)."""
  x = np.array([[hops, link] for hops, link, _ in points], dtype=float)
  y = np.array([t for _, _, t in points])
  (latency, inverse), *_ = np.linalg.lstsq(x, y, rcond=None)
  return latency, (1.0 / inverse if inverse > 0 else float("inf"))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", default="2,4")
  parser.add_argument("--networks", default="none,100mbit")
  parser.add_argument("--widths", default="1x,2x,4x")
  parser.add_argument("--device_profile", default="configs/devices/epyc_avx512_core.gin")
  args = parser.parse_args()
  print(f"{'network':>8s} {'W':>2s} {'width':>5s} {'MB a replica':>12s} {'hops':>5s} "
        f"{'measured ms':>11s} {'model ms':>9s} {'ratio':>6s}", flush=True)
  for network in args.networks.split(","):
    profile = load_profile(os.path.join(REPO, args.device_profile), network)
    every = []   # All worker counts' points: the link's bandwidth (the profile's figure).
    for n in (int(w) for w in args.workers.split(",")):
      points = []
      for width in args.widths.split(","):
        account = replay(n, network, WIDTHS[width])
        measured = account["collective_s_per_step"]
        model = modelled(account, n, profile)
        replayed = {k: v for k, v in account["by_kind"].items() if k != "outputs"}
        payload = sum(v["bytes"] for v in replayed.values())
        hops = sum(v["count"] for v in replayed.values()) * 2 * (n - 1)
        points.append((hops, 2 * (n - 1) * payload, measured))
        print(f"{network:>8s} {n:2d} {width:>5s} {payload / 1e6:12.3f} {hops:5.0f} "
              f"{measured * 1e3:11.2f} {model * 1e3:9.2f} {measured / model:6.2f}", flush=True)
      latency, bandwidth = fit(points)
      print(f"{network:>8s} {n:2d} fit: latency {latency * 1e3:.3f} ms a hop, bandwidth "
            f"{bandwidth * 8 / 1e6:,.0f} Mbit/s (profile: {profile.inter_host_latency_s * 1e3:.3f}"
            f" ms x {1 / profile.core_share(n):g}, {profile.inter_host_bytes_per_s * 8 / 1e6:,.0f}"
            f" Mbit/s)", flush=True)
      every += points
    latency, bandwidth = fit(every)
    print(f"{network:>8s} all fit: latency {latency * 1e3:.3f} ms a hop, bandwidth "
          f"{bandwidth * 8 / 1e6:,.0f} Mbit/s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
