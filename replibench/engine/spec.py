"""The spec of a run's step and the context of one input pipeline.

config/ builds one TrainSpec per experiment; the harness hands that one object
to the replicator (`compile`) and to the workload (`build`), and `plan` reads it
too, so every setting reaches the step by one route. The global batch is split
over the replicas here and nowhere else.
"""

import dataclasses

import tensorflow as tf

from replibench.engine import compilation
from replibench.engine.regimes.base import Regime, Sync
from replibench.errors import UserError


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
  """Splits the global batch evenly; the math must not depend on the split."""
  if global_batch_size % num_replicas:
    raise UserError(
        f"The global batch size {global_batch_size} does not divide over {num_replicas} "
        f"replicas; choose a multiple of {num_replicas} (e.g. "
        f"{global_batch_size - global_batch_size % num_replicas or num_replicas}).")
  return global_batch_size // num_replicas


@dataclasses.dataclass(frozen=True)
class InputContext:
  """What `input_fn` needs to build one pipeline of the replicated input."""

  per_replica_batch_size: int
  input_pipeline_id: int
  num_input_pipelines: int
  num_replicas: int
  start_step: int = 0   # Global steps already trained: a resumed pipeline skips their data.
  # Worker processes (engine Replicator._one_process_input): this is the one-process
  # pipeline's context (pipeline 0 of 1), of which a worker keeps only the batches of
  # the replicas of pipeline keep[0] of keep[1] (kept()). An input_fn marked
  # engine.keeps_replicas does that itself, where it is cheapest; for any other the
  # engine keeps them from the whole stream.
  keep: tuple[int, int] | None = None

  @property
  def replicas_per_pipeline(self) -> int:
    """Replicas that take their batches, one after another, from this pipeline."""
    return self.num_replicas // self.num_input_pipelines

  def replica_range(self) -> tuple[int, int]:
    """(first, count): the global replicas whose batches this pipeline yields, in turn
    (kept ones only, with keep)."""
    if self.keep:
      count = self.num_replicas // self.keep[1]
      return self.keep[0] * count, count
    return self.input_pipeline_id * self.replicas_per_pipeline, self.replicas_per_pipeline

  def kept(self, stream: tf.data.Dataset) -> tf.data.Dataset:
    """stream (this context's: element k is replica k % num_replicas's, in turn), with
    keep: the kept replicas' elements only (keep_replicas); without: stream itself."""
    return keep_replicas(stream, self.num_replicas, *self.keep) if self.keep else stream


def keep_replicas(whole: tf.data.Dataset, num_replicas: int, pipeline: int,
                  pipelines: int) -> tf.data.Dataset:
  """Of whole, a one-process stream (element k is replica k % num_replicas's batch of
  step k // num_replicas, or any stream in that order), the elements of pipeline's
  replicas, in order: replicas [pipeline * R, (pipeline + 1) * R) with R = num_replicas /
  pipelines (the replica ids tf.distribute gives a worker's local replicas, which take
  its elements in turn). An endless stream stays endless, and says so."""
  per = num_replicas // pipelines
  if per == 1:
    return whole.shard(pipelines, pipeline)
  kept = whole.enumerate().filter(lambda k, _: (k % num_replicas) // per == pipeline)
  kept = kept.map(lambda _, element: element)
  if whole.cardinality() == tf.data.INFINITE_CARDINALITY:
    # With an unknown cardinality MultiWorkerMirroredStrategy all-reduces a "has data"
    # flag every step to stop all workers together.
    kept = kept.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
  return kept


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """What the compiler fixed about a run's step, read by the replicator, the workload
  and the plan alike.

  regime: how replicas turn gradients into updates. The workload builds its
  optimizers with `regime.build_optimizer`, applies gradients with
  `regime.apply_gradients` (or `apply_gradients_jointly`), never by itself, and
  returns the metrics those return among step_fn's outputs.
  precision: a Keras dtype policy name (workloads/precision.py): the workload
  builds its models under `precision.policy_scope`, wraps its optimizers with
  `precision.wrap_optimizer` and differentiates `precision.scaled(optimizer, loss)`.
  per_replica_batch_size: derived, global_batch_size / num_replicas (UserError if
  it does not divide).
  jit_compile: compile the step with XLA around its exchange (engine/compilation.py):
  the workload calls its forward and backward pass through `compiled` and builds its
  optimizers with `build_optimizer` (the regime's, plus the compiled update).
  """

  global_batch_size: int
  num_replicas: int
  seed: int = 0
  steps_per_epoch: float = 1.0    # Training steps per pass over the training set.
  total_steps: int = 1            # The budget: the run stops here if the target is not met.
  regime: Regime = dataclasses.field(default_factory=Sync)
  precision: str = "float32"      # 'float32' | 'mixed_bfloat16' | 'mixed_float16'.
  steps_per_call: int = 1         # Steps per compiled call (one host round trip).
  jit_compile: bool = False       # XLA around the exchange (Experiment.jit_compile, resolved).
  per_replica_batch_size: int = dataclasses.field(init=False)
  # fn -> its compiled piece: a step calling one pass several times (SN-GAN's n_dis
  # discriminator updates) compiles it once per replica, not once per call.
  _pieces: dict = dataclasses.field(init=False, default_factory=dict, compare=False,
                                    repr=False)

  def __post_init__(self):
    if self.steps_per_call < 1:
      raise UserError(f"steps_per_call must be >= 1, got {self.steps_per_call}.")
    object.__setattr__(self, "per_replica_batch_size",
                       per_replica_batch_size(self.global_batch_size, self.num_replicas))

  @tf.autograph.experimental.do_not_convert   # Engine code (regimes/base.py says why).
  def compiled(self, fn):
    """fn (a replica's forward and backward pass, no collectives inside) as one XLA
    cluster when jit_compile, else fn itself."""
    if not self.jit_compile:
      return fn
    if fn not in self._pieces:
      self._pieces[fn] = compilation.compiled(fn, True)
    return self._pieces[fn]

  def build_optimizer(self, optimizer, variables: list) -> None:
    """The regime's build_optimizer (slots, regime state; under scope()), then, when
    jit_compile and the regime's update may compile, the update compiled with XLA."""
    self.regime.build_optimizer(optimizer, variables)
    if self.jit_compile and self.regime.update_compiles:
      compilation.compile_updates(optimizer)

  def input_context(self, pipeline: int = 0, pipelines: int = 1,
                    start_step: int = 0) -> InputContext:
    """The context of input pipeline `pipeline` of `pipelines` (all replicas' batches
    at the per-replica size; a resumed run skips start_step steps of data)."""
    return InputContext(self.per_replica_batch_size, pipeline, pipelines, self.num_replicas,
                        start_step)
