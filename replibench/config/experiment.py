"""The experiment a gin config declares, validated before anything runs."""

import dataclasses
import math

import gin

from replibench import inputs
from replibench.config import compile_choice
from replibench.engine import Topology, TrainSpec
from replibench.engine.regimes import Regime, Sync
from replibench.errors import UserError
from replibench.inputs import shown
from replibench.workloads import precision as precision_lib
from replibench.workloads.base import Workload


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
  # A TensorFlow profile of steps (A, B) in the run's TensorBoard directory (None: none);
  # `run --profile_steps=A,B` sets it. Which calls it traces: harness/profiling.py.
  profile_steps: tuple | None = None
  regime: Regime = dataclasses.field(default_factory=Sync)   # How replicas combine updates.
  # Keras mixed-precision policy: 'float32' | 'mixed_bfloat16' | 'mixed_float16'
  # (replibench/workloads/precision.py: what stays float32, loss scaling).
  precision: str = "float32"
  # XLA: True | False | 'auto' (by device kind and workload: config/compile_choice.py).
  # Compiled around the exchange between replicas (engine/compilation.py).
  jit_compile: bool | str = compile_choice.AUTO
  # TensorFlow's thread pools for this process (0: TensorFlow's default, one thread per
  # core the process may use); set before the runtime starts (engine/devices.py). A
  # small model's ops gain little from intra-op threads and pay for their hand-offs:
  # D4PG's state learner has 1.17x the examples/s with intra_op_threads = 1 on 2 cores
  # (A/B, results/d4pg/README.md). result.json's machine.threads says what ran.
  intra_op_threads: int = 0
  inter_op_threads: int = 0
  # The regression tracker's own test of its power, never set by a real config: after
  # every training call the harness runs extra matmuls on the step's cores so that
  # examples/s drop by this fraction (harness/slowdown.py; results/tracking/README.md).
  # The operative config of a run shows it.
  inject_slowdown: float = 0.0

  def __post_init__(self):
    """The one validation of a config, shared by `replibench plan` and `run`; builds
    the run's one TrainSpec."""
    self._check_types()
    self._check_values()
    regime = self.topology.regime_for(self.regime)
    self.compile_choice = compile_choice.resolve(self.jit_compile, self.workload,
                                                 self.topology, regime)
    try:
      self._spec = TrainSpec(
          global_batch_size=self.global_batch_size, num_replicas=self.topology.num_replicas,
          seed=self.seed, steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps,
          regime=regime, precision=self.precision, steps_per_call=self.steps_per_call,
          jit_compile=self.compile_choice.enabled)
    except UserError as e:
      raise UserError(f"Experiment.global_batch_size = {self.global_batch_size} with "
                      f"{self.topology.describe()}: {e}") from None
    self.regime.check(self.topology)
    self.topology.check_spec(self._spec)
    self.regime.check_workload(self.workload)
    self._check_model_parallel()
    self._check_precision()
    if self.profile_steps is not None:
      self.profile_steps = inputs.step_range("Experiment.profile_steps", self.profile_steps,
                                             self.total_steps)

  def thread_pool_warning(self) -> str | None:
    """What the thread pools chosen undo, or None. A pool of one inter-op thread runs
    the backward pass inline and leaves a ready bucket's collective queued until it
    ends (regimes/base.py inter_op_threads_for_buckets, which only raises TensorFlow's
    default): an explicit Experiment.inter_op_threads = 1 wins over it, legal but with
    buckets that hide nothing."""
    bucket_bytes = getattr(self._spec.regime, "bucket_bytes", 0)
    if self.inter_op_threads == 1 and bucket_bytes:
      return (f"Experiment.inter_op_threads = 1 with regimes.Sync.bucket_bytes = "
              f"{bucket_bytes}: with one inter-op thread each bucket's all-reduce waits "
              f"for the whole backward pass, so the buckets overlap nothing; use 2 or more "
              f"inter-op threads (or 0, the default), or bucket_bytes = 0.")
    return None

  def _check_model_parallel(self) -> None:
    """A replica spanning devices needs a workload whose models can be split: refused
    with that workload's own advice (not another workload's) where they cannot."""
    model = getattr(self.topology, "model", 1)
    if not isinstance(model, int) or model <= 1:
      return
    refusal = self.workload.model_parallel_refusal()
    if refusal:
      raise UserError(f"topology.Mesh.model = {model} (parallelism "
                      f"{getattr(self.topology, 'parallelism', '?')!r}) with the "
                      f"{self.workload.name} workload: {refusal}.")

  def check_models(self) -> None:
    """Builds the workload's models once (UserError if a model binding does not build).

    Apart from __post_init__ because it initialises TensorFlow, which some strategies
    must configure first: `plan` calls it at once, `run` right after the replicator
    exists and before anything is written.
    """
    self.workload.check_config(self.train_spec())

  def _check_values(self):
    positive = {"global_batch_size": self.global_batch_size, "train_epochs": self.train_epochs,
                "eval_every_epochs": self.eval_every_epochs,
                "checkpoint_every_epochs": self.checkpoint_every_epochs,
                "steps_per_call": self.steps_per_call, "log_every_steps": self.log_every_steps}
    for name, value in positive.items():
      if not (math.isfinite(value) and value > 0):
        raise UserError(f"Experiment.{name} = {shown(value)}: must be a positive, finite number.")
    examples = self.workload.examples_per_epoch()
    if self.global_batch_size > examples:
      raise UserError(
          f"Experiment.global_batch_size = {self.global_batch_size}: more than the {examples:,} "
          f"examples of one epoch of {self.workload.name}; give a batch in [1, {examples}].")
    if self.seed < 0:
      raise UserError(f"Experiment.seed = {self.seed}: must be >= 0.")
    for name in ("intra_op_threads", "inter_op_threads"):
      if getattr(self, name) < 0:
        raise UserError(f"Experiment.{name} = {getattr(self, name)}: must be >= 0 (0: "
                        f"TensorFlow's default, one thread per core the process may use).")
    if not 0 <= self.inject_slowdown < 0.9:
      raise UserError(f"Experiment.inject_slowdown = {self.inject_slowdown!r}: a fraction of "
                      f"examples/s to remove, in [0, 0.9) (0: none, the default).")
    low, high = self.workload.target_range
    if not (math.isfinite(self.target) and low <= self.target <= high):
      raise UserError(
          f"Experiment.target = {shown(self.target)}: {self.workload.target_metric} of "
          f"{type(self.workload).__name__} lies in [{low}, {high}], so this target could "
          f"never (or always) be met; choose a finite value in that range.")

  def _check_precision(self):
    if self.precision not in precision_lib.PRECISIONS:
      raise UserError(
          f"Experiment.precision = {shown(self.precision)}: not a precision replibench knows; "
          f"choose one of {', '.join(repr(p) for p in precision_lib.PRECISIONS)} (a Keras "
          f"mixed-precision policy: variables stay float32, layers compute in the named dtype).")
    # Exactly Sync: the regimes that apply per-replica gradients cannot agree on a skip.
    if self.precision == precision_lib.FLOAT16 and type(self.regime) is not Sync:  # noqa: E721
      raise UserError(
          f"Experiment.precision = 'mixed_float16' with Experiment.regime = "
          f"{self.regime.setting()}: float16 needs dynamic loss scaling, which skips a step "
          f"when the gradients overflow, and replicas only agree on skipping when they check "
          f"the same all-reduced gradients, as regimes.Sync does. Use regimes.Sync() with "
          f"float16, or 'mixed_bfloat16' (no loss scaling) with this regime.")

  def _check_types(self):
    expected = {"workload": Workload, "topology": Topology, "global_batch_size": int,
                "target": (int, float), "train_epochs": (int, float), "seed": int,
                "eval_every_epochs": (int, float), "steps_per_call": int,
                "checkpoint_every_epochs": (int, float), "log_every_steps": int,
                "regime": Regime, "precision": str, "inject_slowdown": (int, float),
                "intra_op_threads": int, "inter_op_threads": int}
    for name, kind in expected.items():
      value = getattr(self, name)
      if not isinstance(value, kind) or isinstance(value, bool):
        want = {int: "an integer", str: "a string"}.get(kind, "a number" if kind == (
            int, float) else f"a {getattr(kind, '__name__', kind)}")
        raise UserError(f"Experiment.{name} must be {want}, got {shown(value)} "
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

  def train_spec(self) -> TrainSpec:
    """The run's step as the replicator, the workload and `plan` read it (built once)."""
    return self._spec
