"""ResNet-50 v1.5 at 224x224 on this machine's CPU: images/s by batch, and what bounds it.

    .venv/bin/python benchmarks/resnet50_cpu.py                # a quiet machine, ~15 min
    .venv/bin/python benchmarks/resnet50_cpu.py --scale=tiny   # checks the script (32 px)

1. The machine: CPU, cores, ISA flags; whether TensorFlow runs oneDNN (on by default
   on x86; TF_ENABLE_ONEDNN_OPTS=0 turns it off); the run calibration
   (provenance.calibrate, longer: a 512^3 float32 matmul and a small conv-net step),
   a 2048^3 matmul (the dense rate the cores reach) and the memory bandwidth (a
   numpy copy of 512 MiB, bytes read + written).
2. Arithmetic intensity: the plan's training FLOPs per image over the bytes a step
   moves per image: every layer's output written in the forward pass, read back in
   the backward pass, its gradient written and read (4 accesses of 4 bytes), plus
   the weights, their gradients and momenta (7 accesses a parameter a step) shared
   by the batch; beside the machine's balance (dense GFLOP/s over GB/s).
3. Throughput at doubling batches: `replibench run` of configs/resnet/
   imagenet_synthetic.gin on 1 replica and all cores, --steps steps each (the first
   call is not timed); stops before a run would pass --budget_s or the memory the
   last run's resident set predicts exceeds 70% of what is available.
4. oneDNN's kernels in one step (ONEDNN_VERBOSE=1, at --verbose_batch): milliseconds
   a step by primitive and implementation (e.g. brg_conv_fwd:avx512_core), and the
   step's remainder outside oneDNN (TensorFlow's own Eigen kernels: batch-norm
   statistics, element-wise ops, the optimizer; the framework).
"""

import argparse
import collections
import json
import os
import time

import numpy as np

import bench_runs   # benchmarks/bench_runs.py (this script's directory is on sys.path)
CONFIG = "configs/resnet/imagenet_synthetic.gin"
TINY = "configs/resnet/synthetic_tiny.gin"


def memory_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
  """Best bytes read + written per second of a numpy copy (STREAM's copy kernel)."""
  src = np.ones(mib * 2**20 // 8)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - start)
  return 2 * src.nbytes / best / 1e9


def machine_facts() -> dict:
  import tensorflow as tf   # pylint: disable=import-outside-toplevel
  from replibench.harness import provenance   # pylint: disable=import-outside-toplevel
  from replibench.internals import onednn_enabled   # pylint: disable=import-outside-toplevel
  big = tf.random.stateless_normal([2048, 2048], seed=[1, 2])
  matmul = tf.function(lambda x: tf.reduce_sum(tf.linalg.matmul(x, x)))
  matmul(big).numpy()
  best, deadline = float("inf"), time.monotonic() + 3.0   # Best of repeats, like timeit.
  while time.monotonic() < deadline:
    best = min(best, _timed(lambda: matmul(big).numpy()))
  return {"cpu": provenance.cpu_model(), "cores": len(os.sched_getaffinity(0)),
          "isa_flags": provenance.isa_flags(), "tensorflow": tf.__version__,
          "onednn": onednn_enabled(),
          "calibration": provenance.calibrate(budget_s=1.0),
          "matmul_2048_gflops": round(2 * 2048**3 / best / 1e9, 1),
          "memory_gbs": round(memory_bandwidth_gbs(), 1)}


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def intensity(image_size: int) -> dict:
  """FLOPs, activation elements and parameters of one training example (float32)."""
  import keras   # pylint: disable=import-outside-toplevel
  from models.resnet import resnet50   # pylint: disable=import-outside-toplevel
  from replibench.engine.measure import cost   # pylint: disable=import-outside-toplevel
  model = resnet50(input_shape=(image_size, image_size, 3))
  activations = sum(int(np.prod(layer.output.shape[1:])) for layer in model.layers
                    if not isinstance(layer, keras.layers.InputLayer))
  return {"train_flops": 3 * cost.forward_flops(model, (image_size, image_size, 3)),
          "activations": activations, "parameters": cost.parameter_count(model)}


def bytes_per_example(facts: dict, batch: int) -> float:
  return 4 * 4 * facts["activations"] + 7 * 4 * facts["parameters"] / batch


def run_config(batch: int, steps: int, tiny: bool, env: dict | None = None):
  """One `replibench run` of the synthetic config, 1 CPU replica: (result.json, output)."""
  bindings = ([f"include '{TINY}'"] if tiny else []) + [
      f"Experiment.global_batch_size = {batch}", "Experiment.steps_per_call = 1",
      "Experiment.log_every_steps = 1", "Experiment.train_epochs = 1000",
      "topology.Local.device = 'cpu'"]
  return bench_runs.run(bench_runs.command(CONFIG, "replicas", 1, bindings, steps, "WORKDIR"),
                        f"batch {batch}", {"CUDA_VISIBLE_DEVICES": "", **(env or {})})


def available_bytes() -> int:
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  return 0


def batch_sweep(args, facts: dict, machine: dict) -> list[dict]:
  rows, batch, started = [], args.first_batch, time.monotonic()
  per_image_rss = None
  while True:
    t0 = time.monotonic()
    result, _ = run_config(batch, args.steps, args.scale == "tiny")
    record = result["throughput"]
    eps, rss = record["examples_per_s"], record["peak_host_memory_bytes"]
    gflops = eps * record["train_flops_per_example"] / 1e9
    rows.append({"batch": batch, "images_per_s": eps, "step_s": record["step_s"],
                 "gflops": gflops, "calibrated_matmul": machine["calibration"]["matmul_gflops"],
                 "of_matmul_2048": gflops / machine["matmul_2048_gflops"],
                 "of_run_calibration": record["fraction_of_calibrated_matmul"],
                 "intensity": facts["train_flops"] / bytes_per_example(facts, batch),
                 "peak_rss_gib": rss / 2**30, "wall_s": time.monotonic() - t0})
    print(_row_line(rows[-1]), flush=True)
    if len(rows) > 1:
      per_image_rss = (rss - rows[-2]["peak_rss_gib"] * 2**30) / (batch - rows[-2]["batch"])
    spent = time.monotonic() - started
    next_wall = 2.2 * rows[-1]["wall_s"]   # Twice the steps, and a longer first call.
    next_rss = rss + (per_image_rss or rss / batch) * batch
    if spent + next_wall > args.budget_s or next_rss > 0.7 * available_bytes():
      why = ("time" if spent + next_wall > args.budget_s else
             f"memory ({next_rss / 2**30:.1f} GiB predicted)")
      print(f"stopping before batch {2 * batch}: {why}", flush=True)
      return rows
    batch *= 2


def _row_line(r: dict) -> str:
  return (f"batch {r['batch']:4d}: {r['images_per_s']:8.2f} images/s, step {r['step_s']:7.2f} s, "
          f"{r['gflops']:7.1f} GFLOP/s = {r['of_matmul_2048']:.0%} of the 2048^3 matmul "
          f"({r['of_run_calibration']:.0%} of the run's 512^3 calibration), intensity "
          f"{r['intensity']:.0f} FLOP/byte, peak RSS {r['peak_rss_gib']:.1f} GiB")


def onednn_profile(batch: int, steps: int, tiny: bool) -> dict:
  """oneDNN execution time a step by (primitive, implementation, propagation kind), from
  ONEDNN_VERBOSE's exec lines."""
  result, output = run_config(batch, steps, tiny, env={"ONEDNN_VERBOSE": "1"})
  ms = collections.Counter()
  for line in output.splitlines():
    fields = line.split(",")
    if not fields[0].startswith("onednn_verbose") or "exec" not in fields:
      continue
    i = fields.index("exec")
    shape = fields[-2]
    # The run's calibration (batch-32 convs, 512^3 matmul) also runs oneDNN: keep the
    # model's own primitives (its batch leads every problem descriptor).
    if not (shape.startswith(f"mb{batch}") or shape.startswith(f"{batch}x")):
      continue
    try:
      ms[(fields[i + 2], fields[i + 3], fields[i + 4])] += float(fields[-1])
    except (ValueError, IndexError):
      continue
  step_ms = result["throughput"]["step_s"] * 1e3
  return {"batch": batch, "steps": steps, "step_ms": step_ms,
          "onednn_ms_per_step": {" ".join(key): v / steps for key, v in ms.most_common()}}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=("full", "tiny"), default="full")
  parser.add_argument("--first_batch", type=int, default=8)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--budget_s", type=float, default=900)
  parser.add_argument("--verbose_batch", type=int, default=4, help="not 32 (the calibration's)")
  args = parser.parse_args()
  size = 32 if args.scale == "tiny" else 224
  machine = machine_facts()
  print(json.dumps(machine, indent=1), flush=True)
  facts = intensity(size)
  balance = machine["matmul_2048_gflops"] / machine["memory_gbs"]
  print(f"ResNet-50 v1.5 at {size}x{size}: {facts['train_flops'] / 1e9:.2f} GFLOP a training "
        f"image, {facts['activations'] / 1e6:.1f} M activations, {facts['parameters'] / 1e6:.1f} M "
        f"parameters; machine balance {balance:.1f} FLOP/byte "
        f"({machine['matmul_2048_gflops']} GFLOP/s over {machine['memory_gbs']} GB/s)", flush=True)
  rows = batch_sweep(args, facts, machine)
  profile = onednn_profile(args.verbose_batch, 2, args.scale == "tiny")
  total = sum(profile["onednn_ms_per_step"].values())
  print(f"oneDNN at batch {profile['batch']}: {total:.1f} ms of a {profile['step_ms']:.1f} ms "
        f"step ({total / profile['step_ms']:.0%}; verbose logging slows the step):")
  for name, value in list(profile["onednn_ms_per_step"].items())[:12]:
    print(f"  {value:9.1f} ms  {name}")
  best = max(rows, key=lambda r: r["images_per_s"])
  print(f"best: batch {best['batch']}, {best['images_per_s']:.2f} images/s "
        f"({best['images_per_s'] / machine['cores']:.2f} a core), {best['gflops']:.1f} GFLOP/s, "
        f"{best['of_matmul_2048']:.0%} of the dense matmul rate; intensity "
        f"{best['intensity']:.0f} FLOP/byte against a balance of {balance:.1f}: "
        f"{'compute' if best['intensity'] > balance else 'memory'}-bound by that measure")


if __name__ == "__main__":
  main()
