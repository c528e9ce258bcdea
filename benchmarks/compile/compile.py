"""Graph vs XLA (Experiment.jit_compile), side by side, for CPU_DEFAULTS' verdicts.

    make bench-compile                                   # this CPU: throughput, time to target
    .venv/bin/python benchmarks/compile/compile.py --scale=tiny --skip_target   # a check, minutes
    .venv/bin/python benchmarks/compile/compile.py --dry_run          # the runs it would make
    .venv/bin/python benchmarks/compile/compile.py --machine=gpu      # one GPU (benchmarks/throughput/throughput.py's)

Throughput: every model, precision and setup (logical replicas and pinned worker
processes) of benchmarks/throughput/throughput.py, with its very commands (synthetic data,
full-size models, a fixed batch per device), run twice a round: once with
`Experiment.jit_compile = False` (TensorFlow's graph executor) and once with True
(XLA around the exchange: engine/compilation.py). The two runs of a round are a
pair, back to back, their order alternating from round to round and from trial to
trial (ABBA), so a drift of the machine falls on both sides; examples/s are the
steady state (result.json's throughput record: the calls after the first, which
holds tracing and XLA's compilation). Reported per trial: the median over rounds
of each side, and the pairs' ratio XLA / graph (median and range).

Time to target: the real-data configs of the bench suites at their smoke scale
(configs/<workload>/smoke.gin; one replica), paired the same way per seed:
time_to_target_s, steps_to_target, first_call_s and xla_compile_s of each side. XLA
compiles on a piece's first run, so its compilation falls in the first training call
(tracing is done in init; XLA offers no compilation ahead of a first run without
executing it); the harness leaves it out of the timed span and reports it as
xla_compile_s (harness/timed_span.py XlaCompilation). XLA may change a workload's
numerics: a steps-to-target change beyond the seeds' spread says so.

Writes results/compile/throughput.{json,md} and time_to_target.{json,md} (--out)
after every pair, so a run cut short keeps its rows. The verdict per workload,
XLA where its ratio is above 1 in every setup, is for the lead to copy into
CPU_DEFAULTS (replibench/config/compile_choice.py) and results/compile/README.md.
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
from benchmarks.throughput import throughput  # noqa: E402  The models, machines and commands.

REPO = bench_runs.REPO
SIDES = (False, True)   # jit_compile: graph, XLA
TARGET_CONFIGS = {      # workload -> (config, smoke overrides): the bench suites' own
    "resnet": ("configs/resnet/fashion_mnist.gin", "configs/resnet/smoke.gin"),
    "sngan": ("configs/sngan/fashion_mnist.gin", "configs/sngan/smoke.gin"),
    "d4pg": ("configs/d4pg/cartpole_swingup.gin", "configs/d4pg/smoke.gin"),
}
# --target_scale=bench: each `make bench` suite's own per-trial config, to its target (the
# figures that 'auto' on a CPU decides: the bench's examples/s and time to target).
BENCH_CONFIGS = {
    "resnet": "configs/resnet/scaling.gin",
    "sngan": "configs/sngan/batch_scaling.gin",
    "d4pg": "configs/d4pg/learner_scaling.gin",
}


def _jit(cmd: list[str], jit: bool) -> list[str]:
  """cmd with Experiment.jit_compile bound (before --max_steps, among the bindings)."""
  i = next(i for i, a in enumerate(cmd) if a.startswith("--max_steps"))
  return [*cmd[:i], f"--gin_bindings=Experiment.jit_compile = {jit}", *cmd[i:]]


def _order(index: int, rnd: int) -> tuple:
  """ABBA: the sides' order alternates by trial and by round."""
  return SIDES if (index + rnd) % 2 == 0 else SIDES[::-1]


def _run(cmd: list[str], label: str, env: dict) -> dict:
  started = time.monotonic()
  try:
    result, _ = bench_runs.run(cmd, label, env)
  except RuntimeError as e:
    return {throughput.FAILED: str(e)[-3000:]}
  return {**result, "wall_s": round(time.monotonic() - started, 1)}


def throughput_pairs(args, machine) -> list[dict]:
  """[{trial, round, graph: result, xla: result}] for every throughput trial and round."""
  chosen = throughput.trials(args, machine)
  pairs = []
  for rnd in range(args.rounds):
    for i, t in enumerate(chosen):
      cmd = throughput.command(t, machine, args, "WORKDIR")
      pair = {"trial": t.label, "round": rnd}
      for jit in _order(i, rnd):
        pair["xla" if jit else "graph"] = _run(_jit(cmd, jit), f"{t.label} jit={jit}",
                                               throughput.environment(machine))
      pairs.append(pair)
      print(f"[round {rnd + 1}/{args.rounds}] {t.label}: {_said(pair, 'throughput')}",
            flush=True)
      if args.out:
        write(args.out, "throughput", pairs, throughput_table(pairs))
  return pairs


def target_command(workload: str, seed: int, scale: str = "smoke",
                   replicas: int = 1) -> list[str]:
  """The run of workload to its target: the bench suite's config (scale 'bench') or its
  smoke scale, on `replicas` logical replicas; the config's budget ends it."""
  if scale == "bench":
    config, bindings = BENCH_CONFIGS[workload], [f"Experiment.seed = {seed}"]
  else:
    config, smoke = TARGET_CONFIGS[workload]
    bindings = [f"include '{smoke}'", f"Experiment.seed = {seed}"]
  return bench_runs.command(config, "replicas", replicas, bindings, 10**9, "WORKDIR")


def target_pairs(args) -> list[dict]:
  """[{trial, round, graph, xla}]: each workload and seed to its smoke target, paired."""
  pairs = []
  trials = [(w, int(n)) for w in args.target_workloads.split(",")
            for n in args.target_replicas.split(",")]
  for seed in range(1, args.seeds + 1):
    for i, (workload, n) in enumerate(trials):
      name = f"{workload} replicas={n} seed={seed}"
      pair = {"trial": name, "round": seed}
      cmd = target_command(workload, seed, args.target_scale, n)
      for jit in _order(i, seed):
        pair["xla" if jit else "graph"] = _run(_jit(cmd, jit), f"{name} jit={jit}", {})
      pairs.append(pair)
      print(f"[seed {seed}] {name}: {_said(pair, 'target')}", flush=True)
      if args.out:
        write(args.out, "time_to_target", pairs, target_table(pairs))
  return pairs


def _rate(result: dict) -> float | None:
  return (result.get("throughput") or {}).get("examples_per_s")


def _said(pair: dict, kind: str) -> str:
  parts = []
  for side in ("graph", "xla"):
    r = pair[side]
    if throughput.FAILED in r:
      parts.append(f"{side} FAILED {r[throughput.FAILED][-300:]}")
    elif kind == "throughput":
      parts.append(f"{side} {_rate(r)} ex/s")
    else:
      parts.append(f"{side} {r.get('status')} {r.get('time_to_target_s')} s "
                   f"{r.get('steps_to_target')} steps {r.get('examples_per_s')} ex/s")
  return "; ".join(parts)


def _by_trial(pairs: list[dict]) -> dict:
  grouped = {}
  for p in pairs:
    grouped.setdefault(p["trial"], []).append(p)
  return grouped


def _failure(result: dict) -> str:
  """A failed run's one-line reason (`replibench run: error: ...`, e.g. a path that
  cannot compile, such as cross-replica batch norm on several replicas)."""
  said = result.get(throughput.FAILED, "")
  line = next((l for l in said.splitlines() if "error:" in l), "failed")
  return line.split("error:", 1)[-1].strip()[:160].replace("|", "/")


def throughput_table(pairs: list[dict]) -> list[str]:
  lines = ["| trial | graph ex/s | XLA ex/s | XLA / graph: median [min, max] | pairs |",
           "|---|---|---|---|---|"]
  for trial, ps in _by_trial(pairs).items():
    ok = [p for p in ps if _rate(p["graph"]) and _rate(p["xla"])]
    if not ok:
      graph, xla = (_rate(ps[-1][s]) or _failure(ps[-1][s]) for s in ("graph", "xla"))
      lines.append(f"| {trial} | {graph} | {xla} | | 0 |")
      continue
    ratios = [_rate(p["xla"]) / _rate(p["graph"]) for p in ok]
    graph = statistics.median(_rate(p["graph"]) for p in ok)
    xla = statistics.median(_rate(p["xla"]) for p in ok)
    lines.append(f"| {trial} | {graph:,.2f} | {xla:,.2f} | {statistics.median(ratios):.3f} "
                 f"[{min(ratios):.3f}, {max(ratios):.3f}] | {len(ok)} |")
  return lines


def target_table(pairs: list[dict]) -> list[str]:
  lines = ["| trial | graph: status, s, steps, first call s, ex/s | XLA: status, s, steps, "
           "first call s, ex/s, compile s (out of the span) | XLA / graph time | "
           "XLA / graph ex/s |", "|---|---|---|---|---|"]
  for p in pairs:
    cells, times, rates = [], [], []
    for side in ("graph", "xla"):
      r = p[side]
      if throughput.FAILED in r:
        cells.append(_failure(r))
        continue
      cells.append(f"{r.get('status')}, {_round(r.get('time_to_target_s'))}, "
                   f"{r.get('steps_to_target')}, {_round(r.get('first_call_s'))}, "
                   f"{_round(r.get('examples_per_s'))}"
                   + (f", {_round(r.get('xla_compile_s'))}" if side == "xla" else ""))
      times.append(r.get("time_to_target_s"))
      rates.append(r.get("examples_per_s"))
    ratio = f"{times[1] / times[0]:.3f}" if len(times) == 2 and all(times) else ""
    rate = f"{rates[1] / rates[0]:.3f}" if len(rates) == 2 and all(rates) else ""
    lines.append(f"| {p['trial']} | {cells[0]} | {cells[-1]} | {ratio} | {rate} |")
  return lines


def _round(value):
  return None if value is None else round(value, 2)


def _slim(result: dict) -> dict:
  """What the JSON keeps of a result.json: the figures, not the curve or config."""
  keep = ("status", "examples_per_s", "time_to_target_s", "steps_to_target", "first_call_s",
          "xla_compile_s", "throughput",
          "jit_compile", "machine", "git_sha", "tf_version", "wall_s", throughput.FAILED)
  return {k: result.get(k) for k in keep if k in result}


def write(out: str, name: str, pairs: list[dict], lines: list[str]) -> None:
  os.makedirs(out, exist_ok=True)
  machine = throughput.describe_machine([p[s] for p in pairs for s in ("graph", "xla")])
  header = [f"machine: {machine}",
            f"TF_XLA_FLAGS: {os.environ.get('TF_XLA_FLAGS', '(unset)')}", ""]
  with open(os.path.join(out, f"{name}.json"), "w") as f:
    json.dump({"pairs": [{**p, "graph": _slim(p["graph"]), "xla": _slim(p["xla"])}
                         for p in pairs], "lines": header + lines}, f, indent=1)
  with open(os.path.join(out, f"{name}.md"), "w") as f:
    f.write("\n".join(header + lines) + "\n")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--machine", choices=sorted(throughput.MACHINES), default="cpu")
  parser.add_argument("--scale", choices=("full", "tiny"), default="full")
  parser.add_argument("--models", default=",".join(throughput.MODELS))
  parser.add_argument("--precisions", default="", help="default: the machine's")
  parser.add_argument("--setups", default="", help="e.g. replicas=1,workers=2 (default: the "
                      "machine's)")
  parser.add_argument("--batch", type=int, default=0, help="examples per device")
  parser.add_argument("--steps", type=int, default=0, help="--max_steps of each run")
  parser.add_argument("--cpus_per_worker", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=3, help="pairs per throughput trial")
  parser.add_argument("--seeds", type=int, default=2, help="pairs per time-to-target trial")
  parser.add_argument("--target_workloads", default=",".join(TARGET_CONFIGS))
  parser.add_argument("--target_scale", choices=("smoke", "bench"), default="smoke",
                      help="bench: each make-bench suite's own config to its target")
  parser.add_argument("--target_replicas", default="1", help="e.g. 1,2: logical replicas "
                      "of the time-to-target runs")
  parser.add_argument("--skip_target", action="store_true", help="throughput only")
  parser.add_argument("--skip_throughput", action="store_true", help="time to target only")
  parser.add_argument("--out", default=os.path.join(REPO, "results", "compile"))
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="a binding for every throughput run (as benchmarks/throughput/throughput.py)")
  parser.add_argument("--profile", action="store_true", help="profile one more call of every "
                      "throughput run (as benchmarks/throughput/throughput.py)")
  parser.add_argument("--dry_run", action="store_true")
  args = parser.parse_args()
  machine = throughput.MACHINES[args.machine]
  if args.dry_run:
    for t in ([] if args.skip_throughput else throughput.trials(args, machine)):
      for jit in SIDES:
        print(t.label, f"jit={jit}", "\n   ",
              shlex.join(_jit(throughput.command(t, machine, args, "WORKDIR"), jit)))
    for workload in ([] if args.skip_target else args.target_workloads.split(",")):
      for jit in SIDES:
        print(workload, f"jit={jit}", "\n   ", shlex.join(_jit(
            target_command(workload, 1, args.target_scale), jit)))
    return
  if not args.skip_throughput:
    print("\n".join(throughput_table(throughput_pairs(args, machine))), flush=True)
  if not args.skip_target:
    print("\n".join(target_table(target_pairs(args))), flush=True)


if __name__ == "__main__":
  main()
