"""A run's RunResult, made from the facts of a session by pure functions.

The harness gathers a session's facts once, at its end (`_Run.facts()` in
loop.py): what the experiment fixed, what the run measured, where it ran.
make_result and failed_result turn those facts into result.json's record and
read nothing else (no clock, file, device or environment).
"""

import dataclasses

from replibench import results
from replibench.engine.measure import noise_scale


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What one session of a run knew at its end. Times in seconds."""

  # What the run was.
  workload: str
  target_metric: str
  higher_is_better: bool
  target: float
  topology: str
  scaling_kind: str
  num_workers: int
  num_replicas: int
  global_batch_size: int
  per_replica_batch_size: int
  steps_per_epoch: float
  seed: int
  regime: dict                  # The regime's settings (Regime.hparams()).
  hparams: dict                 # What TensorBoard's HParams view and the suite group by.
  budget: results.Budget
  operative_config: str
  git_sha: str
  tf_version: str
  # What it measured: the steps, the timed span and init, the run state.
  final_step: int
  elapsed_s: float              # The timed span, over every session so far.
  init_s: float                 # This session's init.
  curve: list                   # [step, timed seconds, target metric] per evaluation.
  last_eval: dict | None
  at_target: dict | None        # The evaluation that met the target.
  reached_at: int | None        # Its step.
  regime_means: dict            # 'regime/...' -> mean over the run's calls.
  eval_s: float | None          # Mean seconds per evaluation.
  sessions: list                # RunState.sessions: dicts of Session's fields.
  examples_per_s: float | None
  first_call_s: float | None
  communication: dict | None    # The step's communication account (BaseStep.communication).
  network: results.Network | None
  machine: results.Machine
  throughput: results.Throughput | None   # On synthetic data only.
  # [steps, wall s, process CPU s] per window of log_every_steps steps (progress.Meter).
  windows: list = dataclasses.field(default_factory=list)
  profile: results.Profile | None = None   # `run --profile_steps`: where the trace went.
  jit_compile: bool = False     # TrainSpec.jit_compile: the step compiled with XLA.
  xla_compile_s: float | None = None   # Left out of the span (timed_span.XlaCompilation).
  scheduler: dict | None = None   # The SLURM job or Kubernetes pod (cluster.scheduler_record).


def make_result(facts: RunFacts, status: str) -> results.RunResult:
  """The result of a session that ended with status."""
  reached, at = status == results.REACHED, facts.reached_at
  return results.RunResult(
      status=status, time_to_target_s=facts.elapsed_s if reached else None,
      init_s=round(facts.init_s, 3), total_s=round(facts.elapsed_s, 3),
      steps_to_target=at if reached else None,
      epochs_to_target=at / facts.steps_per_epoch if reached else None,
      examples_to_target=at * facts.global_batch_size if reached else None,
      final_metric=facts.curve[-1][2] if facts.curve else None,
      final_metrics=facts.last_eval, metrics_at_target=facts.at_target if reached else None,
      examples_per_s=facts.examples_per_s, first_call_s=_rounded(facts.first_call_s),
      xla_compile_s=_rounded(facts.xla_compile_s),
      windows=list(facts.windows),
      eval_s=_rounded(facts.eval_s), regime=facts.regime, regime_metrics=facts.regime_means,
      communication=communication_account(facts.communication, facts.examples_per_s,
                                          facts.global_batch_size),
      network=facts.network,
      noise_scale=noise_record(facts.regime_means, facts.per_replica_batch_size,
                               facts.global_batch_size, facts.communication),
      resumed=max(0, len(facts.sessions) - 1), operative_config=facts.operative_config,
      machine=facts.machine, throughput=facts.throughput, **_described(facts))


def failed_result(facts: RunFacts, error: Exception) -> results.RunResult:
  """What result.json says while a run that raised waits to be resumed."""
  return results.RunResult(status=results.FAILED, error=f"{type(error).__name__}: {error}",
                           **_described(facts))


def _described(facts: RunFacts) -> dict:
  """The RunResult fields every result has: the run, its budget, curve and sessions."""
  return {"workload": facts.workload, "target_metric": facts.target_metric,
          "target": facts.target, "higher_is_better": facts.higher_is_better,
          "final_step": facts.final_step, "budget": facts.budget, "curve": facts.curve,
          "sessions": [results.Session(**s) for s in facts.sessions],
          "topology": facts.topology, "scaling_kind": facts.scaling_kind,
          "num_workers": facts.num_workers, "num_replicas": facts.num_replicas,
          "global_batch_size": facts.global_batch_size, "seed": facts.seed,
          "hparams": facts.hparams, "git_sha": facts.git_sha, "tf_version": facts.tf_version,
          "profile": facts.profile, "jit_compile": facts.jit_compile,
          "scheduler": facts.scheduler}


def communication_account(account: dict | None, examples_per_s: float | None,
                          global_batch_size: int) -> results.Communication | None:
  """The step's communication account, with the measured step time beside the time
  its collectives take alone (their share of the step, a lower bound)."""
  if account is None:
    return None
  account = dict(account)
  if examples_per_s:
    step_s = global_batch_size / examples_per_s
    account["step_s"] = round(step_s, 6)
    if account.get("collective_s_per_step") is not None:
      account["collective_fraction"] = round(min(1.0, account["collective_s_per_step"] / step_s), 4)
  return results.Communication.of(account)


def noise_record(means: dict, per_replica_batch: int, global_batch: int,
                 account: dict | None = None) -> results.NoiseScale | None:
  """The simple gradient noise scale from the run's mean |G_b|^2 and |G_B|^2 (None
  where the regime recorded none: one replica, loss scaling, or not Sync)."""
  if (noise_scale.SMALL not in means or noise_scale.BIG not in means
      or per_replica_batch >= global_batch):
    return None
  found = noise_scale.estimate(means[noise_scale.SMALL], means[noise_scale.BIG],
                               per_replica_batch, global_batch)
  caveat = None
  if "batch_norm" in ((account or {}).get("by_kind") or {}):
    # The backward pass of the moments' all-reduce mixes every replica's examples
    # into each replica's gradient (parts that cancel in the sum), so |G_b|^2 is
    # inflated against |G_B|^2: measured here, |G|^2 came out negative.
    caveat = ("cross-replica batch norm couples the replicas' gradients, which "
              "are then not independent batch-b estimates: the estimate is biased "
              "(tr(Sigma) up, |G|^2 down, possibly negative). Measure the noise "
              "scale with per-replica batch norm (engine.per_replica_batch_norm).")
  return results.NoiseScale(
      b_simple=found.b_simple, trace_sigma=found.trace_sigma, grad_sq=found.grad_sq,
      per_replica_batch=per_replica_batch, global_batch=global_batch,
      method="McCandlish et al. 2018 A.1: per-replica vs all-reduced gradient norms, each "
             "averaged over the run before the ratio", caveat=caveat)


def hparams(spec, topology, workload, network: str | None) -> dict:
  """What TensorBoard's HParams view and the suite group runs by; network: a launched
  cluster's link rate (None outside one)."""
  regime = spec.regime
  network = {"network": network} if network is not None else {}
  # Named only when not float32, so float32 runs group with those recorded before the knob.
  precision = {"precision": spec.precision} if spec.precision != "float32" else {}
  # Likewise named only when compiled: graph runs group with those from before the choice.
  compiled = {"jit_compile": True} if spec.jit_compile else {}
  return {"topology": topology.describe(), "scaling_kind": topology.kind,
          "num_replicas": spec.num_replicas,
          "global_batch_size": spec.global_batch_size, "seed": spec.seed,
          "regime_setting": regime.setting(), **network, **precision, **compiled,
          **regime.hparams(), **workload.hparams()}


def _rounded(value):
  return None if value is None else round(value, 3)
