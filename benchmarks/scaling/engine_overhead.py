"""Engine overhead: replibench's compiled step against a hand-written tf.distribute step.

Prints, from one run: the per-step time of the engine and of a hand-written
`tf.function` training step with plain tf.distribute (same model, same
in-memory inputs, same k steps per call) and their ratio, for 1 and 2 logical
CPU replicas; then the throughput of 1 against 2 worker processes launched
locally with `replibench launch` (each pinned to one core).

  make bench-engine            # or: .venv/bin/python benchmarks/scaling/engine_overhead.py
Target: engine / hand-written <= 1.03.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("REPLIBENCH_CPU_DEVICES", "2")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)  # The checkout.

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.resnet import small_resnet  # noqa: E402
from replibench import engine  # noqa: E402

BATCH, STEPS_PER_CALL = 128, 5


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH * 4, 28, 28, 1)).astype(np.float32)
  y = rng.integers(0, 10, size=(BATCH * 4,)).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat()


def _loss(model, x, y):
  logits = model(x, training=True)
  per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
  return tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)


def _build(strategy):
  with strategy.scope():
    keras.utils.set_random_seed(0)
    model = small_resnet(widths=(16, 32, 64))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
  return model, optimizer


def engine_step(num_replicas):
  """The engine: researcher-style step_fn, Replicator.compile."""
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"))
  model, optimizer = _build(replicator.strategy)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = _loss(model, *batch)
    replicator.regime.apply_gradients(optimizer, tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables)
    return {"loss": loss * engine.num_replicas()}   # The local mean; the engine averages.

  input_fn = lambda ctx: _data().batch(ctx.per_replica_batch_size)  # noqa: E731
  return replicator.compile(step_fn, input_fn, BATCH, steps_per_call=STEPS_PER_CALL)


def handwritten_step(num_replicas):
  """What one writes with plain tf.distribute: strategy.run in a tf.range loop."""
  devices = [f"/cpu:{i}" for i in range(num_replicas)]
  strategy = tf.distribute.MirroredStrategy(
      devices, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0]))
  model, optimizer = _build(strategy)
  per_replica = BATCH // num_replicas
  iterator = iter(strategy.distribute_datasets_from_function(
      lambda ctx: _data().batch(per_replica)))

  def step(batch):
    with tf.GradientTape() as tape:
      loss = _loss(model, *batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))   # Keras sums over replicas.
    return loss

  @tf.function
  def steps():
    total = tf.constant(0.0)
    for _ in tf.range(STEPS_PER_CALL):
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, (next(iterator),)),
                               axis=None)
    return total / STEPS_PER_CALL

  return lambda: {"loss": steps().numpy()}


def time_interleaved(fns: dict, rounds: int, calls: int) -> dict:
  """Median seconds per step of each fn, timing them in alternation to share the noise."""
  for fn in fns.values():
    fn()
    fn()                    # trace and warm up
  samples = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      for _ in range(calls):
        fn()
      samples[name].append((time.perf_counter() - start) / (calls * STEPS_PER_CALL))
  return {name: statistics.median(s) for name, s in samples.items()}


def worker_throughput(workers: int, steps: int) -> float:
  """examples/s of a real ResNet run with `workers` processes, each on one core."""
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "-m", "replibench.cli", "launch", f"--workers={workers}",
           "--cpus_per_worker=1", "--", "run", "--gin_file=configs/resnet/fashion_mnist.gin",
           "--gin_file=configs/topology/workers.gin", f"--max_steps={steps}",
           "--gin_bindings=Experiment.eval_every_epochs = 100",
           "--gin_bindings=Experiment.checkpoint_every_epochs = 100", f"--workdir={workdir}"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    with open(os.path.join(workdir, "result.json")) as f:
      return json.load(f)["examples_per_s"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=4)
  parser.add_argument("--worker_steps", type=int, default=120)
  args = parser.parse_args()
  print(f"small_resnet(16,32,64), global batch {BATCH}, {STEPS_PER_CALL} steps per call, "
        f"{args.rounds} interleaved rounds of {args.calls} calls; median s/step")
  for n in (1, 2):
    t = time_interleaved({"engine": engine_step(n), "handwritten": handwritten_step(n)},
                         args.rounds, args.calls)
    print(f"replicas={n}: engine {t['engine'] * 1e3:.1f} ms/step, hand-written "
          f"{t['handwritten'] * 1e3:.1f} ms/step, ratio {t['engine'] / t['handwritten']:.3f}")
  one, two = worker_throughput(1, args.worker_steps), worker_throughput(2, args.worker_steps)
  print(f"workers=1: {one:.0f} examples/s, workers=2: {two:.0f} examples/s, "
        f"speed-up {two / one:.2f}x (1 core per worker)")
  print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
  main()
