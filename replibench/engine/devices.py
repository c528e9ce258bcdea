"""Making the local devices a topology asks for visible to TensorFlow.

With no accelerator, N replicas on one host are N logical CPU devices. TensorFlow
fixes its device list when the runtime initialises (the first op), so the split
must happen before that; afterwards it can only be checked.
"""

import os

from absl import logging
import tensorflow as tf

from replibench.errors import UserError

# Tests and tools that need several replicas set this before importing TensorFlow
# work; the engine reads it as the minimum number of logical CPUs to create.
CPU_DEVICES_ENV = "REPLIBENCH_CPU_DEVICES"


def _env_minimum() -> int:
  raw = os.environ.get(CPU_DEVICES_ENV, "1")
  try:
    value = int(raw)
  except ValueError:
    value = 0
  if value < 1:
    raise UserError(f"{CPU_DEVICES_ENV}={raw!r}: must be a positive whole number of logical "
                    f"CPU devices (or unset).")
  return value


def reserve_logical_cpus(n: int) -> None:
  """Splits the CPU into max(n, REPLIBENCH_CPU_DEVICES) logical devices, if TensorFlow
  has not initialised yet (afterwards the split cannot change; ensure_logical_cpus checks)."""
  cpus = tf.config.list_physical_devices("CPU")
  want = max(n, _env_minimum())
  try:
    if len(tf.config.get_logical_device_configuration(cpus[0]) or []) < want:
      tf.config.set_logical_device_configuration(
          cpus[0], [tf.config.LogicalDeviceConfiguration()] * want)
  except RuntimeError:
    pass  # Runtime already initialised: use what exists.


def ensure_logical_cpus(n: int) -> list[str]:
  """Returns the names of n logical CPU devices, creating them if still possible."""
  reserve_logical_cpus(n)
  logical = tf.config.list_logical_devices("CPU")
  if len(logical) < n:
    raise UserError(
        f"The topology asks for {n} CPU replicas but TensorFlow was initialised with "
        f"{len(logical)} logical CPU device(s), and the device list cannot change after "
        f"initialisation. Build the topology before running any TensorFlow op, or set "
        f"{CPU_DEVICES_ENV}={n} in the environment before the process starts.")
  return [d.name for d in logical[:n]]


def gpu_names() -> list[str]:
  return [d.name for d in tf.config.list_logical_devices("GPU")]


def resolve_kind(num_replicas: int, device: str) -> str:
  """'cpu' or 'gpu' for Local(num_replicas, device).

  'auto' is 'gpu' when at least num_replicas GPUs are visible, else 'cpu' (logical
  devices): a 2-replica config on a 1-GPU machine still runs its cross-replica code,
  where 'gpu' would refuse. The plan's device line says which was chosen.
  """
  if device not in ("auto", "cpu", "gpu"):
    raise UserError(f"Local(device={device!r}): device must be 'auto', 'cpu' or 'gpu'.")
  if device != "auto":
    return device
  return "gpu" if len(tf.config.list_physical_devices("GPU")) >= num_replicas else "cpu"


def local_devices(num_replicas: int, device: str) -> list[str]:
  """Device names for num_replicas replicas of type device ('auto', 'cpu', 'gpu')."""
  if resolve_kind(num_replicas, device) == "cpu":
    return ensure_logical_cpus(num_replicas)
  gpus = gpu_names()
  if not gpus:
    raise UserError(
        "Local(device='gpu') asks for GPUs but TensorFlow sees none on this machine "
        "(tf.config.list_physical_devices('GPU') is empty). Use device='auto' or 'cpu'.")
  if num_replicas > len(gpus):
    raise UserError(
        f"Local(num_replicas={num_replicas}, device='gpu'): only {len(gpus)} GPU(s) are "
        f"visible, one replica per GPU.")
  return gpus[:num_replicas]


def set_thread_pools(intra_op: int, inter_op: int) -> None:
  """Sizes TensorFlow's intra-op and inter-op thread pools (0: leave TensorFlow's
  default, one thread per core this process may use).

  Like the device split, the pools are fixed when the runtime starts; afterwards (an
  in-process test, a notebook) this logs and leaves them, and thread_pools() reports
  what the runtime really has.
  """
  setters = {"intra": tf.config.threading.set_intra_op_parallelism_threads,
             "inter": tf.config.threading.set_inter_op_parallelism_threads}
  for kind, threads in (("intra", intra_op), ("inter", inter_op)):
    if threads:
      try:
        setters[kind](threads)
      except RuntimeError:
        logging.warning("Experiment.%s_op_threads = %d: TensorFlow's runtime had already "
                        "started, so its %s-op pool keeps its size (%d).", kind, threads,
                        kind, thread_pools()[f"{kind}_op"])


def thread_pools() -> dict:
  """{'intra_op': n, 'inter_op': n}: the pools' sizes this process's runtime uses. A
  default (0) resolves as TensorFlow resolves it: TF_NUM_INTRAOP_THREADS /
  TF_NUM_INTEROP_THREADS where set, else the cores the process may use."""
  def size(configured: int, env: str) -> int:
    try:
      from_env = int(os.environ.get(env, "0"))
    except ValueError:
      from_env = 0
    return configured or (from_env if from_env > 0 else len(os.sched_getaffinity(0)))
  return {"intra_op": size(tf.config.threading.get_intra_op_parallelism_threads(),
                           "TF_NUM_INTRAOP_THREADS"),
          "inter_op": size(tf.config.threading.get_inter_op_parallelism_threads(),
                           "TF_NUM_INTEROP_THREADS")}
