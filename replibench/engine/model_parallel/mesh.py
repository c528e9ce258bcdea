"""topology.Mesh: D data-parallel replicas of M devices each, in one process.

    Experiment.topology = @topology.Mesh()
    topology.Mesh.data = 2                    # D replicas (the global batch splits D ways)
    topology.Mesh.model = 2                   # M devices each
    topology.Mesh.parallelism = 'tensor'      # or 'pipeline'
    topology.Mesh.micro_batches = 4           # pipeline only
    topology.Mesh.device_memory_bytes = 64e6  # optional: refuse what would not fit a device

D x M logical CPU devices on CPU (as topology.Local makes them), GPUs when there are
enough. Devices (d, 0..M-1) are replica d's; as Mesh-TensorFlow lays out data
parallelism, the batch is split along the data axis only, so each replica's M
devices see the same examples. `num_replicas` is D: per-replica batch, the
engine's collectives and the workload's view are the data axis's. The model axis
stays inside this process (no worker processes).
"""

import dataclasses

import gin
import tensorflow as tf

from replibench import internals
from replibench.engine import devices as devices_lib
from replibench.engine.model_parallel import layout as layout_lib
from replibench.engine.model_parallel.data_axis import DataAxisOps
from replibench.engine.regimes.base import Sync
from replibench.engine.topology import Topology
from replibench.errors import UserError

PARALLELISMS = (layout_lib.TENSOR, layout_lib.PIPELINE)


@gin.configurable(module="topology")
@dataclasses.dataclass(frozen=True)
class Mesh(Topology):
  """D (`data`) replicas of M (`model`) devices: tensor-parallel layers or a pipeline.

  device: 'auto' | 'cpu' | 'gpu' (as topology.Local). device_memory_bytes: each
  device's memory; plan says whether the configuration fits and run refuses one that
  does not (0: unchecked).
  """

  data: int = 1
  model: int = 2
  parallelism: str = layout_lib.TENSOR
  micro_batches: int = 1
  device: str = "auto"
  device_memory_bytes: float = 0.0
  kind = "model_parallel"

  def __post_init__(self):
    for name in ("data", "model", "micro_batches"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"topology.Mesh.{name} = {value!r}: need a positive integer.")
    if self.parallelism not in PARALLELISMS:
      raise UserError(f"topology.Mesh.parallelism = {self.parallelism!r}: choose "
                      f"{' or '.join(repr(p) for p in PARALLELISMS)}.")
    if self.micro_batches > 1 and self.parallelism != layout_lib.PIPELINE:
      raise UserError(f"topology.Mesh.micro_batches = {self.micro_batches}: micro-batches are "
                      f"a pipeline's; set topology.Mesh.parallelism = 'pipeline' or leave "
                      f"micro_batches at 1.")
    if not self.device_memory_bytes >= 0:
      raise UserError(f"topology.Mesh.device_memory_bytes = {self.device_memory_bytes!r}: "
                      f"need bytes >= 0 (0: unchecked).")

  @property
  def num_replicas(self) -> int:
    return self.data

  @property
  def num_devices(self) -> int:
    return self.data * self.model

  def describe_devices(self) -> str:
    kind = devices_lib.resolve_kind(self.num_devices, self.device)
    what = "GPU" if kind == "gpu" else "CPU (logical devices)"
    how = ("tensor-parallel layers" if self.parallelism == layout_lib.TENSOR else
           f"a {self.model}-stage pipeline over {self.micro_batches} micro-batch(es)")
    return f"{self.data} x {self.model} {what}: {self.data} replica(s) of {self.model} devices, {how}"

  def layout(self, devices: list[str] | None = None) -> layout_lib.Layout:
    """The layout models build under: on these devices, or None to plan."""
    return layout_lib.Layout(self.parallelism, self.data, self.model, self.micro_batches,
                             tuple(devices) if devices is not None else None)

  def devices(self) -> list[str]:
    """The D x M device names, replica d's at d * M .. d * M + M - 1."""
    try:
      return devices_lib.local_devices(self.num_devices, self.device)
    except UserError as e:
      raise UserError(f"topology.Mesh(data={self.data}, model={self.model}) needs "
                      f"data x model = {self.num_devices} devices: {e}") from None

  def make_strategy(self) -> tf.distribute.Strategy:
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

  def check_experiment(self, experiment) -> None:
    regime = experiment.regime
    if type(regime) is not Sync:   # pylint: disable=unidiomatic-typecheck
      raise UserError(
          f"topology.Mesh with Experiment.regime = {regime.setting()}: model parallelism "
          f"composes with synchronous data parallelism (regimes.Sync) only; the other regimes "
          f"exchange or average each replica's own state, which a replica split over devices "
          f"does not hold in one place.")
    if self.parallelism == layout_lib.TENSOR and experiment.precision == "mixed_float16":
      raise UserError(
          "topology.Mesh.parallelism = 'tensor' with Experiment.precision = 'mixed_float16': "
          "loss scaling skips a step when a gradient overflows, and the devices of a replica "
          "hold different parts of the gradients, so they could disagree on skipping. Use "
          "'mixed_bfloat16' (no loss scaling) or float32.")
    per_replica = experiment.global_batch_size // self.data
    if per_replica % self.micro_batches:
      raise UserError(
          f"topology.Mesh.micro_batches = {self.micro_batches} does not divide the per-replica "
          f"batch {per_replica} (Experiment.global_batch_size = {experiment.global_batch_size} "
          f"over data = {self.data} replicas); choose micro-batches that divide it.")


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
        "wrap its model builder (ImageClassification.model = @model_parallel.pipelined, "
        "model_parallel.pipelined.builder = @small_resnet, and the split, e.g. "
        "model_parallel.pipelined.split = @resnet_pieces).")
