"""result.json: the typed record of one run, written by the harness, read by the suite.

`RunResult` is the schema (with a version); `write` and `read` are the only
code that touches the file. Its parts are typed records (Budget, Session,
Network, NoiseScale, Machine, Communication with its ModelParallel, Throughput,
Profile): frozen dataclasses read by attribute (`result.budget.total_steps`) or, as the plain
dicts of schema 1 were, by key (`result.budget["total_steps"]`; a field that schema 1
left out when it had no value is absent then).

Schema 2 writes every field of every record (null where nothing was measured).
Schema 1 (and 0: no schema_version) wrote the records as dicts that left out
what they did not measure; `read` takes them (`_from_v1`), and a result keeps
the version it was read from until it is written again. A field added to schema 2
later (`profile`) is null where absent, and an older reader ignores it. Anything
that is not such a record (bad JSON, a list, missing or mistyped required
fields, an unknown status) is a UserError naming the file.
"""

import collections.abc
import dataclasses
import json
import math
import os
import types
import typing
from typing import Any

from replibench import atomic
from replibench.errors import UserError

SCHEMA_VERSION = 2
FILE = "result.json"

REACHED, BUDGET_EXHAUSTED, DIVERGED, FAILED = "reached", "budget_exhausted", "diverged", "failed"
# A run with one of these statuses is over: running it again does nothing. A failed
# run (status failed, or no result.json) is resumed from its checkpoint.
FINAL_STATUSES = (REACHED, BUDGET_EXHAUSTED, DIVERGED)
STATUSES = FINAL_STATUSES + (FAILED,)


class Record(collections.abc.Mapping):
  """A frozen dataclass that also reads as a mapping of its fields, as schema 1's dict
  did: without the fields in LEFT_OUT that have no value (schema 1 left them out)."""

  LEFT_OUT = frozenset()

  def __getitem__(self, key: str) -> Any:
    if key not in self.__iter__():
      raise KeyError(key)
    return getattr(self, key)

  def __iter__(self):
    return iter([name for name in _names(type(self))
                 if name not in self.LEFT_OUT or getattr(self, name) is not None])

  def __len__(self) -> int:
    return sum(1 for _ in self)

  @classmethod
  def of(cls, values: dict):
    """The record of a dict that leaves out fields it has no value for (None); a dict
    in a field that holds a record becomes that record."""
    hints = typing.get_type_hints(cls)
    return cls(**{**dict.fromkeys(_optional(cls)),
                  **{k: _record_of(hints.get(k), v) for k, v in values.items()}})


def _record_of(annotation, value):
  record = _record_kind(annotation)
  return record.of(value) if record is not None and isinstance(value, dict) else value


@dataclasses.dataclass(frozen=True)
class Budget(Record):
  total_steps: int          # The run's budget.
  limit: int                # Where this session stopped (--max_steps).


@dataclasses.dataclass(frozen=True)
class Session(Record):
  """The first run or a resume: global steps, init and timed seconds."""
  start_step: int
  end_step: int
  init_s: float
  timed_s: float


@dataclasses.dataclass(frozen=True)
class Network(Record):
  """Bytes on a launched cluster's wire this session (harness/wire.py)."""
  LEFT_OUT = frozenset({"init_bytes", "bytes_on_wire_per_step", "expected_bytes_per_step",
                        "measured_over_expected"})
  rate: str
  init_bytes: int | None        # From the cluster's start to the timed run (schema 1: none).
  bytes_on_wire: int
  eval_bytes: int
  checkpoint_bytes: int
  steps: int
  bytes_on_wire_per_step: int | None
  expected_bytes_per_step: int | None
  measured_over_expected: float | None


@dataclasses.dataclass(frozen=True)
class NoiseScale(Record):
  """The simple gradient noise scale (engine/measure/noise_scale.py)."""
  LEFT_OUT = frozenset({"caveat"})
  b_simple: float | None     # None where |G|^2 came out <= 0.
  trace_sigma: float | None  # None: not finite (written as null).
  grad_sq: float | None
  per_replica_batch: int
  global_batch: int
  method: str
  caveat: str | None


@dataclasses.dataclass(frozen=True)
class Machine(Record):
  """Where the run ran (harness/provenance.py); calibration in GFLOP/s at run start."""
  cpu: str = ""
  cores: int = 0
  isa_flags: list = dataclasses.field(default_factory=list)
  accelerators: list = dataclasses.field(default_factory=list)
  accelerator_peak_memory_bytes: dict = dataclasses.field(default_factory=dict)
  calibration: dict | None = None
  malloc: str | None = None
  # TensorFlow's pool sizes, {'intra_op': n, 'inter_op': n} (Experiment.*_op_threads;
  # null in files written before they were recorded).
  threads: dict | None = None
  # replibench/machine.py's fingerprint (CPU vendor, family, model, stepping, kernel
  # flags, cores): "AMD EPYC" names a Zen 4 and a Zen 5 alike. Null in older files.
  fingerprint: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelParallel(Record):
  """A replica spanning devices (engine/model_parallel): the mesh; each axis's collectives,
  payload and wire bytes per step (engine/measure/communication.by_axis); and each of
  this process's devices' bytes, {parameters, optimizer, other, activations, total}, from
  where the variables are and what the traced step keeps there."""
  parallelism: str               # 'tensor' or 'pipeline'.
  data: int                      # D data-parallel replicas
  model: int                     # of M devices each
  micro_batches: int
  workers: int                   # Worker processes the data axis spans (0: one process).
  model_axis: dict
  data_axis: dict
  device_memory_bytes: dict      # device -> {kind: bytes}


@dataclasses.dataclass(frozen=True)
class Communication(Record):
  """The step's communication account (engine/measure/communication.py; for
  parameter-server workers engine/measure/transfers.py), per replica and step, with
  the measured step time beside the collectives' time alone."""
  LEFT_OUT = frozenset({"wire_bytes_per_replica_per_step", "wire_messages_per_replica_per_step",
                        "wire_messages_by_collective", "wire_ops_per_step_by_collective",
                        "graph_collectives_per_step", "collective_s_per_step",
                        "rpc_overhead_bytes_by_collective", "rpc_overhead_bytes_per_message",
                        "rpc_overhead_bytes_per_call_by_collective", "parameter_server",
                        "model_parallel", "note", "step_s", "collective_fraction"})
  collectives_per_step: float
  bytes_per_step: int
  by_kind: dict                                   # kind -> {count, bytes}
  # On the wire, with the ring algorithms' factors (or the ps transfers).
  wire_bytes_per_replica_per_step: int | None
  wire_messages_per_replica_per_step: float | None
  wire_messages_by_collective: dict | None
  wire_ops_per_step_by_collective: dict | None   # Collective ops (calls) a step runs.
  # What TensorFlow's graph holds, and the collectives' time alone.
  graph_collectives_per_step: float | None
  collective_s_per_step: float | None
  # Protocol bytes per message, measured on a launched cluster's link at init.
  rpc_overhead_bytes_by_collective: dict | None
  rpc_overhead_bytes_per_message: float | None
  rpc_overhead_bytes_per_call_by_collective: dict | None
  parameter_server: dict | None            # pulls, pushes, repeated_reads
  model_parallel: ModelParallel | None      # A replica spanning devices: its axes and devices.
  note: str | None
  # The measured step, and the collectives' share of it (a lower bound).
  step_s: float | None
  collective_fraction: float | None


@dataclasses.dataclass(frozen=True)
class Throughput(Record):
  """A run on synthetic data (harness/throughput.py): examples/s in all and per device,
  step time, the plan's FLOP rate and its fraction of the calibrated matmul, peak memory."""
  data: str                                 # 'synthetic'
  time_to_target: str                       # Why it is undefined.
  examples_per_s: float | None
  devices: int
  device_names: list
  examples_per_s_per_device: float | None
  step_s: float | None
  train_flops_per_example: float | None
  achieved_flops_per_s: float | None
  achieved_flops_per_s_per_device: float | None
  fraction_of_calibrated_matmul: float | None
  peak_host_memory_bytes: int
  peak_accelerator_memory_bytes: dict
  # Why examples_per_s is None (the session timed no call), with the smallest
  # --max_steps that gives one; None where it has a value (older results lack it).
  no_throughput_because: str | None = None


@dataclasses.dataclass(frozen=True)
class Profile(Record):
  """A TensorFlow profile of some training steps (`run --profile_steps`,
  harness/profiling.py); paths relative to the run's directory."""
  steps: list                    # [A, B] as asked.
  traced_steps: list | None      # [first, last] step of the calls traced this session.
  calls: int                     # Training calls traced.
  logdir: str                    # The TensorBoard logdir it went to ('.': the run's).
  trace_dir: str | None          # LOGDIR/plugins/profile/<start time>: the .xplane.pb files.
  overhead_s: float              # The profiler's start and stop (not in the timed span).


@dataclasses.dataclass
class RunResult:
  """One run's outcome. Times in seconds; curve rows are [step, timed seconds, metric]."""

  status: str
  workload: str
  target_metric: str
  target: float
  higher_is_better: bool
  final_step: int = 0
  # Time to accuracy (MLPerf: init apart, the timed span to the first evaluation that met
  # the target), and the steps, epochs and examples it took.
  time_to_target_s: float | None = None
  init_s: float | None = None
  total_s: float | None = None
  steps_to_target: int | None = None
  epochs_to_target: float | None = None
  examples_to_target: int | None = None
  final_metric: float | None = None
  final_metrics: dict | None = None       # eval name -> value, at the last evaluation
  metrics_at_target: dict | None = None   # the same, at the evaluation that met the target
  # Throughput: training calls after the first; the first apart.
  examples_per_s: float | None = None
  first_call_s: float | None = None
  # This session's XLA compilation: its first training call's seconds beyond its second
  # (the same program, compiled), left out of time_to_target_s and total_s like the
  # step's tracing (init) (harness/timed_span.py XlaCompilation). Null for a graph
  # run, a session of one call, and files from before (added within schema 2).
  xla_compile_s: float | None = None
  # The training calls after the first in windows of log_every_steps steps, this session:
  # [steps, wall seconds, process CPU seconds] each (the throughput probe's raw data).
  windows: list = dataclasses.field(default_factory=list)
  eval_s: float | None = None   # Mean seconds per evaluation (inside time_to_target_s).
  regime: dict = dataclasses.field(default_factory=dict)           # The regime's settings.
  regime_metrics: dict = dataclasses.field(default_factory=dict)   # 'regime/...' -> run mean
  communication: Communication | None = None
  network: Network | None = None   # Bytes on the wire, in a launched cluster.
  noise_scale: NoiseScale | None = None
  budget: Budget | None = None
  curve: list = dataclasses.field(default_factory=list)
  # What ran: where, at which batch, grouped how (TensorBoard's HParams, the suite).
  topology: str = ""
  scaling_kind: str = "unknown"
  num_workers: int = 1
  num_replicas: int = 1
  global_batch_size: int = 0
  seed: int = 0
  hparams: dict = dataclasses.field(default_factory=dict)
  # Experiment.jit_compile as the run resolved it (XLA around the exchange); null in
  # files written before the choice existed, whose steps ran as graphs. Added within
  # schema 2 (readers ignore fields they do not know, so older ones read these files).
  jit_compile: bool | None = None
  sessions: list[Session] = dataclasses.field(default_factory=list)
  resumed: int = 0
  # The scheduler that placed the run's tasks (cluster.scheduler_record): SLURM's
  # {name: slurm, job_id, array_task_id, nodes, tasks_per_node, distribution,
  # gpus_per_task} or a Kubernetes pod's {name: kubernetes, pod, index}; null for a run
  # started by hand or by `launch`, and in older files (added within schema 2).
  scheduler: dict | None = None
  operative_config: str = ""
  git_sha: str = ""
  tf_version: str = ""
  machine: Machine | None = None
  throughput: Throughput | None = None   # On synthetic data, where time to target is undefined.
  # Where `run --profile_steps` wrote its profile (absent before it existed: null).
  profile: Profile | None = None
  error: str | None = None
  schema_version: int = SCHEMA_VERSION

  def __post_init__(self):
    # Records given as dicts (as schema 1 held them) become records.
    for name, record in _records().items():
      if isinstance(getattr(self, name), dict):
        setattr(self, name, record.of(getattr(self, name)))
    self.sessions = [Session(**s) if isinstance(s, dict) else s for s in self.sessions]

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
    """Validates data (a parsed result.json, of any schema version); UserError naming
    source if it is not one."""
    if not isinstance(data, dict):
      raise UserError(f"{source} holds a JSON {type(data).__name__}, not a run result "
                      f"(an object written by `replibench run`).")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
      raise UserError(f"{source} has schema_version {version!r}; this replibench reads up "
                      f"to {SCHEMA_VERSION}. Upgrade replibench to read it.")
    names = _names(cls)
    result = _build(cls, {k: v for k, v in (_from_v1(data) if version < 2 else data).items()
                          if k in names}, source, "")
    if result.status not in STATUSES:
      raise UserError(f"{source}: status {result.status!r} is not one of "
                      f"{', '.join(STATUSES)}.")
    return dataclasses.replace(result, schema_version=version)


def _from_v1(data: dict) -> dict:
  """A schema 0/1 result as schema 2 reads it: its records' absent fields are null, an
  empty budget or machine (a result made without one) is none, and the noise scale's
  per-replica batch (a float then) is an integer."""
  data = dict(data)
  for name, record in _records().items():
    value = data.get(name)
    if value == {}:
      data[name] = None
    elif isinstance(value, dict):
      data[name] = {**dict.fromkeys(_optional(record)), **value}
  noise = data.get("noise_scale")
  if isinstance(noise, dict) and isinstance(noise.get("per_replica_batch"), float):
    data["noise_scale"] = {**noise, "per_replica_batch": int(noise["per_replica_batch"])}
  return data


def _records() -> dict:
  """{RunResult field: its Record class} for the fields that hold one record."""
  return {name: kind for name, hint in typing.get_type_hints(RunResult).items()
          for kind in _kinds(hint) if isinstance(kind, type) and issubclass(kind, Record)}


def _optional(cls) -> list[str]:
  """The fields of cls that may be None."""
  return [name for name, hint in typing.get_type_hints(cls).items()
          if type(None) in _kinds(hint)]


def _names(cls) -> tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(cls))


def _kinds(annotation) -> tuple:
  """The runtime types an annotation allows (int | None -> (int, NoneType); list[X] -> list)."""
  args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
  return tuple(typing.get_origin(a) or a for a in (args or (annotation,)))


def _record_kind(annotation) -> type | None:
  """The Record class an annotation holds (ModelParallel | None -> ModelParallel), or None."""
  return next((k for k in _kinds(annotation) if isinstance(k, type) and issubclass(k, Record)),
              None)


def _value(annotation, value, source: str, where: str):
  """value, checked against annotation; a dict for a Record becomes the record."""
  kinds = _kinds(annotation)
  record = _record_kind(annotation)
  if record is not None and isinstance(value, dict):
    return _build(record, value, source, where)
  item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
  if isinstance(item, type) and issubclass(item, Record) and isinstance(value, list):
    return [_value(item, v, source, f"{where}[{i}]") for i, v in enumerate(value)]
  numbers = (int,) if float in kinds else ()
  ok = (isinstance(value, kinds + numbers)
        and (not isinstance(value, bool) or bool in kinds)
        and (value is not None or type(None) in kinds))
  if not ok:
    raise UserError(f"{source}: field {where!r} is {value!r} ({type(value).__name__}), which "
                    f"is not what `replibench run` writes there.")
  return value


def _build(cls, data: Any, source: str, where: str = ""):
  """cls (RunResult or a Record) from a parsed object: unknown keys are ignored (a
  newer writer's), missing required ones are an error, every value is type-checked."""
  prefix = f"{where}." if where else ""
  if not isinstance(data, dict):
    raise UserError(f"{source}: field {where!r} is {data!r}, not an object.")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  hints = typing.get_type_hints(cls)
  # A field that may be null and is absent was added after its writer's version (a
  # schema-2 file from before model parallelism has no communication.model_parallel):
  # null, as that writer would have written it. Any other absent field is an error.
  absent = [n for n, f in fields.items() if n not in data
            and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  missing = [n for n in absent if type(None) not in _kinds(hints[n])]
  if missing:
    raise UserError(f"{source} lacks the field(s) {', '.join(prefix + m for m in missing)}; "
                    f"it was not written by `replibench run` or by an incompatible version.")
  return cls(**dict.fromkeys(absent),
             **{name: _value(hints[name], value, source, prefix + name)
                for name, value in data.items() if name in fields})


def configuration(hparams: dict) -> dict:
  """A run's hparams without its seed: what names its configuration. Runs that differ
  only in seed are one configuration: one row of a report, one session group (its
  seeds the sessions) in TensorBoard's HParams table."""
  return {k: v for k, v in hparams.items() if k != "seed"}


def path_in(directory: str) -> str:
  return os.path.join(directory, FILE)


def write(directory: str, result: RunResult) -> None:
  """Writes directory/result.json atomically (a reader never sees half of it), in the
  current schema (whichever version the result was read from)."""
  atomic.write_json(path_in(directory),
                    _finite({**result.to_dict(), "schema_version": SCHEMA_VERSION}))


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
