"""A user's values where they first enter: one validator per kind of value, one formatter.

Each validator takes the culprit as the user knows it (a flag such as '--network',
a gin binding such as 'predict.DeviceProfile.overhead_s', a file's key such as
'sweep.toml: axes[0].points[1].network'), checks the value and its range, and
raises a UserError saying the culprit, the value as the user wrote it and the range
allowed. `shown` is the one place that writes a value back to the user: as a gin
config writes it (@regimes.Compressed(), @small_resnet, 'abc', (4, 8), nan), never
as a Python object's repr.
"""

import inspect
import math
import numbers
import os

from replibench.errors import UserError


def shown(value) -> str:
  """value as a gin binding writes it: numbers, quoted strings, tuples and lists of
  them, True / False / None, and @name() (@name for a function or class) for a gin
  configurable; any other object by its type's name."""
  if value is None or isinstance(value, (bool, str)):
    return repr(value)
  if isinstance(value, numbers.Number):
    return _number(value)
  if isinstance(value, (tuple, list)):
    inner = ", ".join(shown(v) for v in value)
    return (f"({inner},)" if len(value) == 1 else f"({inner})") if isinstance(
        value, tuple) else f"[{inner}]"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{shown(k)}: {shown(v)}" for k, v in value.items()) + "}"
  from replibench import internals  # pylint: disable=import-outside-toplevel  (TensorFlow: only for objects)
  reference = inspect.isclass(value) or inspect.isroutine(value)
  name = internals.gin_name(value if reference else type(value))
  if name is not None:
    return f"@{name}" if reference else f"@{name}()"
  return f"a {type(value).__name__}"


def _number(value) -> str:
  if isinstance(value, numbers.Integral):
    return str(int(value))
  value = float(value)
  return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(
      value) else repr(value)


def binding(culprit: str, value) -> str:
  """'culprit = value' for a binding or key, '--flag=value' for a flag."""
  if culprit.startswith("--"):
    return f"{culprit}={value}"
  return f"{culprit} = {shown(value)}"


def number(culprit: str, value, low: float = -math.inf, high: float = math.inf, *,
           integer: bool = False, low_open: bool = False, high_open: bool = False,
           finite: bool = True, meaning: str = ""):
  """value, checked to be a number (an integer with integer=True; not a bool) in the
  range [low, high] (either end open as asked; infinities refused with finite=True);
  UserError naming the culprit, the value and the range otherwise."""
  kind = "an integer" if integer else "a number"
  ok = (isinstance(value, numbers.Integral if integer else numbers.Real)
        and not isinstance(value, bool))
  if ok:
    v = float(value)
    ok = not math.isnan(v) and not (finite and math.isinf(v)) and (
        v > low if low_open else v >= low) and (v < high if high_open else v <= high)
  if not ok:
    raise UserError(f"{binding(culprit, value)}: must be {kind} in "
                    f"{_range(low, high, low_open, high_open)}{meaning and f' ({meaning})'}.")
  return value


def _range(low, high, low_open, high_open) -> str:
  return (f"{'(' if low_open or math.isinf(low) else '['}{_number(low)}, "
          f"{_number(high)}{')' if high_open or math.isinf(high) else ']'}")


def one_of(culprit: str, value, choices) -> object:
  """value, checked to be one of choices; UserError listing them otherwise."""
  if value not in choices:
    raise UserError(f"{binding(culprit, value)}: must be one of "
                    f"{', '.join(shown(c) for c in choices)}.")
  return value


def input_file(culprit: str, path: str) -> str:
  """path, checked to be a file this process can read; UserError naming the flag (or
  key) and what is wrong: missing, a directory, or unreadable."""
  if not isinstance(path, str) or not path:
    raise UserError(f"{binding(culprit, path)}: give the path of a file.")
  if os.path.isdir(path):
    raise UserError(f"{binding(culprit, path)}: is a directory, not a file.")
  if not os.path.exists(path):
    raise UserError(f"{binding(culprit, path)}: no such file.")
  if not os.access(path, os.R_OK):
    raise UserError(f"{binding(culprit, path)}: this user cannot read it.")
  return path


def output_directory(culprit: str, path: str) -> str:
  """path, checked to be a directory this process can make or write in (it may not
  exist yet); UserError naming the flag and what is in the way otherwise."""
  if not isinstance(path, str) or not path:
    raise UserError(f"{binding(culprit, path)}: give the path of a directory.")
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{binding(culprit, path)}: is a file, not a directory.")
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"{binding(culprit, path)}: {parent} is a file, so no directory can be "
                    f"made below it.")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise UserError(f"{binding(culprit, path)}: {parent} is not writable by this user.")
  return path


def metric_fractions(culprit: str, items, metrics, low: float, high: float, *,
                     low_open: bool = False, high_open: bool = False,
                     example: str = "") -> dict[str, float]:
  """['metric=fraction', ...] -> {metric: fraction}, each metric one of `metrics` and each
  fraction in the range given; UserError naming the item otherwise."""
  out = {}
  for item in items:
    metric, _, text = item.partition("=")
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if metric not in metrics:
      raise UserError(f"{culprit}={item}: expected metric=fraction with metric one of "
                      f"{', '.join(sorted(metrics))}{example and f' (e.g. {example})'}.")
    try:
      out[metric] = number(culprit, value, low, high, low_open=low_open, high_open=high_open)
    except UserError:
      raise UserError(f"{culprit}={item}: the fraction must be a number in "
                      f"{_range(low, high, low_open, high_open)}.") from None
  return out


def step_range(culprit: str, value, total_steps: int | None = None) -> tuple[int, int]:
  """A pair of steps (A, B) with 1 <= A <= B (and A <= total_steps: a step the run
  trains); UserError naming culprit (--profile_steps, Experiment.profile_steps)."""
  said = binding(culprit, ",".join(str(v) for v in value) if culprit.startswith("--")
                 and isinstance(value, (tuple, list)) else value)
  pair = value if isinstance(value, (tuple, list)) and len(value) == 2 else None
  if pair is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
    raise UserError(f"{said}: give the first and last step as two integers, A,B (e.g. 5,6; "
                    f"steps count from 1).")
  first, last = pair
  if first < 1 or last < first:
    raise UserError(f"{said}: not a range of steps; give 1 <= A <= B (steps count from 1).")
  if total_steps is not None and first > total_steps:
    raise UserError(f"{said}: the run trains {total_steps} step(s), so step {first} never "
                    f"runs and no profile would be written; give A <= {total_steps}.")
  return first, last
