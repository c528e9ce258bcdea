"""The sweep file: a TOML description of a grid of trials beside the gin files.

Format (TOML, stdlib tomllib; relative paths are relative to the sweep file):

  gin_files = ["fashion_mnist.gin"]   # base configs, parsed first
  bindings = ["EVAL_EVERY = 1"]        # applied to every trial (optional)
  seeds = [1, 2, 3]
  seed_binding = "SEED"                # each trial gets `SEED = <seed>`
  judge = ["converged", "examples_per_s"]   # what `compare` decides on (optional;
                                       # default all); the rest is reported only

  [[axes]]                             # a zipped axis: each point moves
  name = "setup"                       # several things together
  points = [
    {label = "replicas=1", gin_files = ["../topology/local1.gin"]},
    {label = "workers=2", gin_files = ["../topology/workers.gin"], workers = 2},
  ]

  # (TOML inline tables must fit on one line; for longer points write them as
  # [[axes.points]] tables, as configs/resnet/scaling.sweep does.)

  [[axes]]                             # a grid axis over one gin binding
  name = "batch"
  binding = "GLOBAL_BATCH_SIZE"
  values = [256, 512]

Trials are the product of the axes times the seeds. A point may carry
`gin_files`, `bindings`, and a launch mode: without `workers` the trial runs in
one process (logical replicas); with `workers = N` (and optionally
`cpus_per_worker`) it runs as N worker processes through `replibench launch`,
and the sweep binds topology.MultiWorker.workers = N so each run checks it;
`ps = P` adds a chief and P parameter servers (for Experiment.regime =
@regimes.AsyncPS(), e.g. with configs/topology/ps.gin). `network = "100mbit"`
(tc's units, or "none") runs the launched cluster on a link of that rate
(`launch --network`); it may sit on a point of its own axis, to cross rates with
topologies, and needs a point with `workers` in the same trial.
A trial's directory is `<label>,<label>/seed=<seed>`, e.g.
`replicas=2,batch=256/seed=1`.
"""

import dataclasses
import itertools
import os
import re
import tomllib
from typing import Any, Sequence

from replibench import inputs, rates
from replibench.errors import UserError
from replibench.suite import aggregate

_TOP_KEYS = {"description", "gin_files", "bindings", "seeds", "seed_binding", "axes", "judge"}
_AXIS_KEYS = {"name", "binding", "values", "points"}
_WORKERS_BINDING = "topology.MultiWorker.workers"
_POINT_KEYS = {"label", "gin_files", "bindings", "workers", "cpus_per_worker", "ps", "network"}
# Labels become directory names and TensorBoard run names: keep them portable.
_LABEL_RE = re.compile(r"^[A-Za-z0-9_.=+-]+$")


@dataclasses.dataclass(frozen=True)
class Launch:
  """How a trial's processes map to the machine.

  workers == 0 means one process with in-process (logical) replicas; workers >= 1
  means that many worker processes started by `replibench launch`.
  cpus_per_worker None lets the runner split the machine's cores evenly; 0
  leaves the processes unpinned. ps > 0 adds a chief and ps parameter servers.
  network: the link's rate (`launch --network`).
  """
  workers: int = 0
  cpus_per_worker: int | None = None
  ps: int = 0
  network: str = "none"

  def to_dict(self) -> dict:
    # Without an unlimited network's key, trials started before the key existed resume.
    return {k: v for k, v in dataclasses.asdict(self).items()
            if not (k == "network" and v == "none")}


@dataclasses.dataclass(frozen=True)
class Point:
  """One value of an axis: a label plus what it adds to a trial."""
  label: str
  gin_files: tuple[str, ...] = ()
  bindings: tuple[str, ...] = ()
  launch: Launch | None = None
  network: str | None = None


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A parsed sweep file; gin file paths are absolute."""
  path: str
  gin_files: tuple[str, ...]
  bindings: tuple[str, ...]
  seeds: tuple[int, ...]
  seed_binding: str
  axes: tuple[tuple[Point, ...], ...]
  description: str = ""
  judge: tuple[str, ...] | None = None   # None: compare judges every metric.


@dataclasses.dataclass(frozen=True)
class Trial:
  """One run of the sweep: a configuration (everything but the seed) and a seed."""
  config: str
  seed: int
  gin_files: tuple[str, ...]
  bindings: tuple[str, ...]
  launch: Launch

  @property
  def name(self) -> str:
    """The trial's stable directory name relative to the sweep root."""
    return f"{self.config}/seed={self.seed}"

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "config": self.config, "seed": self.seed,
            "gin_files": list(self.gin_files), "bindings": list(self.bindings),
            "launch": self.launch.to_dict()}


def _fail(path: str, key: str, problem: str) -> UserError:
  return UserError(f"Sweep file {path}: key '{key}' {problem}")


def _check_keys(path: str, where: str, table: Any, allowed: set[str]) -> dict:
  if not isinstance(table, dict):
    raise _fail(path, where, f"must be a table, got {type(table).__name__}.")
  for key in table:
    if key not in allowed:
      name = f"{where}.{key}" if where else key
      raise _fail(path, name, f"is not a sweep file key; allowed here: "
                  f"{', '.join(sorted(allowed))}.")
  return table


def _string_list(path: str, key: str, value: Any) -> tuple[str, ...]:
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise _fail(path, key, f"must be a list of strings, got {value!r}.")
  return tuple(value)


def _gin_paths(path: str, key: str, value: Any) -> tuple[str, ...]:
  """Resolves gin files against the sweep file's directory and checks they exist."""
  base = os.path.dirname(os.path.abspath(path))
  files = []
  for name in _string_list(path, key, value):
    full = os.path.normpath(os.path.join(base, name))
    if not os.path.isfile(full):
      what = "is a directory, not a gin file" if os.path.isdir(full) else "does not exist"
      raise _fail(path, key, f"names gin file {name!r}, which {what} "
                  f"(looked for {full}; paths are relative to the sweep file).")
    files.append(full)
  return tuple(files)


def _positive_int(path: str, key: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise _fail(path, key, f"must be a positive integer, got {value!r}.")
  return value


def _label(path: str, key: str, value: Any) -> str:
  if not isinstance(value, str) or not _LABEL_RE.match(value):
    raise _fail(path, key, f"must be a non-empty string of letters, digits and "
                f"'_.=+-' (it names the trial directory), got {value!r}.")
  return value


def gin_literal(value: Any) -> str:
  """Formats a TOML value as the right-hand side of a gin binding.

  Strings starting with '@' or '%' are gin references/macros and pass through.
  """
  if isinstance(value, bool):
    return "True" if value else "False"
  if isinstance(value, str) and value[:1] in ("@", "%"):
    return value
  if isinstance(value, (int, float, str)):
    return repr(value)
  raise TypeError(value)


def _grid_axis(path: str, where: str, name: str, axis: dict) -> tuple[Point, ...]:
  binding = axis["binding"]
  if not isinstance(binding, str) or not binding.strip():
    raise _fail(path, f"{where}.binding", f"must be a gin parameter name, got {binding!r}.")
  values = axis.get("values")
  if not isinstance(values, list) or not values:
    raise _fail(path, f"{where}.values", f"must be a non-empty list, got {values!r}.")
  points = []
  for i, value in enumerate(values):
    if not isinstance(value, (bool, int, float, str)):
      raise _fail(path, f"{where}.values[{i}]",
                  f"must be a number, string or boolean, got {value!r}.")
    label = _label(path, f"{where}.values[{i}]", f"{name}={value}")
    points.append(Point(label, bindings=(f"{binding} = {gin_literal(value)}",)))
  return tuple(points)


def _zipped_point(path: str, where: str, point: Any) -> Point:
  _check_keys(path, where, point, _POINT_KEYS)
  if "label" not in point:
    raise _fail(path, f"{where}.label", "is missing: every point needs a label.")
  launch = None
  if "workers" in point:
    cpus = point.get("cpus_per_worker")
    ps = point.get("ps", 0)
    launch = Launch(
        _positive_int(path, f"{where}.workers", point["workers"]),
        cpus if cpus in (None, 0) else _positive_int(path, f"{where}.cpus_per_worker", cpus),
        ps if ps == 0 else _positive_int(path, f"{where}.ps", ps))
  elif "cpus_per_worker" in point or "ps" in point:
    raise _fail(path, f"{where}.cpus_per_worker / ps", "need 'workers' in the same point.")
  bindings = _string_list(path, f"{where}.bindings", point.get("bindings", []))
  if any(b.replace(" ", "").startswith(_WORKERS_BINDING + "=") for b in bindings):
    raise _fail(path, f"{where}.bindings", f"binds {_WORKERS_BINDING}: state a point's worker "
                "count once, as `workers = N` (the sweep binds it for each trial).")
  if launch is not None:   # One source of truth: the launch's count, checked by each run.
    bindings = (*bindings, f"{_WORKERS_BINDING} = {launch.workers}")
  network = point.get("network")
  if network is not None:
    rates.check(f"Sweep file {path}: key '{where}.network'", network)
  return Point(
      label=_label(path, f"{where}.label", point["label"]),
      gin_files=_gin_paths(path, f"{where}.gin_files", point.get("gin_files", [])),
      bindings=bindings,
      launch=launch, network=network)


def _axis(path: str, index: int, axis: Any) -> tuple[Point, ...]:
  where = f"axes[{index}]"
  _check_keys(path, where, axis, _AXIS_KEYS)
  name = _label(path, f"{where}.name", axis.get("name"))
  if ("binding" in axis) == ("points" in axis):
    raise _fail(path, where, "needs exactly one of 'binding' (with 'values', a grid "
                "axis) or 'points' (a zipped axis).")
  if "binding" in axis:
    points = _grid_axis(path, where, name, axis)
  else:
    if "values" in axis:
      raise _fail(path, f"{where}.values", "belongs to grid axes; this axis has 'points'.")
    raw = axis["points"]
    if not isinstance(raw, list) or not raw:
      raise _fail(path, f"{where}.points", f"must be a non-empty list of tables, got {raw!r}.")
    points = tuple(_zipped_point(path, f"{where}.points[{i}]", p) for i, p in enumerate(raw))
  labels = [p.label for p in points]
  if len(set(labels)) != len(labels):
    raise _fail(path, where, f"has repeated labels {labels}; each must be unique.")
  return points


def _seeds(path: str, value: Any) -> tuple[int, ...]:
  if (not isinstance(value, list) or not value
      or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
    raise _fail(path, "seeds", f"must be a non-empty list of integers, got {value!r}.")
  if len(set(value)) != len(value):
    raise _fail(path, "seeds", f"has repeated seeds {value}.")
  return tuple(value)


def _judge(path: str, value: Any) -> tuple[str, ...] | None:
  if value is None:
    return None
  names = _string_list(path, "judge", value)
  unknown = [n for n in names if n not in aggregate.JUDGEABLE]
  if unknown or not names:
    raise _fail(path, "judge", f"must list some of {', '.join(aggregate.JUDGEABLE)}; got "
                f"{value!r}.")
  return names


def load(path: str) -> Sweep:
  """Parses and validates a sweep file; errors are UserErrors naming file and key."""
  try:
    with open(path, "rb") as f:
      raw = tomllib.loads(f.read().decode("utf-8"))
  except FileNotFoundError:
    raise UserError(f"Sweep file {path} does not exist.") from None
  except IsADirectoryError:
    raise UserError(f"Sweep file {path} is a directory; give the .sweep file.") from None
  except UnicodeDecodeError:
    raise UserError(f"Sweep file {path} is not UTF-8 text (a binary file?); sweep files "
                    f"are TOML.") from None
  except OSError as e:
    raise UserError(f"Sweep file {path} cannot be read ({e.strerror}).") from None
  except tomllib.TOMLDecodeError as e:
    raise UserError(f"Sweep file {path} is not valid TOML: {e}.") from None
  _check_keys(path, "", raw, _TOP_KEYS)
  for key in ("gin_files", "seeds", "seed_binding"):
    if key not in raw:
      raise _fail(path, key, "is missing.")
  seed_binding = raw["seed_binding"]
  if not isinstance(seed_binding, str) or not seed_binding.strip():
    raise _fail(path, "seed_binding", f"must name a gin parameter, got {seed_binding!r}.")
  axes = raw.get("axes", [])
  if not isinstance(axes, list):
    raise _fail(path, "axes", "must be an array of tables ([[axes]]).")
  description = raw.get("description", "")
  if not isinstance(description, str):
    raise _fail(path, "description", "must be a string.")
  return Sweep(
      path=path,
      gin_files=_gin_paths(path, "gin_files", raw["gin_files"]),
      bindings=_string_list(path, "bindings", raw.get("bindings", [])),
      seeds=_seeds(path, raw["seeds"]),
      seed_binding=seed_binding.strip(),
      axes=tuple(_axis(path, i, a) for i, a in enumerate(axes)),
      description=description, judge=_judge(path, raw.get("judge")))


def _dedupe(paths: Sequence[str]) -> tuple[str, ...]:
  return tuple(dict.fromkeys(os.path.abspath(p) for p in paths))


def expand(sweep: Sweep, extra_gin_files: Sequence[str] = (),
           seeds: Sequence[int] | None = None,
           extra_bindings: Sequence[str] = ()) -> list[Trial]:
  """The sweep's trials, seed-major (every configuration at seed 1 first).

  Seed-major order means an interrupted sweep already covers every
  configuration. Gin files come in the order: sweep base files, extra files
  (e.g. from the command line), then each axis point's files; bindings after:
  the sweep's, the point's, the extra ones (e.g. `include 'configs/resnet/smoke.gin'`
  to shrink every trial), then the seed.
  """
  for f in extra_gin_files:
    inputs.input_file("--gin_file", f)
  seeds = tuple(seeds) if seeds else sweep.seeds
  trials = []
  for seed in seeds:
    for combo in itertools.product(*sweep.axes):
      launch = _combined_launch(sweep.path, combo)
      trials.append(Trial(
          config=",".join(p.label for p in combo) or "default",
          seed=seed,
          gin_files=_dedupe([*sweep.gin_files, *extra_gin_files,
                             *(f for p in combo for f in p.gin_files)]),
          bindings=(*sweep.bindings, *(b for p in combo for b in p.bindings),
                    *extra_bindings, f"{sweep.seed_binding} = {seed}"),
          launch=launch))
  return trials


def _combined_launch(path: str, combo: Sequence[Point]) -> Launch:
  """The launch of a trial made of these points: one sets `workers`, one may set `network`."""
  labels = [p.label for p in combo]
  launches = [p.launch for p in combo if p.launch is not None]
  networks = [p.network for p in combo if p.network is not None]
  if len(launches) > 1 or len(networks) > 1:
    raise UserError(f"Sweep file {path}: points {labels} combine into one trial but more "
                    f"than one sets {'workers' if len(launches) > 1 else 'network'}.")
  launch = launches[0] if launches else Launch()
  if networks and not launch.workers:
    raise UserError(f"Sweep file {path}: points {labels} set network = {networks[0]!r} "
                    f"without `workers`: only a launched cluster runs on an emulated link.")
  return dataclasses.replace(launch, network=networks[0]) if networks else launch
