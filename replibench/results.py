"""result.json: the typed record of one run, written by the harness, read by the suite.

`RunResult` is the schema (with a version); `write` and `read` are the only
code that touches the file. A result written by an older replibench (no
schema_version) is read as version 0: fields it lacks take their defaults.
Anything that is not such a record (bad JSON, a list, missing or mistyped
required fields, an unknown status) is a UserError naming the file.
"""

import dataclasses
import json
import math
import os
from typing import Any

from replibench import atomic
from replibench.errors import UserError

SCHEMA_VERSION = 1
FILE = "result.json"

REACHED, BUDGET_EXHAUSTED, DIVERGED, FAILED = "reached", "budget_exhausted", "diverged", "failed"
# A run with one of these statuses is over: running it again does nothing. A failed
# run (status failed, or no result.json) is resumed from its checkpoint.
FINAL_STATUSES = (REACHED, BUDGET_EXHAUSTED, DIVERGED)
STATUSES = FINAL_STATUSES + (FAILED,)


@dataclasses.dataclass
class RunResult:
  """One run's outcome. Times in seconds; curve rows are [step, timed seconds, metric]."""

  status: str
  workload: str
  target_metric: str
  target: float
  higher_is_better: bool
  final_step: int = 0
  time_to_target_s: float | None = None
  init_s: float | None = None
  total_s: float | None = None
  steps_to_target: int | None = None
  epochs_to_target: float | None = None
  examples_to_target: int | None = None
  final_metric: float | None = None
  final_metrics: dict | None = None
  metrics_at_target: dict | None = None
  examples_per_s: float | None = None
  first_call_s: float | None = None
  eval_s: float | None = None   # Mean seconds per evaluation (inside time_to_target_s).
  regime: dict = dataclasses.field(default_factory=dict)
  regime_metrics: dict = dataclasses.field(default_factory=dict)
  communication: dict | None = None
  network: dict | None = None   # Bytes on the wire, in a launched cluster (harness/wire.py).
  noise_scale: dict | None = None   # The gradient noise scale (engine/noise_scale.py).
  budget: dict = dataclasses.field(default_factory=dict)
  curve: list = dataclasses.field(default_factory=list)
  topology: str = ""
  scaling_kind: str = "unknown"
  num_workers: int = 1
  num_replicas: int = 1
  global_batch_size: int = 0
  seed: int = 0
  hparams: dict = dataclasses.field(default_factory=dict)
  sessions: list = dataclasses.field(default_factory=list)
  resumed: int = 0
  operative_config: str = ""
  git_sha: str = ""
  tf_version: str = ""
  machine: dict = dataclasses.field(default_factory=dict)
  # On synthetic data (time to target undefined): examples/s per device, step time,
  # FLOP rate, peak memory (harness/throughput.py).
  throughput: dict | None = None
  error: str | None = None
  schema_version: int = SCHEMA_VERSION

  @property
  def is_final(self) -> bool:
    return self.status in FINAL_STATUSES

  @property
  def converged(self) -> bool:
    return self.status == REACHED and self.time_to_target_s is not None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, data: Any, source: str = FILE) -> "RunResult":
    """Validates data (a parsed result.json); UserError naming source if it is not one."""
    if not isinstance(data, dict):
      raise UserError(f"{source} holds a JSON {type(data).__name__}, not a run result "
                      f"(an object written by `replibench run`).")
    missing = [f for f in _REQUIRED if f not in data]
    if missing:
      raise UserError(f"{source} lacks the field(s) {', '.join(missing)}; it was not "
                      f"written by `replibench run` or by an incompatible version.")
    if data["status"] not in STATUSES:
      raise UserError(f"{source}: status {data['status']!r} is not one of "
                      f"{', '.join(STATUSES)}.")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
      raise UserError(f"{source} has schema_version {version!r}; this replibench reads up "
                      f"to {SCHEMA_VERSION}. Upgrade replibench to read it.")
    known = {f.name: f for f in dataclasses.fields(cls)}
    values = {k: v for k, v in data.items() if k in known}
    for name, value in values.items():
      _check_type(source, name, value)
    return cls(**{**values, "schema_version": version})


_REQUIRED = ("status", "workload", "target_metric", "target", "higher_is_better")
_NUMBERS = {"target", "time_to_target_s", "init_s", "total_s", "epochs_to_target",
            "final_metric", "examples_per_s", "first_call_s"}
_INTEGERS = {"final_step", "steps_to_target", "examples_to_target", "num_workers",
             "num_replicas", "global_batch_size", "seed", "resumed"}
_CONTAINERS = {"final_metrics": dict, "metrics_at_target": dict, "regime": dict,
               "regime_metrics": dict, "communication": dict, "network": dict, "budget": dict,
               "curve": list, "hparams": dict, "sessions": list, "machine": dict,
               "throughput": dict}


def _check_type(source: str, name: str, value: Any) -> None:
  if value is None:
    return
  ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in _NUMBERS else
        isinstance(value, int) and not isinstance(value, bool) if name in _INTEGERS else
        isinstance(value, _CONTAINERS[name]) if name in _CONTAINERS else
        isinstance(value, bool) if name == "higher_is_better" else True)
  if not ok:
    raise UserError(f"{source}: field {name!r} is {value!r} ({type(value).__name__}), which "
                    f"is not what `replibench run` writes there.")


def configuration(hparams: dict) -> dict:
  """A run's hparams without its seed: what names its configuration. Runs that differ
  only in seed are one configuration: one row of a report, one session group (its
  seeds the sessions) in TensorBoard's HParams table."""
  return {k: v for k, v in hparams.items() if k != "seed"}


def path_in(directory: str) -> str:
  return os.path.join(directory, FILE)


def write(directory: str, result: RunResult) -> None:
  """Writes directory/result.json atomically (a reader never sees half of it)."""
  atomic.write_json(path_in(directory), _finite(result.to_dict()))


def read(directory: str) -> RunResult | None:
  """directory/result.json as a RunResult; None if there is none. UserError if unreadable."""
  path = path_in(directory)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    return None
  except IsADirectoryError:
    raise UserError(f"{path} is a directory, not a result file.") from None
  try:
    data = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); result.json is written atomically, "
                    f"so something else changed it. Delete it to run the trial again.") from None
  return RunResult.from_dict(data, path)


def _finite(value):
  """NaN and infinities as None: strict JSON has neither (a diverged metric is recorded
  by status, not by a non-standard literal)."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value
