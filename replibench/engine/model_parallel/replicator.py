"""MeshReplicator: the engine's Replicator over a topology.Mesh.

The researcher's step_fn stays the one-device step: it sees D replicas (engine.
num_replicas(), replica_id() and the collectives are the data axis's), and the
models built under `scope()` are split across each replica's devices as the layout
says (tensor_parallel.py, pipeline.py). Under tensor parallelism the strategy has a
replica per device and each replica's M devices get the same batch (the dataset's
elements are repeated M times, in replica order); under a pipeline it has one per
model replica, on its first device.

After the step is traced the replicator knows what each device holds: its variables'
bytes from where they are (placement.py) and the activations the step keeps there
(memory.py). With topology.Mesh.device_memory_bytes set, a configuration in which a
device would need more is refused before training (UserError: exit 2). The step's
communication account says the same per device and each axis's bytes.
"""

import contextlib

import tensorflow as tf
from absl import logging

from replibench import internals
from replibench.engine import collectives
from replibench.engine.model_parallel import layout as layout_lib, memory, placement
from replibench.engine.model_parallel.data_axis import DataAxisView
from replibench.engine.model_parallel.mesh import Mesh, check_split
from replibench.engine.model_parallel.sharded import SplitCreator
from replibench.engine.regimes.base import Regime, Sync
from replibench.engine.replicator import (CompiledStep, InputContext, Replicator,
                                          per_replica_batch_size)
from replibench.errors import UserError


class MeshReplicator(Replicator):
  """A Replicator whose replicas span several devices each (see the module docstring)."""

  def __init__(self, topology: Mesh, regime: Regime | None = None):
    super().__init__(topology, regime)
    self.mesh = topology
    self.layout = topology.layout(topology.devices())
    self.tensor_parallel = topology.parallelism == layout_lib.TENSOR
    self.recorder = placement.Recorder()
    self._view = DataAxisView(topology.data, topology.model) if self.tensor_parallel else None
    if self.tensor_parallel:
      # A device's gradient is part of its replica's: no per-replica norm to compare, and
      # no norm to clip by. (The regime is this run's own; Mesh accepts only Sync.)
      if isinstance(self.regime, Sync) and self.regime.noise_scale:
        logging.info("Tensor parallelism: the gradient noise scale is not measured.")
        self.regime.noise_scale = False
      build = self.regime.build_optimizer

      def build_optimizer(optimizer, variables):
        _refuse_norm_clipping(optimizer)
        build(optimizer, variables)

      self.regime.build_optimizer = build_optimizer

  @property
  def num_replicas(self) -> int:
    return self.mesh.data

  @contextlib.contextmanager
  def scope(self):
    with contextlib.ExitStack() as stack:
      stack.enter_context(layout_lib.active(self.layout))
      if not self.tensor_parallel:
        names = self.layout.devices
        grid = [list(names[d * self.mesh.model:(d + 1) * self.mesh.model])
                for d in range(self.mesh.data)]
        stack.enter_context(tf.variable_creator_scope(
            placement.StagePlacement([row[0] for row in grid], grid)))
      stack.enter_context(self.strategy.scope())
      stack.enter_context(tf.variable_creator_scope(self.recorder))
      if self.tensor_parallel:
        stack.enter_context(tf.variable_creator_scope(SplitCreator(self.layout)))
      yield

  def replica_step(self, step_fn):
    inner = super().replica_step(step_fn)

    def replica_fn(*args, **kwargs):
      with layout_lib.active(self.layout), (collectives.replica_group(self._view)
                                            if self._view else contextlib.nullcontext()):
        return inner(*args, **kwargs)

    return replica_fn

  def distribute(self, input_fn, global_batch_size: int, start_step: int = 0):
    if not self.tensor_parallel:
      return super().distribute(input_fn, global_batch_size, start_step)
    per_replica = per_replica_batch_size(global_batch_size, self.num_replicas)
    model = self.mesh.model

    def dataset_fn(tf_ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      dataset = input_fn(InputContext(per_replica, tf_ctx.input_pipeline_id,
                                      tf_ctx.num_input_pipelines, self.num_replicas, start_step))
      # Replica r = d * M + m takes the r-th element of each round: the M devices of
      # model replica d each take d's batch.
      return dataset.flat_map(lambda *e: tf.data.Dataset.from_tensors(e).repeat(model)).map(
          lambda *e: e if len(e) > 1 else e[0])

    return self.strategy.distribute_datasets_from_function(dataset_fn)

  def check_models(self) -> None:
    """UserError if the models built under scope() do not split as the mesh asks."""
    check_split(self.layout)
    for layer in self.layout.pair_layers:
      layer.input_spec = None   # Built on its channels' share; outside a step it takes all.

  def compile(self, step_fn, input_fn, global_batch_size: int, steps_per_call: int = 1,
              start_step: int = 0) -> CompiledStep:
    self.check_models()
    if steps_per_call < 1:
      raise UserError(f"steps_per_call must be >= 1, got {steps_per_call}.")
    dataset = self.distribute(input_fn, global_batch_size, start_step)
    return MeshCompiledStep(self, self.replica_step(step_fn), dataset, steps_per_call)

  def device_memory(self, graph: tf.Graph) -> dict[str, dict[str, int]]:
    """{device: {parameters, optimizer, other, activations, total}} bytes, every device of
    the mesh: variables where they are, activations a step (graph) keeps there."""
    held = self.recorder.device_bytes(self.strategy)
    kept = memory.activation_bytes(graph)
    rows = {}
    for device in self.layout.devices:
      name = internals.canonical_device(device)
      row = {kind: held.get(name, {}).get(kind, 0)
             for kind in (placement.PARAMETERS, placement.OPTIMIZER, placement.OTHER)}
      row["activations"] = kept.get(name, 0)
      row["total"] = sum(row.values())
      rows[name] = row
    return rows


def _refuse_norm_clipping(optimizer) -> None:
  """Clipping by norm would take each device's norm of its part of the gradients."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  if inner.clipnorm or inner.global_clipnorm:
    raise UserError(
        f"Tensor parallelism: the workload's {type(inner).__name__} clips gradients by norm "
        f"(clipnorm / global_clipnorm), which each device would compute over its part of the "
        f"split layers' gradients; drop the clipping or use a pipeline.")


class MeshCompiledStep(CompiledStep):
  """CompiledStep that, once traced, checks and reports each device's memory."""

  def trace(self) -> None:
    super().trace()
    self.memory = self.replicator.device_memory(self.step_graph())
    limit = self.replicator.mesh.device_memory_bytes
    worst = max(self.memory.values(), key=lambda row: row["total"])
    if limit and worst["total"] > limit:
      parts = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in worst.items() if k != "total")
      raise UserError(
          f"topology.Mesh.device_memory_bytes = {limit:.4g}: a device of this configuration "
          f"needs {worst['total'] / 1e6:.2f} MB ({parts}), more than its "
          f"{limit / 1e6:.2f} MB. Spread the model over more devices (topology.Mesh.model), "
          f"or shrink the per-replica batch (activations).")

  def step_graph(self) -> tf.Graph:
    """The graph of one replicated step (every replica's ops, placed)."""
    return self._replicated.get_concrete_function(self.iterator.element_spec).graph

  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    account = super().communication(time_collectives, wire_counter)
    mesh = self.replicator.mesh
    model_kind = account["by_kind"].get("activations", {"count": 0, "bytes": 0})
    account["model_parallel"] = {
        "parallelism": mesh.parallelism, "data": mesh.data, "model": mesh.model,
        "micro_batches": mesh.micro_batches,
        "model_axis_bytes_per_step": model_kind["bytes"],
        "data_axis_bytes_per_step": account["bytes_per_step"] - model_kind["bytes"],
        "device_memory_bytes": self.memory,
    }
    return account
