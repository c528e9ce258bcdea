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
benchmarks/predict/calibrate_collectives.py measured 1.8 ms a hop for 4 workers on 2
cores against 1.0 ms for 2).

A DeviceProfile is one replica's device. Every number comes from a spec sheet or a
measurement; each profile file's header says which.
"""

import dataclasses
import math

from replibench.device_profile import DeviceProfile  # noqa: F401  (predict.DeviceProfile)


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
