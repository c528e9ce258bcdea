"""The training regime: how replicas combine their work into parameter updates.

A regime is chosen in gin like a topology (`Experiment.regime = @regimes.LocalSGD()`)
and changes nothing in model code. The replicator and the workload both read it
from the run's one TrainSpec (engine/spec.py); the workload calls it:

  regime.build_optimizer(optimizer, variables)              at build time, under scope()
  metrics = regime.apply_gradients(optimizer, grads, vars)  inside step_fn, which
                                                            returns the metrics

`Sync` (the default) all-reduces the gradients once and applies them, the
paper's synchronous data parallelism. Other synchronous regimes (local SGD,
compressed, gossip) live beside it in this package; asynchronous
parameter-server training has a replicator of its own (engine/ps).

Each regime states what it sends with one formula, `wire_bytes`, which the
plan (from the model's tensor sizes) and the run (from the traced tensors)
both use.
"""

import os

import gin
import tensorflow as tf
from absl import logging

from replibench import inputs
from replibench.engine import aggregation, training_kernels
from replibench.engine.measure import noise_scale
from replibench.engine.regimes.step_metrics import StepMetrics

GRADIENTS, STATE = "gradient", "state"   # What a regime sends: see Regime.exchanges.


def inter_op_threads_for_buckets() -> None:
  """Gives this process at least 2 inter-op threads, so that a gradient bucket's
  collective can start while the backward pass still runs.

  TensorFlow sizes its inter-op pool by the cores the process may use: 1 for a
  worker pinned to one core. With one thread the executor keeps running the backward
  chain inline and a ready collective waits in the pool's queue until the chain
  ends, so buckets hide nothing: measured at 2 one-core workers and 100 Mbit/s, 0.3
  of 30 ms of exchange ran under compute with 1 thread, 15.5 ms with 2 (step 62 ->
  52 ms; results/scaling/README.md). The pool can only be sized before TensorFlow's
  runtime starts; afterwards (an in-process test, a notebook) this logs and leaves it.
  """
  threads = tf.config.threading.get_inter_op_parallelism_threads()
  if (threads or len(os.sched_getaffinity(0))) >= 2:
    return
  try:
    tf.config.threading.set_inter_op_parallelism_threads(2)
  except RuntimeError:
    logging.warning("regimes.Sync.bucket_bytes: TensorFlow's runtime already started with "
                    "one inter-op thread, so the buckets' collectives will wait for the "
                    "backward pass (set TF_NUM_INTEROP_THREADS=2 before the process starts).")


class Regime:
  """Base class: synchronous semantics, overridable piece by piece."""

  name = "abstract"
  # What the regime's communication carries per step: GRADIENTS (one copy of the
  # gradients) or STATE (parameters and optimizer slots), for wire_bytes.
  exchanges = GRADIENTS
  # Whether TrainSpec.jit_compile may compile the optimizer's per-variable update with
  # XLA (engine/compilation.py); False where the update must stay TensorFlow's own
  # kernel (the parameter servers' locking updates).
  update_compiles = True

  def __init_subclass__(cls, **kwargs):
    """Each regime's apply_gradients and apply_gradients_jointly run unconverted by
    AutoGraph, as TensorFlow's and Keras' own code does: they branch on tensors with
    tf.cond and tf.while_loop, never with Python `if`. Converted, the engine's code
    cost every process that traces a step, launched tasks included, about a fifth of
    a small ResNet run's CPU (2026-12-07, docs/reference/tests-and-benchmarks.md: 24%
    of it in AutoGraph, 6% once the engine's code was left alone; -17% CPU side by
    side). The workload's step_fn that calls them is still converted, as
    tf.distribute converts it."""
    super().__init_subclass__(**kwargs)
    for name in ("apply_gradients", "apply_gradients_jointly"):
      if name in vars(cls):
        setattr(cls, name, tf.autograph.experimental.do_not_convert(vars(cls)[name]))

  def check(self, topology) -> None:
    """Raises UserError if this regime cannot run on topology (called before any device work)."""

  def check_workload(self, workload) -> None:
    """Raises UserError if this regime cannot train workload (called before any device work)."""

  def build_optimizer(self, optimizer, variables: list) -> None:
    """Creates optimizer slots and any regime state for these variables (under scope()).

    Keras 3 optimizers must be built before the first traced step. Keras SGD and
    Adam then update through TensorFlow's fused kernels (engine/training_kernels.py:
    Keras' own arithmetic, one op a variable instead of up to ~28).
    """
    optimizer.build(variables)
    training_kernels.use_training_kernels(optimizer)

  def apply_gradients(self, optimizer, grads: list, variables: list) -> StepMetrics:
    """Turns one replica's gradients (of an `average_loss`-scaled loss) into updates.

    Returns the regime's scalars for this update (e.g. the bytes sent), which
    step_fn returns among its outputs: they are averaged over replicas and steps
    like the others. Several calls in one step add up (`a + b`).
    """
    raise NotImplementedError

  @tf.autograph.experimental.do_not_convert   # As the subclasses' (__init_subclass__).
  def apply_gradients_jointly(self, updates: list) -> StepMetrics:
    """Several optimizers' gradients from one step, [(optimizer, grads, vars), ...].

    By default one apply_gradients after the other; a regime may fuse their
    communication (Sync reduces them in one collective).
    """
    return sum((self.apply_gradients(*update) for update in updates), StepMetrics())

  def wire_bytes(self, sizes: list[int], num_replicas: int) -> float:
    """Bytes one replica sends per step, for float32 tensors of these sizes (entries).

    sizes: the tensors `exchanges` names (gradients of every optimizer step in
    a training step, or parameters and slots). The unit is each replica's own
    payload; a ring all-reduce moves about twice that per replica.
    """
    del num_replicas
    return 4.0 * sum(sizes)

  def describe(self, sizes: list[int] | None, num_replicas: int) -> dict:
    """Static facts for `replibench plan`: the regime and its bytes per replica and step."""
    facts = {"regime": self.setting()}
    if sizes is not None:
      facts["bytes_communicated_per_step"] = round(self.wire_bytes(sizes, num_replicas))
    return facts

  def setting(self) -> str:
    """The regime and its settings in one string, e.g. "compressed(bits=8)"."""
    return self.name

  def hparams(self) -> dict:
    """Regime settings for TensorBoard's HParams view and result.json."""
    return {"regime": self.name}


def tensor_sizes(tensors) -> list[int]:
  """Entries of each tensor (None skipped), for wire_bytes."""
  return [t.shape.num_elements() for t in tensors if t is not None]


@gin.configurable(module="regimes")
class Sync(Regime):
  """Synchronous data parallelism: gradients summed over replicas once per step.

  'regime/bytes_communicated' is each replica's gradient payload per step (the
  unit the other regimes report against; a ring all-reduce moves about twice
  that per replica, a tree or a parameter server a similar multiple).
  """

  name = "sync"

  def __init__(self, noise_scale: bool = True, bucket_bytes: int = 0):
    """noise_scale: record |G_b|^2 and |G_B|^2 each step (engine/measure/noise_scale.py) on
    two or more replicas, for the gradient noise scale; off under loss scaling.
    bucket_bytes: all-reduce the gradients in buckets of about this many bytes, the last
    layers' first, each as soon as the backward pass has made its gradients (overlap of
    the exchange with the backward pass; aggregation.all_reduce_gradients); 0: one
    all-reduce after the whole backward pass. On every synchronous path (logical
    replicas, worker processes, a Mesh's data axis); under worker processes each
    bucket is one collective unless topology.MultiWorker.bytes_per_pack splits it
    further. 0 by default: at 2 one-core workers 128 KB buckets measured 7.5% slower at
    1 Gbit/s and 17% faster at 100 Mbit/s (results/scaling/README.md; the suites run on
    loopback); benchmarks/scaling/overlap.py measures bucket sizes on an emulated link. With buckets the process gets at least
    two inter-op threads (inter_op_threads_for_buckets).
    """
    inputs.number("regimes.Sync.bucket_bytes", bucket_bytes, 0, integer=True)
    self.noise_scale = noise_scale
    self.bucket_bytes = int(bucket_bytes)
    if self.bucket_bytes:
      inter_op_threads_for_buckets()

  def apply_gradients(self, optimizer, grads, variables):
    return self.apply_gradients_jointly([(optimizer, grads, variables)])

  def apply_gradients_jointly(self, updates):
    reduced = aggregation.sync_apply_gradients_jointly(updates, self.bucket_bytes)
    local = [g for _, grads, _ in updates for g in grads]
    metrics = {"regime/bytes_communicated": self.wire_bytes(tensor_sizes(local), 0)}
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    # A loss-scaled step's gradients carry the scale (and inf on skipped steps).
    scaled = any(hasattr(optimizer, "inner_optimizer") for optimizer, _, _ in updates)
    if self.noise_scale and replicas > 1 and not scaled:
      metrics.update(noise_scale.step_norms(local, reduced, replicas))
    return StepMetrics(metrics)
