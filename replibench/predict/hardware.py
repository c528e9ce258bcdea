"""Hardware efficiency: seconds per step from FLOPs, device speed and collective cost.

Paleo's decomposition (Qi et al., ICLR 2017), with no overlap of communication
and compute (tf.distribute's all-reduce starts after the backward pass unless the
topology packs it: MultiWorker.bytes_per_pack):

  step_s    = compute_s + comm_s
  compute_s = overhead_s + flops_per_example * per_replica_batch / achieved FLOP/s
  comm_s    = collectives * latency term + bytes term

The all-reduce is a ring within a host and, across hosts, a ring over the hosts
(hierarchical, as NCCL and TF's collectives do): each replica's payload M (bytes)
crosses its in-host link 2(d-1)/d times and its host's network link 2(H-1)/H
times, with d devices per host and H hosts. A `shared_link` profile (one machine's
emulated cluster, `replibench launch --network`) has one link for all traffic:
the whole ring's 2(N-1) M bytes pass through it. That link is a token bucket (tc
tbf): while the step computes, the link idles and its bucket refills, up to
link_burst_bytes, which then pass at once; only the rest waits for the rate.
Where more replicas than `shared_cores` share a machine's cores, compute and every
hop's latency slow by the core share (a hop waits for its peer to be scheduled:
benchmarks/calibrate_collectives.py measured 1.8 ms a hop for 4 workers on 2
cores against 1.0 ms for 2).

A DeviceProfile is one replica's device. Every number comes from a spec sheet or a
measurement; each profile file's header says which.
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


@dataclasses.dataclass(frozen=True)
class StepTime:
  compute_s: float
  comm_s: float

  @property
  def step_s(self) -> float:
    return self.compute_s + self.comm_s


def compute_seconds(profile: DeviceProfile, flops_per_example: float, per_replica_batch: float,
                    num_replicas: int) -> float:
  """One replica's step compute: overhead plus its FLOPs at the achieved rate, both
  slowed by the share of a core each gets when more replicas than `shared_cores`
  share one machine's cores."""
  return (profile.overhead_s + flops_per_example * per_replica_batch / profile.achieved_flops
          ) / profile.core_share(num_replicas)


def allreduce_seconds(profile: DeviceProfile, payload_bytes: float, collectives: int,
                      num_replicas: int, idle_s: float = 0.0) -> float:
  """A step's all-reduces: `collectives` of them, payload_bytes per replica in all;
  idle_s: how long the link idles in a step (its compute), refilling a token bucket."""
  n = num_replicas
  if n <= 1:
    return 0.0
  d = min(profile.devices_per_host, n)
  hosts = math.ceil(n / d)
  share = profile.core_share(n)
  if profile.shared_link:
    rate = profile.inter_host_bytes_per_s
    burst = min(profile.link_burst_bytes, rate * idle_s)
    return (collectives * 2 * (n - 1) * profile.inter_host_latency_s / share
            + max(0.0, 2 * (n - 1) * payload_bytes - burst) / rate)
  latency = 2 * (d - 1) * profile.intra_host_latency_s + 2 * (hosts - 1) * profile.inter_host_latency_s
  moved = (2 * (d - 1) / d * payload_bytes / profile.intra_host_bytes_per_s
           + 2 * (hosts - 1) / hosts * payload_bytes / profile.inter_host_bytes_per_s)
  return collectives * latency / share + moved


def step_time(profile: DeviceProfile, flops_per_example: float, global_batch: int,
              num_replicas: int, payload_bytes: float, collectives: int) -> StepTime:
  """Seconds per step of a synchronous step on num_replicas replicas of profile."""
  compute = compute_seconds(profile, flops_per_example, global_batch / num_replicas,
                            num_replicas)
  return StepTime(compute_s=compute,
                  comm_s=allreduce_seconds(profile, payload_bytes, collectives, num_replicas,
                                           idle_s=compute))
