"""ShardedSync: regimes.Sync for replicas whose gradients are split across devices.

On a tensor-parallel topology.Mesh (engine/model_parallel) each device of a replica
holds its part of every split layer, and so its part of the gradients; the data
axis all-reduces each part among the devices that hold it, exactly as Sync does.
What needs a replica's whole gradient cannot be done from a part:

  - the gradient noise scale (|G_b|^2 of one replica's gradient) is not measured;
  - an optimizer that clips by norm (clipnorm, global_clipnorm) would clip each
    device's part by that part's norm, so it is refused when the optimizer is built.

The topology makes this regime from the configured Sync (Topology.regime_for); it is
not a gin choice, and it reports itself as 'sync'.
"""

from replibench.engine.regimes.base import Sync
from replibench.errors import UserError


class ShardedSync(Sync):
  """Sync without what a part of a replica's gradient cannot give (see the module)."""

  def __init__(self, bucket_bytes: int = 0):
    super().__init__(noise_scale=False, bucket_bytes=bucket_bytes)

  def build_optimizer(self, optimizer, variables: list) -> None:
    inner = getattr(optimizer, "inner_optimizer", optimizer)   # A loss-scale wrapper's.
    if inner.clipnorm or inner.global_clipnorm:
      raise UserError(
          f"Tensor parallelism: the workload's {type(inner).__name__} clips gradients by "
          f"norm (clipnorm / global_clipnorm), which each device would compute over its part "
          f"of the split layers' gradients; drop the clipping or use a pipeline "
          f"(topology.Mesh.parallelism = 'pipeline').")
    super().build_optimizer(optimizer, variables)
