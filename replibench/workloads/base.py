"""The interface between a workload and the harness that drives it."""

import abc

import tensorflow as tf

from replibench.engine import BaseReplicator, InputContext, TrainSpec

__all__ = ["SYNTHETIC_TIME_TO_TARGET", "TrainSpec", "Workload"]   # TrainSpec: engine/spec.py

# What result.json, TensorBoard and the plan say of time to target on synthetic data.
SYNTHETIC_TIME_TO_TARGET = ("undefined: synthetic data (one batch a replica, generated once "
                            "and repeated), so the run reports throughput, step time and "
                            "memory only")


class Workload(abc.ABC):
  """One benchmarked training task: data, model, replicated step and evaluation.

  The harness calls, in order: `build(spec)` under the replicator's scope,
  `input_fn(ctx)` once per input pipeline, `step_fn(batch)` on every replica
  each step, and `evaluate(replicator)` at the evaluation cadence.
  """

  name: str = "workload"
  target_metric: str = "eval/metric"     # Key of `evaluate`'s result checked against the target.
  higher_is_better: bool = True
  # The values target_metric can take: Experiment.target must lie within (a target
  # outside could never, or always, be met).
  target_range: tuple[float, float] = (float("-inf"), float("inf"))
  # True when input_fn reads state of this process (e.g. a replay buffer its actors
  # fill), so the step cannot run on another process (regimes.AsyncPS workers).
  host_local_input: bool = False
  # Whether evaluation counts in the timed span (time to target). MLPerf Training times
  # the evaluation of its supervised benchmarks; an RL workload's evaluation episodes
  # (played apart from training, the exploring actors idle meanwhile) are not timed.
  timed_evaluation: bool = True
  # The MLPerf Training benchmark this workload is a version of (its mllog's
  # submission_benchmark), or None: the log then names the workload.
  mlperf_benchmark: str | None = None

  @property
  def synthetic_data(self) -> bool:
    """True when the workload trains on synthetic data (replibench/data/synthetic.py): time
    to target is undefined, so the harness never evaluates and reports throughput only.
    Default: the `synthetic` flag of the workload's `data` source, if it has one."""
    return bool(getattr(getattr(self, "data", None), "synthetic", False))

  @abc.abstractmethod
  def examples_per_epoch(self) -> int:
    """Training examples in one epoch."""

  def model_parallel_refusal(self) -> str | None:
    """Why this workload's models cannot span devices (a replica over a mesh's model
    axis), with what to do instead; None when they can (the default: the model builder
    is wrapped as docs/concepts/model-parallelism.md shows)."""
    return None

  def check_config(self, spec: TrainSpec) -> None:
    """Raises UserError if the workload's own configuration cannot work (e.g. a model
    binding that does not build). Called at config time, outside any strategy, by
    `plan` and `run` alike; must not need devices or the dataset."""
    del spec

  @abc.abstractmethod
  def build(self, spec: TrainSpec) -> None:
    """Creates models and optimizers (called under Replicator.scope())."""

  def build_learner(self, spec: TrainSpec) -> None:
    """What step_fn needs and nothing more (models, optimizers): no data, scorers or
    actor processes. `replibench plan` traces a step after it. Default: build()."""
    self.build(spec)

  def element_spec(self, per_replica_batch_size: int):
    """The structure of one input_fn element (tf.TensorSpec nest), after build_learner;
    None if the workload cannot say (the plan then has no communication account)."""
    del per_replica_batch_size
    return None

  @abc.abstractmethod
  def input_fn(self, ctx: InputContext) -> tf.data.Dataset:
    """One input pipeline of training batches at ctx.per_replica_batch_size."""

  @abc.abstractmethod
  def step_fn(self, batch) -> dict:
    """One replica's training step; returns scalar tensors: its own (e.g. {'loss': ...})
    and the metrics its regime.apply_gradients calls returned."""

  @abc.abstractmethod
  def evaluate(self, replicator: BaseReplicator) -> dict:
    """Evaluates the current model: {name: host float}, including target_metric.

    Values that are numpy arrays [k, H, W, C] (floats in [0, 1]) are written as
    TensorBoard images (e.g. a grid of generated samples) and kept out of
    result.json.
    """

  @abc.abstractmethod
  def checkpoint_items(self) -> dict:
    """Trackables to checkpoint (models, optimizers, other state)."""

  def prepare_evaluation(self, replicator: BaseReplicator) -> None:
    """Builds (traces) what evaluate() runs, during init: tracing must not fall into
    the timed span."""
    del replicator

  def eval_examples(self) -> int:
    """Examples (or episodes) one evaluation scores, for the MLPerf log."""
    return 0

  def mlperf_hyperparameters(self, spec: TrainSpec) -> dict:
    """MLPerf log keys (e.g. opt_name, opt_base_learning_rate) and their values."""
    del spec
    return {}

  def after_train_call(self, step: int) -> None:
    """Host-side work after each compiled call of steps_per_call steps (e.g. publishing
    policy weights to actor processes). step is the global step reached."""

  def host_metrics(self) -> dict:
    """Host-side scalars logged with the training metrics (e.g. actor env steps/s)."""
    return {}

  def close(self) -> None:
    """Releases what build() started (processes, files). Called once, at the end."""

  def learning_rate(self, step: int) -> float:
    """The learning rate in force at a step, for summaries (nan if not applicable)."""
    del step
    return float("nan")

  def hparams(self) -> dict:
    """Workload hyperparameters shown in TensorBoard's HParams view."""
    return {}

  def describe(self, spec: TrainSpec) -> dict:
    """Static facts for `replibench plan` (parameters, FLOPs, bytes all-reduced...).

    Called outside any strategy; must not need the dataset.
    """
    del spec
    return {}
