"""predict.DeviceProfile: one replica's device and its links, as a gin file describes it.

Apart from predict (which imports config) so that loading any config registers it:
gin refuses a configurable first defined after a config was loaded and locked.
"""

import dataclasses
import math

import gin

from replibench import inputs
from replibench.errors import UserError


@gin.configurable(module="predict")
@dataclasses.dataclass(frozen=True)
class DeviceProfile:
  """One replica's device and its links. Units: FLOP/s, seconds, bytes, bytes/s."""

  name: str = gin.REQUIRED
  peak_flops: float = gin.REQUIRED          # Dense FLOP/s in the run's precision.
  achieved_fraction: float = gin.REQUIRED   # Of peak, on models like these.
  overhead_s: float = 0.0                   # Per step: host, launch, input pipeline.
  memory_bytes: float = 0.0                 # Per device (0: unchecked).
  devices_per_host: int = 1
  intra_host_bytes_per_s: float = math.inf  # Per device (NVLink, ICI).
  intra_host_latency_s: float = 0.0         # Per collective hop.
  inter_host_bytes_per_s: float = math.inf  # Per host network link.
  inter_host_latency_s: float = 0.0
  shared_link: bool = False                 # One link for the whole cluster.
  link_burst_bytes: float = 0.0             # A token-bucket link's depth (tc tbf burst).
  shared_cores: int = 0                     # > 0: devices share this many cores.

  def __post_init__(self):
    """Every field in its range, each named as its binding: a zero bandwidth would
    divide by zero, a fraction above 1 claim more than the device's peak."""
    check = lambda field, *args, **kwargs: inputs.number(  # noqa: E731
        f"predict.DeviceProfile.{field}", getattr(self, field), *args, **kwargs)
    if not isinstance(self.name, str) or not self.name:
      raise UserError(f"{inputs.binding('predict.DeviceProfile.name', self.name)}: must be a "
                      f"non-empty string (the device, e.g. 'NVIDIA V100 SXM2').")
    check("peak_flops", 0, low_open=True, meaning="FLOP/s")
    check("achieved_fraction", 0, 1, low_open=True, meaning="of the peak")
    for field in ("overhead_s", "intra_host_latency_s", "inter_host_latency_s"):
      check(field, 0, meaning="seconds")
    for field in ("memory_bytes", "link_burst_bytes"):
      check(field, 0, meaning="bytes; 0 for none")
    for field in ("intra_host_bytes_per_s", "inter_host_bytes_per_s"):
      check(field, 0, low_open=True, finite=False, meaning="bytes/s; inf for no limit")
    check("devices_per_host", 1, integer=True)
    check("shared_cores", 0, integer=True, meaning="0 when the devices do not share cores")
    if not isinstance(self.shared_link, bool):
      raise UserError(f"{inputs.binding('predict.DeviceProfile.shared_link', self.shared_link)}"
                      f": must be True or False.")

  @property
  def achieved_flops(self) -> float:
    return self.peak_flops * self.achieved_fraction

  def core_share(self, num_replicas: int) -> float:
    """The share of its own speed each of num_replicas devices gets: < 1 where more
    replicas than `shared_cores` share one machine's cores."""
    return min(1.0, self.shared_cores / num_replicas) if self.shared_cores else 1.0
