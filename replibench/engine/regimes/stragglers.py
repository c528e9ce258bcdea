"""regimes.Stragglers: injected worker slowdowns, for the parameter-server regimes and
for local SGD (SwarmSGD) on lockstep replicas.

A straggler is a worker update that takes longer than the others (a busy or
slower machine, a long garbage collection, a noisy neighbour). On one machine
they are injected: each worker update is slowed with probability `fraction`,
by sleeping `delay_ms` milliseconds inside the update's own graph on the
worker (tf.data's SleepDataset, run for one element by the update function:
the worker thread waits in the kernel's sleep and burns no CPU, which matters
when all workers share a few cores; a Python sleep could not run there, and a
busy loop would slow every other worker).

Whether update u of worker w is slowed is a stateless draw from (seed, w, u)
(`slowed`), so it is reproducible and independent of timing; `workers` limits
the slowdowns to some workers (e.g. (1,) with fraction 1.0: worker 1 is always
slow). The delay is a fixed time, not a factor of the update's duration: a
factor needs a base time, and the update time of a loaded 2-core machine
varies by more than the effect measured. For "a fraction f of updates k times
slower", set delay_ms to (k - 1) times the measured update time (the sweep
headers state it).

Bound on a regime: `regimes.AsyncPS.stragglers = @regimes.Stragglers()`,
`regimes.BackupPS.stragglers = ...` or `regimes.LocalSGD.stragglers = ...`, so
they compare under the same slowdowns (see those regimes for where in an update
the sleep sits). Under LocalSGD the worker is the replica (one per worker
process) and update u its optimizer step: the sleep sits between computing the
gradients and applying them, so a slowed replica reaches the next collective
(its pair exchange, or the per-call reduction of the outputs) late, and the
others wait there: what a lockstep SwarmSGD pays for a straggler.
"""

import gin
import tensorflow as tf

from replibench.errors import UserError
from replibench.inputs import shown

_SALT = 0x5157   # Separates this draw's stream from other stateless draws of the seed.


def slowed(seed, worker, update, fraction: float) -> tf.Tensor:
  """A bool scalar: update `update` of worker `worker` is slowed (probability fraction).

  Stateless: the same (seed, worker, update) always draws the same value, in
  eager code and in a graph alike.
  """
  key = tf.stack([tf.cast(seed, tf.int64), tf.constant(_SALT, tf.int64)])
  key = tf.random.experimental.stateless_fold_in(key, tf.cast(worker, tf.int64))
  key = tf.random.experimental.stateless_fold_in(key, tf.cast(update, tf.int64))
  return tf.random.stateless_uniform([], key) < fraction


def sleep_after(microseconds, tensors):
  """`tensors` (a nest), returned once `microseconds` (int64 scalar) have passed after
  they were computed: one element through tf.data's SleepDataset, in the graph
  of the calling function (no CPU is used while it waits)."""
  flat = [t for t in tf.nest.flatten(tensors) if t is not None]
  with tf.control_dependencies(flat):
    ready = tf.zeros([], tf.int64)
  source = tf.data.Dataset.from_tensors(ready)
  variant = tf.raw_ops.SleepDataset(input_dataset=source._variant_tensor,   # pylint: disable=protected-access
                                    sleep_microseconds=tf.cast(microseconds, tf.int64),
                                    output_types=[tf.int64], output_shapes=[[]])
  # SleepDataset sleeps before every GetNext, the one that ends the stream too:
  # take(1) ends it without asking.
  slept = tf.data.experimental.from_variant(variant, source.element_spec)
  done = slept.take(1).get_single_element()
  with tf.control_dependencies([done]):
    return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), tensors)


def checked(stragglers, binding: str):
  """stragglers if it is None or a Stragglers; else a UserError naming binding
  (e.g. 'regimes.LocalSGD.stragglers')."""
  if stragglers is not None and not isinstance(stragglers, Stragglers):
    raise UserError(f"{binding} must be None or @regimes.Stragglers(), got {shown(stragglers)}.")
  return stragglers


@gin.configurable(module="regimes")
class Stragglers:
  """Each worker update slowed by delay_ms with probability fraction (see module doc).

  fraction: probability that an update is slowed, in [0, 1].
  delay_ms: how long a slowed update sleeps, in milliseconds (>= 0).
  seed: the draw's seed (an integer).
  workers: the worker indices whose updates may be slowed; () = every worker.
  """

  def __init__(self, fraction: float = 0.0, delay_ms: float = 0.0, seed: int = 0,
               workers: tuple = ()):
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
        or not 0.0 <= fraction <= 1.0):
      raise UserError(f"regimes.Stragglers.fraction must be a probability in [0, 1] (the "
                      f"share of worker updates that are slowed), got {shown(fraction)}.")
    if (isinstance(delay_ms, bool) or not isinstance(delay_ms, (int, float))
        or not 0.0 <= delay_ms < float("inf")):
      raise UserError(f"regimes.Stragglers.delay_ms must be a finite number of milliseconds "
                      f">= 0 (how long a slowed update sleeps), got {shown(delay_ms)}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
      raise UserError(f"regimes.Stragglers.seed must be an integer, got {shown(seed)}.")
    workers = tuple(workers) if isinstance(workers, (list, tuple)) else workers
    if (not isinstance(workers, tuple)
        or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in workers)):
      raise UserError(f"regimes.Stragglers.workers must be a tuple of worker indices (>= 0), "
                      f"or () for every worker, got {shown(workers)}.")
    self.fraction, self.delay_ms, self.seed = float(fraction), float(delay_ms), seed
    self.workers = tuple(sorted(set(workers)))

  @property
  def active(self) -> bool:
    return self.fraction > 0 and self.delay_ms > 0

  def check_workers(self, num_workers: int) -> None:
    """Raises UserError if `workers` names a worker the cluster does not have."""
    missing = [w for w in self.workers if w >= num_workers]
    if missing:
      raise UserError(f"regimes.Stragglers.workers = {self.workers} names worker(s) "
                      f"{missing}, but the cluster has workers 0..{num_workers - 1}.")

  def delay_us(self, worker, update) -> tf.Tensor:
    """int64 microseconds update `update` of worker `worker` sleeps (0 if not slowed)."""
    hit = slowed(self.seed, worker, update, self.fraction)
    if self.workers:
      worker = tf.cast(worker, tf.int64)
      hit = tf.logical_and(hit, tf.reduce_any(tf.equal(
          worker, tf.constant(self.workers, tf.int64))))
    return tf.where(hit, tf.constant(round(self.delay_ms * 1000), tf.int64),
                    tf.constant(0, tf.int64))

  def delay(self, worker, update, tensors):
    """tensors, after this update's sleep if it is slowed (as is when inactive)."""
    if not self.active:
      return tensors
    return sleep_after(self.delay_us(worker, update), tensors)

  def setting(self) -> str:
    who = "all" if not self.workers else "+".join(map(str, self.workers))
    return f"stragglers={self.fraction:g}x{self.delay_ms:g}ms@{who}"

  def hparams(self) -> dict:
    return {"straggler_fraction": self.fraction, "straggler_delay_ms": self.delay_ms,
            "straggler_workers": "all" if not self.workers else ",".join(map(str, self.workers)),
            "straggler_seed": self.seed}

