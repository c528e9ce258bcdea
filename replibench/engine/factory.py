"""engine.make_replicator: the one place that picks a replicator for a topology and regime."""

from replibench.engine.model_parallel import Mesh, MeshReplicator
from replibench.engine.ps import AsyncPS, AsyncReplicator, BackupPS, BackupReplicator
from replibench.engine.regimes.base import Regime, Sync
from replibench.engine.replicator import Replicator
from replibench.engine.topology import Topology


def make_replicator(topology: Topology, regime: Regime | None = None):
  """A Replicator (synchronous, lockstep replicas); for regimes.AsyncPS an
  AsyncReplicator (workers updating parameter servers on their own); for
  regimes.BackupPS a BackupReplicator (synchronous steps on parameter servers that
  drop the slowest workers' gradients); for a topology.Mesh a MeshReplicator (replicas
  spanning several devices). All offer num_replicas, num_workers,
  is_chief, scope, distribute, run, reduce, compile."""
  regime = regime or Sync()
  if isinstance(topology, Mesh):   # Replicas of several devices each (engine/model_parallel).
    return MeshReplicator(topology, regime)
  if isinstance(regime, BackupPS):   # Before AsyncPS: a subclass of it.
    return BackupReplicator(topology, regime)
  if isinstance(regime, AsyncPS):
    return AsyncReplicator(topology, regime)
  return Replicator(topology, regime)
