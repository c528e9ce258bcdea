"""Training regimes (gin module `regimes`): how replicas turn gradients into updates.

Synchronous (lockstep replicas): Sync, LocalSGD, Compressed, Gossip, GradientTracking.
ShardedSync: Sync for replicas split across devices (a tensor-parallel topology.Mesh
makes it). On parameter servers (engine/ps runs them): AsyncPS, BackupPS. Stragglers
slow a regime's worker updates on purpose.
"""

from replibench.engine.regimes.async_ps import AsyncPS
from replibench.engine.regimes.backup_ps import BackupPS
from replibench.engine.regimes.base import GRADIENTS, STATE, Regime, Sync, tensor_sizes
from replibench.engine.regimes.compressed import Compressed
from replibench.engine.regimes.gossip import Complete, Gossip, Graph, RandomMatching, Ring
from replibench.engine.regimes.gradient_tracking import GradientTracking
from replibench.engine.regimes.local_sgd import LocalSGD
from replibench.engine.regimes.sharded_sync import ShardedSync
from replibench.engine.regimes.stragglers import Stragglers

__all__ = ["AsyncPS", "BackupPS", "Complete", "Compressed", "Gossip", "GradientTracking",
           "GRADIENTS", "Graph", "LocalSGD", "RandomMatching", "Regime", "Ring", "ShardedSync",
           "STATE", "Stragglers", "Sync", "tensor_sizes"]
