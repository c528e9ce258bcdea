"""Asynchronous parameter-server training: its regime, replicator and task serving.

  regimes.AsyncPS   the regime a config names (gin), with its locked updates
  AsyncReplicator   the Replicator interface over ParameterServerStrategy
  is_server_task / serve   for the CLI: workers and ps tasks serve the chief
"""

from replibench.engine.ps.regime import AsyncPS
from replibench.engine.ps.replicator import AsyncReplicator, AsyncStep, WorkerGroup
from replibench.engine.ps.serve import is_server_task, serve

__all__ = ["AsyncPS", "AsyncReplicator", "AsyncStep", "WorkerGroup", "is_server_task", "serve"]
