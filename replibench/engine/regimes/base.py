"""The training regime: how replicas combine their work into parameter updates.

A regime is chosen in gin like a topology (`Experiment.regime = @regimes.LocalSGD()`)
and changes nothing in model or workload code. Workloads call two engine
functions, and the regime active on the current Replicator decides what they do:

  engine.build_optimizer(optimizer, variables)   at build time, under scope()
  engine.apply_gradients(optimizer, grads, vars)  inside step_fn

`Sync` (the default) all-reduces the gradients once and applies them, the
paper's synchronous data parallelism. Other regimes (local SGD, compressed,
gossip, asynchronous parameter servers) live beside it in this package.
"""

import contextlib

import gin
import tensorflow as tf

from replibench.engine.regimes.step_metrics import StepMetrics, payload_bytes

# A module global, not a thread-local: MirroredStrategy traces each replica's
# step in a thread of its own, and those threads must see the regime too.
_ACTIVE = None


class Regime:
  """Base class: synchronous all-reduce semantics, overridable piece by piece."""

  name = "abstract"
  # > 0 when each replica step runs on one of this many workers with no
  # collective between them (AsyncPS); the engine's collectives then act on
  # one worker's values (see collectives.py).
  asynchronous_workers = 0

  def check(self, topology) -> None:
    """Raises UserError if this regime cannot run on topology (called before any device work)."""

  def check_workload(self, workload) -> None:
    """Raises UserError if this regime cannot train workload (called before any device work)."""

  def serve(self, topology) -> None:
    """On a process that only serves the regime's cluster (e.g. a parameter server),
    runs that server and never returns; on processes that train, returns at once."""

  def begin_step(self) -> list:
    """Called inside the replicated step just before step_fn (e.g. to read a counter).

    Returns tensors that every op of step_fn must run after (default none).
    """
    return []

  def make_strategy(self, topology) -> tf.distribute.Strategy:
    """The tf.distribute strategy this regime runs on (the topology's, by default)."""
    return topology.make_strategy()

  def build_optimizer(self, optimizer, variables: list) -> None:
    """Creates optimizer slots and any regime state for these variables (under scope())."""
    optimizer.build(variables)

  def apply_gradients(self, optimizer, grads: list, variables: list) -> None:
    """Turns one replica's gradients (of an `average_loss`-scaled loss) into updates."""
    raise NotImplementedError

  def apply_gradients_jointly(self, updates: list) -> None:
    """Several optimizers' gradients from one step, [(optimizer, grads, vars), ...].

    By default one apply_gradients after the other; a regime may fuse their
    communication (Sync reduces them in one collective).
    """
    for optimizer, grads, variables in updates:
      self.apply_gradients(optimizer, grads, variables)

  def step_metrics(self) -> dict:
    """Scalar tensors this regime reports for the step just traced (e.g. bytes sent).

    Called inside the replicated step after step_fn; the values are averaged
    over replicas like the step's own outputs. Keys are prefixed 'regime/'.
    """
    return {}

  def describe(self, gradient_bytes: int, num_replicas: int) -> dict:
    """Static facts for `replibench plan` (e.g. bytes communicated per step)."""
    del gradient_bytes, num_replicas
    return {"regime": self.name}

  def hparams(self) -> dict:
    """Regime settings for TensorBoard's HParams view and result.json."""
    return {"regime": self.name}


@gin.configurable(module="regimes")
class Sync(Regime):
  """Synchronous data parallelism: gradients summed over replicas once per step.

  'regime/bytes_communicated' is each replica's gradient payload per step (the
  unit the other regimes report against; a ring all-reduce moves about twice
  that per replica, a tree or a parameter server a similar multiple).
  """

  name = "sync"

  def __init__(self):
    self._metrics = StepMetrics()

  def apply_gradients(self, optimizer, grads, variables):
    self.apply_gradients_jointly([(optimizer, grads, variables)])

  def apply_gradients_jointly(self, updates):
    from replibench.engine import aggregation  # pylint: disable=import-outside-toplevel
    aggregation.sync_apply_gradients_jointly(updates)
    for _, grads, _ in updates:
      self._metrics.add("regime/bytes_communicated", float(payload_bytes(grads)))

  def step_metrics(self):
    return self._metrics.take()

  def describe(self, gradient_bytes, num_replicas):
    return {"regime": self.name, "bytes_communicated_per_step": gradient_bytes}


def active() -> Regime:
  """The regime of the Replicator whose scope or step is being built (Sync if none)."""
  return _ACTIVE or _DEFAULT


@contextlib.contextmanager
def activate(regime: Regime):
  """Makes regime the one engine.apply_gradients / build_optimizer use, for a block."""
  global _ACTIVE  # pylint: disable=global-statement
  previous, _ACTIVE = _ACTIVE, regime
  try:
    yield regime
  finally:
    _ACTIVE = previous


_DEFAULT = Sync()
