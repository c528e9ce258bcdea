"""Finding the trials' results in a sweep directory (read through replibench.results)."""

import os

from replibench import results
from replibench.errors import UserError
from replibench.results import RunResult

MANIFEST_FILE = "sweep.json"   # A sweep directory's record of its sweep file and trials.


def read_result(trial_dir: str) -> RunResult | None:
  """The trial's result, or None when the trial has not written one."""
  return results.read(trial_dir)


def is_final(result: RunResult | None) -> bool:
  return result is not None and result.is_final


def find_results(root: str) -> list[tuple[str, RunResult]]:
  """Every (trial dir relative to root, result) under root, in sorted order."""
  if not os.path.isdir(root):
    raise UserError(f"{root} is not a directory (expected a sweep directory).")
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    if results.FILE in filenames:
      found.append((os.path.relpath(dirpath, root), read_result(dirpath)))
      dirnames[:] = []  # A trial's own subdirectories (workers, checkpoints) are part of it.
  return found
