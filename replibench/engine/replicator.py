"""The Replicator: runs single-device `input_fn` / `step_fn` code on a topology.

    replicator = Replicator(topology.Local(num_replicas=4))
    with replicator.scope():
      model, optimizer = build()
    train = replicator.compile(step_fn, input_fn, 256, steps_per_call=10)   # or a TrainSpec
    metrics = train()   # 10 replicated steps in one tf.function graph

`step_fn(batch)` is written for one replica; inside it the collectives in
`replibench.engine.collectives` and the regime's `apply_gradients` talk to the
other replicas (step_fn returns the metrics apply_gradients returns).
`input_fn(ctx)` builds one input pipeline at the per-replica batch size given by
`ctx`. This replicator is synchronous (the Mirrored strategies and TPUStrategy);
engine/ps has the parameter-server ones, and engine.make_replicator picks.
"""

import dataclasses
from typing import Any, Callable

import tensorflow as tf

from replibench import cluster
from replibench.engine import collectives
from replibench.engine.interface import BaseReplicator, BaseStep
from replibench.engine.measure import communication
from replibench.engine.regimes.base import Regime
from replibench.engine.spec import InputContext, TrainSpec
from replibench.engine.topology import Topology


class CompiledStep(BaseStep):
  """k replicated training steps in one tf.function; call it to run them.

  Returns the step outputs (a dict of scalars) averaged over replicas and over
  the k steps, as host numpy values. `iterator` is checkpointable where the
  strategy supports it.

  The replicated step is a tf.function of its own, called k times from a
  tf.range loop: it is traced once (MirroredStrategy traces step_fn once per
  replica, so a second trace would double init), and the loop starts from zero
  outputs so the call holds one copy of it (TensorFlow inlines a function at each
  call site: a first step before the loop doubled the graph that the first call
  optimises and partitions). Outputs are summed per replica over the k steps and
  reduced over replicas once per call: one collective for all of them, not one
  per output and step.
  """

  def __init__(self, replicator: "Replicator", step_fn, dataset, spec: TrainSpec):
    super().__init__(replicator, spec)
    self.iterator = iter(dataset)
    strategy = replicator.strategy
    self._replicated = tf.function(lambda batch: strategy.run(step_fn, args=(batch,)))
    self._fn = tf.function(self._steps)

  def _steps(self):
    strategy = self.replicator.strategy
    specs = self._output_specs()
    total = strategy.run(lambda: tf.nest.map_structure(_zeros, specs))
    for _ in tf.range(self.steps_per_call):
      outputs = self._replicated(next(self.iterator))
      total = strategy.run(_add, args=(total, outputs))
    return tf.nest.map_structure(lambda t: t / self.steps_per_call,
                                 self.replicator.reduce(total, "mean"))

  def _output_specs(self):
    """One replica's outputs of one step, as TensorSpecs (traces the step, once)."""
    step = self._replicated.get_concrete_function(self.iterator.element_spec)
    local = self.replicator.strategy.experimental_local_results
    return tf.nest.map_structure(lambda v: tf.TensorSpec.from_tensor(local(v)[0]),
                                 step.structured_outputs)

  def trace(self) -> None:
    """Builds the graph, recording the step's collectives for communication()."""
    with communication.Ledger() as ledger:
      self._fn.get_concrete_function()
    self._ledger = ledger

  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    entries = self._ledger.entries()
    account = communication.summarize(entries, self.steps_per_call,
                                      self.replicator.num_replicas)
    # The traced call holds one step (its function is shared by the loop) and the
    # outputs' reduction.
    graph_ops = communication.graph_collectives(self._fn.get_concrete_function())
    if graph_ops:
      outputs = sum(e.kind == "outputs" for e in entries)
      account["graph_collectives_per_step"] = round(
          graph_ops - outputs + outputs / self.steps_per_call, 3)
    if time_collectives:
      alone = communication.replay(self.replicator.strategy, entries,
                                   wire_counter=wire_counter,
                                   all_to_all=collectives.all_to_all)
      account["collective_s_per_step"] = round(alone.pop("seconds"), 6)
      account.update(alone)
    return account

  def __call__(self) -> dict:
    return tf.nest.map_structure(lambda t: t.numpy(), self._fn())


def _zeros(spec: tf.TensorSpec) -> tf.Tensor:
  return tf.zeros(spec.shape, spec.dtype)


def _add(a, b):
  return tf.nest.map_structure(tf.add, a, b)


class Replicator(BaseReplicator):
  """Replicates single-device training code over a topology's replicas, in lockstep."""

  def __init__(self, topology: Topology, regime: Regime | None = None):
    super().__init__(topology, regime)
    self.strategy = topology.make_strategy()

  @property
  def num_replicas(self) -> int:
    return self.strategy.num_replicas_in_sync

  @property
  def num_workers(self) -> int:
    """Processes that run replicas."""
    multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
    return cluster.current().training_processes if multi_worker else 1

  def distribute(self, input_fn: Callable[[InputContext], tf.data.Dataset],
                 spec: TrainSpec | int, start_step: int = 0):
    """A distributed dataset: each replica gets its own per-replica batch, the one it
    gets from the same config in one process (worker processes: _one_process_input)."""
    if self.num_workers > 1 and not getattr(input_fn, "per_worker_input", False):
      return self._one_process_input(input_fn, spec, start_step)
    spec = self.as_spec(spec)

    def dataset_fn(tf_ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      return input_fn(spec.input_context(tf_ctx.input_pipeline_id, tf_ctx.num_input_pipelines,
                                         start_step))

    return self.strategy.distribute_datasets_from_function(dataset_fn)

  def _one_process_input(self, input_fn, spec: TrainSpec | int, start_step: int):
    """Each worker builds the one-process input pipeline (every replica's batches in
    turn, after the resume skip) and keeps its own replicas' batches (keep_replicas).

    Why not a pipeline each, sized for the worker: batch norm per replica (and a
    pipeline's micro-batches) makes a replica's math depend on which examples it gets,
    not on the global batch alone. The data sources split a global batch between
    input pipelines by example (Fashion-MNIST: pipeline i takes positions i, i+N, ...,
    each with its own augmentation draws) but between one pipeline's replicas by whole
    batches, so N pipelines would hand replica d other examples than one pipeline of N
    replicas does in one process, and a scaling curve's points would train different
    models. The cost: each worker does every replica's input work, unless input_fn is
    marked engine.keeps_replicas (it keeps them itself, before its expensive work). An
    input_fn whose data is the worker's own (D4PG's replay) opts out with
    engine.per_worker_input.
    """
    spec = self.as_spec(spec)
    keeps = getattr(input_fn, "keeps_replicas", False)

    def dataset_fn(tf_ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      whole = spec.input_context(0, 1, start_step)
      ctx = dataclasses.replace(whole, keep=(tf_ctx.input_pipeline_id,
                                             tf_ctx.num_input_pipelines))
      return input_fn(ctx) if keeps else ctx.kept(input_fn(whole))

    return self.strategy.distribute_datasets_from_function(dataset_fn)

  def run(self, step_fn: Callable, *args, **kwargs) -> Any:
    """Runs step_fn once on every replica; returns per-replica results."""
    return self.strategy.run(step_fn, args=args, kwargs=kwargs)

  @tf.autograph.experimental.do_not_convert   # Engine code (regimes/base.py says why).
  def reduce(self, values, op: str = "mean"):
    """Per-replica results to host values: 'sum', 'mean' or 'concat'.

    Sum and mean pack the whole nest into one collective per dtype.
    """
    if op == "concat":
      return tf.nest.map_structure(lambda v: self.strategy.gather(v, axis=0), values)
    if op not in ("sum", "mean"):
      raise ValueError(f"reduce op must be 'sum', 'mean' or 'concat', got {op!r}.")
    reduce_op = tf.distribute.ReduceOp.SUM if op == "sum" else tf.distribute.ReduceOp.MEAN
    flat = tf.nest.flatten(values)
    return tf.nest.pack_sequence_as(values, self._reduce_flat(reduce_op, flat) if flat else [])

  def _reduce_flat(self, reduce_op, flat: list) -> list:
    """Reduces a list of per-replica tensors with one collective per dtype (packed)."""
    results = [None] * len(flat)
    by_dtype = {}
    for i, v in enumerate(flat):
      by_dtype.setdefault(self.strategy.experimental_local_results(v)[0].dtype, []).append(i)
    for indices in by_dtype.values():
      leaves = [flat[i] for i in indices]
      packed = self.strategy.run(_flat_concat, args=leaves)
      communication.record("outputs", self.strategy.experimental_local_results(packed)[0],
                           cross_replica=True)
      reduced = self.strategy.reduce(reduce_op, packed, axis=None)
      shapes = [self.strategy.experimental_local_results(v)[0].shape for v in leaves]
      for i, part, shape in zip(indices, tf.split(reduced, [s.num_elements() for s in shapes]),
                                shapes):
        results[i] = tf.reshape(part, shape)
    return results

  def _compile(self, step_fn, input_fn, spec, start_step) -> CompiledStep:
    return CompiledStep(self, step_fn, self.distribute(input_fn, spec, start_step), spec)


def keeps_replicas(input_fn):
  """Marks input_fn as one that applies its context's keep itself (InputContext.kept,
  or replica_range), e.g. before its expensive work: each worker then builds only its
  replicas' share of the one-process pipeline, not all of it (Fashion-MNIST's gathers
  and augmentation; synthetic batches)."""
  input_fn.keeps_replicas = True
  return input_fn


def per_worker_input(input_fn):
  """Marks input_fn (a function or method) as one whose pipeline p of P already yields
  what replicas [p*R, (p+1)*R) get in one process, or whose data is the worker's own
  (D4PG's replay): worker processes then build one pipeline each, at their own
  InputContext, not the one-process pipeline (Replicator._one_process_input)."""
  input_fn.per_worker_input = True
  return input_fn


def _flat_concat(*tensors):
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
