"""Gradient buckets on an emulated link: 2 workers' step time with and without overlap.

For each link rate (`replibench launch --network=RATE`: the cluster's private loopback
rate-limited by tc, shared by the whole cluster) and each bucket size
(regimes.Sync.bucket_bytes; 0 = one all-reduce after the whole backward pass, today's
default), runs the workload's scaling recipe (benchmarks/scaling/scaling.py's WORKLOADS: eval
and checkpoints out of the way) on 2 worker processes pinned to a core each, in
interleaved rounds, and prints per rate and bucket size the median step time, its
ratio to the same bucket size on the unlimited link (the goal: within 1.10 at 1 Gbit/s)
and to one all-reduce (bucket 0) on the same link, the bytes measured on the link per
step (bucketing sends the same payload; each further collective adds its own RPC
overhead, ~1% for 4 buckets of ResNet's 311 KB in a trial run), and the
exchange's share of the step (the step's collectives timed alone,
communication.collective_s_per_step, over the step time: what overlap can hide).

  make bench-overlap     # = .venv/bin/python benchmarks/scaling/overlap.py (needs root for tc)
  .venv/bin/python benchmarks/scaling/overlap.py --workload resnet --rates none,10gbit,1gbit,100mbit \\
      --buckets 0,32768,131072 --rounds 2 [--profile [--profile_steps 10]] [--dry_run]
  make bench-overlap OVERLAP_ARGS=--profile

--profile: each trial also trains --profile_steps more steps (whole calls) under
TensorFlow's profiler (`Experiment.profile_steps`; those calls count in no step time)
and reports worker 0's traced step split into compute, exchange and waiting
(replibench/harness/step_split.py: the exchange is the collectives' span not hidden
under compute) beside the measured step time; the traces stay in
runs/overlap-profiles/<time>/<rate>-bucket<B>-round<r>/ (TensorBoard's profile
plugin reads them; benchmarks/scaling/step_split.py prints every worker's split).

Bucketing must not change what crosses the link: the bench checks each bucket size's
bytes on the wire a step against one all-reduce's on the same link (within
WIRE_TOLERANCE: each further collective's own framing), prints the verdict under the
table and exits 1 if any differs by more.

Writes the table to results/scaling/overlap-<workload>.txt and every trial's figures to
results/scaling/overlap-<workload>.json (with --profile: -profile in both names, so the
unprofiled figures stay). Each launch makes its own network namespace and removes it
when the cluster ends (replibench/harness/netns.py).
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from benchmarks import bench_runs  # noqa: E402
from benchmarks.scaling import scaling  # noqa: E402

REPO = bench_runs.REPO
OUT_DIR = os.path.join(REPO, "results", "scaling")
PROFILE_DIR = os.path.join(REPO, "runs", "overlap-profiles")
# Bytes on the wire a step with buckets against one all-reduce: each collective adds
# its own RPC framing (+0.6-1.3% for 3 buckets of ResNet's 311 KB, measured 2026-11-27).
WIRE_TOLERANCE = 0.05


def command(w: scaling.Workload, rate: str, bucket_bytes: int, workers: int = 2,
            profile_steps: int = 0) -> list[str]:
  """The launched run of w on `workers` processes (a core each) over a link of `rate`;
  profile_steps > 0: that many more steps, traced (the calls that train them)."""
  bindings = [*w.bindings, *scaling.QUIET, f"Experiment.global_batch_size = {w.global_batch}",
              f"regimes.Sync.bucket_bytes = {bucket_bytes}"]
  steps = w.steps + profile_steps
  if profile_steps:
    bindings.append(f"Experiment.profile_steps = ({w.steps + 1}, {steps})")
  cmd = bench_runs.command(w.gin_file, "workers", workers, bindings, steps, "WORKDIR", 1)
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


def profile_figures(run_dir: str) -> dict:
  """Worker 0's (the chief's) traced steps split (step_split.summary: ms a step and
  shares), and the other workers' exchange shares; {} if the run left no profile."""
  from replibench.harness import step_split  # pylint: disable=import-outside-toplevel
  splits = step_split.split_run(run_dir)
  chief = step_split.summary(splits.get("chief", []))
  if not chief:
    return {}
  others = {name: step_split.summary(calls).get("exchange_share")
            for name, calls in splits.items() if name != "chief"}
  return {**{f"profile_{k}": v for k, v in chief.items()}, "profile_others_exchange_share": others}


PROFILE_KEYS = ("profile_wall_ms", "profile_compute_ms", "profile_exchange_ms",
                "profile_wait_ms", "profile_exchange_hidden_ms", "profile_exchange_share")


def medians(trials: dict) -> dict:
  """{(rate, bucket): {figure: median over rounds (None where a round lacks it)}}."""
  keys = ["step_ms", "examples_per_s", "bytes_on_wire_per_step", "gradient_collectives",
          "exchange_alone_ms", "exchange_share", *PROFILE_KEYS]
  return {key: {k: statistics.median(v[k] for v in runs)
                if all(isinstance(v.get(k), (int, float)) for v in runs) else None for k in keys}
          for key, runs in trials.items()}


def table(trials: dict, rates: list[str], buckets: list[int]) -> list[str]:
  """trials: {(rate, bucket): [figures, ...]} -> the report's lines (medians over rounds);
  with profiled trials, worker 0's traced step split beside them."""
  med = medians(trials)
  profiled = any(m["profile_wall_ms"] is not None for m in med.values())
  head = (f"{'link':>8s} {'bucket B':>9s} {'step ms':>8s} {'vs none':>8s} {'vs one':>8s} "
          f"{'wire B/step':>12s} {'wire/one':>8s} {'grad colls':>10s} {'exch ms':>8s} "
          f"{'exch share':>10s}")
  if profiled:
    head += (f" | {'traced ms':>9s} {'compute':>8s} {'exchange':>8s} {'wait':>7s} "
             f"{'hidden':>7s} {'exch/trace':>10s}")
  lines = [head]
  for rate in rates:
    for bucket in buckets:
      m, base, one = med[(rate, bucket)], med.get(("none", bucket)), med.get((rate, 0))
      vs = f"{m['step_ms'] / base['step_ms']:.3f}" if base else "-"
      vs_one = f"{m['step_ms'] / one['step_ms']:.3f}" if one else "-"
      ratio = wire_ratio(m, one)
      line = (f"{rate:>8s} {bucket:9d} {m['step_ms']:8.2f} {vs:>8s} {vs_one:>8s} "
              f"{m['bytes_on_wire_per_step'] or 0:12,.0f} "
              f"{'-' if ratio is None else f'{ratio:.3f}':>8s} "
              f"{m['gradient_collectives'] or 0:10g} "
              f"{m['exchange_alone_ms'] or 0:8.2f} {m['exchange_share'] or 0:10.1%}")
      if profiled:
        p = [m[k] for k in PROFILE_KEYS]
        line += (" | " + " ".join("-".rjust(w) for w in (9, 8, 8, 7, 7, 10)) if p[0] is None
                 else f" | {p[0]:9.2f} {p[1]:8.2f} {p[2]:8.2f} {p[3]:7.2f} {p[4]:7.2f} "
                      f"{p[5]:10.1%}")
      lines.append(line)
  return lines


def wire_ratio(m: dict, one: dict | None) -> float | None:
  """Bytes on the wire a step against one all-reduce's on the same link."""
  if not one or not m["bytes_on_wire_per_step"] or not one["bytes_on_wire_per_step"]:
    return None
  return m["bytes_on_wire_per_step"] / one["bytes_on_wire_per_step"]


def wire_check(trials: dict, rates: list[str], buckets: list[int]) -> tuple[bool, str]:
  """(whether every bucket size sends what one all-reduce sends on its link, within
  WIRE_TOLERANCE; the verdict's line)."""
  med = medians(trials)
  ratios = {(r, b): wire_ratio(med[(r, b)], med.get((r, 0))) for r in rates for b in buckets
            if b != 0}
  known = {k: v for k, v in ratios.items() if v is not None}
  if not known:
    return True, "bytes on the wire: no bucket size to compare with one all-reduce"
  bad = {k: v for k, v in known.items() if abs(v - 1) > WIRE_TOLERANCE}
  span = f"{min(known.values()) - 1:+.1%} to {max(known.values()) - 1:+.1%}"
  if bad:
    named = ", ".join(f"{r} bucket={b}: {v - 1:+.1%}" for (r, b), v in sorted(bad.items()))
    return False, (f"bytes on the wire CHANGED with buckets (more than {WIRE_TOLERANCE:.0%} "
                   f"from one all-reduce on the same link): {named}")
  return True, (f"bytes on the wire unchanged by buckets: {span} against one all-reduce on "
                f"the same link (within {WIRE_TOLERANCE:.0%}; {len(known)} comparisons)")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="resnet", choices=sorted(scaling.WORKLOADS))
  parser.add_argument("--rates", default="none,10gbit,1gbit,100mbit",
                      help="launch --network values ('none': unlimited loopback)")
  parser.add_argument("--buckets", default="0,32768,131072", help="regimes.Sync.bucket_bytes")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out_dir", default=OUT_DIR)
  parser.add_argument("--profile", action="store_true",
                      help="also profile --profile_steps more steps of each trial and report "
                           "worker 0's split into compute, exchange and waiting")
  parser.add_argument("--profile_steps", type=int, default=10,
                      help="with --profile: the steps traced after the timed ones")
  parser.add_argument("--profile_dir", default=PROFILE_DIR,
                      help="with --profile: where each trial's traces are kept")
  parser.add_argument("--dry_run", action="store_true", help="print the runs, run nothing")
  args = parser.parse_args()
  w = scaling.WORKLOADS[args.workload]
  rates, buckets = args.rates.split(","), [int(b) for b in args.buckets.split(",")]
  extra = args.profile_steps if args.profile else 0
  if args.dry_run:
    for rate in rates:
      for bucket in buckets:
        print(f"{rate} bucket={bucket}: {shlex.join(command(w, rate, bucket, 2, extra))}")
    return 0
  profiles = os.path.join(args.profile_dir, time.strftime("%Y%m%d-%H%M%S"))
  trials = {(rate, bucket): [] for rate in rates for bucket in buckets}
  for r in range(args.rounds):
    for rate in rates:
      for bucket in buckets:
        label = f"{w.name} {rate} bucket={bucket}"
        keep = (os.path.join(profiles, f"{rate}-bucket{bucket}-round{r + 1}") if args.profile
                else None)
        result, _ = bench_runs.run(command(w, rate, bucket, 2, extra), label, keep=keep)
        f = figures(result, w.global_batch)
        if keep:
          f.update(profile_figures(keep))
        trials[(rate, bucket)].append(f)
        split = (f", traced {f['profile_wall_ms']:.2f} ms: exchange {f['profile_exchange_ms']:.2f}"
                 f" ms ({f['profile_exchange_share']:.1%})" if f.get("profile_wall_ms") else "")
        print(f"[round {r + 1}/{args.rounds}] {label}: {f['step_ms']:.2f} ms a step, "
              f"{f['bytes_on_wire_per_step'] or 0:,.0f} B on the wire a step{split}", flush=True)
  ok, verdict = wire_check(trials, rates, buckets)
  lines = [f"== {w.name} ({w.gin_file}, global batch {w.global_batch}, {w.steps} steps, "
           f"2 workers x 1 core, {args.rounds} round(s), medians)", *table(trials, rates, buckets),
           verdict]
  if args.profile:
    lines.append(f"traced: worker 0's {args.profile_steps} profiled steps a trial (after the "
                 f"timed ones), ms a step: compute, exchange not hidden under compute, "
                 f"waiting, exchange hidden under compute; traces in {profiles}")
  print("\n".join(lines), flush=True)
  os.makedirs(args.out_dir, exist_ok=True)
  base = os.path.join(args.out_dir, f"overlap-{w.name}" + ("-profile" if args.profile else ""))
  with open(base + ".txt", "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with open(base + ".json", "w", encoding="utf-8") as f:
    json.dump({f"{rate} bucket={bucket}": runs for (rate, bucket), runs in trials.items()}, f,
              indent=1)
  print(f"wrote {base}.txt and {base}.json")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
