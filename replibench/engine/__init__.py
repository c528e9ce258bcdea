"""The replibench engine: the TF-Replicator programming model on tf.distribute.

Public API (documented in README.md):
  topologies   Local, MultiWorker, Tpu
  Replicator   scope(), distribute(input_fn, B), run(step_fn, ...), reduce(...),
               compile(step_fn, input_fn, B, steps_per_call)
  collectives  all_reduce, all_gather, broadcast, replica_id, num_replicas
  aggregation  average_loss, all_reduce_gradients, apply_gradients, build_optimizer
  regimes      Sync (default), ... : how replicas turn gradients into updates
  layers       CrossReplicaBatchNorm (gin: @engine.cross_replica_batch_norm)
"""

from replibench.engine.aggregation import (all_reduce_gradients, apply_gradients,
                                           apply_gradients_jointly, average_loss,
                                           build_optimizer, sync_apply_gradients)
from replibench.engine.collectives import all_gather, all_reduce, broadcast, num_replicas, replica_id
from replibench.engine.layers import (CrossReplicaBatchNorm, PerReplicaBatchNorm,
                                      cross_replica_batch_norm, per_replica_batch_norm)
from replibench.engine.replicator import CompiledStep, InputContext, Replicator
from replibench.engine.topology import Local, MultiWorker, Topology, Tpu

__all__ = [
    "all_gather", "all_reduce", "all_reduce_gradients", "apply_gradients",
    "apply_gradients_jointly", "average_loss",
    "broadcast", "build_optimizer", "sync_apply_gradients", "CompiledStep", "CrossReplicaBatchNorm", "cross_replica_batch_norm", "per_replica_batch_norm", "PerReplicaBatchNorm", "InputContext", "Local",
    "MultiWorker", "num_replicas", "replica_id", "Replicator", "Topology", "Tpu",
]
