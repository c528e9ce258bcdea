"""Reading the result.json files that `replibench run` writes, one per trial."""

import json
import os
from typing import Any

from replibench.errors import UserError

RESULT_FILE = "result.json"
MANIFEST_FILE = "sweep.json"   # A sweep directory's record of its sweep file and trials.
# A trial with one of these statuses is finished; anything else (failed, or no
# result yet) is run again, which resumes it from its checkpoint.
FINAL_STATUSES = ("reached", "budget_exhausted", "diverged")
STATUSES = FINAL_STATUSES + ("failed",)
# The fields the suite reads; the harness writes more (see the task's schema).
REQUIRED_FIELDS = ("status", "workload", "target_metric", "target", "higher_is_better")


def read_result(trial_dir: str) -> dict[str, Any] | None:
  """The trial's result.json as a dict, or None when the trial has not written one."""
  path = os.path.join(trial_dir, RESULT_FILE)
  try:
    with open(path) as f:
      result = json.load(f)
  except FileNotFoundError:
    return None
  except json.JSONDecodeError as e:
    raise UserError(f"{path} is not valid JSON ({e}); result.json is written "
                    f"atomically, so something else changed it. Delete it to rerun the trial.")
  missing = [k for k in REQUIRED_FIELDS if k not in result]
  if missing:
    raise UserError(f"{path} lacks the field(s) {', '.join(missing)}; it was not "
                    f"written by `replibench run` or by an incompatible version.")
  if result["status"] not in STATUSES:
    raise UserError(f"{path}: status {result['status']!r} is not one of {', '.join(STATUSES)}.")
  return result


def is_final(result: dict[str, Any] | None) -> bool:
  return result is not None and result["status"] in FINAL_STATUSES


def find_results(root: str) -> list[tuple[str, dict[str, Any]]]:
  """Every (trial dir relative to root, result) under root, in sorted order."""
  if not os.path.isdir(root):
    raise UserError(f"{root} is not a directory (expected a sweep directory).")
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    if RESULT_FILE in filenames:
      found.append((os.path.relpath(dirpath, root), read_result(dirpath)))
      dirnames[:] = []  # A trial's own subdirectories (workers, checkpoints) are part of it.
  return found
