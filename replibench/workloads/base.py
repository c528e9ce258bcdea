"""The interface between a workload and the harness that drives it."""

import abc
import dataclasses

import tensorflow as tf

from replibench.engine import InputContext, Replicator


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """What the compiler fixed about a run, handed to the workload at build time."""

  global_batch_size: int
  num_replicas: int
  seed: int
  steps_per_epoch: float    # Training steps per pass over the training set.
  total_steps: int          # The budget: the run stops here if the target is not met.


class Workload(abc.ABC):
  """One benchmarked training task: data, model, replicated step and evaluation.

  The harness calls, in order: `build(spec)` under the replicator's scope,
  `input_fn(ctx)` once per input pipeline, `step_fn(batch)` on every replica
  each step, and `evaluate(replicator)` at the evaluation cadence.
  """

  name: str = "workload"
  target_metric: str = "eval/metric"     # Key of `evaluate`'s result checked against the target.
  higher_is_better: bool = True
  # True when input_fn reads state of this process (e.g. a replay buffer its actors
  # fill), so the step cannot run on another process (regimes.AsyncPS workers).
  host_local_input: bool = False

  @abc.abstractmethod
  def examples_per_epoch(self) -> int:
    """Training examples in one epoch."""

  @abc.abstractmethod
  def build(self, spec: TrainSpec) -> None:
    """Creates models and optimizers (called under Replicator.scope())."""

  @abc.abstractmethod
  def input_fn(self, ctx: InputContext) -> tf.data.Dataset:
    """One input pipeline of training batches at ctx.per_replica_batch_size."""

  @abc.abstractmethod
  def step_fn(self, batch) -> dict:
    """One replica's training step; returns scalar tensors (e.g. {'loss': ...})."""

  @abc.abstractmethod
  def evaluate(self, replicator: Replicator) -> dict:
    """Evaluates the current model: {name: host float}, including target_metric.

    Values that are numpy arrays [k, H, W, C] (floats in [0, 1]) are written as
    TensorBoard images (e.g. a grid of generated samples) and kept out of
    result.json.
    """

  @abc.abstractmethod
  def checkpoint_items(self) -> dict:
    """Trackables to checkpoint (models, optimizers, other state)."""

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
