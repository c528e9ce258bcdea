"""Parameter-server training: its regimes, replicators and task serving.

  regimes.AsyncPS   the asynchronous regime a config names (gin), with its locked updates
  regimes.BackupPS  synchronous steps that take the first N - b of N workers' gradients
                    (backup workers; b = 0 is synchronous training), a subclass of AsyncPS
  regimes.Stragglers   injected worker slowdowns, bound on either regime
  AsyncReplicator   the Replicator interface over ParameterServerStrategy
  BackupReplicator  the same cluster, compiling BackupPS's synchronous steps
  is_server_task / serve   for the CLI: workers and ps tasks serve the chief
  transfers        what a worker update pulls from and pushes to the ps: the account
                   of its bytes on the wire (AsyncStep.communication)
"""

from replibench.engine.ps.backup import BackupPS, BackupReplicator, BackupStep
from replibench.engine.ps.regime import AsyncPS
from replibench.engine.ps.replicator import AsyncReplicator, AsyncStep, WorkerGroup
from replibench.engine.ps.serve import is_server_task, serve
from replibench.engine.stragglers import Stragglers

__all__ = ["AsyncPS", "AsyncReplicator", "AsyncStep", "BackupPS", "BackupReplicator",
           "BackupStep", "Stragglers", "WorkerGroup", "is_server_task", "serve"]
