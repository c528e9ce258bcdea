"""MeshReplicator: lockstep replicas (engine.Replicator) over a topology.Mesh.

The researcher's step_fn stays the one-device step: it sees D replicas (engine.
num_replicas(), replica_id() and the collectives are the data axis's), and the
models built under `scope()` are split across each replica's devices as the layout
says (tensor_parallel.py, pipeline.py). Under tensor parallelism the strategy has a
replica per device and each replica's M devices get the same batch (the dataset's
elements are repeated M times, in replica order); under a pipeline it has one per
model replica, on its first device (with worker processes: one per worker).

The run's TrainSpec is the one config built (its per-replica batch is the data
axis's: global batch / D); its regime is the topology's (Mesh.regime_for). After
the step is traced the replicator knows what each of this process's devices holds
and keeps (engine/measure/device_memory.py); with topology.Mesh.device_memory_bytes
set, a configuration in which a device would need more is refused before training
(UserError: exit 2). The step's communication account carries the same per device
and each axis's collectives and bytes (result.json communication.model_parallel).
"""

import contextlib

import tensorflow as tf

from replibench.engine import collectives, compilation
from replibench.engine.measure import communication, device_memory
from replibench.engine.model_parallel import layout as layout_lib
from replibench.engine.model_parallel.data_axis import DataAxisView
from replibench.engine.model_parallel.mesh import BINDING, Mesh, check_split
from replibench.engine.model_parallel.placement import StagePlacement
from replibench.engine.model_parallel.sharded import SplitCreator
from replibench.engine.regimes.base import Regime
from replibench.engine.replicator import CompiledStep, Replicator
from replibench.engine.spec import TrainSpec
from replibench.errors import UserError


class MeshReplicator(Replicator):
  """A Replicator whose replicas span several devices each (see the module docstring)."""

  def __init__(self, topology: Mesh, regime: Regime | None = None):
    super().__init__(topology, regime)
    self.mesh = topology
    self.layout = topology.layout(topology.devices())
    self.local_devices = topology.local_devices()
    self.tensor_parallel = topology.parallelism == layout_lib.TENSOR
    self.recorder = device_memory.VariableRecorder()
    self._view = DataAxisView(topology.data, topology.model) if self.tensor_parallel else None

  @property
  def num_replicas(self) -> int:
    return self.mesh.data

  @contextlib.contextmanager
  def scope(self):
    with contextlib.ExitStack() as stack:
      stack.enter_context(layout_lib.active(self.layout))
      if not self.tensor_parallel:   # Below the strategy's creator: it runs after it.
        stack.enter_context(tf.variable_creator_scope(StagePlacement(self.layout.rows())))
      stack.enter_context(self.strategy.scope())
      stack.enter_context(tf.variable_creator_scope(self.recorder))
      if self.tensor_parallel:
        stack.enter_context(tf.variable_creator_scope(SplitCreator(self.layout)))
      yield

  def _in_mesh(self, step_fn, per_device: bool = False):
    """step_fn as each replica runs it: under the layout, seeing the data axis; with
    per_device (a compiled pipeline step), compiling each stage on its device
    (compilation.per_device_pieces) instead of the pass, which spans them."""

    def replica_fn(*args, **kwargs):
      with contextlib.ExitStack() as stack:
        stack.enter_context(layout_lib.active(self.layout))
        if self._view:
          stack.enter_context(collectives.replica_group(self._view))
        if per_device:
          stack.enter_context(compilation.per_device_pieces())
        return step_fn(*args, **kwargs)

    return replica_fn

  def run(self, step_fn, *args, **kwargs):
    return super().run(self._in_mesh(step_fn), *args, **kwargs)

  def distribute(self, input_fn, spec: TrainSpec | int, start_step: int = 0):
    if self.mesh.workers:   # One replica a worker: the base's one-process input, kept.
      return self._one_process_input(input_fn, spec, start_step)
    if not self.tensor_parallel:
      return super().distribute(input_fn, spec, start_step)
    spec, model = self.as_spec(spec), self.mesh.model

    def dataset_fn(tf_ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      dataset = input_fn(spec.input_context(tf_ctx.input_pipeline_id,
                                            tf_ctx.num_input_pipelines, start_step))
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

  def _compile(self, step_fn, input_fn, spec, start_step) -> "MeshCompiledStep":
    self.check_models()
    per_device = self.as_spec(spec).jit_compile and not self.tensor_parallel
    return MeshCompiledStep(self, self._in_mesh(step_fn, per_device),
                            self.distribute(input_fn, spec, start_step), spec)

  def device_memory(self, graph: tf.Graph) -> dict[str, dict[str, int]]:
    """{device: {parameters, optimizer, other, activations, total}} bytes, each of this
    process's devices: variables where they are, activations a step (graph) keeps there."""
    return device_memory.per_device(self.recorder.held_bytes(self.strategy), graph,
                                    self.local_devices)

  def check_memory(self, memory: dict) -> None:
    """UserError if a device of memory (device_memory's) needs more than the mesh allows."""
    limit = self.mesh.device_memory_bytes
    worst = max(memory.values(), key=lambda row: row["total"])
    if limit and worst["total"] > limit:
      parts = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in worst.items() if k != "total")
      raise UserError(
          f"{BINDING}.device_memory_bytes = {limit:.4g}: a device of this configuration "
          f"needs {worst['total'] / 1e6:.2f} MB ({parts}), more than its "
          f"{limit / 1e6:.2f} MB. Spread the model over more devices ({BINDING}.model), "
          f"or shrink the per-replica batch (activations).")


class MeshCompiledStep(CompiledStep):
  """A CompiledStep that, once traced, checks and reports each device's memory, and
  accounts for each axis of the mesh."""

  def trace(self) -> None:
    super().trace()
    self.memory = self.replicator.device_memory(self.step_graph())
    self.replicator.check_memory(self.memory)

  def step_graph(self) -> tf.Graph:
    """The graph of one replicated step (every local replica's ops, placed)."""
    return self._replicated.get_concrete_function(self.iterator.element_spec).graph

  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    account = super().communication(time_collectives, wire_counter)
    mesh = self.replicator.mesh
    account["model_parallel"] = {
        "parallelism": mesh.parallelism, "data": mesh.data, "model": mesh.model,
        "micro_batches": mesh.micro_batches, "workers": mesh.workers,
        **communication.by_axis(self._ledger.entries(), self.steps_per_call, mesh.data),
        "device_memory_bytes": self.memory,
    }
    return account
