"""A run's RunResult, made from the harness's state at the end of a session."""

from replibench import results
from replibench.engine import noise_scale
from replibench.harness import netns, provenance, wire


def make_result(run, status: str) -> results.RunResult:
  """The result of `run` (a harness _Run) that ended with status."""
  exp, state = run.experiment, run.state
  step, reached_at = int(run.step.numpy()), state.reached_at
  reached = status == results.REACHED
  throughput = state.throughput or {}
  return results.RunResult(
      status=status, workload=run.workload.name,
      target_metric=run.workload.target_metric, target=exp.target,
      higher_is_better=run.workload.higher_is_better,
      time_to_target_s=float(run.elapsed.numpy()) if reached else None,
      init_s=round(run.init_s, 3), total_s=round(float(run.elapsed.numpy()), 3),
      steps_to_target=reached_at if reached else None,
      epochs_to_target=reached_at / run.spec.steps_per_epoch if reached else None,
      examples_to_target=reached_at * exp.global_batch_size if reached else None,
      final_metric=state.curve[-1][2] if state.curve else None, final_step=step,
      final_metrics=state.last_eval, metrics_at_target=state.at_target if reached else None,
      examples_per_s=throughput.get("examples_per_s"),
      first_call_s=_rounded(throughput.get("first_call_s")),
      eval_s=_rounded(state.eval_time[0] / state.eval_time[1]) if state.eval_time[1] else None,
      regime=exp.regime.hparams(), regime_metrics=state.regime_means(),
      communication=communication_account(run.communication, throughput.get("examples_per_s"),
                                          exp.global_batch_size),
      network=network_record(run),
      noise_scale=noise_record(state.regime_means(), exp.global_batch_size,
                               run.replicator.num_replicas, run.communication),
      budget={"total_steps": exp.total_steps, "limit": run.limit}, curve=state.curve,
      sessions=state.sessions, resumed=max(0, len(state.sessions) - 1),
      operative_config=run.operative_config,
      machine=provenance.machine(throughput.get("calibration")),
      throughput=throughput.get("record"),   # Synthetic data only.
      **describe(run), **provenance.versions())


def communication_account(account: dict, examples_per_s: float | None,
                          global_batch_size: int) -> dict:
  """The step's communication account, with the measured step time beside the time
  its collectives take alone (their share of the step, a lower bound)."""
  account = dict(account)
  if examples_per_s:
    step_s = global_batch_size / examples_per_s
    account["step_s"] = round(step_s, 6)
    if account.get("collective_s_per_step") is not None:
      account["collective_fraction"] = round(min(1.0, account["collective_s_per_step"] / step_s), 4)
  return account


def noise_record(means: dict, global_batch: int, num_replicas: int,
                 account: dict | None = None) -> dict | None:
  """The simple gradient noise scale from the run's mean |G_b|^2 and |G_B|^2 (None
  where the regime recorded none: one replica, loss scaling, or not Sync)."""
  if noise_scale.SMALL not in means or noise_scale.BIG not in means or num_replicas < 2:
    return None
  b_small = global_batch / num_replicas
  found = noise_scale.estimate(means[noise_scale.SMALL], means[noise_scale.BIG],
                               b_small, global_batch)
  record = {"b_simple": found.b_simple, "trace_sigma": found.trace_sigma,
            "grad_sq": found.grad_sq, "per_replica_batch": b_small,
            "global_batch": global_batch,
            "method": "McCandlish et al. 2018 A.1: per-replica vs all-reduced gradient "
                      "norms, each averaged over the run before the ratio"}
  if "batch_norm" in ((account or {}).get("by_kind") or {}):
    # The backward pass of the moments' all-reduce mixes every replica's examples
    # into each replica's gradient (parts that cancel in the sum), so |G_b|^2 is
    # inflated against |G_B|^2: measured here, |G|^2 came out negative.
    record["caveat"] = ("cross-replica batch norm couples the replicas' gradients, which "
                        "are then not independent batch-b estimates: the estimate is biased "
                        "(tr(Sigma) up, |G|^2 down, possibly negative). Measure the noise "
                        "scale with per-replica batch norm (engine.per_replica_batch_norm).")
  return record


def network_record(run) -> dict | None:
  """Bytes the cluster put on its wire this session, beside what the account predicts."""
  meter = getattr(run, "wire", None)   # None: the checkpoint held a finished run.
  if meter is None:
    return None
  steps = int(run.step.numpy()) - run.state.sessions[-1]["start_step"]
  return meter.record(steps, wire.expected_per_step(run.communication,
                                                    run.replicator.num_replicas))


def failed_result(run, error: Exception) -> results.RunResult:
  """What result.json says while a run that raised waits to be resumed."""
  exp = run.experiment
  return results.RunResult(
      status=results.FAILED, workload=run.workload.name,
      target_metric=run.workload.target_metric, target=exp.target,
      higher_is_better=run.workload.higher_is_better, final_step=int(run.step.numpy()),
      budget={"total_steps": exp.total_steps, "limit": run.limit},
      error=f"{type(error).__name__}: {error}", curve=run.state.curve,
      sessions=run.state.sessions, **describe(run), **provenance.versions())


def describe(run) -> dict:
  """The run's topology and batch, as result fields."""
  exp = run.experiment
  return {"topology": exp.topology.describe(), "scaling_kind": exp.topology.kind,
          "num_workers": run.replicator.num_workers,
          "num_replicas": run.replicator.num_replicas,
          "global_batch_size": exp.global_batch_size, "seed": exp.seed,
          "hparams": hparams(run)}


def hparams(run) -> dict:
  """What TensorBoard's HParams view and the suite group runs by."""
  exp = run.experiment
  network = {"network": netns.rate()} if netns.inside() else {}   # A launched cluster's link.
  # Named only when not float32, so float32 runs group with those recorded before the knob.
  precision = {"precision": exp.precision} if exp.precision != "float32" else {}
  return {"topology": exp.topology.describe(), "scaling_kind": exp.topology.kind,
          "num_replicas": run.replicator.num_replicas,
          "global_batch_size": exp.global_batch_size, "seed": exp.seed,
          "regime_setting": exp.regime.setting(), **network, **precision,
          **exp.regime.hparams(), **run.workload.hparams()}


def _rounded(value):
  return None if value is None else round(value, 3)
