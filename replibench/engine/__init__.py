"""The replibench engine: the TF-Replicator programming model on tf.distribute.

Public API (documented in README.md):
  topologies    Local, MultiWorker, Tpu
  make_replicator(topology, regime) -> Replicator (lockstep) or ps.AsyncReplicator;
                both: scope(), distribute(input_fn, B), run(step_fn, ...), reduce(...),
                compile(step_fn, input_fn, B, steps_per_call)
  collectives   all_reduce, all_gather, broadcast, pair_all_reduce, permute, replica_id,
                num_replicas
  aggregation   average_loss, all_reduce_gradients, sync_apply_gradients(_jointly)
  regimes       Sync (default), LocalSGD, Compressed, Gossip, GradientTracking (LocalSGD's
                average may be a Gossip: SwarmSGD); ps.AsyncPS: what
                regime.build_optimizer / regime.apply_gradients do
  layers        cross_replica_batch_norm, per_replica_batch_norm (gin factories)
  model_parallel  Mesh (replicas spanning devices), MeshReplicator, tensor_parallel_conv,
                pipelined
  cost          parameter_count, graph_flops, forward_flops, gradient_bytes

Dependencies inside the engine point down: collectives and cluster import no
other engine module; aggregation uses collectives; regimes use aggregation;
the replicators use regimes and topology; factory picks a replicator.
"""

from replibench.engine.aggregation import (all_reduce_gradients, apply_reduced, average_loss,
                                           sync_apply_gradients, sync_apply_gradients_jointly)
from replibench.engine.collectives import (all_gather, all_reduce, broadcast, num_replicas,
                                           pair_all_reduce, permute, replica_id)
from replibench.engine.factory import make_replicator
from replibench.engine.layers import (CrossReplicaBatchNorm, PerReplicaBatchNorm,
                                      cross_replica_batch_norm, per_replica_batch_norm)
from replibench.engine.replicator import CompiledStep, InputContext, Replicator
from replibench.engine.topology import Local, MultiWorker, Topology, Tpu

__all__ = [
    "all_gather", "all_reduce", "all_reduce_gradients", "apply_reduced", "average_loss",
    "broadcast", "CompiledStep", "CrossReplicaBatchNorm", "cross_replica_batch_norm",
    "InputContext", "Local", "make_replicator", "MultiWorker", "num_replicas", "pair_all_reduce",
    "PerReplicaBatchNorm", "per_replica_batch_norm", "permute", "replica_id", "Replicator",
    "sync_apply_gradients", "sync_apply_gradients_jointly", "Topology", "Tpu",
]
