"""Gradient pack size (topology.MultiWorker.bytes_per_pack) for 2 worker processes.

TF's CommunicationOptions split the gradient all-reduce into packs of about
bytes_per_pack bytes (0: one pack), which lets the first packs travel while the
backward pass still computes the rest (DDP's buckets, Horovod's fusion). This
measures, with benchmarks/scaling.py's runs (one core per worker, evaluation and
checkpoints out of the way), 1 worker and 2 workers at each pack size, in
interleaved rounds, and prints each 2-worker median over the 1-worker median.

  .venv/bin/python benchmarks/pack_size.py --workload resnet --rounds 4 --packs 0,65536,32768
"""

import argparse
import dataclasses
import statistics

import scaling


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="resnet", choices=sorted(scaling.WORKLOADS))
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--packs", default="0,65536,32768", help="bytes_per_pack values")
  args = parser.parse_args()
  base = scaling.WORKLOADS[args.workload]
  trials = [("workers=1", 1, 0)] + [(f"workers=2 pack={p}", 2, int(p))
                                     for p in args.packs.split(",")]
  examples_per_s = {label: [] for label, _, _ in trials}
  for r in range(args.rounds):
    for label, workers, pack in trials:
      w = dataclasses.replace(
          base, bindings=(*base.bindings, f"topology.MultiWorker.bytes_per_pack = {pack}"))
      result = scaling.measure(w, scaling.Setup(label, "workers", workers))
      examples_per_s[label].append(result["examples_per_s"])
      print(f"[{args.workload} round {r + 1}/{args.rounds}] {label}: "
            f"{result['examples_per_s']:.1f} ex/s", flush=True)
  one = statistics.median(examples_per_s["workers=1"])
  for label, values in examples_per_s.items():
    median = statistics.median(values)
    print(f"{label:24s} {median:8.1f} ex/s  {median / one:.2f}x workers=1   "
          f"rounds {[round(v) for v in values]}")


if __name__ == "__main__":
  main()
