"""regimes.AsyncPS: each worker applies its own updates to variables on parameter servers.

The regime is what the workload sees (build_optimizer, apply_gradients); the
cluster, the coordinator and the step live in ps/replicator.py. Semantics,
chosen so that sync and async numbers compare:

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
  * Updates are atomic per variable (engine/training_kernels.py): each variable's update
    is one TF training kernel holding the locks of the variable and its slots,
    and optimizer.iterations counts every update. Keras' own update reads,
    then writes, and concurrent workers corrupted Adam's slots (the SN-GAN
    diverged at W = 4). Only SGD and Adam are wired; others are refused.
  * Staleness ('regime/staleness', mean per call, reported by the replicator's
    AsyncStep): replica steps of other workers that completed between a step's
    start (its read of the variables) and its own update, counted on one atomic
    counter on the ps.
  * Stragglers (`regimes.AsyncPS.stragglers = @regimes.Stragglers()`, engine/regimes/stragglers.py):
    a slowed update sleeps between computing its gradients and pushing them (the
    first apply_gradients of its step), so its update lands later and staler, as
    a slow worker's would. Update u of the draw is the update counter read at the
    step's start.
"""

import contextlib
import threading

import gin
import keras
import tensorflow as tf

from replibench import internals
from replibench.engine import aggregation, topology as topology_lib
from replibench.engine import training_kernels
from replibench.engine.regimes import stragglers as stragglers_lib
from replibench.engine.regimes.stragglers import Stragglers
from replibench.engine.regimes.base import Regime, tensor_sizes
from replibench.engine.regimes.step_metrics import StepMetrics
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
  chief, the workers and the ps (configs/topology/ps.gin). engine.make_replicator
  gives it an AsyncReplicator.
  """

  name = "async_ps"
  topology_file = "configs/topology/ps.gin"   # Named in the error for a local topology.
  update_compiles = False   # Locking kernels (make_updates_atomic): XLA would drop the locks.

  def __init__(self, stragglers: Stragglers | None = None):
    stragglers = stragglers_lib.checked(stragglers, "regimes.AsyncPS.stragglers")
    self.stragglers = stragglers
    self.workers = 1              # W, set by the replicator from TF_CONFIG.
    self._local = threading.local()

  def attach(self, workers: int) -> None:
    """Called once by the replicator with the cluster's training workers (TF_CONFIG),
    before it connects: UserError if they cannot run this regime's settings."""
    if self.stragglers is not None:
      self.stragglers.check_workers(workers)
    self.workers = workers

  def check(self, topology):
    binding = f"Experiment.regime = @regimes.{type(self).__name__}()"
    if not isinstance(topology, topology_lib.MultiWorker):
      raise UserError(
          f"{binding} needs Experiment.topology = @topology.MultiWorker() (a chief, "
          f"workers and parameter servers listed in TF_CONFIG), got {topology.describe()}. "
          f"For a try on this machine include {self.topology_file} and run `replibench "
          f"launch --workers 2 --ps 1 -- run ...`.")
    if topology.replicas_per_worker != 1:
      raise UserError(
          f"topology.MultiWorker.replicas_per_worker = {topology.replicas_per_worker}: "
          f"regimes.{type(self).__name__} runs one replica per worker (one update per "
          f"worker at a time).")

  def check_workload(self, workload):
    if workload.host_local_input:
      raise UserError(
          f"Experiment.workload {type(workload).__name__} ({workload.name}) reads its "
          f"training input from state in the chief's process (e.g. a replay buffer), which "
          f"parameter-server workers cannot reach, so Experiment.regime = "
          f"@regimes.{type(self).__name__}() cannot train it; use a synchronous regime.")

  def build_optimizer(self, optimizer, variables):
    optimizer.build(variables)
    training_kernels.make_updates_atomic(optimizer)
    # The schedule's steps are harness steps: W updates each. The public setter
    # takes the wrapped schedule.
    schedule = internals.optimizer_schedule(optimizer)
    if (isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
        and not isinstance(schedule, _StepsOfUpdates)):
      optimizer.learning_rate = _StepsOfUpdates(schedule, max(1, self.workers))

  @contextlib.contextmanager
  def worker_update(self, updates_before: tf.Tensor):
    """The replicator traces a worker update's step_fn inside this block, with the
    update counter read at the update's start: the straggler draw's update index."""
    self._local.before, self._local.slowed = updates_before, False
    try:
      yield
    finally:
      self._local.before = None

  def apply_gradients(self, optimizer, grads, variables):
    # None: `replibench plan` traces a step outside any worker update; it only applies.
    before = getattr(self._local, "before", None)
    if self.stragglers is not None and before is not None and not self._local.slowed:
      # The step's first update: a slowed one pushes its gradients late.
      worker = tf.distribute.coordinator.experimental_get_current_worker_index()
      grads = self.stragglers.delay(worker, before, grads)
      self._local.slowed = True
    # No all-reduce: this worker's gradient goes straight to the ps variables.
    aggregation.apply_reduced(optimizer, grads, variables)
    # Read after the update (ordered by the variable): the replicator counts the update
    # done once the step's outputs, these among them, are computed.
    with tf.control_dependencies([tf.convert_to_tensor(optimizer.iterations)]):
      sent = tf.identity(tf.constant(self.wire_bytes(tensor_sizes(grads), 0), tf.float32))
    return StepMetrics({"regime/bytes_communicated": sent})

  def setting(self):
    return self.name if self.stragglers is None else f"{self.name}({self.stragglers.setting()})"

  def hparams(self):
    return {"regime": self.name, **(self.stragglers.hparams() if self.stragglers else {})}

  # wire_bytes (the base's): per worker update, the gradient pushed to the ps, as Sync
  # counts per replica. Pulling the parameters moves as many bytes again, more where a
  # step reads a variable twice (an L2 term): AsyncStep.communication's account
  # (engine/measure/transfers.py) has every tensor that crosses.
