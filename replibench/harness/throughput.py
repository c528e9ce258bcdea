"""The throughput record of a run on synthetic data (result.json `throughput`).

Time to target is undefined on synthetic data (replibench/data/synthetic.py), so
such a run reports what it can: examples/s in all and per device (replica), the
step time, the FLOP rate from the plan's FLOPs per example (Workload.describe,
what `replibench plan` prints), its fraction of the machine's calibrated float32
matmul rate where the replicas are CPU devices (an accelerator's peak comes from
a device profile: benchmarks/throughput/throughput.py), and peak memory: this process's
resident set and, per accelerator, TensorFlow's allocator peak.
"""

import resource

from replibench.harness import provenance
from replibench.workloads.base import SYNTHETIC_TIME_TO_TARGET


def train_flops_per_example(workload, spec) -> float | None:
  """The plan's training FLOPs per example (None where the workload cannot say)."""
  return workload.describe(spec).get("train_flops_per_example")


def replica_devices(replicator) -> list[str]:
  """The devices this process's replicas run on ([] where the strategy does not say)."""
  return list(getattr(replicator.strategy.extended, "worker_devices", ()))


def peak_host_memory_bytes() -> int:
  """This process's peak resident set so far (Linux reports kibibytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def why_none(start_step: int, end_step: int, steps_per_call: int, total_steps: int) -> str:
  """Why a session that trained from start_step to end_step timed no training call, and
  the smallest --max_steps that times one (the first call traces and compiles, so it is
  never timed: a throughput needs a second)."""
  calls = -(-(end_step - start_step) // steps_per_call)
  smallest = start_step + 2 * steps_per_call
  said = (f"no throughput: this session ran {calls} training call(s) of {steps_per_call} "
          f"step(s) (steps {start_step}-{end_step}) and the first call, which traces and "
          f"compiles the step, is never timed")
  if smallest > total_steps:
    return (f"{said}; the run's budget ({total_steps} steps) holds fewer than two calls: "
            f"raise Experiment.train_epochs or lower Experiment.steps_per_call")
  return f"{said}; --max_steps={smallest} (two calls) is the smallest that gives one"


def record(examples_per_s: float | None, global_batch_size: int, num_replicas: int,
           num_workers: int, devices: list[str], flops_per_example: float | None,
           calibration: dict | None, no_throughput_because: str | None = None) -> dict:
  """The record; examples_per_s over the training calls after the first (None: one call,
  and no_throughput_because says so), devices: this process's replica devices,
  calibration: this process's (provenance)."""
  per_device = examples_per_s / num_replicas if examples_per_s else None
  flops_per_s = examples_per_s * flops_per_example if per_device and flops_per_example else None
  on_cpu = bool(devices) and all("CPU" in d.upper() for d in devices)
  matmul = (calibration or {}).get("matmul_gflops")
  fraction = (flops_per_s / (matmul * 1e9 * num_workers)
              if flops_per_s and matmul and on_cpu else None)
  return {
      "data": "synthetic", "time_to_target": SYNTHETIC_TIME_TO_TARGET,
      "examples_per_s": examples_per_s, "devices": num_replicas, "device_names": devices,
      "examples_per_s_per_device": _round(per_device),
      "step_s": _round(global_batch_size / examples_per_s if examples_per_s else None),
      "train_flops_per_example": flops_per_example,
      "achieved_flops_per_s": _round(flops_per_s),
      "achieved_flops_per_s_per_device": _round(flops_per_s / num_replicas
                                                if flops_per_s else None),
      # The calibration times one matmul on all of this process's cores, which its
      # logical CPU replicas share; each worker process of a launch has its own cores.
      "fraction_of_calibrated_matmul": _round(fraction),
      "peak_host_memory_bytes": peak_host_memory_bytes(),
      "peak_accelerator_memory_bytes": provenance.accelerator_peak_memory(),
      "no_throughput_because": None if examples_per_s else no_throughput_because,
  }


def summary_scalars(record_: dict) -> dict:
  """TensorBoard's throughput/... scalars of a record (those it has)."""
  keys = ("examples_per_s", "examples_per_s_per_device", "step_s", "achieved_flops_per_s",
          "fraction_of_calibrated_matmul", "peak_host_memory_bytes")
  values = {f"throughput/{k}": record_[k] for k in keys if record_.get(k) is not None}
  for device, peak in (record_.get("peak_accelerator_memory_bytes") or {}).items():
    values[f"throughput/peak_memory_bytes/{device.split('device:')[-1]}"] = peak
  return values


def _round(value: float | None, digits: int = 6) -> float | None:
  return None if value is None else float(f"{value:.{digits}g}")
