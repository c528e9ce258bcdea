"""The replibench engine: the TF-Replicator programming model on tf.distribute.

Public API (documented in docs/concepts/programming-model.md):
  topologies    Local, MultiWorker, Tpu
  TrainSpec     the run's step, built once by config/ and read by the replicator and
                the workload (batch per replica, steps per call, regime, precision,
                jit_compile: spec.compiled(pass), spec.build_optimizer(...); compilation.py)
  make_replicator(topology, regime) -> a BaseReplicator (interface.py): Replicator
                (lockstep), ps.AsyncReplicator, ps.BackupReplicator or (a Mesh)
                model_parallel.MeshReplicator; scope(), distribute(input_fn, spec),
                run(step_fn, ...), reduce(...),
                compile(step_fn, input_fn, spec) -> a BaseStep; worker processes get
                the one-process input's batches of their replicas (input_fn marked
                keeps_replicas keeps them itself; per_worker_input: one pipeline each)
  process_role(topology, regime) -> Role: whether this process trains or serves, and
                whether it is the chief
  collectives   all_reduce, all_gather, broadcast, pair_all_reduce, permute, replica_id,
                num_replicas
  aggregation   average_loss, all_reduce_gradients, sync_apply_gradients(_jointly)
  regimes       Sync (default), LocalSGD, Compressed, Gossip, GradientTracking, AsyncPS,
                BackupPS, ShardedSync (a tensor-parallel Mesh's Sync): regime.build_optimizer,
                metrics = regime.apply_gradients(...)
  layers        cross_replica_batch_norm, per_replica_batch_norm (gin factories)
  model_parallel  Mesh (replicas spanning devices), MeshReplicator, tensor_parallel_conv,
                pipelined
  measure       communication accounts, noise scale, cost (parameters, FLOPs, bytes),
                device memory (what each device of a mesh holds and keeps)

Dependencies inside the engine point down (TF_CONFIG's cluster facts are replibench/cluster.py,
outside it, so that the launcher reads them without importing TensorFlow):
collectives only fusion and measure (which imports none); aggregation and compilation
use collectives; regimes use aggregation; spec uses compilation; spec and interface use
the regimes; the
replicators implement interface (model_parallel's extends the lockstep one); factory
picks a replicator.
"""

from replibench.engine.aggregation import (all_reduce_gradients, apply_reduced, average_loss,
                                           sync_apply_gradients, sync_apply_gradients_jointly)
from replibench.engine.collectives import (all_gather, all_reduce, broadcast, num_replicas,
                                           pair_all_reduce, permute, replica_id)
from replibench.engine.factory import Role, make_replicator, process_role
from replibench.engine.interface import BaseReplicator, BaseStep
from replibench.engine.layers import (CrossReplicaBatchNorm, PerReplicaBatchNorm,
                                      cross_replica_batch_norm, per_replica_batch_norm)
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.engine.replicator import (CompiledStep, Replicator, keeps_replicas,
                                          per_worker_input)
from replibench.engine.spec import InputContext, TrainSpec
from replibench.engine.topology import Local, MultiWorker, Topology, Tpu
from replibench.internals import untuned_per_device_datasets

# tf.distribute's per-device datasets without tf.data's autotuning thread: freeing one
# otherwise waits up to a minute for it (internals.untuned_per_device_datasets).
untuned_per_device_datasets()

__all__ = [
    "all_gather", "all_reduce", "all_reduce_gradients", "apply_reduced", "average_loss",
    "BaseReplicator", "BaseStep", "broadcast", "CompiledStep", "CrossReplicaBatchNorm",
    "cross_replica_batch_norm", "InputContext", "keeps_replicas", "Local", "make_replicator",
    "MultiWorker", "num_replicas", "pair_all_reduce", "PerReplicaBatchNorm",
    "per_replica_batch_norm", "per_worker_input", "permute", "process_role", "replica_id",
    "Replicator", "Role", "StepMetrics", "sync_apply_gradients", "sync_apply_gradients_jointly",
    "Topology", "Tpu", "TrainSpec",
]
