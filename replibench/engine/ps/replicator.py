"""AsyncReplicator: the Replicator interface over ParameterServerStrategy.

The cluster (TF_CONFIG; `replibench launch --workers W --ps P` on one machine)
is a chief, W workers and P parameter servers. Variables live on the ps.
Worker and ps processes run no training code, only a tf.distribute.Server
(serve.py, started by the CLI); the chief runs the harness: it builds the
model, dispatches worker updates through a ClusterCoordinator, evaluates inline
(the model called on the chief, its variables read from the ps) and writes
checkpoints.

  * The workers jointly read the stream one pipeline would feed W replicas:
    worker w takes replica w's batches, so the W workers' r-th batches together
    are Sync's r-th global batch (every worker's pipeline computes the whole
    stream and keeps 1/W of it: a CPU cost of W times the input pipeline).
  * Inside a worker's step the collectives see W replicas that all hold this
    worker's values (WorkerGroup): num_replicas() is W, replica_id() the
    worker's index, a sum is W times the value (a loss scaled by average_loss
    reads on the global-batch scale), anything else the worker's own value.
  * Each call schedules steps_per_call * W updates and waits for all of them:
    a barrier per call, where evaluation and checkpoints happen. A larger
    Experiment.steps_per_call leaves the workers more asynchronous.
  * Fault tolerance (the coordinator's): an update whose worker fails is run
    again on another worker, or on the restarted one (`replibench launch`
    restarts it), so it may be applied twice; a restarted worker rebuilds its
    input pipeline from the first batch of the run's data position.
  * Checkpoints hold the ps variables; a resumed run's data stream restarts at
    the checkpointed step's global batch. Which worker read what, and updates
    in flight, are not restored.
"""

from typing import Callable

import numpy as np
import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.interface import BaseReplicator, BaseStep
from replibench.engine.measure import transfers
from replibench.engine.ps import serve
from replibench.engine.regimes.async_ps import AsyncPS
from replibench.engine.spec import InputContext, TrainSpec
from replibench.errors import UserError


class WorkerGroup(collectives.ReplicaGroup):
  """The collectives of a step that runs alone on one of W asynchronous workers."""

  def __init__(self, workers: int):
    self.workers = workers

  def num_replicas(self) -> int:
    return self.workers

  def replica_id(self) -> tf.Tensor:
    return tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int32)

  def all_reduce(self, x, op: str):
    return tf.nest.map_structure(lambda t: t * self.workers if op == "sum" else tf.identity(t), x)

  def all_gather(self, x, axis: int):
    return x

  def broadcast(self, x, source_replica: int):
    return tf.nest.map_structure(tf.identity, x)


class AsyncReplicator(BaseReplicator):
  """Replicates single-device training code over asynchronous parameter-server workers."""

  def __init__(self, topology, regime: AsyncPS):
    super().__init__(topology, regime)
    spec = serve.check_cluster(topology)
    if spec.task_type != "chief":
      raise UserError(
          f"TF_CONFIG makes this process {spec.task_type} #{spec.task_index}: under "
          f"regimes.AsyncPS only the chief trains; other tasks serve (`replibench run` "
          f"does that by itself).")
    self._workers = spec.count("worker")   # Training workers (not the chief, the ps).
    regime.attach(self._workers)            # Its settings against the cluster, before connecting.
    self.strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())   # Variables not partitioned.
    if self.strategy.num_replicas_in_sync != 1:
      raise UserError(
          f"regimes.AsyncPS runs one replica per worker; these workers have "
          f"{self.strategy.num_replicas_in_sync} GPUs each. Hide all but one "
          f"(CUDA_VISIBLE_DEVICES) or use a synchronous regime.")
    self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
    with self.strategy.scope():   # Worker updates completed (AsyncStep's staleness).
      self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="async_ps_updates")

  @property
  def num_replicas(self) -> int:
    """One per worker: the global batch is split over all of them."""
    return self._workers

  @property
  def num_workers(self) -> int:
    return self._workers

  def distribute(self, input_fn: Callable[[InputContext], tf.data.Dataset],
                 spec: TrainSpec | int, start_step: int = 0) -> tf.data.Dataset:
    """The chief evaluates inline: one plain pipeline at the global batch size."""
    batch = spec.global_batch_size if isinstance(spec, TrainSpec) else spec
    return input_fn(InputContext(batch, 0, 1, 1, start_step))

  def run(self, step_fn: Callable, *args, **kwargs):
    """Runs step_fn inline on the chief (evaluation; variables are read from the ps)."""
    return step_fn(*args, **kwargs)

  def reduce(self, values, op: str = "mean"):
    """run() was inline: one pipeline, nothing to reduce."""
    del op
    return values

  def per_worker_iterator(self, dataset_fn: Callable[[], tf.data.Dataset]):
    """An iterator over a dataset every worker builds for itself with dataset_fn()
    (ParameterServerStrategy gives every worker input pipeline 0 of 1: dataset_fn asks
    which worker it runs on)."""

    @tf.function
    def per_worker_dataset():
      return self.strategy.distribute_datasets_from_function(lambda _: dataset_fn())

    return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))

  def _compile(self, step_fn, input_fn, spec, start_step) -> "AsyncStep":
    return AsyncStep(self, step_fn, input_fn, spec, start_step)


class AsyncStep(BaseStep):
  """A call schedules steps_per_call * W worker updates (each a replica step of step_fn
  on the next batch of whichever worker runs it), waits for all of them and returns
  their outputs averaged, as host values.

  Staleness ('regime/staleness'): every update reads a counter of updates on the
  ps before step_fn reads the model and adds itself once its outputs are computed
  (the regime's metrics follow its variable updates): the other workers' updates
  that completed in between.
  """

  def __init__(self, replicator: AsyncReplicator, step_fn, input_fn, spec: TrainSpec,
               start_step: int):
    super().__init__(replicator, spec)
    workers, strategy, regime = spec.num_replicas, replicator.strategy, replicator.regime
    self.coordinator, updates = replicator.coordinator, replicator.updates
    # One pipeline's view for W replicas: per-replica batches, in replica order.
    ctx = spec.input_context(start_step=start_step)

    def dataset_fn():
      worker = tf.distribute.coordinator.experimental_get_current_worker_index()
      return input_fn(ctx).shard(workers, worker)

    self.iterator = replicator.per_worker_iterator(dataset_fn)
    group = WorkerGroup(workers)

    def replica_fn(batch):
      with collectives.replica_group(group):
        # Every op of the step follows the read (it could otherwise run as late as the update).
        before = updates.read_value()
        with regime.worker_update(before), tf.control_dependencies([before]):
          outputs = step_fn(batch)
      with tf.control_dependencies(tf.nest.flatten(outputs)):
        after = updates.assign_add(1, read_value=True)
      return {**outputs, "regime/staleness": tf.cast(after - before - 1, tf.float32)}

    @tf.function
    def update(iterator):
      return strategy.run(replica_fn, args=(next(iterator),))

    self._update = update

  def trace(self) -> None:
    self._update.get_concrete_function(self.iterator)

  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    """No collectives: the tensors each worker update pulls from and pushes to the ps
    (engine/measure/transfers.py), per update, which is per worker and harness step.

    time_collectives with wire_counter also measures each transfer's and closure's
    protocol bytes on the link, with closures that only read, so that the account
    predicts the bytes on the wire.
    """
    update = self._update.get_concrete_function(self.iterator)
    overheads = None
    if time_collectives and wire_counter:
      overheads = transfers.measure_overheads(self.coordinator, update.graph,
                                              update.structured_outputs, wire_counter)
    found = transfers.account(transfers.find_transfers(update.graph), overheads)
    found["note"] = ("asynchronous workers: variables pulled from and updates pushed to the "
                     "parameter servers over gRPC (RecvTensor), no collectives")
    return found

  def __call__(self) -> dict:
    results = [self.coordinator.schedule(self._update, args=(self.iterator,))
               for _ in range(self.steps_per_call * self.spec.num_replicas)]
    self.coordinator.join()
    outputs = [r.fetch() for r in results]
    return tf.nest.map_structure(lambda *values: np.mean(values, axis=0), *outputs)
