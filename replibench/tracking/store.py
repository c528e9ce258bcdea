"""The results history: every trial of every `make bench` and A/B, kept in the repo.

Layout (JSON Lines, one trial a line, append-only, so a merge of two branches'
histories is a merge of lines):

  results/history/<machine fingerprint>/<suite>.jsonl

Each line is a `Record`: the commit (and its committer date), the machine
fingerprint and description, the suite, configuration, seed and round, where it
came from (bench, ab), the run's status, its judged metrics and its machine
calibration. `schema` is the record format's version; a line from a newer
replibench, or one that is not a record, is a UserError naming the file and line.
"""

import dataclasses
import datetime
import json
import os
from typing import Iterable, Iterator

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
  machine: str                # fingerprint (tracking/machine.py)
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
  jit_compile: bool | None = None   # The run's XLA choice (null: recorded before it existed).
  schema: int = SCHEMA

  @property
  def series_config(self) -> str:
    """The configuration a history series is keyed on: a compiled trial's is its own."""
    return f"{self.config} [xla]" if self.jit_compile else self.config

  @property
  def converged(self) -> bool:
    return self.status == "reached" and self.metrics.get("time_to_target_s") is not None


def root(path: str | None = None) -> str:
  return path or os.environ.get(ENV_ROOT) or DEFAULT_ROOT


def _file(store: str, machine: str, suite: str) -> str:
  return os.path.join(store, machine, f"{suite}.jsonl")


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def append(records: Iterable[Record], store: str | None = None) -> int:
  """Appends records to their machine's and suite's files; returns how many."""
  by_file: dict[str, list[Record]] = {}
  for r in records:
    by_file.setdefault(_file(root(store), r.machine, r.suite), []).append(r)
  for path, rs in by_file.items():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "".join(json.dumps(dataclasses.asdict(r), sort_keys=True) + "\n" for r in rs)
    # One write of whole lines with O_APPEND: concurrent appenders never interleave a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, text.encode())
    finally:
      os.close(fd)
  return sum(map(len, by_file.values()))


def _parse(line: str, where: str) -> Record:
  try:
    raw = json.loads(line)
  except json.JSONDecodeError as e:
    raise UserError(f"{where}: not a JSON line ({e.msg}); the history store holds one "
                    f"JSON record a line. Remove or repair that line.") from None
  if not isinstance(raw, dict):
    raise UserError(f"{where}: a JSON {type(raw).__name__}, not a history record.")
  schema = raw.get("schema", 0)
  if not isinstance(schema, int) or schema > SCHEMA:
    raise UserError(f"{where}: record schema {schema!r}, newer than this replibench's "
                    f"({SCHEMA}); update replibench to read it.")
  fields = {f.name for f in dataclasses.fields(Record)}
  try:
    return Record(**{k: v for k, v in raw.items() if k in fields})
  except TypeError as e:
    raise UserError(f"{where}: not a history record ({e}).") from None


def read(store: str | None = None, machine: str | None = None,
         suite: str | None = None) -> list[Record]:
  """Every record in the store, optionally of one machine and suite."""
  return list(_iter(root(store), machine, suite))


def _iter(store: str, machine: str | None, suite: str | None) -> Iterator[Record]:
  if not os.path.isdir(store):
    return
  for m in sorted(os.listdir(store)):
    if machine is not None and m != machine or not os.path.isdir(os.path.join(store, m)):
      continue
    for name in sorted(os.listdir(os.path.join(store, m))):
      if not name.endswith(".jsonl") or suite is not None and name != f"{suite}.jsonl":
        continue
      path = os.path.join(store, m, name)
      with open(path) as f:
        for i, line in enumerate(f, 1):
          if line.strip():
            yield _parse(line, f"{path}:{i}")


def machines(store: str | None = None) -> list[str]:
  path = root(store)
  return sorted(m for m in os.listdir(path) if os.path.isdir(os.path.join(path, m))) \
      if os.path.isdir(path) else []


def newest_commit(records: list[Record], exclude: str | None = None) -> str | None:
  """The commit recorded last (by append time) other than `exclude`."""
  candidates = [r for r in records if r.commit != exclude]
  return max(candidates, key=lambda r: (r.recorded, r.commit_time)).commit if candidates else None
