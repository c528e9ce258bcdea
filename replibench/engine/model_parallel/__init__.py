"""Model parallelism: a replica that spans several devices, composed with data parallelism.

topology.Mesh (mesh.py) lays D data-parallel replicas of M devices each, in one
process or (a pipeline) one replica per worker process; the parallelism is a gin
choice:
  'tensor'    Megatron's column- then row-split layers (tensor_parallel.py), the model
              saying which of its convolutions pair (models/layers.py); SPMD over a
              MirroredStrategy with a replica per device, reductions along the data
              axis (data_axis.py), the pair's all-reduces along the model axis
              (model_axis.py), split variables whole outside a step (sharded.py), and
              regimes.ShardedSync for what a part of a gradient cannot give.
  'pipeline'  GPipe over the model's pieces (pipeline.py, models/pieces.py), stage k of
              replica d on device (d, k) (placement.py).
MeshReplicator (replicator.py), an engine.Replicator, runs the unchanged step_fn on the
run's TrainSpec; engine/measure/device_memory.py accounts for what each device holds,
keeps and computes. Layout (layout.py) is what model code reads.
"""

from replibench.engine.model_parallel.layout import PIPELINE, TENSOR, Layout
from replibench.engine.model_parallel.mesh import Mesh
from replibench.engine.model_parallel.pipeline import Pipelined, pipelined
from replibench.engine.model_parallel.replicator import MeshReplicator
from replibench.engine.model_parallel.tensor_parallel import tensor_parallel_conv

__all__ = ["Layout", "Mesh", "MeshReplicator", "PIPELINE", "Pipelined", "pipelined", "TENSOR",
           "tensor_parallel_conv"]
