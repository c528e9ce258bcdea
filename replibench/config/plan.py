"""`replibench plan`: what a config will do, computed without training or devices.

Workloads describe themselves (Workload.describe): parameters, FLOPs, and the
sizes of the tensors a step communicates (gradient_tensors: every optimizer
step's gradients; state_tensors: parameters and optimizer slots), to which the
regime applies its byte formula. The precision line says what computes in
which dtype; gradients are all-reduced in float32 under every precision (no
compute-dtype all-reduce), so the bytes per step are float32's.
"""

import tensorflow as tf

from replibench import internals
from replibench.config import model_parallel_plan
from replibench.config.experiment import Experiment
from replibench.engine import layers
from replibench.engine.measure import communication
from replibench.workloads import build_once, precision as precision_lib
from replibench.workloads.base import SYNTHETIC_TIME_TO_TARGET


def make_plan(experiment: Experiment) -> dict:
  """The plan as a JSON-able dict. Works for topologies this machine lacks."""
  # check_models, describe and the traced step read the models' structure alone: one
  # build serves all three (workloads/build_once.py).
  # The traced step is read and dropped: its custom gradients' registrations would
  # keep its graph alive for the process's life (0.3 GiB a full-size ResNet-50 plan).
  with build_once.shared(), internals.custom_gradients_forgotten():
    return _plan(experiment)


def _plan(experiment: Experiment) -> dict:
  with layers.recording() as norms:
    experiment.check_models()
  spec, workload, topology = experiment.train_spec(), experiment.workload, experiment.topology
  facts = workload.describe(spec)
  flops = facts.get("train_flops_per_example")
  # A replica spanning devices: one device's share, traced under the mesh's layout.
  with model_parallel_plan.planning(experiment) as layout:
    traced = trace_step(experiment)
  return {
      "workload": workload.name,
      "topology": topology.describe(),
      "scaling_kind": topology.kind,
      "num_replicas": spec.num_replicas,
      "devices": topology.describe_devices(),
      "global_batch_size": spec.global_batch_size,
      "per_replica_batch_size": spec.per_replica_batch_size,
      "parameters": facts.get("parameters"),
      "forward_flops_per_example": facts.get("forward_flops_per_example"),
      "train_flops_per_example": flops,
      "train_flops_per_step": flops * spec.global_batch_size if flops else None,
      "precision": precision_lib.describe(spec.precision),
      # Experiment.jit_compile resolved (config/compile_choice.py), and why.
      "jit_compile": experiment.compile_choice.describe(),
      "batch_norm": batch_norm(norms),
      "threads": threads(experiment),
      "allreduce_bytes_per_step": facts.get("allreduce_bytes_per_step"),
      # The regime's name/settings and what it sends per replica and step (its own
      # formula, applied to the tensors it exchanges).
      **spec.regime.describe(facts.get(f"{spec.regime.exchanges}_tensors"), spec.num_replicas),
      "examples_per_epoch": workload.examples_per_epoch(),
      "steps_per_epoch": round(spec.steps_per_epoch, 2),
      "train_epochs": experiment.train_epochs,
      "total_steps": spec.total_steps,
      "steps_per_call": spec.steps_per_call,
      "learning_rate": facts.get("learning_rate"),
      "communication": _account(traced, spec),
      **({"model_parallel": model_parallel_plan.facts(experiment, layout, *traced)}
         if layout else {}),
      "eval_every_steps": experiment.eval_every_steps,
      "target_metric": workload.target_metric,
      "target": experiment.target,
      # On synthetic data the target is never checked (data/synthetic.py).
      **({"time_to_target": SYNTHETIC_TIME_TO_TARGET} if workload.synthetic_data else {}),
      "seed": spec.seed,
      **({"profile": _profile(experiment.profile_steps, spec)} if experiment.profile_steps
         else {}),
  }


def _profile(steps: tuple[int, int], spec) -> str:
  """What `run` will profile: the whole calls that train steps A..B (harness/profiling.py)."""
  calls = spec.steps_per_call
  first = (steps[0] - 1) // calls * calls + 1
  last = min(-(-steps[1] // calls) * calls, spec.total_steps)
  return (f"steps {steps[0]}-{steps[1]}: the calls of steps {first}-{last} traced into "
          f"the run's TensorBoard directory (plugins/profile)")


def threads(experiment: Experiment) -> str:
  """TensorFlow's pools as the run will size them (Experiment.*_op_threads)."""
  def size(n: int) -> str:
    return str(n) if n else "TensorFlow's default (one a core)"
  warning = experiment.thread_pool_warning()
  return (f"intra-op {size(experiment.intra_op_threads)}, "
          f"inter-op {size(experiment.inter_op_threads)}"
          + (f" (warning: {warning})" if warning else ""))


def batch_norm(kinds: set[str]) -> str | None:
  """The batch norms the models use and their one momentum and epsilon (None: none of
  the engine's kinds, e.g. layer norm or a model's own default)."""
  if not kinds:
    return None
  setting = layers.batch_norm_setting()
  return (f"{' and '.join(sorted(kinds))}: momentum {setting['momentum']:g}, epsilon "
          f"{setting['epsilon']:g} (engine.batch_norm_setting, one setting for both kinds)")


def trace_step(experiment: Experiment) -> tuple[list, tf.Graph] | None:
  """The collectives one replica issues per step, as recorded while tracing its step
  (engine/measure/communication.py), and the traced graph; None where the workload
  cannot say its input's structure. The counts do not depend on the replica count;
  they include the backward pass's collectives (a forward all-reduce that a gradient
  flows through, such as cross-replica batch norm's, sends again: two per layer)."""
  workload, spec = experiment.workload, experiment.train_spec()
  workload.build_learner(spec)
  element = workload.element_spec(spec.per_replica_batch_size)
  if element is None:
    return None
  # The replica step the replicator runs: step_fn, its regime's metrics among its outputs.
  step = tf.function(workload.step_fn)
  with communication.Ledger() as ledger:
    concrete = step.get_concrete_function(element)
    communication.record("outputs", [tf.zeros([len(concrete.structured_outputs)])],
                         cross_replica=True)
  return ledger.entries(), concrete.graph


def communication_account(experiment: Experiment) -> dict | None:
  """The plan's account of one replica's collectives per step (trace_step's, by kind)."""
  return _account(trace_step(experiment), experiment.train_spec())


def _account(traced: tuple | None, spec) -> dict | None:
  if traced is None:
    return None
  return communication.summarize(traced[0], spec.steps_per_call, spec.num_replicas)


def _human(key: str, value) -> str:
  """Large counts with SI units: FLOPs as GFLOP/TFLOP, bytes as MB, others with commas."""
  if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 10**6:
    return str(value)
  unit = "FLOP" if "flops" in key else "B" if "bytes" in key else None
  if unit is None:
    return f"{value:,}"
  for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
    if value >= scale:
      return f"{value / scale:.2f} {prefix}{unit}"
  return str(value)


def format_plan(plan: dict) -> str:
  width = max(len(k) for k in plan)
  return "\n".join(f"{k.ljust(width)}  {_format(k, v)}" for k, v in plan.items())


def _format(key: str, value) -> str:
  if key == "precision" and isinstance(value, dict):
    return (f"{value['policy']}: compute {value['compute_dtype']}, variables and optimizer "
            f"state {value['variable_dtype']}, gradients all-reduced in "
            f"{value['gradient_allreduce_dtype']} (the bytes per step below), loss scaling "
            f"{value['loss_scaling']}")
  if key == "model_parallel" and isinstance(value, dict):
    return model_parallel_plan.format_facts(value)
  if key == "communication" and isinstance(value, dict):
    kinds = ", ".join(f"{k} {v['count']:g} x {_human('bytes', v['bytes'])}"
                      for k, v in value["by_kind"].items())
    wire = value.get("wire_bytes_per_replica_per_step")
    wire = f"; {wire:,} B on the wire a replica (ring algorithms)" if wire else ""
    return (f"{value['collectives_per_step']:g} collectives/step issued, backward pass "
            f"included ({kinds}){wire}")
  return _human(key, value)
