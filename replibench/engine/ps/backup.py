"""BackupReplicator: the parameter-server cluster running regimes.BackupPS's synchronous
steps (regimes/backup_ps.py says what they mean). The chief drives them:

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
"""

import collections
import threading

import numpy as np
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.interface import BaseStep
from replibench.engine.ps.replicator import AsyncReplicator, WorkerGroup
from replibench.engine.regimes.backup_ps import BINDING, BackupPS
from replibench.engine.regimes.base import tensor_sizes
from replibench.engine.spec import TrainSpec
from replibench.errors import UserError

_MAX_OUTPUTS = 64             # Scalars a step may output (summed on the ps for the chief).
_TICKET_LIMIT = 2**62         # ResourceCountUpTo's limit: never reached.
_TICKETS_KEPT = 256           # Steps whose ticket counters stay alive for late closures.
ACCEPTED, LATE, STALE = 0, 1, 2   # What a closure did (its return value).


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

  def _compile(self, step_fn, input_fn, spec, start_step) -> "BackupStep":
    return BackupStep(self, step_fn, input_fn, spec, start_step)


def _counted(variable: tf.Variable, status: int) -> tf.Tensor:
  """status, once variable has been incremented."""
  with tf.control_dependencies([variable.assign_add(1, read_value=False)]):
    return tf.constant(status)


def _read(iterator, wanted: tf.Tensor) -> tuple:
  """(index, batch) of element `wanted` of a worker's numbered stream: skips forward to
  it (a worker's closures come in step order); an index past it was read before."""
  index, batch = next(iterator)
  return tf.while_loop(lambda i, _: i < wanted, lambda i, _: next(iterator), (index, batch))


class BackupStep(BaseStep):
  """Each call runs steps_per_call synchronous steps with backup workers (module doc)
  and returns their outputs averaged, as host values."""

  def __init__(self, replicator: BackupReplicator, step_fn, input_fn, spec: TrainSpec,
               start_step: int):
    super().__init__(replicator, spec)
    self.regime: BackupPS = replicator.regime
    self.strategy, self.coordinator = replicator.strategy, replicator.coordinator
    self.n = spec.num_replicas
    self.taken = self.n - self.regime.backup_workers
    self._step_fn = step_fn
    self._ps = "/job:ps/replica:0/task:0"
    self._make_state()
    self._t = 0                    # The step the chief runs next (== self._step).
    self._tickets = collections.deque(maxlen=_TICKETS_KEPT)
    self._slots = [tf.constant(k, tf.int64) for k in range(self.n)]
    self._counted = (0, 0)
    self._keys = None              # The step's output names, from the trace.
    # One pipeline's view for N replicas, numbered: element i is replica i % N's
    # batch of global batch i // N (after the resumed steps'). Every worker reads it all.
    ctx = spec.input_context(start_step=start_step)
    self.iterator = replicator.per_worker_iterator(lambda: input_fn(ctx).enumerate())
    self._update = tf.function(self._closure)
    self._apply = None

  def _make_state(self) -> None:
    """The step counter, the outputs' accumulator, the drop counters and the queue of
    accepted closures' tokens, on the ps."""
    with self.strategy.scope():
      self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_step")
      self._outputs = tf.Variable(tf.zeros([_MAX_OUTPUTS]), trainable=False,
                                  name="backup_ps_outputs")
      # Closures dropped (stale or late) and, of those, late ones.
      self._dropped = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_dropped")
      self._late = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_ps_late")
    with tf.device(self._ps):
      self._done = tf.queue.FIFOQueue(max(1024, 4 * self.n), [tf.int32], shapes=[[]],
                                      name="backup_ps_done")

  # -- a worker closure ------------------------------------------------------------

  def _closure(self, iterator, step, slot, tickets):
    """Slot `slot` of step `step` on whichever worker runs it: ACCEPTED, LATE or STALE."""
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    wanted = step * self.n + slot
    stale = lambda: _counted(self._dropped, STALE)   # noqa: E731

    def compute():
      index, batch = _read(iterator, wanted)
      return tf.cond(tf.equal(index, wanted),
                     lambda: self.strategy.run(self._train, args=(batch, slot, tickets)), stale)

    def attempt():
      stragglers = self.regime.stragglers
      if stragglers is None or not stragglers.active:
        return compute()
      # A slowed closure sleeps first, then looks again whether its step is over.
      awake = stragglers.delay(worker, wanted, tf.zeros([]))
      with tf.control_dependencies([awake]):
        current = tf.equal(self._step.read_value(), step)
      return tf.cond(current, compute, stale)

    return tf.cond(tf.equal(self._step.read_value(), step), attempt, stale)

  def _train(self, batch, slot, tickets):
    """The slot's step on this worker; then its ticket decides whether it counts."""
    with collectives.replica_group(SlotGroup(self.n, slot)):
      with self.regime.recording() as recorded:
        outputs = self._step_fn(batch)
    if not recorded:
      raise UserError(f"{BINDING}: the workload's step_fn applied no gradients "
                      f"(regime.apply_gradients).")
    grads = recorded[0]
    if self._keys is None:
      self._keys = sorted(outputs)
    if len(self._keys) > _MAX_OUTPUTS or sorted(outputs) != self._keys:
      raise UserError(f"{BINDING}: the step outputs {len(outputs)} values; at most "
                      f"{_MAX_OUTPUTS} scalars, the same every step.")
    packed = tf.stack([tf.cast(tf.reshape(outputs[k], []), tf.float32) for k in self._keys])
    self._pushed = tensor_sizes(grads)
    self._present = [g is not None for g in grads]
    return self._ticketed(grads, tf.pad(packed, [[0, _MAX_OUTPUTS - len(self._keys)]]), tickets)

  def _ticketed(self, grads: list, packed: tf.Tensor, tickets) -> tf.Tensor:
    """On the ps once the gradients are there (a worker that dies after pushing leaves
    a complete update, or a late one, behind, not a ticket whose gradient never comes):
    the first `taken` tickets add their gradients and outputs and post a token."""
    with tf.device(self._ps):
      arrived = [tf.identity(tf.convert_to_tensor(g)) for g in grads if g is not None]
      arrived_outputs = tf.identity(packed)
      with tf.control_dependencies(arrived + [arrived_outputs]):
        ticket = tf.raw_ops.ResourceCountUpTo(resource=tickets, limit=_TICKET_LIMIT,
                                              T=tf.int64)

      def add():
        accumulators = [acc for g, acc in zip(grads, self.regime.learner[2]) if g is not None]
        adds = [acc.assign_add(tf.cast(g, acc.dtype), read_value=False)
                for g, acc in zip(arrived, accumulators)]
        adds.append(self._outputs.assign_add(arrived_outputs, read_value=False))
        with tf.control_dependencies(adds):
          posted = self._done.enqueue(tf.constant(1, tf.int32))
        with tf.control_dependencies([posted]):
          return tf.constant(ACCEPTED)

      def late():
        with tf.control_dependencies([self._late.assign_add(1, read_value=False)]):
          return _counted(self._dropped, LATE)

      return tf.cond(ticket < self.taken, add, late)

  # -- the chief's half ------------------------------------------------------------

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
    """Builds the closure's and the chief's graphs. The closure is traced the
    coordinator's way, by scheduling it: N closures of a step that is over (-1),
    which only count themselves, so the workers also load it before the timed run."""
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
