"""Seconds per step of a replica spanning devices (a topology.Mesh plan), and its fit.

From the plan's model_parallel entry (config/model_parallel_plan.py): each device's
train FLOPs per step, held bytes and activations, and each axis's collectives and
bytes on the wire. With M devices a replica inside one host and D replicas:

  compute_s  the slowest device: overhead + its FLOPs / achieved FLOP/s; a pipeline
             of K stages over n micro-batches takes (n + K - 1) / n of that (GPipe:
             the bubble (K-1)/(n+K-1) of each device idles);
  model_s    the model axis, inside a host: per collective or send 2(M-1) hops (one
             for a pipeline's send) of the in-host latency, plus its wire bytes over
             the in-host link; not overlapped with compute;
  data_s     the data axis: the gradients' all-reduce among D replicas, each device
             with its own share (hardware.allreduce_seconds, with devices_per_host / M
             replicas a host);
  step_s     compute_s + model_s + data_s.

Per-device FLOPs and activations scale with the per-replica batch: a prediction for
D' replicas (predict --workers) rescales the plan's, made at D, by D / D'.
A configuration fits where every device's parameters, optimizer and other state and
activations fit the profile's memory_bytes.
"""

import dataclasses

from replibench.predict.hardware import DeviceProfile, StepTime, allreduce_seconds


def step_time(profile: DeviceProfile, plan: dict, num_replicas: int) -> tuple[StepTime, dict]:
  """(StepTime, details) of the plan's mesh at num_replicas data-parallel replicas."""
  mp = plan["model_parallel"]
  m = mp["model"]
  scale = mp["data"] / num_replicas   # Per-replica batch against the plan's.
  share = profile.core_share(num_replicas * m)
  slowest = max(row["train_flops_per_step"] for row in mp["per_device"]) * scale
  compute = (profile.overhead_s + slowest / profile.achieved_flops) / share
  if mp["parallelism"] == "pipeline":
    n = mp["micro_batches"]
    compute *= (n + m - 1) / n
  model = mp["model_axis"]
  hops = 1 if mp["parallelism"] == "pipeline" else 2 * (m - 1)
  model_s = (model["collectives_per_step"] * hops * profile.intra_host_latency_s / share
             + model["wire_bytes_per_step"] * scale / profile.intra_host_bytes_per_s)
  data = mp["data_axis"]
  per_host = dataclasses.replace(profile, devices_per_host=max(1, profile.devices_per_host // m))
  data_s = allreduce_seconds(per_host, data["payload_bytes_per_step"],
                             round(data["collectives_per_step"]), num_replicas, idle_s=compute)
  details = {"compute_s": compute, "model_axis_s": model_s, "data_axis_s": data_s,
             "bubble_fraction": mp["bubble_fraction"],
             "max_device_bytes": max_device_bytes(plan, num_replicas)}
  return StepTime(compute_s=compute, comm_s=model_s + data_s), details


def max_device_bytes(plan: dict, num_replicas: int) -> float:
  """The largest device's bytes: state as planned, activations at the per-replica batch."""
  mp = plan["model_parallel"]
  scale = mp["data"] / num_replicas
  return max(row["total"] - row["activation_bytes"] * (1 - scale) for row in mp["per_device"])


def fits(plan: dict, profile: DeviceProfile, num_replicas: int) -> bool | None:
  """Whether every device's bytes fit the profile's memory (None: the profile gives none)."""
  if not profile.memory_bytes:
    return None
  return max_device_bytes(plan, num_replicas) <= profile.memory_bytes
