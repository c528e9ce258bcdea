"""Fits steps to target against the global batch from a batch-size sweep.

Reads every trial's result.json under SWEEP_DIR (`replibench sweep` layout:
TRIAL/seed=K/result.json), fits steps(B) = S_min (1 + B_crit / B) over the runs that
reached the target (replibench/predict/efficiency.py), and writes the statistical-
efficiency file `replibench predict` reads: the points, the fit, the noise scale the
engine recorded (median over the runs, this sweep's and --noise_dir's, whose estimate
carries no bias caveat), and the mean seconds per evaluation with the
training FLOP/s the same runs achieved (evaluations scale to another device by its
achieved FLOP/s against these). Prints a table: per batch, the seeds' steps, their mean, the fit.

  python benchmarks/predict/statistical_efficiency.py runs/resnet_batch \\
    --noise_dir=runs/resnet_noise --out=results/predict/resnet_fashion_mnist.json \\
    [--hold_out=256]

--hold_out leaves a batch out of the fit and prints its predicted against measured
steps (the held-out check of results/predict/README.md).
"""

import argparse
import dataclasses
import glob
import json
import os
import statistics
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)  # The checkout.

from replibench import results  # noqa: E402  pylint: disable=wrong-import-position
from replibench.predict import efficiency  # noqa: E402  pylint: disable=wrong-import-position


def _runs(sweep_dir: str) -> list:
  found = [results.read(os.path.dirname(p))
           for p in sorted(glob.glob(os.path.join(sweep_dir, "*", "seed=*", "result.json")))]
  return [r for r in found if r is not None and r.is_final]


def _achieved_train_flops(runs) -> float | None:
  """FLOP/s the sweep's own runs achieved in training (plan FLOPs x examples/s, median):
  the speed its evaluations ran at, to scale them to another device."""
  import tempfile  # pylint: disable=import-outside-toplevel
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  from replibench.config.plan import make_plan  # pylint: disable=import-outside-toplevel
  with tempfile.NamedTemporaryFile("w", suffix=".gin") as f:
    f.write(runs[0].operative_config)
    f.flush()
    flops = make_plan(load_experiment([f.name], []))["train_flops_per_example"]
  speeds = [r.examples_per_s for r in runs if r.examples_per_s]
  return flops * statistics.median(speeds) if flops and speeds else None


def _noise_scales(runs) -> list[float]:
  """B_simple of the runs that recorded an unbiased one: runs flagged with a caveat
  (cross-replica batch norm couples the replicas' gradients) are left out."""
  return [r.noise_scale.b_simple for r in runs
          if r.noise_scale and r.noise_scale.b_simple and r.noise_scale.caveat is None]


def _batch_norm_setting(run) -> tuple[float, float]:
  """The run's batch-norm (momentum, epsilon), from its operative config:
  engine.batch_norm_setting's or, in runs from before it, a factory's own; Keras'
  (0.99, 1e-3) where none is bound."""
  found = {"momentum": 0.99, "epsilon": 1e-3}
  for line in run.operative_config.splitlines():
    key, _, value = line.partition(" = ")
    name = key.rsplit(".", 1)[-1]
    if "batch_norm" in key and name in found:
      found[name] = float(value)
  return found["momentum"], found["epsilon"]


def _check_one_recipe(runs, noise_runs) -> None:
  """Stops when the noise scale comes from runs of another batch-norm recipe than the
  fit's: B_simple and B_crit would then describe two trainings."""
  fitted = {_batch_norm_setting(r) for r in runs}
  others = {_batch_norm_setting(r) for r in noise_runs} - fitted
  if len(fitted) > 1 or others:
    raise SystemExit(f"the runs differ in their batch-norm (momentum, epsilon): "
                     f"{sorted(fitted | others)}; re-run them with one engine.batch_norm_setting.")


def _table(runs, fit, held_out) -> str:
  lines = [f"{'batch':>6} {'runs':>5} {'reached':>8} {'steps (each)':<28} {'mean':>8} {'fit':>8}"]
  for batch in sorted({r.global_batch_size for r in runs}):
    mine = [r for r in runs if r.global_batch_size == batch]
    steps = [r.steps_to_target for r in mine if r.converged]
    mean = f"{statistics.mean(steps):.0f}" if steps else "-"
    predicted, low, high = fit.steps(batch)
    note = "  (held out)" if batch == held_out else ""
    lines.append(f"{batch:>6} {len(mine):>5} {len(steps):>8} "
                 f"{', '.join(map(str, steps)) or 'none':<28} {mean:>8} "
                 f"{predicted:>8.0f} [{low:.0f}, {high:.0f}]{note}")
  b_low, b_high = fit.b_crit_interval()
  lines.append(f"S_min = {fit.s_min:.0f}, B_crit = {fit.b_crit:.0f} [{b_low:.0f}, {b_high:.0f}] "
               f"({efficiency.LEVEL:.0%} interval)")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("sweep_dir")
  parser.add_argument("--out", required=True)
  parser.add_argument("--noise_dir", action="append", default=[],
                      help="another sweep whose runs' noise scale to report (e.g. "
                           "configs/resnet/noise_scale.sweep's, with per-replica batch norm)")
  parser.add_argument("--hold_out", type=int, default=None, help="a batch to leave out of the fit")
  args = parser.parse_args()
  runs = _runs(args.sweep_dir)
  if not runs:
    print(f"{args.sweep_dir}: no finished trials (TRIAL/seed=K/result.json)", file=sys.stderr)
    return 2
  fitted = [r for r in runs if r.converged and r.global_batch_size != args.hold_out]
  fit = efficiency.fit_steps([r.global_batch_size for r in fitted],
                             [r.steps_to_target for r in fitted])
  noise_runs = [r for d in args.noise_dir for r in _runs(d)]
  _check_one_recipe(runs, noise_runs)
  noise = _noise_scales(runs + noise_runs)
  evals = [r.eval_s for r in runs if r.eval_s]
  record = {
      "workload": runs[0].workload, "target": runs[0].target,
      "target_metric": runs[0].target_metric,
      "source": os.path.relpath(os.path.abspath(args.sweep_dir), REPO),
      "points": [{"global_batch": r.global_batch_size, "seed": r.seed, "status": r.status,
                  "steps_to_target": r.steps_to_target} for r in runs],
      "held_out": args.hold_out, "fit": dataclasses.asdict(fit),
      "noise_scale": {"b_simple": statistics.median(noise), "runs": len(noise),
                      "each": noise} if noise else None,
      "eval_s": statistics.mean(evals) if evals else None,
      "eval_achieved_flops": _achieved_train_flops(runs),
  }
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  print(_table(runs, fit, args.hold_out))
  if noise:
    print(f"noise scale B_simple: median {statistics.median(noise):.0f} over {len(noise)} runs "
          f"(range {min(noise):.0f}-{max(noise):.0f})")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
