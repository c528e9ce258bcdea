"""The experiment a gin config declares, validated before anything runs."""

import dataclasses
import math

import gin

from replibench.engine import Topology
from replibench.engine.regimes import Regime, Sync
from replibench.engine.replicator import per_replica_batch_size
from replibench.errors import UserError
from replibench.workloads.base import TrainSpec, Workload


@gin.configurable(module="replibench")
@dataclasses.dataclass
class Experiment:
  """Model, data, topology, regime, budget, evaluation cadence and target.

  Budget and cadence are in epochs (passes over the training set); they turn
  into steps once the global batch is known, rounded up to whole calls of
  steps_per_call steps.
  """

  workload: Workload = gin.REQUIRED
  topology: Topology = gin.REQUIRED
  global_batch_size: int = gin.REQUIRED
  target: float = gin.REQUIRED          # Value of workload.target_metric that ends the run.
  train_epochs: float = gin.REQUIRED    # Budget if the target is never met.
  seed: int = 0
  eval_every_epochs: float = 1.0
  steps_per_call: int = 1               # Steps per tf.function call (host round trips).
  checkpoint_every_epochs: float = 1.0
  log_every_steps: int = 100
  regime: Regime = dataclasses.field(default_factory=Sync)   # How replicas combine updates.

  def __post_init__(self):
    self._check_types()
    if self.global_batch_size <= 0 or self.train_epochs <= 0 or self.eval_every_epochs <= 0:
      raise UserError(
          "Experiment.global_batch_size, train_epochs and eval_every_epochs must be positive "
          f"(got {self.global_batch_size}, {self.train_epochs}, {self.eval_every_epochs}).")
    try:
      per_replica_batch_size(self.global_batch_size, self.topology.num_replicas)
    except UserError as e:
      raise UserError(f"Experiment.global_batch_size = {self.global_batch_size} with "
                      f"{self.topology.describe()}: {e}") from None

  def _check_types(self):
    expected = {"workload": Workload, "topology": Topology, "global_batch_size": int,
                "target": (int, float), "train_epochs": (int, float), "seed": int,
                "eval_every_epochs": (int, float), "steps_per_call": int,
                "checkpoint_every_epochs": (int, float), "log_every_steps": int,
                "regime": Regime}
    for name, kind in expected.items():
      value = getattr(self, name)
      if not isinstance(value, kind) or isinstance(value, bool):
        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise UserError(f"Experiment.{name} must be a {want}, got {value!r} "
                        f"({type(value).__name__}); check that binding in the gin files.")

  @property
  def steps_per_epoch(self) -> float:
    return self.workload.examples_per_epoch() / self.global_batch_size

  def _steps(self, epochs: float) -> int:
    steps = max(1, math.ceil(epochs * self.steps_per_epoch))
    return math.ceil(steps / self.steps_per_call) * self.steps_per_call

  @property
  def total_steps(self) -> int:
    return self._steps(self.train_epochs)

  @property
  def eval_every_steps(self) -> int:
    return self._steps(self.eval_every_epochs)

  @property
  def checkpoint_every_steps(self) -> int:
    return self._steps(self.checkpoint_every_epochs)

  def train_spec(self, num_replicas: int | None = None) -> TrainSpec:
    return TrainSpec(global_batch_size=self.global_batch_size,
                     num_replicas=num_replicas or self.topology.num_replicas,
                     seed=self.seed, steps_per_epoch=self.steps_per_epoch,
                     total_steps=self.total_steps)
