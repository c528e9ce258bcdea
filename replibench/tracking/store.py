"""The results history: every trial of every `make bench` and A/B, kept in the repo.

Layout (JSON Lines, one trial a line, append-only, so a merge of two branches'
histories is a merge of lines):

  results/history/<machine fingerprint>/<suite>.jsonl

Each line is a `Record`: the commit (and its committer date), the machine
fingerprint and description, the suite, configuration, seed and round, where it
came from (bench, ab), the run's status, its judged metrics and its machine
calibration, the TensorFlow version and thread pools it ran with. `schema` is the
record format's version. Every line is validated as it is read (JSON, a record's
fields and their types, the schema version): a bad one (garbage, a record of a newer
replibench, a field of the wrong type) is skipped with a warning naming the file and
line, so one damaged line never hides the rest of the history; a directory where a
.jsonl file should be is skipped the same way.

Only trials that ran to a result are recorded (record.py): a failed trial measures
nothing, and its commit would otherwise enter the series with no value. A trial is
recorded once (`key`): appending a resumed bench or an A/B run again adds nothing.
"""

import dataclasses
import datetime
import json
import os
import re
import sys
from typing import Callable, Iterable, Iterator

from replibench import inputs
from replibench.errors import UserError

SCHEMA = 1
DEFAULT_ROOT = os.path.join("results", "history")
ENV_ROOT = "REPLIBENCH_HISTORY"   # Overrides the store's location (tests, CI).
METRICS = ("time_to_target_s", "steps_to_target", "examples_per_s", "final_metric")


@dataclasses.dataclass(frozen=True)
class Record:
  """One trial as the history keeps it."""
  commit: str                 # full sha
  commit_time: str            # committer date, ISO 8601 (orders the series)
  machine: str                # fingerprint (replibench/machine.py)
  suite: str
  config: str                 # the sweep's configuration label, e.g. 'replicas=2'
  seed: int
  status: str                 # a result.json status, or 'failed'
  metrics: dict               # {metric: value or None}, METRICS
  source: str                 # 'bench' | 'ab'
  run_id: str                 # the bench id or A/B directory it came from
  round: int = 0
  recorded: str = ""          # when it was appended, ISO 8601
  workload: str = ""
  target_metric: str = ""
  target: float | None = None
  higher_is_better: bool = True
  calibration: dict | None = None
  machine_info: dict | None = None
  tf_version: str = ""        # TensorFlow's version in the trial ('' in early records)
  side: str = ""              # an A/B's 'base' or 'head' ('' for bench and early records)
  jit_compile: bool | None = None   # The run's XLA choice (null: recorded before it existed).
  # TensorFlow's {intra_op, inter_op} pools the trial ran in (null: recorded before
  # 2026-11-28). Its calibration ran in them too, so `compare` must know them.
  thread_pools: dict | None = None
  schema: int = SCHEMA

  @property
  def series_config(self) -> str:
    """The configuration a history series is keyed on: a compiled trial's is its own."""
    return f"{self.config} [xla]" if self.jit_compile else self.config

  @property
  def converged(self) -> bool:
    return self.status == "reached" and self.metrics.get("time_to_target_s") is not None


# Each field's accepted types as JSON gives them (an int is accepted for a float).
_NUMBER = (int, float)
FIELD_TYPES = {
    "commit": str, "commit_time": str, "machine": str, "suite": str, "config": str,
    "seed": int, "status": str, "metrics": dict, "source": str, "run_id": str, "round": int,
    "recorded": str, "workload": str, "target_metric": str, "target": (*_NUMBER, type(None)),
    "higher_is_better": bool, "calibration": (dict, type(None)),
    "machine_info": (dict, type(None)), "tf_version": str, "side": str, "schema": int,
    "jit_compile": (bool, type(None)), "thread_pools": (dict, type(None))}
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
REQUIRED = tuple(f.name for f in dataclasses.fields(Record)
                 if f.default is dataclasses.MISSING)


def root(path: str | None = None) -> str:
  """The store's directory: path, else $REPLIBENCH_HISTORY, else results/history.
  A UserError naming the variable (or path) when a file stands there."""
  given = path or os.environ.get(ENV_ROOT)
  where = path or (f"{ENV_ROOT}={given}" if given else DEFAULT_ROOT)
  chosen = given or DEFAULT_ROOT
  if os.path.exists(chosen) and not os.path.isdir(chosen):
    raise UserError(f"{where}: is a file, not a directory; the history store is a directory "
                    f"of <machine>/<suite>.jsonl files. Point {ENV_ROOT} at a directory "
                    f"(or unset it for {DEFAULT_ROOT}).")
  return chosen


def _file(store: str, machine: str, suite: str) -> str:
  return os.path.join(store, machine, f"{suite}.jsonl")


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def check_writable(store: str | None = None) -> str:
  """The store's directory, checked to be one this process can make or write in (a
  UserError naming $REPLIBENCH_HISTORY or the path otherwise): before trials run."""
  path = root(store)
  given = store or os.environ.get(ENV_ROOT)
  inputs.output_directory(ENV_ROOT if given and not store else "history store", path)
  return path


def key(r: Record) -> tuple:
  """What makes a record the same trial: recording a sweep or an A/B again (a resumed
  `make bench BENCH_ID=...`, an A/B run again on its --workdir) must not count it twice."""
  return (r.commit, r.config, r.seed, r.round, r.source, r.run_id, r.side)


def append(records: Iterable[Record], store: str | None = None) -> int:
  """Appends records to their machine's and suite's files, leaving out those already
  there (`key`); returns how many it appended."""
  by_file: dict[str, list[Record]] = {}
  for r in records:
    by_file.setdefault(_file(root(store), r.machine, r.suite), []).append(r)
  for path in by_file:   # Check every target before the first write: all or nothing.
    if os.path.exists(path) and not os.path.isfile(path):
      raise UserError(f"{path}: is not a regular file, so the history cannot append to it; "
                      f"move it away.")
  appended = 0
  for path, rs in by_file.items():
    known = {key(r) for _, r in _read_file(path, lambda message: None)}
    new = list({key(r): r for r in rs if key(r) not in known}.values())
    appended += len(new)
    if not new:
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "".join(json.dumps(dataclasses.asdict(r), sort_keys=True) + "\n" for r in new)
    # One write of whole lines with O_APPEND: concurrent appenders never interleave a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, text.encode())
    finally:
      os.close(fd)
  return appended


def warn(message: str) -> None:
  print(f"replibench history: warning: {message}", file=sys.stderr)


def _type_error(raw: dict) -> str | None:
  """What is wrong with a decoded line as a record (None when it is one)."""
  missing = [k for k in REQUIRED if k not in raw]
  if missing:
    return f"missing field(s) {', '.join(missing)}"
  for key, types in FIELD_TYPES.items():
    types = types if isinstance(types, tuple) else (types,)
    value = raw.get(key)
    # bool is an int to isinstance: true/false is no seed or round.
    if key in raw and (not isinstance(value, types) or isinstance(value, bool)
                       and bool not in types):
      return f"field {key!r} is {type(value).__name__} {value!r:.40}"
  if not _SHA.fullmatch(raw["commit"]):   # It reaches git's command line: never an option.
    return f"field 'commit' is not a full commit id: {raw['commit']!r:.50}"
  bad = [k for k, v in raw["metrics"].items()
         if v is not None and (isinstance(v, bool) or not isinstance(v, _NUMBER))]
  if bad:
    return f"metric(s) {', '.join(map(repr, bad))} not a number"
  return None


def parse(line: bytes | str, where: str) -> Record:
  """One line of a .jsonl file as a Record; a UserError naming `where` otherwise."""
  try:
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    raw = json.loads(text)
  except UnicodeDecodeError:
    raise UserError(f"{where}: not UTF-8 text (binary garbage?)") from None
  except json.JSONDecodeError as e:
    raise UserError(f"{where}: not a JSON line ({e.msg})") from None
  if not isinstance(raw, dict):
    raise UserError(f"{where}: a JSON {type(raw).__name__}, not a history record")
  schema = raw.get("schema", 0)
  if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA:
    raise UserError(f"{where}: record schema {schema!r}, not one this replibench reads "
                    f"(<= {SCHEMA}; a newer replibench wrote it?)")
  problem = _type_error(raw)
  if problem:
    raise UserError(f"{where}: not a history record ({problem})")
  fields = {f.name for f in dataclasses.fields(Record)}
  return Record(**{k: v for k, v in raw.items() if k in fields})


def read(store: str | None = None, machine: str | None = None,
         suite: str | None = None, warn: Callable[[str], None] = warn) -> list[Record]:
  """Every valid record in the store, optionally of one machine and suite; each line
  that is not one is skipped with warn('FILE:LINE: why ...')."""
  return list(_iter(root(store), machine, suite, warn))


def _iter(store: str, machine: str | None, suite: str | None, warn) -> Iterator[Record]:
  if not os.path.isdir(store):
    return
  for m in sorted(os.listdir(store)):
    if machine is not None and m != machine or not os.path.isdir(os.path.join(store, m)):
      continue
    for name in sorted(os.listdir(os.path.join(store, m))):
      if not name.endswith(".jsonl") or suite is not None and name != f"{suite}.jsonl":
        continue
      path = os.path.join(store, m, name)
      if not os.path.isfile(path):
        warn(f"{path}: not a regular file (a directory?); skipped.")
        continue
      for i, record in _read_file(path, warn):
        if (record.machine, record.suite) == (m, name[:-len(".jsonl")]):
          yield record
        else:
          warn(f"{path}:{i}: a record of machine {record.machine!r} and suite "
               f"{record.suite!r} in another machine's or suite's file; line skipped.")


def _read_file(path: str, warn) -> Iterator[tuple[int, Record]]:
  """(line number, record) for the valid records of one .jsonl file (none if it does
  not exist)."""
  if not os.path.isfile(path):
    return
  with open(path, "rb") as f:   # Bytes: a line of garbage must not stop the file.
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield i, parse(line, f"{path}:{i}")
      except UserError as e:
        warn(f"{e}; line skipped (repair or remove it).")


def machines(store: str | None = None) -> list[str]:
  path = root(store)
  return sorted(m for m in os.listdir(path) if os.path.isdir(os.path.join(path, m))) \
      if os.path.isdir(path) else []


def newest_commit(records: list[Record], exclude: str | None = None,
                  main_line: list[str] | None = None) -> str | None:
  """The newest commit with records, other than `exclude`: with main_line (the main
  line's shas, oldest first), the one latest on it (records of other commits are not
  candidates); without, the one recorded last."""
  candidates = [r for r in records if r.commit != exclude]
  if main_line is not None:
    position = {sha: i for i, sha in enumerate(main_line)}
    on_line = [r for r in candidates if r.commit in position]
    return max(on_line, key=lambda r: position[r.commit]).commit if on_line else None
  return max(candidates, key=lambda r: (r.recorded, r.commit_time)).commit if candidates else None
