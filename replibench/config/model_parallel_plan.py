"""`replibench plan` for a topology.Mesh: what each device of a model replica holds,
computes and sends, built and traced as that device sees it.

The workload's models are built under the mesh's layout with no device behind it
(engine/model_parallel/layout.py: planning), so a tensor-parallel device's share
(local shapes) and a pipeline's stages are what the run will make; one replica's
step is traced there. From that:

  parameters, optimizer state, other state   bytes of the variables a device holds
      (a pipeline stage: its pieces' parameters, and optimizer state in proportion);
  activations     bytes of the forward tensors the backward pass reads, per device
      (engine/measure/device_memory.py; a pipeline keeps all n micro-batches');
  FLOPs           per step: the workload's train FLOPs per example of the device's
      share (tensor) or of the model split by each stage's share of the traced
      step's FLOPs (pipeline), times the per-replica batch;
  bytes per step  the model axis (activations: tensor-parallel all-reduces, pipeline
      sends) and the data axis (gradients, batch-norm moments, outputs), as
      payload and as bytes put on the wire (ring algorithms) by each device
      (engine/measure/communication.by_axis, as the run reports them);
  bubble          a pipeline's idle share, (K-1)/(n+K-1);
  fits            whether the largest device total fits topology.Mesh.device_memory_bytes.
"""

import contextlib
import math

import tensorflow as tf

from replibench import internals
from replibench.engine.measure import communication, cost, device_memory
from replibench.engine.model_parallel import Mesh, layout as layout_lib
from replibench.engine.model_parallel.mesh import check_split


@contextlib.contextmanager
def planning(experiment):
  """The layout one replica's step is planned under (active inside the block), or None
  when the topology is not a Mesh: models built and traced in the block are one device's
  share (tensor) or staged (pipeline), on no device."""
  mesh = experiment.topology
  if not isinstance(mesh, Mesh):
    yield None
    return
  layout = mesh.layout()
  with layout_lib.active(layout):
    yield layout


def facts(experiment, layout: layout_lib.Layout, entries: list, graph: tf.Graph) -> dict:
  """The plan's model_parallel entry, from the step traced under `planning` (its
  communication entries and graph)."""
  mesh, workload, spec = experiment.topology, experiment.workload, experiment.train_spec()
  check_split(layout)
  with layout_lib.active(mesh.layout()):   # Its own: the models describe builds split alike.
    share = workload.describe(spec)   # FLOPs of a device's share (tensor) or the model.
  devices = _devices(mesh, layout, workload, graph, share, spec.per_replica_batch_size)
  largest = max(row["total"] for row in devices)
  return {
      "parallelism": mesh.parallelism, "data": mesh.data, "model": mesh.model,
      "micro_batches": mesh.micro_batches, "workers": mesh.workers,
      "bubble_fraction": _bubble(mesh),
      "per_device": devices,
      "max_device_bytes": largest,
      **communication.by_axis(entries, spec.steps_per_call, mesh.data),
      "device_memory_bytes": mesh.device_memory_bytes or None,
      "fits": (largest <= mesh.device_memory_bytes) if mesh.device_memory_bytes else None,
  }


def _bubble(mesh: Mesh) -> float:
  if mesh.parallelism != layout_lib.PIPELINE:
    return 0.0
  k, n = mesh.model, mesh.micro_batches
  return round((k - 1) / (n + k - 1), 4)


def _variables(workload) -> list:
  """Every variable of the workload's checkpointed models and optimizers, once."""
  seen, found = set(), []
  for item in workload.checkpoint_items().values():
    for v in getattr(item, "variables", []):
      if id(v) not in seen:
        seen.add(id(v))
        found.append(v)
  return found


def _bytes(variables) -> int:
  return sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables)


def _devices(mesh: Mesh, layout, workload, graph, share: dict, per_replica: int) -> list:
  """One row per device of a model replica: held bytes by kind, activations, FLOPs."""
  variables = _variables(workload)
  optimizers = [item for item in workload.checkpoint_items().values()
                if hasattr(item, "build") and hasattr(item, "iterations")]
  slots = {id(v) for o in optimizers for v in cost.optimizer_slots(o)}
  params = [v for v in variables if v.trainable]
  optimizer = [v for v in variables if id(v) in slots]
  other = [v for v in variables if not v.trainable and id(v) not in slots]
  kept = device_memory.activation_bytes(graph)
  flops_step = (share.get("train_flops_per_example") or 0) * per_replica
  if mesh.parallelism == layout_lib.TENSOR:
    return [_row(0, _bytes(params), _bytes(optimizer), _bytes(other), sum(kept.values()),
                 flops_step)]
  stage_of = {}
  for pipeline in layout.pipelines:
    for k, stage in enumerate(pipeline.stage_variables()):
      stage_of.update({id(v): k for v in stage})
  ratio = _bytes(optimizer) / max(1, _bytes(params))   # Slot bytes a parameter byte.
  by_device = device_memory.flops(graph)
  names = [internals.canonical_device(f"/device:CPU:{k}") for k in range(mesh.model)]
  total_flops = max(1, sum(by_device.values()))
  rows = []
  for k, name in enumerate(names):
    held = [v for v in params if stage_of.get(id(v), 0) == k]
    extra = [v for v in other if stage_of.get(id(v), 0) == k]
    device_flops = by_device.get(name, 0) + (by_device.get("", 0) if k == 0 else 0)
    activations = kept.get(name, 0) + (kept.get("", 0) if k == 0 else 0)
    rows.append(_row(k, _bytes(held), round(ratio * _bytes(held)), _bytes(extra),
                     activations, round(flops_step * device_flops / total_flops)))
  return rows


def _row(index: int, params: int, optimizer: int, other: int, activations: int,
         flops: int) -> dict:
  return {"device": index, "parameter_bytes": params, "optimizer_bytes": optimizer,
          "other_state_bytes": other, "activation_bytes": activations,
          "total": params + optimizer + other + activations, "train_flops_per_step": flops}


def format_facts(facts: dict) -> str:
  """The plan's model_parallel line: per device, each axis, the bubble, the fit."""
  mb = lambda b: f"{b / 1e6:.3g} MB"  # noqa: E731
  devices = "; ".join(
      f"device {r['device']}: params {mb(r['parameter_bytes'])}, optimizer "
      f"{mb(r['optimizer_bytes'])}, other {mb(r['other_state_bytes'])}, activations "
      f"{mb(r['activation_bytes'])} (total {mb(r['total'])}), "
      f"{r['train_flops_per_step'] / 1e9:.3g} GFLOP/step" for r in facts["per_device"])
  axes = ", ".join(f"{name.replace('_', ' ')} {facts[name]['collectives_per_step']:g} "
                   f"collectives {mb(facts[name]['wire_bytes_per_step'])} on the wire"
                   for name in ("model_axis", "data_axis"))
  fit = ("" if facts["fits"] is None else
         f"; {'fits' if facts['fits'] else 'DOES NOT FIT'} {mb(facts['device_memory_bytes'])} "
         f"a device")
  return (f"{facts['parallelism']}, {facts['data']} x {facts['model']} devices"
          f"{', bubble ' + format(facts['bubble_fraction'], '.3g') if facts['bubble_fraction'] else ''}"
          f" | {devices} | per step and device: {axes}{fit}")
