"""What every replicator and every compiled step offers, declared once.

Three replicators implement it: `Replicator` (lockstep replicas: the Mirrored,
MultiWorkerMirrored and TPU strategies), `ps.AsyncReplicator` (workers that
update parameter servers on their own) and `ps.BackupReplicator` (synchronous
steps on parameter servers that drop the slowest workers' gradients);
engine.make_replicator picks one. A new way of placing replicas is one more
subclass: it makes its strategy and implements the abstract methods; the
regime's check, the run's TrainSpec and the input contexts are shared here.
"""

import abc
import contextlib
from typing import Any, Callable

import tensorflow as tf

from replibench.engine.regimes.base import Regime, Sync
from replibench.engine.spec import InputContext, TrainSpec
from replibench.errors import UserError


class BaseStep(abc.ABC):
  """spec.steps_per_call training steps of a step_fn; call it to run them.

  A call returns the step outputs (a dict of scalars) averaged over replicas and
  steps, as host values.
  """

  def __init__(self, replicator: "BaseReplicator", spec: TrainSpec):
    self.replicator, self.spec = replicator, spec

  @property
  def steps_per_call(self) -> int:
    return self.spec.steps_per_call

  @abc.abstractmethod
  def trace(self) -> None:
    """Builds the step's graphs without training (part of init, not of the timed run)."""

  @abc.abstractmethod
  def communication(self, time_collectives: bool = True, wire_counter=None) -> dict:
    """The step's communication account (engine/measure/communication.py's format),
    after trace(). time_collectives also times its collectives alone (every worker of
    a cluster calls it together); wire_counter, a callable returning the bytes sent so
    far on a launched cluster's link, also prices their protocol overhead."""

  @abc.abstractmethod
  def __call__(self) -> dict:
    """Runs steps_per_call steps: {output name: host value, averaged}."""


class BaseReplicator(abc.ABC):
  """Replicates single-device `input_fn` / `step_fn` code over a topology.

  Subclasses set self.strategy (a tf.distribute strategy) in __init__.
  """

  strategy: tf.distribute.Strategy

  def __init__(self, topology, regime: Regime | None = None):
    self.topology = topology
    # A config's spec holds the topology's regime already (regime_for returns it as is).
    self.regime = topology.regime_for(regime or Sync())
    self.regime.check(topology)

  @property
  @abc.abstractmethod
  def num_replicas(self) -> int:
    """Replicas the global batch is split over."""

  @property
  def num_workers(self) -> int:
    """Processes that run replicas."""
    return 1

  @property
  def is_chief(self) -> bool:
    """True on the one process that writes summaries, results and checkpoints."""
    return self.topology.is_chief()

  @contextlib.contextmanager
  def scope(self):
    """Variables (models, optimizers, metrics) created here are replicated."""
    with self.strategy.scope():
      yield

  @abc.abstractmethod
  def distribute(self, input_fn: Callable[[InputContext], tf.data.Dataset],
                 spec: TrainSpec | int, start_step: int = 0):
    """The replicated input of input_fn for run(): spec's batches (or a global batch
    size's) on every replica."""

  @abc.abstractmethod
  def run(self, step_fn: Callable, *args, **kwargs) -> Any:
    """Runs step_fn once on every replica (outside compile: evaluation, tests)."""

  @abc.abstractmethod
  def reduce(self, values, op: str = "mean"):
    """run()'s per-replica results as host values: 'sum', 'mean' or 'concat'."""

  def as_spec(self, spec: TrainSpec | int, steps_per_call: int | None = None) -> TrainSpec:
    """spec, checked against this replicator; a global batch size (for code without a
    config: tests, scripts) becomes this replicator's spec at that batch."""
    if not isinstance(spec, TrainSpec):
      return TrainSpec(spec, self.num_replicas, regime=self.regime,
                       steps_per_call=1 if steps_per_call is None else steps_per_call)
    if steps_per_call is not None:
      raise TypeError("steps_per_call is the TrainSpec's; give it there.")
    if spec.num_replicas != self.num_replicas or spec.regime is not self.regime:
      raise UserError(
          f"The run's spec plans {spec.num_replicas} replica(s) under {spec.regime.setting()}, "
          f"but {self.topology.describe()} runs {self.num_replicas} under "
          f"{self.regime.setting()}: check topology.MultiWorker.replicas_per_worker against "
          f"the devices each worker has.")
    return spec

  def compile(self, step_fn: Callable, input_fn: Callable, spec: TrainSpec | int,
              steps_per_call: int | None = None, start_step: int = 0) -> BaseStep:
    """spec.steps_per_call replicated steps of step_fn per call.

    spec: the run's TrainSpec, or a global batch size with steps_per_call (default 1).
    start_step: steps already trained (a resumed run's input skips their data).
    """
    return self._compile(step_fn, input_fn, self.as_spec(spec, steps_per_call), start_step)

  @abc.abstractmethod
  def _compile(self, step_fn: Callable, input_fn: Callable, spec: TrainSpec,
               start_step: int) -> BaseStep:
    """compile, for a spec already checked against this replicator."""
