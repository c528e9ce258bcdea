"""Scaling of the distributed path, for every workload, measured in one run.

For each workload: 1 vs 2 worker processes (one core each) at the same global
batch (strong scaling) and at twice the batch (weak scaling); 1, 2 and 4 logical
replicas in one process pinned to one core (pure replication overhead: the same
work, split N ways); init and first-call time per topology; and the collectives
per step. More runs measure what the split and the machine allow: one replica at
a quarter of the batch (4 replicas on one core cannot beat 4 such steps), one
worker at half the batch (2 workers cannot beat twice its examples/s), and two
independent one-worker runs at once, one per core, at half the batch and at the
batch (2 workers cannot beat what the machine gives two processes that never
communicate); the report sets the measured ratios beside these ceilings.

Every figure comes from a real `replibench run` (or `replibench launch -- run`)
with --max_steps, read back from its result.json: examples/s over the training
calls after the first (the first call builds the executor), init_s, and the
run's communication account. Configurations are run in rounds (all of them, then
all again), and the median over rounds is reported, so slow drift in the
machine's state hits every configuration alike.

  make bench-scaling          # or: .venv/bin/python benchmarks/scaling/scaling.py [--rounds 3]
Goals (issue 12): workers=2 >= 1.8x workers=1 (same batch), >= 1.9x at twice the
batch; 4 logical replicas <= 1.3x one replica's step time; init <= 2x.

On a machine with more cores, --worker_counts=1,2,4,8 [--cpus_per_worker=2] runs
instead N worker processes at the workload's global batch (strong scaling) and at
N times it (weak), and the machine's ceiling for each N: N independent one-worker
runs at once, each pinned to the cores worker i of the N-worker cluster gets, that
never communicate (at the workload's batch each: weak scaling's per-worker batch;
with --strong_ceilings also at batch/N: strong scaling's). It reports each count's
speed-up over workers=1, its efficiency against N (speed-up / N) and against the
ceiling (speed-up / the ceiling's summed examples/s over workers=1's): the
accelerator machine's run (tools/accelerator). Horovod's "scaling efficiency" is
the first; the second separates what the engine loses from what the machine does
(shared caches, memory bandwidth, clocks under load).
"""

import argparse
import dataclasses
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from benchmarks import bench_runs  # noqa: E402

REPO = bench_runs.REPO


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  gin_file: str
  global_batch: int
  steps: int
  bindings: tuple = ()


WORKLOADS = {
    "resnet": Workload("resnet", "configs/resnet/scaling.gin", 256, 60,
                       ("small_resnet.norm_layer = @engine.per_replica_batch_norm",)),
    "sngan": Workload("sngan", "configs/sngan/batch_scaling.gin", 32, 40,
                      ("Experiment.steps_per_call = 5",
                       "sngan_generator.norm_layer = @engine.per_replica_batch_norm")),
    # The learner alone: with its samples-per-insert ratio (16) the learner waits for the
    # actors, which share its core (results/scaling/README.md); at 1e6 the actors fill
    # replay to min_size and then block, so the figure is the distributed learner's.
    "d4pg": Workload("d4pg", "configs/d4pg/learner_scaling.gin", 256, 500,
                     ("UniformReplay.samples_per_insert = 1e6",)),
}
# Evaluation and checkpoints out of the way: only training calls are measured.
QUIET = ("Experiment.eval_every_epochs = 1000", "Experiment.checkpoint_every_epochs = 1000",
         "Experiment.train_epochs = 1000")


@dataclasses.dataclass(frozen=True)
class Setup:
  label: str
  kind: str          # 'replicas' (logical, one process), 'workers', or 'independent':
                     # n one-worker runs at once, each on its own cores (the ceiling)
  n: int
  batch_factor: float = 1   # Of the workload's global batch.
  cores: str = "0"   # taskset list for logical replicas


# One replica at the batch each replica of a split gets: the ceiling the split itself
# sets (a step's batch-independent work, which every replica repeats, does not shrink).
QUARTER = "replicas=1, batch/4 (1 core)"
HALF = "workers=1, batch/2"
# Two independent single workers, one per core, at the same time: what the machine gives
# two processes (shared caches, memory bandwidth, clock) with no communication at all,
# at the per-worker batch of strong scaling (batch/2) and of weak scaling (batch).


def ceiling_label(n: int, batch_factor: float = 1) -> str:
  """The label of n independent one-worker runs at once (at batch_factor of the batch)."""
  batch = "" if batch_factor == 1 else f", batch/{round(1 / batch_factor)}"
  return f"{n} x workers=1{batch}, at once"


PAIR_HALF, PAIR = ceiling_label(2, 0.5), ceiling_label(2)


def setups() -> list[Setup]:
  return [Setup("replicas=1 (1 core)", "replicas", 1), Setup("replicas=2 (1 core)", "replicas", 2),
          Setup("replicas=4 (1 core)", "replicas", 4),
          Setup(QUARTER, "replicas", 1, 0.25),
          Setup("workers=1", "workers", 1), Setup("workers=2 (strong)", "workers", 2),
          Setup(HALF, "workers", 1, 0.5), Setup(PAIR_HALF, "independent", 2, 0.5),
          Setup(PAIR, "independent", 2),
          Setup("workers=1 (2x batch)", "workers", 1, 2),
          Setup("workers=2 (weak, 2x batch)", "workers", 2, 2)]


def worker_setups(counts: list[int], strong_ceilings: bool = False) -> list[Setup]:
  """workers=N at the workload's batch (strong) and at N times it (weak), and for each
  N > 1 the machine's ceiling: N one-worker runs at once at the batch (weak scaling's
  per worker) and, with strong_ceilings, at batch/N (strong scaling's)."""
  many = [n for n in counts if n > 1]
  return ([Setup(f"workers={n}", "workers", n) for n in counts]
          + [Setup(f"workers={n} (weak, {n}x batch)", "workers", n, n) for n in many]
          + [Setup(ceiling_label(n), "independent", n) for n in many]
          + [Setup(ceiling_label(n, 1 / n), "independent", n, 1 / n)
             for n in many if strong_ceilings])


def command(w: Workload, s: Setup, workdir: str, cpus_per_worker: int = 1) -> list[str]:
  batch = round(w.global_batch * s.batch_factor)
  bindings = [*w.bindings, *QUIET, f"Experiment.global_batch_size = {batch}"]
  cmd = bench_runs.command(w.gin_file, s.kind, s.n, bindings, w.steps, workdir, cpus_per_worker)
  return ["taskset", "-c", s.cores, *cmd] if s.kind == "replicas" else cmd


def measure(w: Workload, s: Setup, cpus_per_worker: int = 1) -> dict:
  if s.kind == "independent":
    return _measure_independent(w, s, cpus_per_worker)
  return bench_runs.run(command(w, s, "WORKDIR", cpus_per_worker), f"{w.name} {s.label}")[0]


def independent_commands(w: Workload, s: Setup, workdirs: list[str],
                         cpus_per_worker: int = 1) -> list[list[str]]:
  """s.n one-worker runs, run i pinned (taskset) to the cores worker i of an s.n-worker
  launch gets (launcher.core_share: this process's allowed cores, cpus_per_worker each,
  in order), and launched with the same --cpus_per_worker inside them."""
  cores = sorted(os.sched_getaffinity(0))
  single = dataclasses.replace(s, kind="workers", n=1)
  return [["taskset", "-c", ",".join(str(cores[(i * cpus_per_worker + k) % len(cores)])
                                     for k in range(cpus_per_worker)),
           *command(w, single, workdir, cpus_per_worker)]
          for i, workdir in enumerate(workdirs)]


def _measure_independent(w: Workload, s: Setup, cpus_per_worker: int = 1) -> dict:
  """s.n one-worker runs at once, each on its own cores: their examples/s add up."""
  with tempfile.TemporaryDirectory() as workdir:
    dirs = [os.path.join(workdir, str(i)) for i in range(s.n)]
    # Output to files, not pipes: a full pipe would stall a run we wait for.
    logs = [open(d + ".log", "w+", encoding="utf-8") for d in dirs]  # pylint: disable=consider-using-with
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
             for cmd, log in zip(independent_commands(w, s, dirs, cpus_per_worker), logs)]
    codes = [p.wait() for p in procs]
    outputs = []
    for log in logs:
      log.seek(0)
      outputs.append(log.read())
      log.close()
    results = [bench_runs.result(d, code, out, f"{w.name} {s.label}")
               for d, code, out in zip(dirs, codes, outputs)]
  return {**results[0], "examples_per_s": sum(r["examples_per_s"] for r in results),
          "init_s": max(r["init_s"] for r in results),
          "runs_examples_per_s": [r["examples_per_s"] for r in results]}


def _median(results: list[dict], key) -> float | None:
  values = [key(r) for r in results]
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def summarize(w: Workload, runs: dict[str, list[dict]]) -> list[str]:
  eps = {label: _median(rs, lambda r: r.get("examples_per_s")) for label, rs in runs.items()}
  init = {label: _median(rs, lambda r: r.get("init_s")) for label, rs in runs.items()}
  first = {label: _median(rs, lambda r: r.get("first_call_s")) for label, rs in runs.items()}
  lines = [f"== {w.name} ({w.gin_file}, global batch {w.global_batch}, {w.steps} steps)"]
  for label, rs in runs.items():
    comm = (rs[-1].get("communication") or {})
    per_step = comm.get("collectives_per_step")
    alone = comm.get("collective_s_per_step")
    lines.append(f"  {label:32s} {eps[label]:9.1f} ex/s   init {init[label]:5.1f} s   "
                 f"first call {first[label] or 0:5.1f} s   "
                 f"collectives/step {per_step if per_step is not None else '-'}"
                 f"{f' ({alone * 1e3:.2f} ms alone)' if alone else ''}"
                 f"{'   ' + _comm_kinds(comm) if comm else ''}")
  ratio = lambda a, b: eps[a] / eps[b]  # noqa: E731
  one = eps["replicas=1 (1 core)"]
  lines += [
      f"  workers=2 / workers=1, same batch (strong): {ratio('workers=2 (strong)', 'workers=1'):.2f}x"
      "   (goal >= 1.8x)",
      f"  workers=2 at 2x batch / workers=1 (weak):   "
      f"{ratio('workers=2 (weak, 2x batch)', 'workers=1'):.2f}x   (goal >= 1.9x)",
      f"  step time replicas=2 / replicas=1 (1 core): {one / eps['replicas=2 (1 core)']:.2f}x",
      f"  step time replicas=4 / replicas=1 (1 core): {one / eps['replicas=4 (1 core)']:.2f}x"
      "   (goal <= 1.3x)",
      f"  init replicas=4 / replicas=1:               "
      f"{init['replicas=4 (1 core)'] / init['replicas=1 (1 core)']:.2f}x   (goal <= 2x)",
      f"  first call replicas=4 / replicas=1:         "
      f"{first['replicas=4 (1 core)'] / first['replicas=1 (1 core)']:.2f}x"]
  return lines + _ceilings(eps, ratio)


def _ceilings(eps: dict, ratio) -> list[str]:
  """What the split alone allows, with no communication at all, and the engine's share.

  4 replicas on one core run 4 steps at batch/4 one after the other: at best
  eps(1 replica) / eps(1 replica at batch/4) times one replica's step time. Two
  workers at batch/2 each make at most 2 eps(batch/2) alone, and at most what two
  independent such workers make side by side on the machine's two cores.
  """
  lines = []
  if QUARTER in eps:
    floor = eps["replicas=1 (1 core)"] / eps[QUARTER]
    measured = eps["replicas=1 (1 core)"] / eps["replicas=4 (1 core)"]
    lines.append(f"  split floor, 4 replicas on one core (1 replica at batch/4, x4): {floor:.2f}x;"
                 f" replication above it: {measured / floor:.2f}x")
  strong = ratio("workers=2 (strong)", "workers=1")
  weak = ratio("workers=2 (weak, 2x batch)", "workers=1")
  if HALF in eps:
    ceiling = 2 * eps[HALF] / eps["workers=1"]
    lines.append(f"  split ceiling, 2 workers at batch/2 each (2x one worker at batch/2 alone): "
                 f"{ceiling:.2f}x; strong scaling reaches {strong / ceiling:.0%} of it")
  for label, scaled, kind in ((PAIR_HALF, strong, "strong"), (PAIR, weak, "weak")):
    if label in eps:
      ceiling = eps[label] / eps["workers=1"]
      lines.append(f"  machine ceiling, {label}: {ceiling:.2f}x; {kind} scaling reaches "
                   f"{scaled / ceiling:.0%} of it")
  return lines + [f"  weak scaling reaches {weak / 2:.0%} of 2x"]


def summarize_workers(w: Workload, runs: dict[str, list[dict]], counts: list[int]) -> list[str]:
  """Speed-up of N workers over one, strong and weak, and its efficiency against N and
  against the machine's ceiling for N (goal: 2 workers >= 1.8x one at the same batch)."""
  eps = {label: _median(rs, lambda r: r.get("examples_per_s")) for label, rs in runs.items()}
  one = eps["workers=1"]
  lines = [f"== {w.name} ({w.gin_file}, global batch {w.global_batch}, {w.steps} steps): "
           f"workers=1 {one:.1f} ex/s"]
  for n in counts[1:]:
    lines += [f"  workers={n}:"]
    for kind, label, factor in (("strong", f"workers={n}", 1 / n),
                                ("weak", f"workers={n} (weak, {n}x batch)", 1)):
      speedup = eps[label] / one
      line = f"    {kind:6s} {speedup:.2f}x (efficiency {speedup / n:.0%} of {n}x"
      ceiling = eps.get(ceiling_label(n, factor))
      if ceiling:
        line += (f", {speedup / (ceiling / one):.0%} of the machine's ceiling "
                 f"{ceiling / one:.2f}x: {ceiling_label(n, factor)})")
      else:
        line += ")"
      lines.append(line + ("   (goal >= 1.8x)" if n == 2 and kind == "strong" else ""))
  return lines


TABLE_HEAD = ["| workload | workers | strong | of N | strong ceiling | of it | weak | of N | "
              "weak ceiling | of it |", "|---|---|---|---|---|---|---|---|---|---|"]


def worker_table(w: Workload, runs: dict[str, list[dict]], counts: list[int]) -> list[str]:
  """summarize_workers' figures as markdown rows under TABLE_HEAD (results/scaling/
  README.md's table): each N's speed-up over one worker, its efficiency against N, the
  machine's ceiling (N independent pinned one-worker runs at once, over one alone; at
  batch/N for strong scaling, with --strong_ceilings) and the share of it reached;
  '-' where the run did not measure a figure."""
  eps = {label: _median(rs, lambda r: r.get("examples_per_s")) for label, rs in runs.items()}
  one, rows = eps["workers=1"], []
  for n in counts[1:]:
    cells = []
    for label, factor in ((f"workers={n}", 1 / n), (f"workers={n} (weak, {n}x batch)", 1)):
      speedup = eps[label] / one if eps.get(label) else None
      ceiling = eps.get(ceiling_label(n, factor))
      ceiling = ceiling / one if ceiling else None
      cells += ["-" if speedup is None else f"{speedup:.2f}x",
                "-" if speedup is None else f"{speedup / n:.0%}",
                "-" if ceiling is None else f"{ceiling:.2f}x",
                "-" if None in (speedup, ceiling) else f"{speedup / ceiling:.0%}"]
    rows.append(f"| {w.name} | {n} | " + " | ".join(cells) + " |")
  return rows


def _comm_kinds(comm: dict) -> str:
  kinds = comm.get("by_kind") or {}
  return ", ".join(f"{k} {v['count']:g} x {v['bytes']:,.0f} B" for k, v in kinds.items())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="resnet,sngan,d4pg")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--setups", default="", help="comma-separated labels (default: all)")
  parser.add_argument("--worker_counts", default="", help="e.g. 1,2,4,8: strong and weak "
                      "scaling over N worker processes instead of the 2-core setups")
  parser.add_argument("--cpus_per_worker", type=int, default=1)
  parser.add_argument("--strong_ceilings", action="store_true", help="with --worker_counts: "
                      "also the ceiling at strong scaling's per-worker batch (batch/N)")
  parser.add_argument("--gin_bindings", action="append", default=[], help="added to every "
                      "run, e.g. 'regimes.Sync.bucket_bytes = 65536' (repeat for more)")
  parser.add_argument("--dry_run", action="store_true", help="print the runs, run nothing")
  args = parser.parse_args()
  counts = [int(n) for n in args.worker_counts.split(",")] if args.worker_counts else []
  if counts and counts[0] != 1:
    raise SystemExit("--worker_counts must start with 1 (the reference)")
  chosen = worker_setups(counts, args.strong_ceilings) if counts else [
      s for s in setups() if not args.setups or s.label in args.setups.split(",")]
  table = []
  for name in args.workloads.split(","):
    w = WORKLOADS[name]
    w = dataclasses.replace(w, bindings=(*w.bindings, *args.gin_bindings))
    if args.dry_run:
      for s in chosen:
        cmds = (independent_commands(w, s, [f"WORKDIR{i}" for i in range(s.n)],
                                     args.cpus_per_worker) if s.kind == "independent"
                else [command(w, s, "WORKDIR", args.cpus_per_worker)])
        print(f"{name} {s.label}: {' & '.join(shlex.join(c) for c in cmds)}")
      continue
    runs = {s.label: [] for s in chosen}
    for r in range(args.rounds):
      for s in chosen:
        result = measure(w, s, args.cpus_per_worker)
        runs[s.label].append(result)
        print(f"[{name} round {r + 1}/{args.rounds}] {s.label}: "
              f"{result.get('examples_per_s')} ex/s, init {result.get('init_s')} s", flush=True)
    try:
      print("\n".join(summarize_workers(w, runs, counts) if counts else summarize(w, runs)),
            flush=True)
      table += worker_table(w, runs, counts) if counts else []
    except KeyError:   # A subset of setups: no ratios.
      pass
  if table:
    print("\n".join(["", f"workers of {args.cpus_per_worker} core(s), {args.rounds} round(s), "
                      f"medians; 'of it': the speed-up over the ceiling", *TABLE_HEAD, *table]))


if __name__ == "__main__":
  main()
