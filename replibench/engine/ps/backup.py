"""regimes.BackupPS: synchronous training with backup workers on parameter servers.

Synchronous SGD that does not wait for the slowest workers (Chen et al. 2016,
"Revisiting distributed synchronous SGD"; the TensorFlow paper, Abadi et al.,
OSDI 2016, and TF1's SyncReplicasOptimizer with replicas_to_aggregate = N - b):
each step aggregates the first N - b of the N workers' gradients and drops the
other b. Collectives (MultiWorkerMirroredStrategy) cannot leave a participant
out, so it runs on the parameter-server path (ParameterServerStrategy and its
ClusterCoordinator), beside regimes.AsyncPS, whose cluster, serving and
replicator setup it shares. The chief drives the steps:

  * Step t (the ps's step counter, from 0 each session) schedules N worker
    closures tagged (t, slot k), k = 0..N-1, and a fresh ticket counter on the
    ps. Slot k trains on shard k of global batch t, whichever worker runs it:
    every worker's pipeline is the stream one pipeline feeds N replicas
    (per-replica batches in replica order, numbered), and a closure reads
    forward to element t*N + k of its worker's stream. So the N gradients of
    step t are those of the N replicas of a synchronous step on global batch t.
  * A closure whose step is over when it starts (or when its straggler delay
    ends) does nothing but count itself ('stale'): queued stale closures cost
    one round trip. Otherwise it computes the workload's step at the current
    parameters (step_fn; the regime's apply_gradients only records the
    gradients) and pushes them to the ps, where it takes a ticket: one atomic
    fetch-and-increment of step t's counter (ResourceCountUpTo, under the
    variable's lock). Tickets 0..N-b-1 add their gradients (and the step's
    outputs) to accumulators on the ps and post a token to a queue there; later
    tickets are dropped there ('late': computed, sent and discarded, as TF1's
    accumulators dropped stale gradients). The ticket is the whole check-and-add
    protocol: exactly N - b closures of step t add, whatever the timing, and
    none of another step can, since each step has its own counter. The ticket
    and the add run on the ps after the gradients arrived, so a worker that dies
    after its push cannot leave a taken ticket without its gradient (the step
    would wait for it forever).
  * The chief dequeues N - b tokens (a blocking queue op on the ps: no polling,
    no spinning), applies the accumulated gradients once with the workload's
    optimizer, zeroes the accumulators and advances the step counter.
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

import collections
import contextlib
import threading

import gin
import numpy as np
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.ps import serve
from replibench.engine.ps.regime import AsyncPS
from replibench.engine.ps.replicator import AsyncReplicator, WorkerGroup
from replibench.engine import stragglers as stragglers_lib
from replibench.engine.stragglers import Stragglers
from replibench.engine.regimes.base import tensor_sizes
from replibench.engine.replicator import InputContext, per_replica_batch_size
from replibench.errors import UserError
from replibench.inputs import shown

_BINDING = "Experiment.regime = @regimes.BackupPS()"
_MAX_OUTPUTS = 64             # Scalars a step may output (summed on the ps for the chief).
_TICKET_LIMIT = 2**62         # ResourceCountUpTo's limit: never reached.
_TICKETS_KEPT = 256           # Steps whose ticket counters stay alive for late closures.
ACCEPTED, LATE, STALE = 0, 1, 2   # What a closure did (its return value).


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
    self._updates = None
    self._local = threading.local()
    self.learner = None           # (optimizer, variables, accumulators), from build_optimizer.

  def _check_backups(self, workers: int, where: str) -> None:
    if self.backup_workers >= workers:
      raise UserError(
          f"regimes.BackupPS.backup_workers = {self.backup_workers} with {workers} "
          f"worker(s) ({where}): each step takes the first N - b of N workers' gradients, "
          f"so b must be at most {workers - 1}.")

  def attach_check(self, workers: int) -> None:
    """Raises UserError if the cluster's workers cannot run this regime's settings."""
    self._check_backups(workers, "in TF_CONFIG")
    if self.stragglers is not None:
      self.stragglers.check_workers(workers)

  def attach(self, workers: int, updates_counter: tf.Variable) -> None:
    self.attach_check(workers)
    super().attach(workers, updates_counter)

  def check(self, topology):
    super().check(topology)
    if topology.workers:
      self._check_backups(topology.workers, "topology.MultiWorker.workers")

  def _refuse_several_updates(self, what: str) -> None:
    raise UserError(
        f"{_BINDING} (regimes.BackupPS.backup_workers = {self.backup_workers}): the "
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

  def _pending(self) -> list:
    graph = tf.compat.v1.get_default_graph()
    if getattr(self._local, "graph", None) is not graph:
      self._local.graph, self._local.updates = graph, []
    return self._local.updates

  def begin_step(self) -> list:
    self._local.graph, self._local.updates = tf.compat.v1.get_default_graph(), []
    return []

  def apply_gradients(self, optimizer, grads, variables):
    self.apply_gradients_jointly([(optimizer, grads, variables)])

  def apply_gradients_jointly(self, updates):
    """Records the step's gradients (the chief applies them); refuses a second call
    or another optimizer than the one built."""
    pending = self._pending()
    if pending or len(updates) != 1:
      self._refuse_several_updates("applies gradients more than once in a training step")
    (optimizer, grads, variables), = updates
    if self.learner is None or optimizer is not self.learner[0]:
      self._refuse_several_updates("applies an optimizer regime.build_optimizer did not build")
    if [id(v) for v in variables] != [id(v) for v in self.learner[1]]:
      raise UserError(f"{_BINDING}: the workload applies gradients to other variables than "
                      f"those it built its optimizer for (regime.build_optimizer).")
    pending.append(list(grads))

  def take_gradients(self) -> list:
    """The gradients recorded in this thread's current trace (one per variable, or None)."""
    pending = self._pending()
    if not pending:
      raise UserError(f"{_BINDING}: the workload's step_fn applied no gradients "
                      f"(regime.apply_gradients).")
    self._local.updates = []
    return pending[0]

  def step_metrics(self):
    return {}   # The chief reports the regime's metrics (BackupStep).

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


class SlotGroup(WorkerGroup):
  """A closure's collectives: N replicas holding its values, itself replica `slot`
  (the shard of the global batch it trains on, whichever worker runs it)."""

  def __init__(self, workers: int, slot: tf.Tensor):
    super().__init__(workers)
    self.slot = slot

  def replica_id(self) -> tf.Tensor:
    return tf.cast(self.slot, tf.int32)


class BackupReplicator(AsyncReplicator):
  """The parameter-server cluster of AsyncReplicator, compiling BackupStep's steps."""

  def __init__(self, topology, regime: BackupPS):
    regime.check(topology)
    # b against TF_CONFIG's workers before connecting (attach checks it again).
    regime.attach_check(serve.check_cluster(topology).count("worker"))
    super().__init__(topology, regime)

  def compile(self, step_fn, input_fn, global_batch_size: int, steps_per_call: int = 1,
              start_step: int = 0) -> "BackupStep":
    if steps_per_call < 1:
      raise UserError(f"steps_per_call must be >= 1, got {steps_per_call}.")
    return BackupStep(self, step_fn, input_fn, global_batch_size, steps_per_call, start_step)


class BackupStep:
  """CompiledStep's interface: each call runs steps_per_call synchronous steps with
  backup workers (module doc) and returns their outputs averaged, as host values."""

  def __init__(self, replicator: BackupReplicator, step_fn, input_fn, global_batch_size: int,
               steps_per_call: int, start_step: int):
    regime: BackupPS = replicator.regime
    n, strategy = replicator.num_workers, replicator.strategy
    self.regime, self.strategy, self.coordinator = regime, strategy, replicator.coordinator
    self.steps_per_call, self.n = steps_per_call, n
    self.taken = n - regime.backup_workers
    self._ps = "/job:ps/replica:0/task:0"
    with strategy.scope():
      self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_step")
      self._outputs = tf.Variable(tf.zeros([_MAX_OUTPUTS]), trainable=False,
                                  name="backup_ps_outputs")
      # Closures dropped (stale or late) and, of those, late ones.
      self._dropped = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_dropped")
      self._late = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_late")
    with tf.device(self._ps):
      self._done = tf.queue.FIFOQueue(max(1024, 4 * n), [tf.int32], shapes=[[]],
                                      name="backup_ps_done")
    self._t = 0                    # The step the chief runs next (== self._step).
    self._tickets = collections.deque(maxlen=_TICKETS_KEPT)
    self._slots = [tf.constant(k, tf.int64) for k in range(n)]
    self._counted = (0, 0)
    self._keys = None              # The step's output names, from the trace.

    # One pipeline's view for N replicas, numbered: element i is replica i % N's
    # batch of global batch i // N (after the resumed steps').
    ctx = InputContext(per_replica_batch_size(global_batch_size, n), 0, 1, n, start_step)

    def dataset_fn(tf_ctx):
      del tf_ctx   # Every worker reads the whole stream.
      return input_fn(ctx).enumerate()

    @tf.function
    def per_worker_dataset():
      return strategy.distribute_datasets_from_function(dataset_fn)

    self.iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))

    def read(iterator, wanted):
      """Element `wanted` of this worker's stream: skips forward to it (a worker's
      closures come in step order); an index past it means it was read before."""
      index, batch = next(iterator)
      return tf.while_loop(lambda i, _: i < wanted, lambda i, _: next(iterator),
                           (index, batch))

    def counted(variable, status):
      with tf.control_dependencies([variable.assign_add(1, read_value=False)]):
        return tf.constant(status)

    def stale():
      return counted(self._dropped, STALE)

    def train(batch, slot, tickets):
      """The slot's step on this worker; then its ticket decides whether it counts."""
      with collectives.replica_group(SlotGroup(n, slot)):
        regime.begin_step()
        outputs = step_fn(batch)
      grads = regime.take_gradients()
      if self._keys is None:
        self._keys = sorted(outputs)
      if len(self._keys) > _MAX_OUTPUTS or sorted(outputs) != self._keys:
        raise UserError(f"{_BINDING}: the step outputs {len(outputs)} values; at most "
                        f"{_MAX_OUTPUTS} scalars, the same every step.")
      packed = tf.stack([tf.cast(tf.reshape(outputs[k], []), tf.float32)
                         for k in self._keys])
      packed = tf.pad(packed, [[0, _MAX_OUTPUTS - len(self._keys)]])
      self._pushed = tensor_sizes(grads)
      self._present = [g is not None for g in grads]
      # The ticket and what follows run on the ps once the gradients are there: a
      # worker that dies after pushing leaves a complete update (or a late one)
      # behind, not a ticket whose gradient never comes.
      with tf.device(self._ps):
        arrived = [tf.identity(tf.convert_to_tensor(g)) for g in grads if g is not None]
        arrived_outputs = tf.identity(packed)
        with tf.control_dependencies(arrived + [arrived_outputs]):
          ticket = tf.raw_ops.ResourceCountUpTo(resource=tickets, limit=_TICKET_LIMIT,
                                                T=tf.int64)

        def add():
          accumulators = [acc for g, acc in zip(grads, regime.learner[2]) if g is not None]
          adds = [acc.assign_add(tf.cast(g, acc.dtype), read_value=False)
                  for g, acc in zip(arrived, accumulators)]
          adds.append(self._outputs.assign_add(arrived_outputs, read_value=False))
          with tf.control_dependencies(adds):
            posted = self._done.enqueue(tf.constant(1, tf.int32))
          with tf.control_dependencies([posted]):
            return tf.constant(ACCEPTED)

        def late():
          with tf.control_dependencies([self._late.assign_add(1, read_value=False)]):
            return counted(self._dropped, LATE)

        return tf.cond(ticket < self.taken, add, late)

    @tf.function
    def update(iterator, step, slot, tickets):
      worker = tf.distribute.coordinator.experimental_get_current_worker_index()
      wanted = step * n + slot

      def compute():
        index, batch = read(iterator, wanted)
        return tf.cond(tf.equal(index, wanted),
                       lambda: strategy.run(train, args=(batch, slot, tickets)), stale)

      def attempt():
        if regime.stragglers is None or not regime.stragglers.active:
          return compute()
        # A slowed closure sleeps first, then looks again whether its step is over.
        awake = regime.stragglers.delay(worker, wanted, tf.zeros([]))
        with tf.control_dependencies([awake]):
          current = tf.equal(self._step.read_value(), step)
        return tf.cond(current, compute, stale)

      return tf.cond(tf.equal(self._step.read_value(), step), attempt, stale)

    self._update = update
    self._apply = None

  def _build_apply(self):
    """The chief's half of a step (after the closure's trace recorded the gradients)."""
    optimizer, variables, accumulators = self.regime.learner
    scale = self.n / self.taken

    @tf.function
    def apply():
      tokens = self._done.dequeue_many(self.taken)
      with tf.control_dependencies([tokens]):
        grads = []
        for acc in accumulators:
          with tf.device(acc.device):
            total = acc.read_value()
            grads.append(total if scale == 1 else total * tf.cast(scale, total.dtype))
        outputs = self._outputs.read_value()
      # A variable the step gave no gradient gets none (not a zero one: momentum).
      applied = [g if present else None for g, present in zip(grads, self._present)]

      def optimizer_step():
        aggregation.apply_reduced(optimizer, applied, variables)
        return tf.convert_to_tensor(optimizer.iterations)

      # Keras applies in a replica context: the chief's one (ParameterServerStrategy
      # warns once, at this trace, that run() is not scheduled on a worker: meant).
      iterations = self.strategy.run(optimizer_step)
      with tf.control_dependencies(grads + [outputs, iterations]):
        resets = [acc.assign(tf.zeros_like(acc), read_value=False) for acc in accumulators]
        resets.append(self._outputs.assign(tf.zeros_like(outputs), read_value=False))
      with tf.control_dependencies(resets):
        advanced = self._step.assign_add(1, read_value=False)
      with tf.control_dependencies([advanced]):
        return outputs / self.taken

    @tf.function
    def counters():
      return tf.stack([self._dropped.read_value(), self._late.read_value()])

    return apply, counters

  def trace(self) -> None:
    """Builds the closure's and the chief's graphs (part of init, not of the timed run).

    The closure is traced the coordinator's way by scheduling it: N closures of a
    step that is over (-1), which only count themselves, so the workers also load
    the function before the timed run."""
    with tf.device(self._ps):
      tickets = tf.Variable(tf.constant(0, tf.int64), trainable=False)
    over = tf.constant(-1, tf.int64)
    for slot in self._slots:
      self.coordinator.schedule(self._update, args=(self.iterator, over, slot, tickets.handle))
    self.coordinator.join()
    self._apply, self._counters = self._build_apply()
    with self.strategy.scope():
      self._apply.get_concrete_function()
    self._counted = tuple(int(x) for x in self._counters().numpy())

  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    """No collectives: each worker closure pulls the variables it reads from the ps, and
    N - b of N push their gradients there (regime/bytes_communicated counts the push)."""
    del time_collectives, wire_counter
    return {"collectives_per_step": 0.0, "bytes_per_step": 0, "by_kind": {},
            "note": f"synchronous steps with {self.regime.backup_workers} backup worker(s): "
                    f"variables pulled from the parameter servers, {self.taken} of "
                    f"{self.n} workers' gradients pushed there per step over gRPC, no "
                    f"collectives"}

  def _wait(self, run):
    """run() in a daemon thread (it blocks on the ps's queue); meanwhile a worker's
    error (the coordinator's) is raised here rather than waited on forever."""
    result = {}

    def target():
      try:
        with self.strategy.scope():
          result["value"] = run()
      except Exception as e:  # pylint: disable=broad-except  (re-raised below)
        result["error"] = e

    thread = threading.Thread(target=target, name="BackupPSApply", daemon=True)
    thread.start()
    while thread.is_alive():
      thread.join(timeout=1.0)
      if thread.is_alive():
        self.coordinator.done()   # Raises a failed closure's error.
    if "error" in result:
      raise result["error"]
    return result["value"]

  def _one_step(self):
    with tf.device(self._ps):
      tickets = tf.Variable(tf.constant(0, tf.int64), trainable=False)
    # Late closures of the last steps still take tickets: keep their counters alive.
    self._tickets.append(tickets)
    step = tf.constant(self._t, tf.int64)
    for slot in self._slots:
      self.coordinator.schedule(self._update, args=(self.iterator, step, slot, tickets.handle))
    outputs = self._wait(self._apply)
    self._t += 1
    return outputs.numpy()

  def __call__(self) -> dict:
    if self._apply is None:
      self.trace()
    total = np.zeros([_MAX_OUTPUTS], np.float64)
    for _ in range(self.steps_per_call):
      total += self._one_step()
    means = total / self.steps_per_call
    dropped, late = (int(x) for x in self._counters().numpy())
    steps = self.steps_per_call
    late_per_step = (late - self._counted[1]) / steps
    metrics = {
        "regime/dropped": (dropped - self._counted[0]) / steps,
        "regime/late": late_per_step,
        # Per worker slot: the N - b taken gradients and the late ones reach the ps.
        "regime/bytes_communicated":
            4.0 * sum(self._pushed) * (self.taken + late_per_step) / self.n,
    }
    self._counted = (dropped, late)
    outputs = {k: np.float32(means[i]) for i, k in enumerate(self._keys)}
    return {**outputs, **{k: np.float32(v) for k, v in metrics.items()}}
