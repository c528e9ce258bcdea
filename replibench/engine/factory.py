"""engine.make_replicator: the one place that picks a replicator for a topology and regime."""

from replibench.engine.ps import AsyncPS, AsyncReplicator
from replibench.engine.regimes.base import Regime, Sync
from replibench.engine.replicator import Replicator
from replibench.engine.topology import Topology


def make_replicator(topology: Topology, regime: Regime | None = None):
  """A Replicator (synchronous, lockstep replicas) or, for regimes.AsyncPS, an
  AsyncReplicator (workers updating parameter servers on their own). Both offer
  num_replicas, num_workers, is_chief, scope, distribute, run, reduce, compile."""
  regime = regime or Sync()
  if isinstance(regime, AsyncPS):
    return AsyncReplicator(topology, regime)
  return Replicator(topology, regime)
