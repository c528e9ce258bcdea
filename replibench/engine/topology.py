"""Topologies: where the replicas live. Each one builds its tf.distribute strategy.

A topology is declared in gin (`@topology.Local()` ...) or built in Python, and
knows how many replicas it has without touching devices, so a config for
hardware this machine lacks can still be planned. `make_strategy` is the only
place that touches devices.
"""

import dataclasses

import gin
import tensorflow as tf

from replibench import cluster, internals
from replibench.engine import devices
from replibench.errors import UserError
from replibench.inputs import shown


class Topology:
  """Base class. Subclasses are frozen dataclasses."""

  kind = "abstract"        # Stored in results: how replicas map to hardware.
  num_replicas: int

  def make_strategy(self) -> tf.distribute.Strategy:
    raise NotImplementedError

  def describe_devices(self) -> str:
    """Where the replicas run, said without initialising any device."""
    raise NotImplementedError

  def is_chief(self) -> bool:
    """Whether this process writes the run's files (known before any device work)."""
    return True

  def regime_for(self, regime):
    """The regime this topology runs for the configured one: regime itself, or a variant
    that does what this topology's replicas need (a tensor-parallel Mesh's replicas hold
    parts of their gradients). Config builds the TrainSpec with it; a replicator made
    without a config asks too. Must return its argument when given its own result."""
    return regime

  def check_spec(self, spec) -> None:
    """Raises UserError if this topology cannot run the run's TrainSpec (its regime,
    precision or per-replica batch); called by config, before any device work."""
    del spec

  def describe(self) -> str:
    fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
    return f"{type(self).__name__}({fields})"


@gin.configurable(module="topology")
@dataclasses.dataclass(frozen=True)
class Local(Topology):
  """num_replicas replicas on this host: one per GPU, or logical CPU devices.

  device: 'gpu', 'cpu', or 'auto' (GPUs when there are at least num_replicas of
  them, else logical CPU devices).
  """

  num_replicas: int = 1
  device: str = "auto"
  kind = "logical_replicas"

  def __post_init__(self):
    if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
      raise UserError(f"Local(num_replicas={shown(self.num_replicas)}): need a positive integer.")

  def describe_devices(self) -> str:
    kind = devices.resolve_kind(self.num_replicas, self.device)
    return f"{self.num_replicas} x {'GPU' if kind == 'gpu' else 'CPU (logical devices)'}"

  def make_strategy(self):
    names = devices.local_devices(self.num_replicas, self.device)
    internals.fresh_collective_keys()
    if "GPU" in names[0]:
      return tf.distribute.MirroredStrategy(names)
    # On CPU the default NCCL path does not exist; reduce on the host.
    return tf.distribute.MirroredStrategy(
        names, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=names[0]))


@gin.configurable(module="topology")
@dataclasses.dataclass(frozen=True)
class MultiWorker(Topology):
  """The cluster in TF_CONFIG; each worker process contributes its local replicas.

  workers: expected number of workers, used for planning and checked against
  TF_CONFIG at run time (0 = whatever TF_CONFIG says). On CPU each worker has
  one replica; on GPU hosts, one per GPU. ps: parameter-server tasks, for
  planning and checked like workers (0 = whatever TF_CONFIG says); only
  Experiment.regime = @regimes.AsyncPS() uses them, and there `workers` counts
  the training workers, not the chief that coordinates them.
  """

  workers: int = 0
  replicas_per_worker: int = 1
  ps: int = 0
  bytes_per_pack: int = 0   # CommunicationOptions: 0 packs all gradients in one collective.
  kind = "worker_processes"

  @property
  def num_replicas(self) -> int:
    workers = self.workers
    if not workers and cluster.present():
      workers = cluster.current().replica_processes
    return max(workers, 1) * self.replicas_per_worker

  def is_chief(self) -> bool:
    return cluster.current().is_chief

  def describe_devices(self) -> str:
    workers = self.workers or "TF_CONFIG's"
    ps = f" + {self.ps} parameter server(s)" if self.ps else ""
    return f"{workers} worker(s) x {self.replicas_per_worker} replica(s){ps}"

  def make_strategy(self):
    return multi_worker_strategy(self.workers, "topology.MultiWorker", self.ps,
                                 self.bytes_per_pack)


def multi_worker_strategy(workers: int, binding: str, ps: int | None = None,
                          bytes_per_pack: int = 0):
  """MultiWorkerMirroredStrategy over TF_CONFIG's training processes (ring collectives).

  UserError, naming binding (the topology's gin name), where TF_CONFIG lists ps tasks
  or ps > 0 (those are for asynchronous training; None: the topology has no ps
  setting), or not `workers` training processes (0: any number).
  """
  spec = cluster.current()
  if ps or spec.count("ps"):
    setting = "" if ps is None else f"{binding}.ps = {ps} and "
    raise UserError(
        f"{setting}TF_CONFIG lists {spec.count('ps')} ps task(s): parameter "
        f"servers are for asynchronous training; set Experiment.regime = @regimes.AsyncPS() "
        f"(as configs/topology/ps.gin does), or launch without --ps for synchronous training.")
  found = spec.training_processes
  if workers and found != workers:
    raise UserError(f"{binding}.workers = {workers} but TF_CONFIG lists {found} worker task(s).")
  options = tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=bytes_per_pack,
      implementation=tf.distribute.experimental.CommunicationImplementation.RING)
  return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


@gin.configurable(module="topology")
@dataclasses.dataclass(frozen=True)
class Tpu(Topology):
  """A TPU slice: num_cores replicas (TPUStrategy)."""

  num_cores: int = 8
  address: str = ""
  kind = "tpu"

  @property
  def num_replicas(self) -> int:
    return self.num_cores

  def describe_devices(self) -> str:
    return f"{self.num_cores} TPU cores"

  def make_strategy(self):
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=self.address)
      tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
      raise UserError(
          f"topology.Tpu(address={shown(self.address)}) found no TPU on this machine ({e}). "
          f"`replibench plan` works without one; to run, use a TPU VM or a Local topology."
      ) from None
    strategy = tf.distribute.TPUStrategy(resolver)
    if strategy.num_replicas_in_sync != self.num_cores:
      raise UserError(
          f"topology.Tpu.num_cores = {self.num_cores} but the TPU has "
          f"{strategy.num_replicas_in_sync} cores.")
    return strategy
