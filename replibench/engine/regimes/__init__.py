"""Synchronous training regimes (gin module `regimes`): how replicas turn gradients into
updates. Asynchronous parameter servers (regimes.AsyncPS) live in engine/ps."""

from replibench.engine.regimes.base import GRADIENTS, STATE, Regime, Sync, tensor_sizes
from replibench.engine.regimes.compressed import Compressed
from replibench.engine.regimes.gossip import Complete, Gossip, Graph, RandomMatching, Ring
from replibench.engine.regimes.gradient_tracking import GradientTracking
from replibench.engine.regimes.local_sgd import LocalSGD

__all__ = ["Complete", "Compressed", "Gossip", "GradientTracking", "GRADIENTS", "Graph", "LocalSGD",
           "RandomMatching", "Regime", "Ring", "STATE", "Sync", "tensor_sizes"]
