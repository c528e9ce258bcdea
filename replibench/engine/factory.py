"""The one place that picks, for a topology and a regime, the replicator and what this
process does in the run."""

import dataclasses

from replibench.engine.interface import BaseReplicator
from replibench.engine.model_parallel import Mesh, MeshReplicator
from replibench.engine.ps import AsyncReplicator, BackupReplicator, is_server_task
from replibench.engine.regimes import AsyncPS, BackupPS, Regime, Sync
from replibench.engine.replicator import Replicator
from replibench.engine.topology import Topology


@dataclasses.dataclass(frozen=True)
class Role:
  """What this process does in a run."""

  trains: bool     # False: a worker or ps task of a parameter-server cluster, which serves.
  is_chief: bool   # Writes the run's files: summaries, results, checkpoints.


def process_role(topology: Topology, regime: Regime) -> Role:
  """This process's role, from the topology, the regime and TF_CONFIG (UserError if
  TF_CONFIG cannot run them); known before any device work."""
  if isinstance(regime, AsyncPS) and is_server_task(topology):
    return Role(trains=False, is_chief=False)
  return Role(trains=True, is_chief=topology.is_chief())


def make_replicator(topology: Topology, regime: Regime | None = None) -> BaseReplicator:
  """A Replicator (synchronous, lockstep replicas); for regimes.AsyncPS an
  AsyncReplicator (workers updating parameter servers on their own); for
  regimes.BackupPS a BackupReplicator (synchronous steps on parameter servers that
  drop the slowest workers' gradients); for a topology.Mesh a MeshReplicator (replicas
  spanning several devices). All implement engine.interface.BaseReplicator."""
  regime = regime or Sync()
  if isinstance(topology, Mesh):   # Replicas of several devices each (engine/model_parallel).
    return MeshReplicator(topology, regime)
  if isinstance(regime, BackupPS):   # Before AsyncPS: a subclass of it.
    return BackupReplicator(topology, regime)
  if isinstance(regime, AsyncPS):
    return AsyncReplicator(topology, regime)
  return Replicator(topology, regime)
