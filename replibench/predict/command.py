"""The `replibench predict` command: flags in, a prediction table (or JSON) out."""

import json
import os

from replibench.config import gin_loader, load_experiment
from replibench.config.plan import make_plan
from replibench import inputs
from replibench.errors import UserError
from replibench.predict import predictor
from replibench.predict.hardware import DeviceProfile   # Registers predict.DeviceProfile with gin.

EFFICIENCY_DIR = os.path.join(gin_loader.REPO_ROOT, "results", "predict")


def predict_command(gin_files: list[str], bindings: list[str], device_profile: str | None,
                    efficiency: str | None, workers: int | None, topology: str | None,
                    network: str, as_json: bool) -> str:
  """The text `replibench predict` prints; UserError on bad input (nothing printed)."""
  if not device_profile:
    raise UserError("predict: --device_profile is required (a gin file binding "
                    "predict.DeviceProfile, e.g. configs/devices/tpu_v3_32.gin).")
  for flag, path in (("--device_profile", device_profile), ("--topology", topology)):
    if path:
      inputs.input_file(flag, path)
  if workers is not None:
    inputs.number("--workers", workers, 1, integer=True, meaning="hosts of the profile's devices")
  experiment = load_experiment(list(gin_files) + ([topology] if topology else [])
                               + [device_profile], bindings)
  profile = _profile(device_profile)
  fit = predictor.load_efficiency(
      efficiency or os.path.join(EFFICIENCY_DIR, f"{experiment.workload.name}.json"))
  plan = make_plan(experiment)
  replicas = workers * profile.devices_per_host if workers else plan["num_replicas"]
  if workers and plan.get("model_parallel"):   # A replica is M of a host's devices.
    replicas = max(1, replicas // plan["model_parallel"]["model"])
  result = predictor.predict(predictor.Question(plan, profile, replicas, network), fit)
  return json.dumps(result, indent=1) if as_json else format_prediction(result)


def _profile(path: str) -> DeviceProfile:
  try:
    return DeviceProfile()
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (gin wraps the missing binding)
    raise UserError(f"--device_profile={path}: {' '.join(str(e).split())}") from None


def format_prediction(p: dict) -> str:
  """Aligned lines: seconds per step and its parts, steps, time, critical batch."""
  rows = [
      ("workload", p["workload"]), ("device", p["device"]),
      ("replicas", f"{p['num_replicas']} on {p['hosts']} host(s), network {p['network']}"
                   + (f" ({p['network_note']})" if p.get("network_note") else "")),
      ("global batch", f"{p['global_batch_size']} ({p['per_replica_batch_size']} per replica)"),
      ("seconds per step", f"{p['step_s']:.4g} (compute {p['compute_s']:.4g}, "
                           f"communication {p['comm_s']:.4g})"),
      ("steps to target", _steps_line(p)),
      ("evaluations", f"{p['evaluations']:.1f} x {p['eval_s']:.3g} s" if p["eval_s"] else
                      f"{p['evaluations']:.1f} (not timed: the efficiency file gives no seconds)"),
      ("time to target", _time_line(p)),
      ("critical batch", _critical_batch_line(p)),
  ]
  if p["steps_bound"] == "at_most":
    rows.append(("steps from", f"a published recipe, an upper bound: {p['steps_source']}"))
  if p.get("model_parallel"):
    mp = p["model_parallel"]
    rows.append(("model parallel", f"compute {mp['compute_s']:.4g} s (bubble "
                                   f"{mp['bubble_fraction']:.3g}), model axis "
                                   f"{mp['model_axis_s']:.4g} s, data axis {mp['data_axis_s']:.4g} s; "
                                   f"largest device {mp['max_device_bytes'] / 1e6:.4g} MB"))
  if p["memory_ok"] is False:
    rows.append(("memory", "a device's parameters, optimizer state and activations exceed its "
                           "memory" if p.get("model_parallel") else
                           "the float32 weights, gradients and slots exceed the device's memory"))
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _interval(pair, fmt: str) -> str:
  return f"[{fmt.format(pair[0])}, {fmt.format(pair[1])}]"


def _estimate(p: dict, value: str, mean: str, run: str, fmt: str, unit: str = "") -> str:
  """'v [mean interval]; one run [interval]', or 'at most v' for a published recipe."""
  if p["steps_bound"] == "at_most":
    return f"at most {fmt.format(p[value])}{unit}"
  return (f"{fmt.format(p[value])}{unit} {_interval(p[mean], fmt)}; "
          f"one run {_interval(p[run], fmt)}")


def _steps_line(p: dict) -> str:
  line = _estimate(p, "steps_to_target", "steps_interval", "run_steps_interval", "{:.0f}")
  if p["steps_bound"] == "at_most":
    line += " (the recipe's end)"
  return line + ("  EXTRAPOLATED beyond the fitted batches" if p["extrapolated_batch"] else "")


def _time_line(p: dict) -> str:
  line = _estimate(p, "time_to_target_s", "time_interval_s", "run_time_interval_s", "{:.4g}",
                   " s")
  return f"{line} ({p['target_metric']} {p['target']})"


def _critical_batch_line(p: dict) -> str:
  if p["critical_batch"] is None:
    line = (f"above {p['critical_batch_interval'][0]:.0f} (no diminishing returns up to the "
            f"largest batch the source reports)")
  else:
    line = f"{p['critical_batch']:.0f} {_interval(p['critical_batch_interval'], '{:.0f}')}"
  if not p["noise_scale_b_simple"]:
    return line
  caveat = p.get("noise_scale_caveat")
  return (line + f"; noise scale B_simple {p['noise_scale_b_simple']:.0f}"
          + (f" ({caveat})" if caveat else ""))
