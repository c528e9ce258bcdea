"""A stand-in for `replibench run` in the suite's tests: writes plausible results, trains
nothing. `run_sweep(..., runner=fakes.FakeRunner())`. Results go through RunResult, so a
field the schema does not know, or a wrong type, fails here as it would for a real run.
"""

import os
import re
from typing import Any, Callable

from replibench import results
from replibench.suite.sweep_file import Trial


def fake_result(*, seed: int = 1, num_replicas: int = 1, num_workers: int = 1,
                scaling_kind: str = "logical_replicas", time_to_target_s: float | None = 100.0,
                examples_per_s: float = 1000.0, final_metric: float = 0.925,
                workload: str = "resnet_fashion_mnist", target: float = 0.92,
                status: str | None = None, global_batch_size: int = 256,
                **overrides: Any) -> dict[str, Any]:
  """A result.json dict in the harness's schema. time_to_target_s None means the
  run ended without reaching the target (status budget_exhausted)."""
  reached = time_to_target_s is not None
  steps = int(time_to_target_s * examples_per_s / global_batch_size) if reached else None
  total = (time_to_target_s or 300.0) + 5.0
  curve = [[int(steps * f) if steps else 100 * i, total * f, final_metric * (0.7 + 0.3 * f)]
           for i, f in enumerate((0.25, 0.5, 0.75, 1.0), 1)]
  result = {
      "status": status or ("reached" if reached else "budget_exhausted"),
      "workload": workload, "target_metric": "eval/top1", "target": target,
      "higher_is_better": True, "time_to_target_s": time_to_target_s,
      "init_s": 3.0, "total_s": total,
      "steps_to_target": steps,
      "epochs_to_target": steps * global_batch_size / 60000 if reached else None,
      "examples_to_target": steps * global_batch_size if reached else None,
      "final_metric": final_metric if reached else target - 0.01, "final_step": steps or 400,
      "examples_per_s": examples_per_s, "curve": curve,
      "topology": f"Local(num_replicas={num_replicas}, device='cpu')",
      "scaling_kind": scaling_kind, "num_workers": num_workers, "num_replicas": num_replicas,
      "global_batch_size": global_batch_size, "seed": seed,
      "hparams": {"topology": scaling_kind, "num_replicas": num_replicas,
                  "global_batch_size": global_batch_size, "learning_rate": 0.1, "seed": seed},
      "operative_config": "# fake\n", "git_sha": "0" * 40, "tf_version": "2.21.0",
      "machine": {"cpu": "fake cpu", "cores": 2, "isa_flags": ["avx2", "fma"], "accelerators": [],
                  "calibration": {"matmul_gflops": 100.0, "convnet_gflops": 50.0}},
  }
  result.update(overrides)
  return result


def write_result(trial_dir: str, result: dict[str, Any]) -> None:
  os.makedirs(trial_dir, exist_ok=True)
  results.write(trial_dir, results.RunResult.from_dict(result, "a fake result"))


def trial_scale(trial: Trial) -> tuple[str, int]:
  """(scaling_kind, num_replicas) from the launch mode or a `replicas=N` label."""
  if trial.launch.workers:
    return "worker_processes", trial.launch.workers
  match = re.search(r"replicas=(\d+)", trial.config)
  return "logical_replicas", int(match.group(1)) if match else 1


class FakeRunner:
  """A sweep runner that writes fake_result(...) files and counts its calls.

  outcome(trial) may return keyword overrides for fake_result, e.g.
  {"time_to_target_s": None} for a trial that does not converge, or None to
  write no result.json at all (a crashed run).
  """

  def __init__(self, outcome: Callable[[Trial], dict[str, Any] | None] = lambda t: {}):
    self.outcome = outcome
    self.calls: list[str] = []

  def __call__(self, trial: Trial, trial_dir: str) -> int:
    self.calls.append(trial.name)
    overrides = self.outcome(trial)
    if overrides is None:
      return 1
    kind, n = trial_scale(trial)
    jitter = 1 + 0.03 * (trial.seed % 3 - 1)  # Seeds differ a little, as real ones do.
    args = {"seed": trial.seed, "num_replicas": n, "scaling_kind": kind,
            "num_workers": n if kind == "worker_processes" else 1,
            "time_to_target_s": 100.0 / n ** 0.5 * jitter,
            "examples_per_s": 1000.0 * n ** 0.8 / jitter}
    args.update(overrides)
    write_result(trial_dir, fake_result(**args))
    return 0
