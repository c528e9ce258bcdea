"""regimes.BackupPS: synchronous training with backup workers on parameter servers.

Synchronous SGD that does not wait for the slowest workers (Chen et al. 2016,
"Revisiting distributed synchronous SGD"; the TensorFlow paper, Abadi et al.,
OSDI 2016, and TF1's SyncReplicasOptimizer with replicas_to_aggregate = N - b):
each step aggregates the first N - b of the N workers' gradients and drops the
other b. Collectives (MultiWorkerMirroredStrategy) cannot leave a participant
out, so it runs on the parameter-server path (ParameterServerStrategy and its
ClusterCoordinator), beside regimes.AsyncPS, whose cluster, serving and
replicator setup it shares.
engine/ps/backup.py runs its steps (the chief's and the workers' closures, the
tickets on the ps); what they mean:

  * Scaling: a loss scaled by average_loss(.., B) gives each slot 1/N of its
    shard's mean gradient, so the sum of all N is the global-batch gradient.
    The chief applies sum * N / (N - b), the mean of the taken slots' shard-mean
    gradients: with b = 0 exactly Sync's gradient (the sum, unscaled), and with
    b > 0 an unbiased estimate of it from (N - b) B / N examples. Steps, epochs
    and learning-rate schedules are Sync's (one optimizer step per step); the
    examples counted are B per step, of which b/N were computed and dropped, or
    never computed.
  * Metrics, per step over each call: 'regime/dropped' (worker updates that did
    not contribute: b per step in the long run, counted as the stragglers' closures
    run, so a call's count can lag its own steps), 'regime/late' (of those, the
    ones that had computed their gradient: the wasted work) and
    'regime/bytes_communicated' (gradient bytes pushed to the ps per worker slot
    and step: (N - b + late) / N of Sync's per-replica payload, the plan's
    figure taking late = 0; the N parameter pulls per step move about as many
    bytes again, uncounted as under AsyncPS).
    'loss' and the workload's outputs are means over the taken slots.
  * Stragglers (`regimes.BackupPS.stragglers = @regimes.Stragglers()`): a slowed
    closure sleeps before it computes (update u of the draw is its stream
    element t*N + k), so its gradient arrives delay_ms later, computed from the
    same step-t parameters; if the step is over when it wakes, it skips the
    computation, as a backup-worker scheme's straggler would be cancelled, and
    leaves the shared cores to the others.
  * Batch-norm moving statistics, updated by each closure's forward pass, are
    written by the workers in whatever order they run, as under AsyncPS (they
    do not enter the gradients); an equivalence with Sync holds for the
    trainable variables and the optimizer's slots.
  * Restrictions: one optimizer, applied once per step (a GAN's discriminator
    and generator steps each read what the other wrote: refused); no host-local
    input (D4PG's replay buffer: refused); one replica per worker.
  * Fault tolerance is the coordinator's: a closure whose worker fails is run
    again on another worker; if the first run had already added its gradient
    while the step was still open, the rerun may add the same shard again in
    place of another slot's (as an AsyncPS update may be applied twice).
  * Checkpoints hold the ps variables, the harness's step and the optimizer; a
    resumed session starts its step counter at 0 and its stream at the
    checkpointed step's global batch. Closures of the last steps of a call may
    still be running (as stale or late ones) during evaluation and checkpoints:
    they change no trainable variable.
"""

import contextlib
import threading

import gin
import tensorflow as tf

from replibench.engine.regimes import stragglers as stragglers_lib
from replibench.engine.regimes.async_ps import AsyncPS
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.engine.regimes.stragglers import Stragglers
from replibench.errors import UserError
from replibench.inputs import shown

BINDING = "Experiment.regime = @regimes.BackupPS()"


@gin.configurable(module="regimes")
class BackupPS(AsyncPS):
  """Synchronous steps on parameter servers that take the first N - b of N workers'
  gradients (b = backup_workers; b = 0 is synchronous training). See the module doc.

  A subclass of AsyncPS for what they share: the cluster (chief, workers, ps), the
  CLI's serving of worker and ps tasks, and the stragglers knob.
  """

  name = "backup_ps"
  topology_file = "configs/topology/backup.gin"

  def __init__(self, backup_workers: int = 0, stragglers: Stragglers | None = None):
    # Not AsyncPS.__init__ (gin would fill its bindings in): the same fields.
    if (isinstance(backup_workers, bool) or not isinstance(backup_workers, int)
        or backup_workers < 0):
      raise UserError(f"regimes.BackupPS.backup_workers must be an integer >= 0 (the "
                      f"stragglers each step drops; 0 is synchronous training), got "
                      f"{shown(backup_workers)}.")
    stragglers = stragglers_lib.checked(stragglers, "regimes.BackupPS.stragglers")
    self.backup_workers, self.stragglers = backup_workers, stragglers
    self.workers = 1              # N, set by the replicator from TF_CONFIG.
    self._local = threading.local()
    self.learner = None           # (optimizer, variables, accumulators), from build_optimizer.

  def _check_backups(self, workers: int, where: str) -> None:
    if self.backup_workers >= workers:
      raise UserError(
          f"regimes.BackupPS.backup_workers = {self.backup_workers} with {workers} "
          f"worker(s) ({where}): each step takes the first N - b of N workers' gradients, "
          f"so b must be at most {workers - 1}.")

  def attach(self, workers: int) -> None:
    self._check_backups(workers, "in TF_CONFIG")
    super().attach(workers)

  def check(self, topology):
    super().check(topology)
    if topology.workers:
      self._check_backups(topology.workers, "topology.MultiWorker.workers")

  def _refuse_several_updates(self, what: str) -> None:
    raise UserError(
        f"{BINDING} (regimes.BackupPS.backup_workers = {self.backup_workers}): the "
        f"workload {what}. BackupPS aggregates one gradient per worker and step, all "
        f"computed from the step's parameters, and applies them once with one optimizer; "
        f"it cannot order several optimizer steps inside a training step (a GAN's "
        f"discriminator and generator steps each read what the other wrote). Use "
        f"regimes.AsyncPS or a synchronous regime for it.")

  def build_optimizer(self, optimizer, variables):
    if self.learner is not None and self.learner[0] is not optimizer:
      self._refuse_several_updates("builds more than one optimizer")
    optimizer.build(variables)
    accumulators = []
    for v in variables:
      # On v's parameter server (under the strategy's scope; `plan` has none).
      place = (tf.distribute.get_strategy().extended.colocate_vars_with(getattr(v, "value", v))
               if tf.distribute.has_strategy() else contextlib.nullcontext())
      with place:
        accumulators.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                        name="backup_ps_gradient"))
    self.learner = (optimizer, list(variables), accumulators)

  # -- inside a worker closure's trace ---------------------------------------------

  @contextlib.contextmanager
  def recording(self):
    """The replicator traces a slot's step_fn inside this block, which yields the list
    that receives the gradients step_fn applies (one entry: a gradient per variable)."""
    self._local.graph, self._local.recorded = tf.compat.v1.get_default_graph(), []
    try:
      yield self._local.recorded
    finally:
      self._local.recorded = None

  def _recorded(self) -> list:
    """This trace's recorded gradients (`plan` traces a step outside any recording)."""
    graph = tf.compat.v1.get_default_graph()
    if getattr(self._local, "graph", None) is not graph or self._local.recorded is None:
      self._local.graph, self._local.recorded = graph, []
    return self._local.recorded

  def apply_gradients(self, optimizer, grads, variables):
    return self.apply_gradients_jointly([(optimizer, grads, variables)])

  def apply_gradients_jointly(self, updates):
    """Records the step's gradients (the chief applies them); refuses a second call
    or another optimizer than the one built. The chief reports the regime's metrics
    (engine/ps/backup.py): none here."""
    recorded = self._recorded()
    if recorded or len(updates) != 1:
      self._refuse_several_updates("applies gradients more than once in a training step")
    (optimizer, grads, variables), = updates
    if self.learner is None or optimizer is not self.learner[0]:
      self._refuse_several_updates("applies an optimizer regime.build_optimizer did not build")
    if [id(v) for v in variables] != [id(v) for v in self.learner[1]]:
      raise UserError(f"{BINDING}: the workload applies gradients to other variables than "
                      f"those it built its optimizer for (regime.build_optimizer).")
    recorded.append(list(grads))
    return StepMetrics()

  # -- what it sends and how runs tell it apart -----------------------------------

  def wire_bytes(self, sizes, num_replicas):
    """Gradient bytes pushed to the ps per worker slot and step: N - b of N slots push
    (and late ones, which the run counts and a plan cannot)."""
    n = num_replicas or self.workers
    return 4.0 * sum(sizes) * (n - min(self.backup_workers, n - 1)) / n if n else 0.0

  def setting(self):
    stragglers = f", {self.stragglers.setting()}" if self.stragglers else ""
    return f"{self.name}(backup_workers={self.backup_workers}{stragglers})"

  def hparams(self):
    return {"regime": self.name, "backup_workers": self.backup_workers,
            **(self.stragglers.hparams() if self.stragglers else {})}
