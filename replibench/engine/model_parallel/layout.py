"""The layout of one model-parallel run, as model-building and model-running code sees it.

A mesh has D data-parallel replicas of M devices each; device (d, m) is entry
d * M + m of `devices`. Under tensor parallelism every device runs the replica's
program on its share of the split layers (SPMD); under a pipeline device (d, k)
holds and runs stage k of replica d. A Layout is made active (a stack, not per
thread: MirroredStrategy traces its replicas in threads of its own) while the
replicator builds the workload's models and while it traces their steps; the
tensor-parallel layers and the pipelined models read it there. Outside any layout
(a workload's host-side sampling, a model built without a mesh) they compute the
whole model's math on whatever device runs them.

When planning (`devices` None) layers build and trace one replica's device of the
mesh: shapes and collectives as at run time, with no device behind them.
"""

import contextlib
import dataclasses

import tensorflow as tf

TENSOR, PIPELINE = "tensor", "pipeline"


@dataclasses.dataclass
class Layout:
  """parallelism: TENSOR or PIPELINE; data (D), model (M); micro_batches (pipeline);
  devices: D * M device names, or None when planning."""

  parallelism: str
  data: int
  model: int
  micro_batches: int = 1
  devices: tuple | None = None
  # What the models built under this layout declared (checked by the replicator).
  split_layers: list = dataclasses.field(default_factory=list)
  open_pair: str | None = None   # The output-split layer whose partner is still to come.
  pair_layers: list = dataclasses.field(default_factory=list)   # Layers built inside a pair.
  pipelines: list = dataclasses.field(default_factory=list)

  @property
  def planning(self) -> bool:
    return self.devices is None

  @property
  def model_axis(self) -> int:
    """Devices a tensor-parallel layer is split over (1 under a pipeline)."""
    return self.model if self.parallelism == TENSOR else 1

  @property
  def stages(self) -> int:
    """Devices a pipelined model is spread over (1 under tensor parallelism)."""
    return self.model if self.parallelism == PIPELINE else 1

  def device(self, d: int, m: int) -> str:
    return self.devices[d * self.model + m]

  def rows(self) -> list[tuple]:
    """The devices of each replica d: (d, 0) .. (d, M-1)."""
    return [self.devices[d * self.model:(d + 1) * self.model] for d in range(self.data)]

  def coordinates(self) -> tuple[int, int]:
    """(d, m) of the replica whose step is being traced; (0, 0) when planning.

    Under tensor parallelism tf.distribute's replica r is device (r // M, r % M);
    under a pipeline its replica d spans devices (d, 0..M-1), and m is 0.
    """
    if self.planning:
      return 0, 0
    replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
    if replica is None:
      raise RuntimeError("model parallelism needs the replica id known when tracing.")
    if self.parallelism == TENSOR:
      return int(replica) // self.model, int(replica) % self.model
    return int(replica), 0


_ACTIVE: list[Layout] = []


@contextlib.contextmanager
def active(layout: Layout):
  """Makes layout the current one for the models built and traced in this block."""
  _ACTIVE.append(layout)
  try:
    yield layout
  finally:
    _ACTIVE.remove(layout)


def current() -> Layout | None:
  return _ACTIVE[-1] if _ACTIVE else None


def in_replica(layout: Layout | None) -> bool:
  """Whether code runs as one device of layout's replicas: inside a replicated step of
  the mesh (or planning one), not on the host."""
  if layout is None:
    return False
  if layout.planning:
    return True
  return not tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy()
