"""An A/B's (or a bisect's) directory: checked before anything runs, and claimed by a
plan file so that a later run on it with other revisions or options is refused
instead of taking the finished trials there as its own."""

import json
import os

from replibench import atomic, inputs
from replibench.errors import UserError

PLAN_FILE = "ab-plan.json"


def check_workdir(path: str, given: bool = True) -> None:
  inputs.output_directory("--workdir" if given else "the default --workdir", path)


def _finished_trials(path: str) -> bool:
  """Whether any trial under an A/B (or bisect) directory wrote a result."""
  return os.path.isdir(path) and any("result.json" in files for _, _, files in os.walk(path))


def check_plan(path: str, plan: dict, what: str = "an A/B") -> dict:
  """The plan as it will be written; a UserError when path holds another A/B's finished
  trials (they would be taken as this A/B's pairs) or an unreadable plan. Writes
  nothing: claim_workdir does, once every check has passed."""
  check_workdir(path)
  plan = json.loads(json.dumps(plan))   # As it reads back (tuples become lists).
  file = os.path.join(path, PLAN_FILE)
  try:
    before = atomic.read_json(file, None)
  except (OSError, ValueError) as e:   # A directory, a JSON or Unicode error.
    raise UserError(f"--workdir={path}: its {PLAN_FILE} is not readable JSON "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:120]}), so what ran "
                    f"there cannot be told. Give a new --workdir, or remove that file if the "
                    f"directory holds no A/B you want to resume.") from None
  if before is not None and not isinstance(before, dict):
    raise UserError(f"--workdir={path}: its {PLAN_FILE} is a JSON "
                    f"{type(before).__name__}, not an A/B plan. Give a new --workdir.")
  if before and before != plan and _finished_trials(path):
    changed = sorted(k for k in set(before) | set(plan) if before.get(k) != plan.get(k))
    raise UserError(f"--workdir={path} holds {what} of other {', '.join(changed)} "
                    f"({before.get(changed[0])!r} there, {plan.get(changed[0])!r} now): its "
                    f"finished trials would be taken as this A/B's. Give a new --workdir.")
  return plan


def claim_workdir(path: str, plan: dict, what: str = "an A/B") -> None:
  """Records what this A/B runs in its directory (after check_plan)."""
  atomic.write_json(os.path.join(path, PLAN_FILE), check_plan(path, plan, what))
