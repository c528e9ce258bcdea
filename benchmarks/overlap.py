"""Gradient buckets on an emulated link: 2 workers' step time with and without overlap.

For each link rate (`replibench launch --network=RATE`: the cluster's private loopback
rate-limited by tc, shared by the whole cluster) and each bucket size
(regimes.Sync.bucket_bytes; 0 = one all-reduce after the whole backward pass, today's
default), runs the workload's scaling recipe (benchmarks/scaling.py's WORKLOADS: eval
and checkpoints out of the way) on 2 worker processes pinned to a core each, in
interleaved rounds, and prints per rate and bucket size the median step time, its
ratio to the same bucket size on the unlimited link (the goal: within 1.10 at 1 Gbit/s)
and to one all-reduce (bucket 0) on the same link, the bytes measured on the link per
step (bucketing sends the same payload; each further collective adds its own RPC
overhead, ~1% for 4 buckets of ResNet's 311 KB in a trial run), and the
exchange's share of the step (the step's collectives timed alone,
communication.collective_s_per_step, over the step time: what overlap can hide).

  make bench-overlap     # = .venv/bin/python benchmarks/overlap.py (needs root for tc)
  .venv/bin/python benchmarks/overlap.py --workload resnet --rates none,10gbit,1gbit,100mbit \
      --buckets 0,32768,131072 --rounds 2 [--dry_run]

Writes the table to results/scaling/overlap-<workload>.txt and every trial's figures to
results/scaling/overlap-<workload>.json. Each launch makes its own network namespace and
removes it when the cluster ends (replibench/harness/netns.py).
"""

import argparse
import json
import os
import shlex
import statistics

import bench_runs   # benchmarks/bench_runs.py (this script's directory is on sys.path)
import scaling

REPO = bench_runs.REPO
OUT_DIR = os.path.join(REPO, "results", "scaling")


def command(w: scaling.Workload, rate: str, bucket_bytes: int, workers: int = 2) -> list[str]:
  """The launched run of w on `workers` processes (a core each) over a link of `rate`."""
  bindings = [*w.bindings, *scaling.QUIET, f"Experiment.global_batch_size = {w.global_batch}",
              f"regimes.Sync.bucket_bytes = {bucket_bytes}"]
  cmd = bench_runs.command(w.gin_file, "workers", workers, bindings, w.steps, "WORKDIR", 1)
  at = cmd.index("launch") + 1
  return [*cmd[:at], f"--network={rate}", *cmd[at:]]


def figures(result: dict, global_batch: int) -> dict:
  """What the table needs from one trial's result.json."""
  step_s = global_batch / result["examples_per_s"]
  comm = result.get("communication") or {}
  alone = comm.get("collective_s_per_step")
  return {"step_ms": 1e3 * step_s, "examples_per_s": result["examples_per_s"],
          "bytes_on_wire_per_step": (result.get("network") or {}).get("bytes_on_wire_per_step"),
          "gradient_collectives": ((comm.get("by_kind") or {}).get("gradients") or {}).get("count"),
          "exchange_alone_ms": None if alone is None else 1e3 * alone,
          "exchange_share": None if alone is None else alone / step_s}


def table(trials: dict, rates: list[str], buckets: list[int]) -> list[str]:
  """trials: {(rate, bucket): [figures, ...]} -> the report's lines (medians over rounds)."""
  med = {key: {k: statistics.median(v[k] for v in runs) if all(v[k] is not None for v in runs)
               else None for k in runs[0]} for key, runs in trials.items()}
  lines = [f"{'link':>8s} {'bucket B':>9s} {'step ms':>8s} {'vs none':>8s} {'vs one':>8s} "
           f"{'wire B/step':>12s} {'grad colls':>10s} {'exch ms':>8s} {'exch share':>10s}"]
  for rate in rates:
    for bucket in buckets:
      m, base, one = med[(rate, bucket)], med.get(("none", bucket)), med.get((rate, 0))
      vs = f"{m['step_ms'] / base['step_ms']:.3f}" if base else "-"
      vs_one = f"{m['step_ms'] / one['step_ms']:.3f}" if one else "-"
      lines.append(
          f"{rate:>8s} {bucket:9d} {m['step_ms']:8.2f} {vs:>8s} {vs_one:>8s} "
          f"{m['bytes_on_wire_per_step'] or 0:12,.0f} {m['gradient_collectives'] or 0:10g} "
          f"{m['exchange_alone_ms'] or 0:8.2f} {m['exchange_share'] or 0:10.1%}")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="resnet", choices=sorted(scaling.WORKLOADS))
  parser.add_argument("--rates", default="none,10gbit,1gbit,100mbit",
                      help="launch --network values ('none': unlimited loopback)")
  parser.add_argument("--buckets", default="0,32768,131072", help="regimes.Sync.bucket_bytes")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out_dir", default=OUT_DIR)
  parser.add_argument("--dry_run", action="store_true", help="print the runs, run nothing")
  args = parser.parse_args()
  w = scaling.WORKLOADS[args.workload]
  rates, buckets = args.rates.split(","), [int(b) for b in args.buckets.split(",")]
  if args.dry_run:
    for rate in rates:
      for bucket in buckets:
        print(f"{rate} bucket={bucket}: {shlex.join(command(w, rate, bucket))}")
    return
  trials = {(rate, bucket): [] for rate in rates for bucket in buckets}
  for r in range(args.rounds):
    for rate in rates:
      for bucket in buckets:
        label = f"{w.name} {rate} bucket={bucket}"
        result, _ = bench_runs.run(command(w, rate, bucket), label)
        trials[(rate, bucket)].append(figures(result, w.global_batch))
        f = trials[(rate, bucket)][-1]
        print(f"[round {r + 1}/{args.rounds}] {label}: {f['step_ms']:.2f} ms a step, "
              f"{f['bytes_on_wire_per_step'] or 0:,.0f} B on the wire a step", flush=True)
  lines = [f"== {w.name} ({w.gin_file}, global batch {w.global_batch}, {w.steps} steps, "
           f"2 workers x 1 core, {args.rounds} round(s), medians)", *table(trials, rates, buckets)]
  print("\n".join(lines), flush=True)
  os.makedirs(args.out_dir, exist_ok=True)
  base = os.path.join(args.out_dir, f"overlap-{w.name}")
  with open(base + ".txt", "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with open(base + ".json", "w", encoding="utf-8") as f:
    json.dump({f"{rate} bucket={bucket}": runs for (rate, bucket), runs in trials.items()}, f,
              indent=1)
  print(f"wrote {base}.txt and {base}.json")


if __name__ == "__main__":
  main()
