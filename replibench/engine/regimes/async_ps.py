"""Asynchronous parameter-server training (regimes.AsyncPS), on ParameterServerStrategy.

The cluster (TF_CONFIG; `replibench launch --workers W --ps P` on one machine)
is a chief, W workers and P parameter servers. Variables live on the ps.
Worker and ps processes run no training code, only a tf.distribute.Server
(`serve`); the chief runs the harness: it builds the model, dispatches worker
updates through a ClusterCoordinator, evaluates inline (the model called on
the chief, its variables read from the ps) and writes checkpoints.

Semantics, chosen so that sync and async numbers compare:
  * The global batch B is split over the W workers. A worker update runs the
    workload's step_fn on B/W examples, whose loss is scaled by
    average_loss(.., B), so its gradient is 1/W of its batch-mean gradient, and
    applies it to the ps variables at once (no all-reduce, no waiting).
  * W updates make one harness step (B examples), so steps, epochs and
    examples-to-target mean what they mean under Sync; with W = 1 async is sync.
    A learning-rate schedule advances one step per W updates.
  * How close W updates come to one sync step depends on the optimizer: with
    SGD (momentum aside) and zero staleness they add up to it; Adam's step does
    not scale with the gradient, so each update is a full-size Adam step.
  * The workers jointly read the stream one pipeline would feed W replicas:
    worker w takes replica w's batches, so the W workers' r-th batches together
    are Sync's r-th global batch (every worker's pipeline computes the whole
    stream and keeps 1/W of it: a CPU cost of W times the input pipeline).
  * Collectives in step_fn see one worker (see collectives.py).
  * Updates are atomic per variable (locked_updates): each variable's update
    is one TF training kernel holding the locks of the variable and its slots,
    and optimizer.iterations counts every update. Keras' own update reads,
    then writes, and concurrent workers corrupted Adam's slots (the SN-GAN
    diverged at W = 4). Only SGD and Adam are wired; others are refused.
  * Staleness ('regime/staleness', mean per call): replica steps of other
    workers that completed between a step's start (its read of the variables)
    and its own update, counted on one atomic counter on the ps (a workload
    may step several optimizers per replica step).
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

import os
import threading

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from replibench.engine import cluster
from replibench.engine import topology as topology_lib
from replibench.engine.regimes import locked_updates
from replibench.engine.regimes.base import Regime
from replibench.engine.regimes.step_metrics import payload_bytes
from replibench.errors import UserError


class _StepsOfUpdates(keras.optimizers.schedules.LearningRateSchedule):
  """A harness-step schedule read at optimizer update u: schedule(u // updates_per_step)."""

  def __init__(self, schedule, updates_per_step: int):
    self.schedule, self.updates_per_step = schedule, updates_per_step

  def __call__(self, step):
    return self.schedule(tf.convert_to_tensor(step) // self.updates_per_step)

  def get_config(self):
    return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
            "updates_per_step": self.updates_per_step}


@gin.configurable(module="regimes")
class AsyncPS(Regime):
  """Workers update variables on parameter servers independently (no synchronisation).

  Needs Experiment.topology = @topology.MultiWorker() and a TF_CONFIG with one
  chief, the workers and the ps (configs/topology/ps.gin).
  """

  name = "async_ps"

  def __init__(self):
    self.asynchronous_workers = 0   # W, known once make_strategy has read TF_CONFIG.
    self.coordinator = None
    self._updates = None            # Replica steps completed, over all workers (on a ps).
    self._local = threading.local()

  # -- checks and the cluster -------------------------------------------------

  def check(self, topology):
    if not isinstance(topology, topology_lib.MultiWorker):
      raise UserError(
          f"Experiment.regime = @regimes.AsyncPS() needs Experiment.topology = "
          f"@topology.MultiWorker() (a chief, workers and parameter servers listed in "
          f"TF_CONFIG), got {topology.describe()}. For a try on this machine include "
          f"configs/topology/ps.gin and run `replibench launch --workers 2 --ps 1 -- run ...`.")
    if topology.replicas_per_worker != 1:
      raise UserError(
          f"topology.MultiWorker.replicas_per_worker = {topology.replicas_per_worker}: "
          f"regimes.AsyncPS runs one replica per worker (one update per worker at a time).")

  def check_workload(self, workload):
    if workload.host_local_input:
      raise UserError(
          f"Experiment.workload {type(workload).__name__} ({workload.name}) reads its "
          f"training input from state in the chief's process (e.g. a replay buffer), which "
          f"parameter-server workers cannot reach, so Experiment.regime = "
          f"@regimes.AsyncPS() cannot train it; use a synchronous regime.")

  def _cluster(self, topology) -> dict:
    """The cluster, checked for one chief, >= 1 worker, >= 1 ps and the topology's counts."""
    self.check(topology)
    spec = cluster.current()
    counts = {job: spec.count(job) for job in ("chief", "worker", "ps")}
    if counts["chief"] != 1 or not counts["worker"] or not counts["ps"]:
      raise UserError(
          f"Experiment.regime = @regimes.AsyncPS() needs TF_CONFIG to list one 'chief', at "
          f"least one 'worker' and at least one 'ps' task; it lists {counts}. "
          f"`replibench launch --workers W --ps P -- run ...` sets that up on this machine.")
    for field, job in (("workers", "worker"), ("ps", "ps")):
      expected = getattr(topology, field)
      if expected and expected != counts[job]:
        raise UserError(f"topology.MultiWorker.{field} = {expected} but TF_CONFIG lists "
                        f"{counts[job]} {job!r} task(s).")
    return spec

  def serve(self, topology):
    spec = self._cluster(topology)
    if spec.task_type == "chief":
      return
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    logging.info("AsyncPS: %s %d serving at %s (pid %d).", spec.task_type, spec.task_index,
                 server.target, os.getpid())
    server.join()   # Never returns: the launcher (or cluster manager) ends this process.

  def make_strategy(self, topology):
    spec = self._cluster(topology)
    if spec.task_type != "chief":
      raise UserError(
          f"TF_CONFIG makes this process {spec.task_type} #{spec.task_index}: "
          f"under regimes.AsyncPS only the chief trains; other tasks call regime.serve().")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)   # Variables not partitioned.
    if strategy.num_replicas_in_sync != 1:
      raise UserError(
          f"regimes.AsyncPS runs one replica per worker; these workers have "
          f"{strategy.num_replicas_in_sync} GPUs each. Hide all but one "
          f"(CUDA_VISIBLE_DEVICES) or use a synchronous regime.")
    self.asynchronous_workers = spec.count("worker")
    self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
      self._updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="async_ps_updates")
    return strategy

  # -- the update ---------------------------------------------------------------

  def build_optimizer(self, optimizer, variables):
    optimizer.build(variables)
    locked_updates.make_updates_atomic(optimizer)
    # The schedule's steps are harness steps: W updates each. Keras keeps the
    # schedule in a private attribute; the public setter takes the wrapped one.
    schedule = optimizer._learning_rate   # pylint: disable=protected-access
    if (isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
        and not isinstance(schedule, _StepsOfUpdates)):
      optimizer.learning_rate = _StepsOfUpdates(schedule, max(1, self.asynchronous_workers))

  def begin_step(self):
    # Read before step_fn reads the model (the update it makes is based on that
    # state). The returned dependency enforces the order: without it the read,
    # which nothing else in the step waits for, may run as late as the update.
    self._local.before = self._updates.read_value()
    self._local.applied, self._local.sent = [], 0
    return [self._local.before]

  def apply_gradients(self, optimizer, grads, variables):
    from replibench.engine import aggregation  # pylint: disable=import-outside-toplevel
    # No all-reduce: this worker's gradient goes straight to the ps variables.
    aggregation._take_over_reduction(optimizer)  # pylint: disable=protected-access
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
    # Read after the update (ordered by the variable): step_metrics counts after it.
    self._local.applied.append(tf.convert_to_tensor(optimizer.iterations))
    # The gradient pushed to the ps (the parameters pulled back are as many again).
    self._local.sent += payload_bytes(grads)

  def step_metrics(self):
    with tf.control_dependencies(self._local.applied):
      after = self._updates.assign_add(1, read_value=True)
    staleness = after - self._local.before - 1
    return {"regime/staleness": tf.cast(staleness, tf.float32),
            "regime/bytes_communicated": tf.constant(float(self._local.sent))}

  def compile(self, replicator, step_fn, input_fn, global_batch_size: int,
              steps_per_call: int, start_step: int) -> "AsyncStep":
    """Replicator.compile's step under this regime."""
    return AsyncStep(replicator, self, step_fn, input_fn, global_batch_size, steps_per_call,
                     start_step)

  def describe(self, gradient_bytes, num_replicas):
    facts = {"regime": self.name}
    del num_replicas
    if gradient_bytes is not None:
      # Per worker update, as regime/bytes_communicated counts it (and as Sync
      # counts per replica): the gradient pushed to the ps. Pulling the
      # parameters back moves as many bytes again.
      facts["bytes_communicated_per_step"] = gradient_bytes
    return facts


class AsyncStep:
  """CompiledStep's interface over the coordinator: call it to run one call's updates.

  Each call schedules steps_per_call * W worker updates (each a replica step of
  step_fn on the next batch of whichever worker runs it), waits for all of them
  and returns their outputs averaged, as host values.
  """

  def __init__(self, replicator, regime: AsyncPS, step_fn, input_fn, global_batch_size: int,
               steps_per_call: int, start_step: int):
    # Imported here: replicator.py imports the regimes package.
    from replibench.engine.replicator import (  # pylint: disable=import-outside-toplevel
        InputContext, per_replica_batch_size)
    workers, strategy = regime.asynchronous_workers, replicator.strategy
    self.coordinator, self.steps_per_call = regime.coordinator, steps_per_call
    self._updates_per_call = steps_per_call * workers
    # One pipeline's view for W replicas: per-replica batches, in replica order.
    ctx = InputContext(per_replica_batch_size(global_batch_size, workers), 0, 1, workers,
                       start_step)

    def dataset_fn(tf_ctx):
      del tf_ctx   # ParameterServerStrategy gives every worker pipeline 0 of 1.
      worker = tf.distribute.coordinator.experimental_get_current_worker_index()
      return input_fn(ctx).shard(workers, worker)

    @tf.function
    def per_worker_dataset():
      return strategy.distribute_datasets_from_function(dataset_fn)

    self.iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))
    replica_fn = replicator.replica_step(step_fn)

    @tf.function
    def update(iterator):
      return strategy.run(replica_fn, args=(next(iterator),))

    self._update = update

  def trace(self) -> None:
    """Builds the update's graph without running it (part of init, not of the timed run)."""
    self._update.get_concrete_function(self.iterator)

  def __call__(self) -> dict:
    results = [self.coordinator.schedule(self._update, args=(self.iterator,))
               for _ in range(self._updates_per_call)]
    self.coordinator.join()
    outputs = [r.fetch() for r in results]
    return tf.nest.map_structure(lambda *values: np.mean(values, axis=0), *outputs)
