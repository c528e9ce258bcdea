"""Can a model-parallel step (topology.Mesh) compile with XLA? The check behind its refusal.

    .venv/bin/python benchmarks/mesh_xla_check.py            # both parallelisms, ~2 min
    .venv/bin/python benchmarks/mesh_xla_check.py tensor     # or pipeline

replibench/config/compile_choice.py refuses `Experiment.jit_compile = True` with a
tensor-parallel topology.Mesh. This script lifts the refusal and runs two steps of the
tiny ResNet of configs/resnet/fashion_mnist.gin (tests/helpers.TINY) on a 1 x 2 mesh of
logical CPU devices, compiled as the engine compiles it (engine/compilation.py: the
forward and backward pass one XLA cluster a replica; a pipeline's stages one cluster
each, on their devices), and prints what TensorFlow says. Measured 2026-11-27,
TensorFlow 2.21 CPU (results/compile/README.md):
  tensor    UNIMPLEMENTED: Duplicate variable passed to XLA cluster; and the pass holds
            the Megatron pair's all-reduce among the replica's devices, which XLA does
            not compile on CPU ("Collectives are not yet implemented for CPU devices
            when compiling with XLA", tests/test_mesh_xla_refusal.py)
  pipeline  compiled: losses [2.427, 2.471]. (The pass as one cluster, before stages
            were compiled each on its device: INVALID_ARGUMENT: Trying to access
            resource kernel/... located in device CPU:1 from device CPU:0, XLA's known
            issue "tf.Variable on a different device".)
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("REPLIBENCH_CPU_DEVICES", "4")

from replibench.engine import devices  # noqa: E402

devices.ensure_logical_cpus(int(os.environ["REPLIBENCH_CPU_DEVICES"]))

from replibench import config, engine  # noqa: E402
from replibench.config import compile_choice  # noqa: E402
from tests import helpers  # noqa: E402

CONFIG = "configs/resnet/fashion_mnist.gin"
PARALLELISMS = {"tensor": "tensor_parallel", "pipeline": "pipeline"}


def check(parallelism: str) -> str:
  """Two compiled steps on a 1 x 2 mesh: 'compiled: losses ...' or TensorFlow's error."""
  experiment = config.load_experiment([CONFIG], [
      *helpers.TINY[CONFIG], f"include 'configs/resnet/{PARALLELISMS[parallelism]}.gin'",
      "topology.Mesh.device = 'cpu'", "topology.Mesh.data = 1", "Experiment.jit_compile = True"])
  spec = dataclasses.replace(experiment.train_spec(), steps_per_call=1)
  workload = experiment.workload
  replicator = engine.make_replicator(experiment.topology, spec.regime)
  with replicator.scope():
    workload.build(spec)
  train = replicator.compile(workload.step_fn, workload.input_fn, spec)
  try:
    return f"compiled: losses {[float(train()['loss']) for _ in range(2)]}"
  except Exception as e:  # pylint: disable=broad-except
    lines = [line.strip() for line in str(e).splitlines() if "(0)" in line or "Cf." in line]
    return f"{type(e).__name__}: {' '.join(lines) or str(e)[:500]}"
  finally:
    workload.close()


def main(argv) -> None:
  compile_choice._cannot_compile = lambda topology, regime: None  # pylint: disable=protected-access
  for parallelism in argv[1:] or sorted(PARALLELISMS):
    print(f"{parallelism}: {check(parallelism)}", flush=True)


if __name__ == "__main__":
  main(sys.argv)
