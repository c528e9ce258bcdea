"""Bytes on the wire per step, measured against the account, for every regime.

Runs scaling.gin's ResNet recipe for a few steps on W launched worker processes
(`replibench launch --network=none`, so the cluster's only link is its private
loopback, whose counters measure every byte) under each regime, and prints per
regime: the cluster's measured bytes per step (evaluations left out), what the
step's communication account expects (ring algorithms plus the per-transfer
overhead measured at init), their ratio, the regime's own
regime/bytes_communicated (one replica's payload), the measured bytes over Sync's,
and what the cluster sent before its timed run (init_bytes: set-up, the variables'
broadcast, the account's replays). Byte counts, not times: the machine need not be
quiet.

  .venv/bin/python benchmarks/wire_bytes.py --workers 2,4 --steps 25
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGIMES = {
    "sync": [],
    "compressed_8bit": ["Experiment.regime = @regimes.Compressed()",
                        "regimes.Compressed.bits = 8"],
    "compressed_8bit_two_pass": ["Experiment.regime = @regimes.Compressed()",
                                 "regimes.Compressed.bits = 8",
                                 "regimes.Compressed.wire = 'two_pass'"],
    "compressed_top1pct": ["Experiment.regime = @regimes.Compressed()",
                           "regimes.Compressed.top_k = 0.01"],
    "local_sgd_H4": ["Experiment.regime = @regimes.LocalSGD()", "regimes.LocalSGD.sync_every = 4"],
    "gossip_ring": ["Experiment.regime = @regimes.Gossip()",
                    "regimes.Gossip.report_consensus = False"],
    "async_ps": None,   # configs/topology/ps.gin, launched with --ps 1.
}


def measure(regime: str, workers: int, steps: int, workdir: str) -> dict:
  """result.json of a short launched run of regime on workers processes."""
  ps = REGIMES[regime] is None
  topology = "configs/topology/ps.gin" if ps else "configs/topology/workers.gin"
  bindings = [f"topology.MultiWorker.workers = {workers}", f"Experiment.train_epochs = "
              f"{steps * 256 / 60000:.6f}", "Experiment.log_every_steps = 5",
              *(REGIMES[regime] or [])]
  command = [sys.executable, "-m", "replibench.cli", "launch", f"--workers={workers}",
             *(["--ps=1"] if ps else []), "--network=none", "--timeout=900", "--", "run",
             "--gin_file=configs/resnet/scaling.gin", f"--gin_file={topology}",
             *(f"--gin_bindings={b}" for b in bindings), f"--workdir={workdir}"]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"{regime} x {workers}: exit {done.returncode}\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "result.json")) as f:
    return json.load(f)


def row(regime: str, workers: int, result: dict, sync_bytes: float | None) -> str:
  wire = result["network"]
  measured, expected = wire["bytes_on_wire_per_step"], wire.get("expected_bytes_per_step")
  payload = result["regime_metrics"].get("regime/bytes_communicated")
  ratio = f"{measured / expected:.3f}" if expected else "-"
  vs_sync = f"{measured / sync_bytes:.3f}" if sync_bytes else "-"
  return (f"{regime:24s} {workers:3d} {measured:14,.0f} {expected or 0:14,.0f} {ratio:>8s} "
          f"{payload or 0:14,.0f} {vs_sync:>8s} {wire.get('init_bytes', 0):14,.0f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", default="2,4")
  parser.add_argument("--steps", type=int, default=25)
  parser.add_argument("--regimes", default=",".join(REGIMES))
  args = parser.parse_args()
  print(f"{'regime':24s} {'W':>3s} {'measured B/step':>14s} {'expected B/step':>14s} "
        f"{'ratio':>8s} {'regime payload':>14s} {'vs sync':>8s} {'start-up B':>14s}", flush=True)
  for workers in (int(w) for w in args.workers.split(",")):
    sync_bytes = None
    for regime in args.regimes.split(","):
      with tempfile.TemporaryDirectory() as workdir:
        result = measure(regime, workers, args.steps, workdir)
      if regime == "sync":
        sync_bytes = result["network"]["bytes_on_wire_per_step"]
      print(row(regime, workers, result, sync_bytes), flush=True)


if __name__ == "__main__":
  main()
