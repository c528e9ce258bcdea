"""Per-device throughput of the paper's models at full size, on synthetic data.

    make bench-throughput                                      # this machine's CPU
    .venv/bin/python benchmarks/throughput/throughput.py --machine=gpu    # one GPU, 3 precisions
    .venv/bin/python benchmarks/throughput/throughput.py --scale=tiny     # checks the bench in minutes
    .venv/bin/python benchmarks/throughput/throughput.py --dry_run        # the runs it would make
    .venv/bin/python benchmarks/throughput/throughput.py --profile --out=F  # and a profile a row

With --profile each row's run trains one more call, which it profiles (`replibench run
--profile_steps`, results/profile/README.md; the traced call counts in no examples/s,
so the timed calls are the rows' without it): its TensorBoard files go to
OUT-profiles/ROW/ (or runs/throughput-profiles/ROW/ without --out; `tensorboard
--logdir` on that folder shows every row as a run) with ROW/top_ops.md, its top ops
(benchmarks/throughput/profile_top_ops.py), and the row's `profile` names the folder.

The way tf_cnn_benchmarks, Horovod and NVIDIA's DeepLearningExamples measure
data-parallel training: ImageNet-shaped synthetic data (replibench/data/synthetic.py),
a fixed batch per device (weak scaling), images/s per device. For each model
(ResNet-50 v1.5 at 224x224, SN-GAN at 128x128 with the paper's widths, D4PG's
learner on 84x84x9 pixels), precision and mapping onto the machine (N logical
replicas in one process, or N worker processes of `replibench launch`, each
pinned to its own cores), one `replibench run --max_steps` whose result.json
`throughput` record gives examples/s (over the calls after the first), step time,
the plan's FLOPs per example and peak memory. Reported per row:

- examples/s in all, per device and per core (CPU: the cores the run had);
- step time; achieved FLOP/s per device and its fraction of the peak: a device
  profile's (configs/devices/, per precision: --machine=gpu) or, on CPUs, the run's
  own calibrated float32 matmul rate (provenance.calibrate, all of its cores);
- peak memory: accelerator (TensorFlow's allocator peak) or host (resident set);
- speed-up and scaling efficiency against 1 device of the same kind, model and
  precision: speed-up = examples/s(N) / examples/s(1), efficiency = speed-up over
  its ideal: N where each device is hardware of its own (GPUs, worker processes
  pinned to their own cores), 1 for logical CPU replicas, which share one
  process's cores (their efficiency is what replication itself costs).

Precision 'float32' on an Ampere-or-later GPU is TF32 for matmuls and
convolutions (TensorFlow's default), and its peak is TF32's.
"""

import argparse
import dataclasses
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from benchmarks import bench_runs  # noqa: E402

REPO = bench_runs.REPO
FAILED = "bench_failure"   # A trial's key when its run failed (result.json has "error").


@dataclasses.dataclass(frozen=True)
class Model:
  config: str
  tiny: str    # Overrides that shrink it (the tests use the same file).
  unit: str    # What an example is.


MODELS = {
    "resnet50": Model("configs/resnet/imagenet_synthetic.gin",
                      "configs/resnet/synthetic_tiny.gin", "images"),
    "sngan128": Model("configs/sngan/imagenet128_synthetic.gin",
                      "configs/sngan/synthetic_tiny.gin", "images"),
    "d4pg_pixels": Model("configs/d4pg/cartpole_swingup_pixels_synthetic.gin",
                         "configs/d4pg/synthetic_tiny.gin", "transitions"),
}


@dataclasses.dataclass(frozen=True)
class Machine:
  device: str                # topology.Local.device for replicas: 'cpu' or 'gpu'.
  batch_per_device: dict     # model -> examples per device and step.
  steps: dict                # model -> --max_steps (the first call is not timed).
  steps_per_call: int
  setups: tuple              # 'replicas=N' | 'workers=N'
  precisions: tuple
  profiles: dict             # precision -> device profile (gin); {}: the CPU calibration.


PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
MACHINES = {
    # A CPU core takes seconds for one ResNet-50 image and ~10 s for one SN-GAN real
    # image (5 discriminator updates on it and a generated one, then the generator's):
    # batches that keep a step within tens of seconds on one core. float16 is left out:
    # CPUs emulate it (results/precision/README.md: 0.2x float32).
    "cpu": Machine("cpu", {"resnet50": 16, "sngan128": 2, "d4pg_pixels": 64},
                   {"resnet50": 4, "sngan128": 3, "d4pg_pixels": 40}, 1,
                   ("replicas=1", "replicas=2", "workers=1", "workers=2"), PRECISIONS[:2], {}),
    # One GPU: NVIDIA's tables use 256 images per GPU for ResNet-50.
    "gpu": Machine("gpu", {"resnet50": 256, "sngan128": 64, "d4pg_pixels": 256},
                   {"resnet50": 120, "sngan128": 40, "d4pg_pixels": 500}, 10,
                   ("replicas=1",), PRECISIONS,
                   {"float32": "configs/devices/h100_sxm_tf32.gin",
                    "mixed_bfloat16": "configs/devices/h100_sxm_bf16.gin",
                    "mixed_float16": "configs/devices/h100_sxm_bf16.gin"}),
}


@dataclasses.dataclass(frozen=True)
class Trial:
  model: str
  precision: str
  kind: str       # 'replicas' or 'workers'
  n: int

  @property
  def label(self) -> str:
    return f"{self.model} {self.precision} {self.kind}={self.n}"


def trials(args, machine: Machine) -> list[Trial]:
  setups = args.setups.split(",") if args.setups else machine.setups
  precisions = args.precisions.split(",") if args.precisions else machine.precisions
  out = []
  for model in args.models.split(","):
    for precision in precisions:
      for setup in setups:
        kind, _, n = setup.partition("=")
        if kind not in ("replicas", "workers") or not n.isdigit():
          raise SystemExit(f"--setups: {setup!r} is not replicas=N or workers=N")
        out.append(Trial(model, precision, kind, int(n)))
  return out


def command(t: Trial, machine: Machine, args, workdir: str) -> list[str]:
  """The `replibench run` (or `launch -- run`) of one trial."""
  model = MODELS[t.model]
  tiny = args.scale == "tiny"
  bindings = [f"include '{model.tiny}'"] if tiny else []
  per_device = args.batch or (None if tiny else machine.batch_per_device[t.model])
  if per_device:
    bindings.append(f"Experiment.global_batch_size = {per_device * t.n}")
  elif t.n > 1:   # The tiny file's batch is one device's.
    bindings.append(f"Experiment.global_batch_size = {_tiny_batch(model) * t.n}")
  steps_per_call = 2 if tiny else machine.steps_per_call
  steps = args.steps or (4 if tiny else machine.steps[t.model])
  if args.profile:   # One more call, traced: the timed calls stay the row's own.
    bindings.append(f"Experiment.profile_steps = ({steps + 1}, {steps + steps_per_call})")
    steps += steps_per_call
  bindings += [f"Experiment.precision = '{t.precision}'",
               f"Experiment.steps_per_call = {steps_per_call}",
               f"Experiment.log_every_steps = {steps_per_call}",
               "Experiment.train_epochs = 1000"]   # --max_steps ends the run.
  if t.kind == "replicas":
    bindings.append(f"topology.Local.device = '{machine.device}'")
  bindings += args.gin_bindings   # Last: the caller's word wins (e.g. jit_compile).
  return bench_runs.command(model.config, t.kind, t.n, bindings, steps, workdir,
                            args.cpus_per_worker)


def _tiny_batch(model: Model) -> int:
  with open(os.path.join(REPO, model.tiny)) as f:
    for line in f:
      if line.startswith("Experiment.global_batch_size"):
        return int(line.split("=")[1].split("#")[0])
  raise SystemExit(f"{model.tiny} sets no Experiment.global_batch_size")


def environment(machine: Machine) -> dict:
  # A GPU machine's CPU figures are the CPU's.
  return {"CUDA_VISIBLE_DEVICES": ""} if machine.device == "cpu" else {}


def measure(t: Trial, machine: Machine, args, round_index: int = 0) -> dict:
  started = time.monotonic()
  keep = profile_dir(t, args, round_index) if args.profile else None
  try:
    result, _ = bench_runs.run(command(t, machine, args, "WORKDIR"), t.label,
                               environment(machine), keep=keep)
  except RuntimeError as e:
    return {FAILED: str(e)[-3000:]}
  if keep:
    inside = os.path.abspath(keep).startswith(REPO + os.sep)
    result["profile_dir"] = os.path.relpath(keep, REPO) if inside else os.path.abspath(keep)
    write_top_ops(keep)
  return {**result, "wall_s": round(time.monotonic() - started, 1)}


def profile_dir(t: Trial, args, round_index: int) -> str:
  """Where a row's profile is kept: OUT-profiles/ROW (runs/throughput-profiles/ROW)."""
  root = f"{args.out}-profiles" if args.out else os.path.join(REPO, "runs",
                                                              "throughput-profiles")
  name = t.label.replace(" ", "_").replace("=", "")
  return os.path.join(root, name + (f"_round{round_index + 1}" if args.rounds > 1 else ""))


def write_top_ops(directory: str) -> None:
  """directory/top_ops.md, by benchmarks/throughput/profile_top_ops.py (a process of its own:
  TensorFlow stays out of this one, and off the GPU)."""
  script = os.path.join(REPO, "benchmarks", "profile_top_ops.py")
  proc = subprocess.run([sys.executable, script, directory, "--top=15",
                         f"--out={os.path.join(directory, 'top_ops.md')}"], cwd=REPO,
                        capture_output=True, text=True, env={**os.environ,
                                                             "CUDA_VISIBLE_DEVICES": ""})
  if proc.returncode:
    print(f"top ops of {directory} failed: {proc.stderr[-1500:]}", flush=True)


def peak_flops(machine: Machine, precision: str) -> tuple[float | None, str]:
  """(peak FLOP/s of one device, where it comes from)."""
  return _profile_peak(machine.profiles.get(precision))


@functools.lru_cache(maxsize=None)
def _profile_peak(path: str | None) -> tuple[float | None, str]:
  if not path:
    return None, "the run's calibrated float32 matmul (all its cores)"
  import gin   # pylint: disable=import-outside-toplevel
  from replibench.config import registry   # pylint: disable=import-outside-toplevel
  from replibench.predict.hardware import DeviceProfile   # pylint: disable=import-outside-toplevel
  registry.register_all()
  gin.clear_config()
  gin.parse_config_files_and_bindings([os.path.join(REPO, path)], [])
  profile = DeviceProfile()
  return profile.peak_flops, f"{profile.name}: {profile.peak_flops / 1e12:.1f} TFLOP/s ({path})"


def cores(t: Trial, result: dict, args) -> int:
  if t.kind == "workers" and args.cpus_per_worker:
    return t.n * args.cpus_per_worker
  return (result.get("machine") or {}).get("cores") or 1


def row(t: Trial, result: dict, base: dict | None, machine: Machine, args) -> dict:
  """One table row from a trial's result.json (base: 1 device, same kind)."""
  record = result.get("throughput") or {}
  eps = record.get("examples_per_s")
  peak, _ = peak_flops(machine, t.precision)
  per_device = record.get("achieved_flops_per_s_per_device")
  fraction = (per_device / peak if peak and per_device
              else record.get("fraction_of_calibrated_matmul"))
  memory = record.get("peak_accelerator_memory_bytes") or {}
  speedup = eps / base["examples_per_s"] if eps and base and base.get("examples_per_s") else None
  # Logical CPU replicas share one process's cores: their ideal speed-up is 1x.
  ideal = 1 if t.kind == "replicas" and machine.device == "cpu" else t.n
  return {
      "model": t.model, "precision": t.precision, "setup": f"{t.kind}={t.n}",
      "global_batch": result.get("global_batch_size"), "examples_per_s": eps,
      "per_device": record.get("examples_per_s_per_device"),
      "per_core": eps / cores(t, result, args) if eps and machine.device == "cpu" else None,
      "step_ms": record["step_s"] * 1e3 if record.get("step_s") else None,
      "tflops_per_device": per_device / 1e12 if per_device else None,
      "fraction_of_peak": fraction,
      "peak_memory_mib": (max(memory.values()) if memory
                          else record.get("peak_host_memory_bytes", 0)) / 2**20,
      "memory_kind": "GPU" if memory else "host RSS",
      "speedup": speedup, "efficiency": speedup / ideal if speedup else None,
      "calibration_gflops": ((result.get("machine") or {}).get("calibration") or {}).get(
          "matmul_gflops"),
      "profile": result.get("profile_dir"),
  }


def _fmt(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> list[str]:
  head = ("| model | precision | setup | global batch | examples/s | per device | per core | "
          "step (ms) | TFLOP/s a device | of peak | peak memory (MiB) | speed-up | efficiency |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    if FAILED in r:
      lines.append(f"| {r['model']} | {r['precision']} | {r['setup']} | failed: "
                   f"{(r[FAILED].splitlines() or [''])[-1][:120]} |")
      continue
    lines.append(
        f"| {r['model']} | {r['precision']} | {r['setup']} | {r['global_batch']} | "
        f"{_fmt(r['examples_per_s'], ',.2f')} | {_fmt(r['per_device'], ',.2f')} | "
        f"{_fmt(r['per_core'], ',.2f')} | {_fmt(r['step_ms'], ',.1f')} | "
        f"{_fmt(r['tflops_per_device'], '.3f')} | {_fmt(r['fraction_of_peak'], '.1%')} | "
        f"{_fmt(r['peak_memory_mib'], ',.0f')} {r['memory_kind']} | "
        f"{_fmt(r['speedup'], '.2f')}x | {_fmt(r['efficiency'], '.0%')} |")
  return lines


def describe_machine(results: list[dict]) -> str:
  for result in results:
    machine = result.get("machine")
    if machine:
      accelerators = ", ".join(machine.get("accelerators") or []) or "none"
      return (f"{machine.get('cpu')} ({machine.get('cores')} cores; "
              f"{' '.join(machine.get('isa_flags') or [])}), accelerators: {accelerators}; "
              f"TensorFlow {result.get('tf_version')}, commit {result.get('git_sha')}")
  return "unknown (no run finished)"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--machine", choices=sorted(MACHINES), default="cpu")
  parser.add_argument("--scale", choices=("full", "tiny"), default="full")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--precisions", default="", help="default: the machine's")
  parser.add_argument("--setups", default="", help="e.g. replicas=1,workers=2 (default: the "
                      "machine's)")
  parser.add_argument("--batch", type=int, default=0, help="examples per device (default: "
                      "the machine's, per model)")
  parser.add_argument("--steps", type=int, default=0, help="--max_steps of each run")
  parser.add_argument("--cpus_per_worker", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=1, help="median over rounds")
  parser.add_argument("--out", default="", help="also write the rows (JSON) and table here")
  parser.add_argument("--gin_bindings", action="append", default=[], help="a binding for "
                      "every run, after the bench's own (repeatable), e.g. "
                      "'Experiment.jit_compile = True'")
  parser.add_argument("--profile", action="store_true", help="profile one more call of "
                      "each row's run and keep the profile and its top ops")
  parser.add_argument("--dry_run", action="store_true")
  args = parser.parse_args()
  machine = MACHINES[args.machine]
  chosen = trials(args, machine)
  if args.dry_run:
    for t in chosen:
      print(t.label, "\n   ", shlex.join(command(t, machine, args, "WORKDIR")))
    return
  runs = {t: [] for t in chosen}
  for r in range(args.rounds):
    for t in chosen:
      result = measure(t, machine, args, r)
      runs[t].append(result)
      said = (f"FAILED {result[FAILED]}" if FAILED in result else
              f"{result['throughput']['examples_per_s']} ex/s, {result['wall_s']} s")
      print(f"[round {r + 1}/{args.rounds}] {t.label}: {said}", flush=True)
      if args.out:   # After every trial: a run cut short by a time limit keeps its rows.
        write(args.out, *report({k: v for k, v in runs.items() if v}, machine, args))
  rows, lines = report(runs, machine, args)
  print("\n".join(lines), flush=True)


def report(runs: dict, machine: Machine, args) -> tuple[list[dict], list[str]]:
  rows = _rows(runs, machine, args)
  lines = [f"machine: {describe_machine([r for rs in runs.values() for r in rs])}",
           *([f"bindings: {'; '.join(args.gin_bindings)}"] if args.gin_bindings else []),
           *(f"peak, {p}: {peak_flops(machine, p)[1]}" for p in dict.fromkeys(
               t.precision for t in runs)), "", *table(rows)]
  profiled = [r for r in rows if r.get("profile")]
  if profiled:
    lines += ["", "Profiles (one more call a row, traced; its top ops in top_ops.md):",
              *(f"- {r['model']} {r['precision']} {r['setup']}: {r['profile']}"
                for r in profiled)]
  return rows, lines


def write(out: str, rows: list[dict], lines: list[str]) -> None:
  with open(out + ".json", "w") as f:
    json.dump({"rows": rows, "lines": lines}, f, indent=1)
  with open(out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def _rows(runs: dict, machine: Machine, args) -> list[dict]:
  """One row a trial: the median round's result, against 1 device of the same kind."""
  medians = {t: _median(results) for t, results in runs.items()}
  rows = []
  for t, result in medians.items():
    if FAILED in result:
      rows.append({"model": t.model, "precision": t.precision, "setup": f"{t.kind}={t.n}",
                   FAILED: result[FAILED]})
      continue
    base = medians.get(dataclasses.replace(t, n=1))
    base = base.get("throughput") if base and FAILED not in base else None
    rows.append(row(t, result, base, machine, args))
  return rows


def _median(results: list[dict]) -> dict:
  ok = [r for r in results if FAILED not in r]
  if not ok:
    return results[-1]
  rate = statistics.median_low([r["throughput"]["examples_per_s"] or 0 for r in ok])
  return next(r for r in ok if (r["throughput"]["examples_per_s"] or 0) == rate)


if __name__ == "__main__":
  main()
