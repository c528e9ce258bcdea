"""Training regimes (gin module `regimes`): how replicas turn gradients into updates."""

from replibench.engine.regimes.async_ps import AsyncPS
from replibench.engine.regimes.base import Regime, Sync, activate, active
from replibench.engine.regimes.compressed import Compressed
from replibench.engine.regimes.gossip import Gossip
from replibench.engine.regimes.local_sgd import LocalSGD

__all__ = ["activate", "active", "AsyncPS", "Compressed", "Gossip", "LocalSGD", "Regime",
           "Sync"]
