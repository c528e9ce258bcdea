"""Where a result came from: code version, TensorFlow version and machine.

Machines of one name differ by generation (an AVX2 and an AVX-512 EPYC, both
"AMD EPYC", trained the same ResNet about 4x apart), so the machine record is a
fingerprint: the ISA flags that decide which kernels TensorFlow runs, and a
calibration measured at the start of every run (a float32 matmul and one
training step of a small conv net, in GFLOP/s). `replibench compare` uses the
calibration to tell whether two sweeps' times may be compared.
"""

import os
import platform
import subprocess
import time

import tensorflow as tf

from replibench import allocator, dirty, inputs
from replibench import machine as machine_id
from replibench.engine import devices

# The flags that change which kernels oneDNN / Eigen pick (x86 and Arm).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd",
             "sve", "sve2")
CALIBRATION_KEYS = ("matmul_gflops", "convnet_gflops")
# Seconds each of the calibration's two rates is timed for (its best-of): the default,
# and the variable that changes it for every run in its environment (launched tasks
# and SLURM jobs inherit it). The test suite sets 0.02: its runs read that a
# calibration is there, not its value, and it costs ~0.4 CPU-s less a run.
CALIBRATION_S, CALIBRATION_ENV = 0.15, "REPLIBENCH_CALIBRATION_S"


def git_sha() -> str:
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                         text=True, timeout=10, check=True).stdout.strip()
    # Only changes that can change a run count (dirty.py): the results history's own
    # appends under results/ must not turn the next run's commit into '<sha>-dirty'.
    return sha + ("-dirty" if dirty.relevant_changes(root, timeout=10) else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def _cpuinfo_field(name: str) -> str | None:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.split(":", 1)[0].strip() == name:
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return None


def cpu_model() -> str:
  return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def isa_flags() -> list[str]:
  """The kernel-relevant ISA flags this CPU reports (sorted; [] where unknown)."""
  flags = set((_cpuinfo_field("flags") or _cpuinfo_field("Features") or "").split())
  return sorted(flags.intersection(ISA_FLAGS))


def _best_rate(fn, flops: float, budget_s: float) -> float:
  """Highest GFLOP/s of fn() over repeats within budget_s (after one warm-up call)."""
  fn()
  best, deadline = 0.0, time.perf_counter() + budget_s
  while True:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    best = max(best, flops / seconds / 1e9)
    if time.perf_counter() > deadline:
      return best


def _matmul_rate(budget_s: float, n: int = 512) -> float:
  a = tf.random.stateless_normal([n, n], seed=[1, 2])
  matmul = tf.function(lambda x: tf.reduce_sum(tf.linalg.matmul(x, x)), autograph=False)
  return _best_rate(lambda: matmul(a).numpy(), 2.0 * n**3, budget_s)


def _convnet_rate(budget_s: float, batch: int = 32) -> float:
  """One SGD step (forward + backward) of conv3x3(1->16) / conv3x3 stride 2 (16->32)
  / dense on [batch, 28, 28, 1]; FLOPs counted analytically (backward = 2x forward)."""
  seed = iter(range(100))
  normal = lambda shape: tf.Variable(  # noqa: E731
      tf.random.stateless_normal(shape, seed=[3, next(seed)]) * 0.1)
  w1, w2, w3 = normal([3, 3, 1, 16]), normal([3, 3, 16, 32]), normal([14 * 14 * 32, 10])
  x = tf.random.stateless_normal([batch, 28, 28, 1], seed=[4, 0])

  @tf.function(autograph=False)
  def step():
    with tf.GradientTape() as tape:
      h = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
      h = tf.nn.relu(tf.nn.conv2d(h, w2, 2, "SAME"))
      loss = tf.reduce_sum(tf.square(tf.matmul(tf.reshape(h, [batch, -1]), w3)))
    for w, g in zip((w1, w2, w3), tape.gradient(loss, [w1, w2, w3])):
      w.assign_sub(1e-6 * g)
    return loss

  forward = 2 * batch * (28 * 28 * 9 * 16 + 14 * 14 * 9 * 16 * 32 + 14 * 14 * 32 * 10)
  return _best_rate(lambda: step().numpy(), 3.0 * forward, budget_s)


def calibration_budget_s() -> float:
  """REPLIBENCH_CALIBRATION_S if set (seconds, in (0, 10]), else 0.15."""
  raw = os.environ.get(CALIBRATION_ENV)
  if raw is None:
    return CALIBRATION_S
  try:
    value = float(raw)
  except ValueError:
    value = raw   # Not a number: inputs.number says so, showing it as written.
  return inputs.number(CALIBRATION_ENV, value, 0, 10, low_open=True,
                       meaning=f"seconds each calibration rate is timed for at a run's "
                               f"start; unset: {CALIBRATION_S}")


def calibrate(budget_s: float | None = None) -> dict:
  """{'matmul_gflops', 'convnet_gflops'}: this machine's speed now, in about 0.5 s
  (at the default budget).

  Measured in the run's own process at its start, so it also reflects what else
  the machine was doing. The best of several repeats within budget_s seconds each
  (None: calibration_budget_s()), like timeit.
  """
  budget_s = calibration_budget_s() if budget_s is None else budget_s
  with tf.device("/CPU:0"):
    return {"matmul_gflops": round(_matmul_rate(budget_s), 2),
            "convnet_gflops": round(_convnet_rate(budget_s), 2)}


def platform_name() -> str:
  """A one-line platform for logs, e.g. 'AMD EPYC x2 (avx2 avx512f fma)'."""
  accelerators = ", ".join(_accelerators())
  flags = " ".join(f for f in isa_flags() if f in ("avx2", "avx512f", "avx512_bf16", "fma"))
  return (f"{cpu_model()} x{len(os.sched_getaffinity(0))}"
          f"{' (' + flags + ')' if flags else ''}{', ' + accelerators if accelerators else ''}")


def _accelerators() -> list[str]:
  return [f"{d.device_type}:{tf.config.experimental.get_device_details(d).get('device_name', d.name)}"
          for d in tf.config.list_physical_devices() if d.device_type != "CPU"]


def accelerator_peak_memory() -> dict:
  """{logical GPU name: the most bytes TensorFlow's allocator held on it so far}."""
  return {d.name: tf.config.experimental.get_memory_info(d.name.split("device:")[-1])["peak"]
          for d in tf.config.list_logical_devices("GPU")}


def machine(calibration: dict | None = None) -> dict:
  """CPU model and ISA flags, cores usable by this process, accelerators TensorFlow
  sees with their peak memory in use (bytes, this process), the calibration
  measured at run start (None if none was), the malloc settings (allocator.py:
  they move CPU step times by up to 2x), TensorFlow's thread pools and the machine's
  fingerprint (replibench/machine.py)."""
  return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
          "isa_flags": isa_flags(), "accelerators": _accelerators(),
          "accelerator_peak_memory_bytes": accelerator_peak_memory(),
          "calibration": calibration, "malloc": allocator.describe(),
          "threads": devices.thread_pools(), "fingerprint": machine_id.fingerprint()}


def versions() -> dict:
  return {"git_sha": git_sha(), "tf_version": tf.__version__}
