"""SLURM's compact host and task lists, expanded: `n[9-10]`, `gpu[001-004,010]`, `2(x3),1`.

SLURM names a step's nodes (SLURM_STEP_NODELIST) as a hostlist expression and its
tasks per node (SLURM_STEP_TASKS_PER_NODE) as counts with repeats. `scontrol show
hostnames` expands the first where a SLURM configuration is readable (a login or
compute node); this module does the same in-process, so a task needs no subprocess
and the fake environments of the tests need no SLURM. The real-SLURM tests hold the
two expansions equal (tests/test_slurm_local.py).
"""

import re
import shutil
import subprocess

from replibench.errors import UserError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
  """Splits at commas outside brackets: 'a[1-2],b' -> ['a[1-2]', 'b']."""
  parts, depth, start = [], 0, 0
  for i, char in enumerate(text):
    depth += {"[": 1, "]": -1}.get(char, 0)
    if depth < 0 or depth > 1:
      raise ValueError(f"unbalanced brackets at character {i}")
    if char == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  if depth:
    raise ValueError("unclosed '['")
  return parts + [text[start:]]


def _expand_ranges(body: str) -> list[str]:
  """'001-004,010' -> ['001', ..., '004', '010'], keeping each range's zero padding."""
  out = []
  for part in body.split(","):
    match = _RANGE.match(part)
    if not match:
      raise ValueError(f"bad range {part!r}")
    first, last = match.group(1), match.group(2) or match.group(1)
    if int(last) < int(first):
      raise ValueError(f"descending range {part!r}")
    width = len(first) if first.startswith("0") else 0
    out += [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
  return out


def _expand_one(item: str) -> list[str]:
  """One host expression, brackets anywhere in it (also several: 'r[1-2]n[1-2]')."""
  match = re.search(r"\[([^\]]*)\]", item)
  if not match:
    return [item]
  head, tail = item[:match.start()], item[match.end():]
  return [head + value + rest for value in _expand_ranges(match.group(1))
          for rest in _expand_one(tail)]


def _python_expand(expression: str) -> list[str]:
  return [host for item in _split_top_level(expression) if item
          for host in _expand_one(item)]


def expand_hosts(expression: str, variable: str = "SLURM_STEP_NODELIST") -> list[str]:
  """The host names of a hostlist expression, in SLURM's order (UserError if malformed).

  An expression this parser does not know is handed to `scontrol show hostnames`
  where scontrol exists; otherwise it is refused, naming the variable.
  """
  try:
    return _python_expand(expression.strip())
  except ValueError as e:
    hosts = _scontrol_expand(expression)
    if hosts:
      return hosts
    raise UserError(f"{variable}={expression!r} is not a SLURM hostlist expression this "
                    f"replibench can expand ({e}); expected names like 'n[9-10]' or "
                    f"'gpu[001-004,010]'.") from None


def _scontrol_expand(expression: str) -> list[str] | None:
  if not shutil.which("scontrol"):
    return None
  try:
    out = subprocess.run(["scontrol", "show", "hostnames", expression], capture_output=True,
                         text=True, timeout=10, check=True).stdout
  except (subprocess.SubprocessError, OSError):
    return None
  return out.split() or None


def expand_counts(expression: str, variable: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
  """'2(x3),1' -> [2, 2, 2, 1]: SLURM's tasks per node, one count a node."""
  counts = []
  for part in expression.strip().split(","):
    match = _REPEAT.match(part.strip())
    if not match:
      raise UserError(f"{variable}={expression!r} is not a SLURM count list (expected "
                      f"counts like '2(x3),1').")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts
