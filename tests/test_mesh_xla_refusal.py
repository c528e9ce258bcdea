"""Why a model-parallel step (topology.Mesh) is not compiled with XLA where it is not:
the refusal's paragraph, and the TensorFlow limitation it names, checked here where it
is cheap (the retired deaceb2:benchmarks/mesh_xla_check.py tried the whole step:
results/compile/README.md).
"""

import pytest
import tensorflow as tf

from replibench import engine
from replibench.config import compile_choice
from replibench.engine import model_parallel, regimes
from replibench.errors import UserError


class _Workload:
  pass


@pytest.mark.parametrize("mesh,said", [
    (dict(data=1), "XLA does not compile a collective on CPU devices"),
    (dict(data=2, parallelism="pipeline", workers=2), "with worker processes"),
])
def test_what_cannot_compile_is_refused_with_why(mesh, said):
  """Tensor parallelism (what TensorFlow said when tried), and a pipeline over worker
  processes (not tried). A pipeline in one process compiles (test_pipeline_compile)."""
  mesh = model_parallel.Mesh(model=2, **mesh)
  with pytest.raises(UserError, match=said):
    compile_choice.resolve(True, _Workload(), mesh, regimes.Sync())
  auto = compile_choice.resolve("auto", _Workload(), mesh, regimes.Sync())
  assert auto.enabled is False and said in auto.reason
  pipeline = model_parallel.Mesh(data=1, model=2, parallelism="pipeline")
  assert compile_choice.resolve(True, _Workload(), pipeline, regimes.Sync()).enabled


def test_xla_compiles_no_collective_on_cpu_devices():
  """The limitation the tensor-parallel refusal names: a CollectiveReduceV2 between two
  replicas' devices (the Megatron pair's all-reduce, model_axis.py) inside an XLA
  cluster. When a TensorFlow release compiles it, this fails: try the mesh again."""
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))

  @tf.function(jit_compile=True)
  def summed(x):
    return tf.raw_ops.CollectiveReduceV2(
        input=x, group_size=2, group_key=(1 << 29) - 7, instance_key=7, ordering_token=[],
        merge_op="Add", final_op="Id", communication_hint="auto", timeout_seconds=0)

  step = tf.function(lambda: replicator.run(lambda: summed(tf.identity(tf.ones([2])))))
  with pytest.raises(tf.errors.UnimplementedError,
                     match="Collectives are not yet implemented for CPU devices"):
    step()
