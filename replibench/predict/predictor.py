"""`replibench predict`: time to target = steps to target x seconds per step (+ evaluations).

Steps to target come from the workload's statistical-efficiency file (a fit of a
batch-size sweep: efficiency.py), the same on any hardware; seconds per step from
the config's plan (FLOPs per example, the step's collectives and their bytes) and
a DeviceProfile (hardware.py), for any replica count, including ones this machine
lacks. Evaluations are the efficiency file's measured seconds per evaluation,
scaled by the ratio of the FLOP/s its runs achieved to the replicas' together.
"""

import dataclasses

from replibench import rates
from replibench.errors import UserError
from replibench.predict import efficiency as efficiency_lib, model_parallel
from replibench.predict.hardware import DeviceProfile, step_time


@dataclasses.dataclass(frozen=True)
class Question:
  """What to predict: a plan (make_plan's dict) on num_replicas devices of profile."""

  plan: dict
  profile: DeviceProfile
  num_replicas: int
  network: str = "none"   # Overrides the profile's host link where not 'none'.


def with_network(profile: DeviceProfile, network: str) -> DeviceProfile:
  """profile with its host link at rate `network` (tc units, e.g. 100mbit), or the
  profile's own link where that is slower. A shared link is `replibench launch
  --network`'s emulation: a token bucket of rates.token_bucket_bytes(network)."""
  if rates.check("--network", network or "none") == "none":
    return profile
  return dataclasses.replace(
      profile,
      inter_host_bytes_per_s=min(rates.bits_per_second(network) / 8,
                                 profile.inter_host_bytes_per_s),
      link_burst_bytes=rates.token_bucket_bytes(network) if profile.shared_link else 0.0)


def predict(question: Question, efficiency: dict) -> dict:
  """The prediction as a JSON-able dict (seconds, steps, examples)."""
  plan, n = question.plan, question.num_replicas
  bound = _steps_bound(plan, efficiency)
  profile = with_network(question.profile, question.network)
  batch = plan["global_batch_size"]
  if batch % n:
    raise UserError(f"global batch {batch} does not divide over {n} replicas.")
  account = plan.get("communication") or {}
  mesh, devices_per_replica = None, 1
  if plan.get("model_parallel"):   # Replicas spanning devices: per device, each axis.
    step, mesh = model_parallel.step_time(profile, plan, n)
    devices_per_replica = plan["model_parallel"]["model"]
  else:
    step = step_time(profile, plan["train_flops_per_example"], batch, n,
                     account.get("bytes_per_step", plan.get("allreduce_bytes_per_step") or 0),
                     account.get("collectives_per_step", 1))
  fit = efficiency["fit"]
  steps, steps_low, steps_high = fit.steps(batch)
  run_low, run_high = fit.run_steps(batch)
  evaluations = steps / plan["eval_every_steps"]
  eval_s = _eval_seconds(efficiency, profile, n)
  total = lambda s: s * step.step_s + s / plan["eval_every_steps"] * eval_s  # noqa: E731
  b_low, b_high = fit.b_crit_interval()
  return {
      "workload": plan["workload"], "device": profile.name, "num_replicas": n,
      "hosts": -(-n * devices_per_replica // profile.devices_per_host),
      "network": question.network, "network_note": _network_note(question),
      "global_batch_size": batch, "per_replica_batch_size": batch // n,
      "step_s": step.step_s, "compute_s": step.compute_s, "comm_s": step.comm_s,
      "steps_to_target": steps, "steps_interval": [steps_low, steps_high], "steps_bound": bound,
      "extrapolated_batch": fit.extrapolates(batch),
      "evaluations": evaluations, "eval_s": eval_s,
      "run_steps_interval": [run_low, run_high],
      "time_to_target_s": total(steps), "time_interval_s": [total(steps_low), total(steps_high)],
      "run_time_interval_s": [total(run_low), total(run_high)],
      "critical_batch": fit.b_crit, "critical_batch_interval": [b_low, b_high],
      "steps_source": (efficiency.get("published") or {}).get("source") or efficiency.get("source"),
      "noise_scale_b_simple": (efficiency.get("noise_scale") or {}).get("b_simple"),
      "noise_scale_caveat": (efficiency.get("noise_scale") or {}).get("caveat"),
      "memory_ok": (model_parallel.fits(plan, profile, n) if mesh else
                    _fits_memory(plan, profile)),
      **({"model_parallel": mesh} if mesh else {}),
      "target": plan["target"], "target_metric": plan["target_metric"],
  }


def _network_note(question: Question) -> str | None:
  """Why --network does not change this prediction (None where it sets the link)."""
  profile, network = question.profile, question.network
  if network in (None, "", "none"):
    return None
  if question.num_replicas <= profile.devices_per_host and not profile.shared_link:
    return (f"not applied: the {question.num_replicas} replica(s) share one host of "
            f"{profile.devices_per_host} devices, so no traffic crosses a host link")
  if rates.bits_per_second(network) / 8 > profile.inter_host_bytes_per_s:
    return (f"not applied: the profile's own host link, "
            f"{profile.inter_host_bytes_per_s * 8 / 1e9:g} Gbit/s, is slower and limits")
  return None


def _steps_bound(plan: dict, efficiency: dict) -> str:
  """'exact' where the efficiency file was measured to the config's target; 'at_most'
  where it is a published recipe whose final metric is at least as good as the target
  (the recipe reaches it by its end, perhaps sooner). UserError otherwise."""
  published = efficiency.get("published")
  if efficiency.get("workload") == plan["workload"]:
    if efficiency.get("target") == plan["target"]:
      return "at_most" if published else "exact"
    sign = 1 if efficiency.get("higher_is_better", True) else -1
    if published and sign * (efficiency["target"] - plan["target"]) > 0:
      return "at_most"
  raise UserError(
      f"{efficiency.get('path', 'the efficiency file')} fits {efficiency.get('workload')!r} to "
      f"target {efficiency.get('target')!r}, but the config is {plan['workload']!r} with "
      f"target {plan['target']!r}: steps to one target say nothing about another (a "
      f"published recipe covers only targets no harder than its final metric). Use the "
      f"file made from this config's batch-size sweep (--efficiency=...).")


def _eval_seconds(efficiency: dict, profile: DeviceProfile, num_replicas: int) -> float:
  """The efficiency file's seconds per evaluation, at the FLOP/s its runs achieved,
  moved to num_replicas devices of profile (evaluation is split over the replicas)."""
  measured = efficiency.get("eval_s") or 0.0
  where = efficiency.get("eval_achieved_flops")
  if not (measured and where):
    return measured
  return measured * where / (profile.achieved_flops * num_replicas
                            * profile.core_share(num_replicas))


def _fits_memory(plan: dict, profile: DeviceProfile) -> bool | None:
  """Whether the float32 weights, gradients and two optimizer slots fit (activations
  are not counted); None where the profile gives no memory."""
  if not profile.memory_bytes or not plan.get("parameters"):
    return None
  return 16 * plan["parameters"] <= profile.memory_bytes


def load_efficiency(path: str) -> dict:
  return {**efficiency_lib.load(path), "path": path}
