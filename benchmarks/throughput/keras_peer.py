"""The Keras peer of replibench's ResNet-50 throughput: `model.fit` as a new user writes it.

    .venv/bin/python benchmarks/throughput/keras_peer.py --out=results/accelerator/keras-peer   # one GPU
    .venv/bin/python benchmarks/throughput/keras_peer.py --scale=tiny        # checks it on a CPU in a minute
    .venv/bin/python benchmarks/throughput/keras_peer.py --dry_run           # the trials it would run

What a user comparing replibench with Keras on the same GPU would run (issue 41):
`keras.applications.ResNet50(weights=None)` (ResNet-50 v1: its stride-2 convolutions
are the blocks' 1x1s, where replibench's v1.5 strides the 3x3s, ~7% more FLOPs; Keras'
BatchNormalization, as replibench's), SGD with momentum 0.9 and sparse categorical cross-entropy on
logits, trained by `model.fit` on one synthetic 224x224x3 batch repeated
(`tf.data.Dataset.from_tensors(...).repeat()`, as replibench's synthetic data repeats
one batch a replica), at the same batch (256) and precision (a Keras mixed-precision
policy; mixed_float16 gets Keras' own loss scaling) as replibench's row, with and
without `model.compile(jit_compile=True)`. Each trial runs in a process of its own
(a fresh policy, allocator and XLA cache), trains --warmup_steps (tracing, XLA
compilation, autotuning: not timed), then --steps timed by a callback over whole
epochs of `fit`; images/s = steps x batch / seconds. Printed and written (--out:
OUT.json rows, OUT.md table) after every trial, so a cut run keeps its rows.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

SCALES = {   # image size, batch, warmup steps, timed steps
    "full": (224, 256, 5, 40),
    "tiny": (32, 4, 1, 2),
}
PRECISIONS = ("mixed_bfloat16", "mixed_float16", "float32")


def trial_command(precision: str, jit: bool, args) -> list[str]:
  """This script, in a process of its own, for one trial (it prints one JSON line)."""
  return [sys.executable, os.path.abspath(__file__), f"--scale={args.scale}",
          f"--one={precision},{int(jit)}", f"--batch={args.batch}", f"--steps={args.steps}",
          f"--warmup_steps={args.warmup_steps}", f"--image_size={args.image_size}",
          f"--steps_per_execution={args.steps_per_execution}"]


def run_one(precision: str, jit: bool, args) -> dict:
  """One trial in this process: {precision, jit_compile, ..., images_per_s}."""
  import keras   # pylint: disable=import-outside-toplevel
  import tensorflow as tf   # pylint: disable=import-outside-toplevel
  keras.config.set_dtype_policy(precision)
  size, batch = args.image_size, args.batch
  model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                      classes=1000, classifier_activation=None)
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=jit, steps_per_execution=args.steps_per_execution)
  images = tf.random.normal([batch, size, size, 3], seed=1)
  labels = tf.random.uniform([batch], 0, 1000, dtype=tf.int32, seed=2)
  data = tf.data.Dataset.from_tensors((images, labels)).repeat()

  class EpochTimer(keras.callbacks.Callback):
    """The epoch of `fit`, begin to end (host clock): Keras reads the epoch's logs as
    numbers before on_epoch_end, which waits for the device's last step."""

    def on_epoch_begin(self, epoch, logs=None):
      self.start = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
      self.seconds = time.monotonic() - self.start

  timer = EpochTimer()
  started = time.monotonic()
  model.fit(data, steps_per_epoch=args.warmup_steps, epochs=1, verbose=0)
  warmup_s = time.monotonic() - started
  model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[timer])
  gpus = tf.config.list_physical_devices("GPU")
  peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] if gpus else None
  return {"model": "keras.applications.ResNet50", "precision": precision,
          "jit_compile": jit, "batch": batch, "image_size": size,
          "steps_per_execution": args.steps_per_execution, "timed_steps": args.steps,
          "images_per_s": round(args.steps * batch / timer.seconds, 2),
          "step_ms": round(timer.seconds / args.steps * 1e3, 2),
          "warmup_s": round(warmup_s, 1), "peak_gpu_memory_mib": peak and peak / 2**20,
          "device": gpus[0].name if gpus else "CPU", "tf_version": tf.__version__,
          "keras_version": keras.__version__}


def table(rows: list[dict]) -> list[str]:
  lines = ["| model | precision | jit_compile | batch | images/s | step (ms) | peak GPU memory "
           "(MiB) | device |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | {r['precision']} | {r['jit_compile']} | failed: "
                   f"{r['error'][-150:]} |")
      continue
    memory = f"{r['peak_gpu_memory_mib']:,.0f}" if r["peak_gpu_memory_mib"] else "-"
    lines.append(f"| {r['model']} | {r['precision']} | {r['jit_compile']} | {r['batch']} | "
                 f"{r['images_per_s']:,.1f} | {r['step_ms']:,.1f} | {memory} | {r['device']} |")
  return lines


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=sorted(SCALES), default="full")
  parser.add_argument("--precisions", default="mixed_bfloat16",
                      help=f"comma-separated, of {', '.join(PRECISIONS)}")
  parser.add_argument("--jit", default="false,true", help="jit_compile values to try")
  parser.add_argument("--batch", type=int, default=0)
  parser.add_argument("--steps", type=int, default=0, help="timed steps")
  parser.add_argument("--warmup_steps", type=int, default=0)
  parser.add_argument("--image_size", type=int, default=0)
  parser.add_argument("--steps_per_execution", type=int, default=1,
                      help="Keras' default, 1 (a new user's)")
  parser.add_argument("--timeout", type=float, default=600, help="seconds a trial")
  parser.add_argument("--out", default="", help="write OUT.json and OUT.md")
  parser.add_argument("--dry_run", action="store_true")
  parser.add_argument("--one", default="", help=argparse.SUPPRESS)   # A trial's process.
  args = parser.parse_args()
  size, batch, warmup, steps = SCALES[args.scale]
  args.image_size, args.batch = args.image_size or size, args.batch or batch
  args.warmup_steps, args.steps = args.warmup_steps or warmup, args.steps or steps
  if args.one:
    precision, jit = args.one.split(",")
    print("ROW " + json.dumps(run_one(precision, jit == "1", args)), flush=True)
    return 0
  precisions = args.precisions.split(",")
  unknown = [p for p in precisions if p not in PRECISIONS]
  jits = [{"true": True, "false": False}.get(j.strip().lower()) for j in args.jit.split(",")]
  if unknown or None in jits:
    print(f"keras_peer.py: --precisions from {PRECISIONS}, --jit from true,false "
          f"(got {args.precisions!r}, {args.jit!r})", file=sys.stderr)
    return 2
  trials = [(p, j) for p in precisions for j in jits]
  if args.dry_run:
    for p, j in trials:
      print(shlex.join(trial_command(p, j, args)))
    return 0
  rows = []
  for p, j in trials:
    rows.append(_trial(p, j, args))
    said = rows[-1].get("images_per_s", "FAILED")
    print(f"[keras peer] {p} jit_compile={j}: {said} images/s", flush=True)
    if args.out:
      _write(args.out, rows)
  print("\n".join(table(rows)), flush=True)
  return 0 if all("error" not in r for r in rows) else 1


def _trial(precision: str, jit: bool, args) -> dict:
  try:
    proc = subprocess.run(trial_command(precision, jit, args), capture_output=True, text=True,
                          timeout=args.timeout)
    found = [l for l in proc.stdout.splitlines() if l.startswith("ROW ")]
    if proc.returncode == 0 and found:
      return json.loads(found[-1][4:])
    error = (proc.stdout + proc.stderr)[-3000:]
  except subprocess.TimeoutExpired:
    error = f"timed out after {args.timeout} s"
  return {"model": "keras.applications.ResNet50", "precision": precision,
          "jit_compile": jit, "error": error}


def _write(out: str, rows: list[dict]) -> None:
  with open(out + ".json", "w") as f:
    json.dump({"rows": rows}, f, indent=1)
  with open(out + ".md", "w") as f:
    f.write("\n".join(table(rows)) + "\n")


if __name__ == "__main__":
  sys.exit(main())
