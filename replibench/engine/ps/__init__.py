"""Parameter-server training: the replicators over ParameterServerStrategy, and task serving.

  AsyncReplicator   the replicator for regimes.AsyncPS: workers update the ps on their own
  BackupReplicator  the same cluster, running regimes.BackupPS's synchronous steps
  is_server_task / serve   for the CLI: workers and ps tasks serve the chief

The regimes themselves (AsyncPS, BackupPS, Stragglers) live with the others in
engine/regimes; what a worker update sends is measured in engine/measure/transfers.py.
"""

from replibench.engine.ps.backup import BackupReplicator, BackupStep
from replibench.engine.ps.replicator import AsyncReplicator, AsyncStep, WorkerGroup
from replibench.engine.ps.serve import is_server_task, serve

__all__ = ["AsyncReplicator", "AsyncStep", "BackupReplicator", "BackupStep", "WorkerGroup",
           "is_server_task", "serve"]
