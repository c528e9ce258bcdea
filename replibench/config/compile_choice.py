"""Experiment.jit_compile: True, False or 'auto', resolved once per run, with its reason.

    Experiment.jit_compile = 'auto'   # the default: by device kind and workload
    Experiment.jit_compile = True     # XLA around the exchange (engine/compilation.py)
    Experiment.jit_compile = False    # TensorFlow's graph executor, op by op

'auto' is True on GPUs and TPUs. On CPUs it is, per workload, whichever of graph and
XLA was faster on the bench's CPU machine, measured side by side by `make
bench-compile` (benchmarks/compile/compile.py) and written down in results/compile/README.md;
CPU_DEFAULTS holds those verdicts. `plan` prints the resolved choice and its reason,
result.json and the history record it, and an A/B never pairs a compiled trial with
an uncompiled one.
"""

import dataclasses

import gin
import tensorflow as tf

from replibench.engine import Local, Tpu, devices
from replibench.engine.model_parallel import PIPELINE, Mesh
from replibench.engine.regimes import AsyncPS
from replibench.errors import UserError
from replibench.inputs import shown

AUTO = "auto"
CHOICES = (True, False, AUTO)

# 'auto' on a CPU, per workload class: True where XLA was the faster in every config
# measured, False otherwise (results/compile/README.md, `make bench-compile`: XLA / graph
# examples/s on a 2-core Zen 4, 2026-11-27; then on a 2-core Zen 5, 2026-11-28). Absent:
# False.
CPU_DEFAULTS = {
    # bench ResNet 0.84x, 0.69x; Zen 5 0.76x, 0.92x. ResNet-50 0.59x; Zen 5 0.54x;
    # Zen 4 2026-12-04: 0.58-0.70x over float32/bfloat16 x 1-2 replicas / 2 workers.
    "ImageClassification": False,
    # bench SN-GAN 0.71x, 0.77x; Zen 5 0.77x, 0.88x. SN-GAN 128 (no bench config) 0.91x;
    # Zen 5 1.05x (3 pairs, 0.92-1.10); Zen 4 2026-12-04: 0.87x float32, 0.53x bfloat16.
    "ConditionalGAN": False,
    # Learner examples/s, states 1.04-1.14x (1 and 2 replicas; time to target decided by
    # the actors' timing, not the step); Zen 5 0.83-1.01x. Pixels 0.91x; Zen 5 0.82x;
    # Zen 4 2026-12-04: 0.81-0.99x float32, 0.50-0.55x bfloat16.
    "D4PG": False,
}


@dataclasses.dataclass(frozen=True)
class CompileChoice:
  """What Experiment.jit_compile asked for, what the run does, and why."""

  requested: bool | str    # True, False or 'auto', as configured.
  enabled: bool            # What TrainSpec.jit_compile is.
  device_kind: str         # 'cpu' | 'gpu' | 'tpu': what 'auto' looked at.
  reason: str              # One sentence, for `plan`.

  def describe(self) -> str:
    return (f"{'XLA' if self.enabled else 'graph (no XLA)'}: Experiment.jit_compile = "
            f"{self.requested!r}, {self.reason}")


def device_kind(topology) -> str:
  """'tpu', 'gpu' or 'cpu': the kind of device the topology's replicas run on (without
  initialising a device: physical devices are listed only)."""
  if isinstance(topology, Tpu):
    return "tpu"
  if isinstance(topology, Local):
    return devices.resolve_kind(topology.num_replicas, topology.device)
  if isinstance(topology, Mesh) and not topology.workers:
    return devices.resolve_kind(topology.num_devices, topology.device)
  if isinstance(topology, Mesh):
    return "cpu"   # A Mesh's worker processes run on CPUs (topology.Mesh refuses GPUs).
  return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def _cannot_compile(topology, regime) -> str | None:
  """Why this path cannot compile its step with XLA, or None."""
  if isinstance(topology, Mesh) and not (topology.parallelism == PIPELINE
                                         and not topology.workers):
    return _mesh_cannot_compile(topology)
  if topology.num_replicas > 1 and _binds_cross_replica_batch_norm():
    return (f"the config binds @engine.cross_replica_batch_norm, whose all-reduce of the "
            f"batch moments lies inside the forward and backward pass that XLA compiles as "
            f"one cluster, and a cluster cannot hold a collective among "
            f"{topology.num_replicas} replicas (tf.distribute's merge_call and CPU "
            f"collectives live outside XLA); @engine.per_replica_batch_norm compiles")
  if isinstance(regime, AsyncPS):
    return (f"Experiment.regime = {regime.setting()} keeps the variables on the parameter "
            f"servers, and an XLA cluster cannot read a variable placed on another device "
            f"(XLA's known issue 'tf.Variable on a different device': TensorFlow refuses "
            f"such a step with INVALID_ARGUMENT, tried under ParameterServerStrategy); the "
            f"servers' updates must stay TensorFlow's locking kernels besides "
            f"(training_kernels.make_updates_atomic), which XLA would not lock")
  return None


def _mesh_cannot_compile(topology) -> str:
  """Why this model-parallel step does not compile: what TensorFlow said when it was
  tried (deaceb2:benchmarks/mesh_xla_check.py, results/compile/README.md). A pipeline in one
  process compiles each stage on its device (engine/model_parallel/pipeline.py)."""
  where = (f"topology.Mesh (model = {topology.model}, parallelism = "
           f"{topology.parallelism!r}) splits each replica's forward and backward pass over "
           f"{topology.model} devices, and an XLA cluster on a CPU or GPU is one device's "
           f"program")
  if topology.parallelism == PIPELINE:
    return (f"{where}; a pipeline in one process compiles each stage on its own device, "
            f"but with worker processes (topology.Mesh.workers = {topology.workers}) that "
            f"has not been tried; use workers = 0, or Experiment.jit_compile = False")
  return (f"{where}: a tensor-parallel pair's partial sums are all-reduced among those "
          f"devices inside the pass (CollectiveReduceV2, engine/model_parallel/"
          f"model_axis.py), and XLA does not compile a collective on CPU devices "
          f"(TensorFlow: 'Collectives are not yet implemented for CPU devices when "
          f"compiling with XLA'); tried, the step stops before that with UNIMPLEMENTED "
          f"'Duplicate variable passed to XLA cluster' (not tried on GPUs)")


def _binds_cross_replica_batch_norm() -> bool:
  """Whether the parsed gin config names cross-replica batch norm anywhere."""
  config = gin.config_str()
  return "cross_replica_batch_norm" in config or "CrossReplicaBatchNorm" in config


def resolve(requested, workload, topology, regime) -> CompileChoice:
  """The run's choice (UserError for a value other than True, False, 'auto', for
  False on a TPU and for True on a path that cannot compile)."""
  if not (isinstance(requested, bool) or requested == AUTO):
    raise UserError(f"Experiment.jit_compile = {shown(requested)}: choose True (XLA), False "
                    f"(TensorFlow's graph executor) or 'auto' (by device kind and workload: "
                    f"replibench/config/compile_choice.py).")
  kind = device_kind(topology)
  if kind == "tpu":
    if requested is False:
      raise UserError(
          "Experiment.jit_compile = False with topology.Tpu: a TPU runs nothing but XLA "
          "programs (TPUStrategy compiles every step), so the step cannot run uncompiled; "
          "use True or 'auto', or a Local or MultiWorker topology for a graph-mode run.")
    return CompileChoice(requested, True, kind, "a TPU runs XLA programs only")
  refusal = _cannot_compile(topology, regime)
  if refusal and requested is True:
    raise UserError(f"Experiment.jit_compile = True: {refusal}. Set "
                    f"Experiment.jit_compile = False, or 'auto' (which resolves to False "
                    f"here and says why in `replibench plan`).")
  if refusal:
    return CompileChoice(requested, False, kind, f"not compiled: {refusal}")
  if requested != AUTO:
    return CompileChoice(requested, requested, kind, "as configured")
  if kind == "gpu":
    return CompileChoice(requested, True, kind, "on GPUs XLA is on by default")
  name = type(workload).__name__
  enabled = CPU_DEFAULTS.get(name, False)
  return CompileChoice(requested, enabled, kind,
                       f"on CPUs {name} {'compiles' if enabled else 'runs as a graph'} by "
                       f"default (CPU_DEFAULTS in replibench/config/compile_choice.py, from "
                       f"results/compile/README.md)")
