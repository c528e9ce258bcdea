"""topology.Mesh: D data-parallel replicas of M devices each.

    Experiment.topology = @topology.Mesh()
    topology.Mesh.data = 2                    # D replicas (the global batch splits D ways)
    topology.Mesh.model = 2                   # M devices each
    topology.Mesh.parallelism = 'tensor'      # or 'pipeline'
    topology.Mesh.micro_batches = 4           # pipeline only
    topology.Mesh.device_memory_bytes = 64e6  # optional: refuse what would not fit a device
    topology.Mesh.workers = 2                 # optional: the data axis over worker processes

In one process (workers = 0) the D x M devices are logical CPU devices on CPU (as
topology.Local makes them), GPUs when there are enough. Devices (d, 0..M-1) are
replica d's; as Mesh-TensorFlow lays out data parallelism, the batch is split along
the data axis only, so each replica's M devices see the same examples.
`num_replicas` is D: the per-replica batch, the engine's collectives and the
workload's view are the data axis's.

With worker processes (workers = N, launched with TF_CONFIG as topology.MultiWorker
is: `replibench launch --workers N -- run ...`) each worker is one replica: the data
axis runs across the processes through MultiWorkerMirroredStrategy, and the model
axis stays inside each worker, on M logical CPU devices of its own. Only a pipeline
runs so; why tensor parallelism does not is said where it is refused
(_refuse_tensor_parallel_workers).
"""

import dataclasses

import gin
import tensorflow as tf

from replibench import cluster, internals
from replibench.engine import devices as devices_lib
from replibench.engine.model_parallel import layout as layout_lib
from replibench.engine.model_parallel.data_axis import DataAxisOps
from replibench.engine.regimes import ShardedSync, Sync
from replibench.engine.topology import Topology, multi_worker_strategy
from replibench.errors import UserError
from replibench.inputs import shown

PARALLELISMS = (layout_lib.TENSOR, layout_lib.PIPELINE)
BINDING = "topology.Mesh"


@gin.configurable(module="topology")
@dataclasses.dataclass(frozen=True)
class Mesh(Topology):
  """D (`data`) replicas of M (`model`) devices: tensor-parallel layers or a pipeline.

  device: 'auto' | 'cpu' | 'gpu' (as topology.Local; worker processes use CPUs).
  device_memory_bytes: each device's memory; plan says whether the configuration
  fits and run refuses one that does not (0: unchecked). workers: 0 (one process)
  or the worker processes in TF_CONFIG, one replica each (so data = workers).
  """

  data: int = 1
  model: int = 2
  parallelism: str = layout_lib.TENSOR
  micro_batches: int = 1
  device: str = "auto"
  device_memory_bytes: float = 0.0
  workers: int = 0
  kind = "model_parallel"

  def __post_init__(self):
    for name in ("data", "model", "micro_batches"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{BINDING}.{name} = {shown(value)}: need a positive integer.")
    if self.parallelism not in PARALLELISMS:
      raise UserError(f"{BINDING}.parallelism = {shown(self.parallelism)}: choose "
                      f"{' or '.join(repr(p) for p in PARALLELISMS)}.")
    if self.micro_batches > 1 and self.parallelism != layout_lib.PIPELINE:
      raise UserError(f"{BINDING}.micro_batches = {self.micro_batches}: micro-batches are "
                      f"a pipeline's; set {BINDING}.parallelism = 'pipeline' or leave "
                      f"micro_batches at 1.")
    if not self.device_memory_bytes >= 0:
      raise UserError(f"{BINDING}.device_memory_bytes = {shown(self.device_memory_bytes)}: "
                      f"need bytes >= 0 (0: unchecked).")
    if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 0:
      raise UserError(f"{BINDING}.workers = {shown(self.workers)}: need 0 (one process) or "
                      f"the number of worker processes.")
    if self.workers:
      self._check_workers()

  def _check_workers(self) -> None:
    if self.parallelism == layout_lib.TENSOR:
      _refuse_tensor_parallel_workers()
    if self.data != self.workers:
      raise UserError(
          f"{BINDING}.workers = {self.workers} with {BINDING}.data = {self.data}: each worker "
          f"process is one replica (the model axis stays inside it), so data must be "
          f"{self.workers} too.")
    if self.device == "gpu":
      raise UserError(
          f"{BINDING}.workers = {self.workers} with {BINDING}.device = 'gpu': "
          f"MultiWorkerMirroredStrategy makes every GPU of a worker a replica of its own, "
          f"where a worker here is one replica spanning M devices; worker processes run "
          f"on logical CPU devices (device = 'cpu' or 'auto').")

  @property
  def num_replicas(self) -> int:
    return self.data

  @property
  def num_devices(self) -> int:
    return self.data * self.model

  def is_chief(self) -> bool:
    return self._cluster().is_chief if self.workers else True

  def _cluster(self) -> cluster.Cluster:
    if not cluster.present():
      raise UserError(
          f"{BINDING}.workers = {self.workers} runs one replica in each of {self.workers} "
          f"worker processes, which need TF_CONFIG (cluster and task), as Kubeflow and other "
          f"launchers set it; on this machine: `replibench launch --workers {self.workers} "
          f"-- run ...`, or set workers = 0 for one process.")
    return cluster.current()

  def describe_devices(self) -> str:
    how = ("tensor-parallel layers" if self.parallelism == layout_lib.TENSOR else
           f"a {self.model}-stage pipeline over {self.micro_batches} micro-batch(es)")
    if self.workers:
      return (f"{self.workers} worker process(es), one replica each of {self.model} "
              f"logical CPU devices: {how}")
    kind = devices_lib.resolve_kind(self.num_devices, self.device)
    what = "GPU" if kind == "gpu" else "CPU (logical devices)"
    return (f"{self.data} x {self.model} {what}: {self.data} replica(s) of {self.model} "
            f"devices, {how}")

  def layout(self, devices: list[str] | None = None) -> layout_lib.Layout:
    """The layout models build under: on these devices, or None to plan."""
    return layout_lib.Layout(self.parallelism, self.data, self.model, self.micro_batches,
                             tuple(devices) if devices is not None else None)

  def devices(self) -> list[str]:
    """The D x M device names, replica d's at d * M .. d * M + M - 1 (with workers,
    replica d is the worker of cluster index d)."""
    if self.workers:
      return [f"/job:{job}/replica:0/task:{index}/device:CPU:{k}"
              for job, index in self._cluster().training_tasks() for k in range(self.model)]
    try:
      return devices_lib.local_devices(self.num_devices, self.device)
    except UserError as e:
      raise UserError(f"{BINDING}(data={self.data}, model={self.model}) needs "
                      f"data x model = {self.num_devices} devices: {e}") from None

  def local_devices(self) -> list[str]:
    """The devices this process holds: all of them, or this worker's M."""
    names = self.devices()
    if not self.workers:
      return names
    first = self._cluster().worker_index * self.model
    return names[first:first + self.model]

  def make_strategy(self) -> tf.distribute.Strategy:
    if self.workers:
      return self._multi_worker_strategy()
    names = self.devices()
    internals.fresh_collective_keys()
    if self.parallelism == layout_lib.TENSOR:
      # A replica per device; reductions along the data axis only (data_axis.py).
      return tf.distribute.MirroredStrategy(names, cross_device_ops=DataAxisOps(names, self.model))
    leads = names[::self.model]   # A replica per model replica, on its first device.
    if "GPU" in leads[0]:
      return tf.distribute.MirroredStrategy(leads)
    return tf.distribute.MirroredStrategy(
        leads, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=leads[0]))

  def _multi_worker_strategy(self) -> tf.distribute.Strategy:
    """One replica a worker, on its first logical CPU; its stages on the other M - 1
    (made before the strategy starts TensorFlow's runtime: the device list is fixed then)."""
    self._cluster()   # Its message first: TF_CONFIG for this topology.
    # Only reserved here: listing the devices would start the runtime, and the strategy
    # must configure its collectives before that; they are checked once it has.
    devices_lib.reserve_logical_cpus(self.model)
    strategy = multi_worker_strategy(self.workers, BINDING)
    devices_lib.ensure_logical_cpus(self.model)
    if strategy.num_replicas_in_sync != self.data:
      raise UserError(
          f"{BINDING}.workers = {self.workers}: MultiWorkerMirroredStrategy made "
          f"{strategy.num_replicas_in_sync} replicas, not one a worker (it makes one a GPU "
          f"where a worker sees GPUs); hide them (CUDA_VISIBLE_DEVICES=) to run on CPUs.")
    return strategy

  def regime_for(self, regime):
    """Tensor parallelism: Sync becomes ShardedSync (a device holds part of its replica's
    gradients: regimes/sharded_sync.py)."""
    if self.parallelism == layout_lib.TENSOR and type(regime) is Sync:  # noqa: E721
      return ShardedSync(regime.bucket_bytes)
    return regime

  def check_spec(self, spec) -> None:
    if not isinstance(spec.regime, Sync):
      raise UserError(
          f"{BINDING} with Experiment.regime = {spec.regime.setting()}: model parallelism "
          f"composes with synchronous data parallelism (regimes.Sync) only; the other regimes "
          f"exchange or average each replica's own state, which a replica split over devices "
          f"does not hold in one place.")
    if self.parallelism == layout_lib.TENSOR and spec.precision == "mixed_float16":
      raise UserError(
          f"{BINDING}.parallelism = 'tensor' with Experiment.precision = 'mixed_float16': "
          f"loss scaling skips a step when a gradient overflows, and the devices of a replica "
          f"hold different parts of the gradients, so they could disagree on skipping. Use "
          f"'mixed_bfloat16' (no loss scaling) or float32.")
    if spec.per_replica_batch_size % self.micro_batches:
      raise UserError(
          f"{BINDING}.micro_batches = {self.micro_batches} does not divide the per-replica "
          f"batch {spec.per_replica_batch_size} (Experiment.global_batch_size = "
          f"{spec.global_batch_size} over data = {self.data} replicas); choose micro-batches "
          f"that divide it.")


def _refuse_tensor_parallel_workers() -> None:
  raise UserError(
      f"{BINDING}.workers > 0 with {BINDING}.parallelism = 'tensor': tensor parallelism "
      f"across worker processes is not supported. Its layers run as one program on every "
      f"device of a replica, which needs a strategy replica per device with reductions along "
      f"the data axis only; MultiWorkerMirroredStrategy gives a CPU worker one replica "
      f"(it ignores a worker's logical CPU devices) and reduces over all of its replicas. "
      f"Use parallelism = 'pipeline' with workers, or tensor parallelism in one process "
      f"(workers = 0).")


def check_split(layout: layout_lib.Layout) -> None:
  """UserError if the models built under layout do not split as its mesh asks (run and
  plan both check)."""
  if layout.parallelism == layout_lib.TENSOR and layout.model > 1:
    if layout.open_pair is not None:
      raise UserError(f"Tensor parallelism: layer {layout.open_pair!r} is split by output "
                      f"channels but no layer split by input channels follows it.")
    if not layout.split_layers:
      raise UserError(
          "topology.Mesh.parallelism = 'tensor' but the workload's models split no layer: "
          "build them with the tensor-parallel factory (basic_block.conv_layer = "
          "@model_parallel.tensor_parallel_conv for ResNet, sngan_generator.conv_layer = "
          "@model_parallel.tensor_parallel_conv for SN-GAN).")
  if layout.parallelism == layout_lib.PIPELINE and not layout.pipelines:
    raise UserError(
        "topology.Mesh.parallelism = 'pipeline' but the workload built no pipelined model: "
        "wrap its model builder in @model_parallel.pipelined (ResNet: "
        "ImageClassification.model = @model_parallel.pipelined, model_parallel.pipelined."
        "builder = @small_resnet, model_parallel.pipelined.split = @resnet_pieces; SN-GAN: "
        "ConditionalGAN.generator = @generator/model_parallel.pipelined with "
        "generator/model_parallel.pipelined.builder = @sngan_generator, and the same for "
        "the discriminator; configs/{resnet,sngan}/pipeline.gin hold them).")
