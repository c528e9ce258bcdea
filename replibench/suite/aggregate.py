"""Aggregating a sweep's trials into per-configuration rows.

A configuration is everything but the seed: trials `<config>/seed=<s>` share a
row. Time-to-target follows MLPerf: with 5 or more converged seeds the score is
the olympic mean (drop the fastest and the slowest, average the rest); with
fewer it is the plain mean with its standard deviation. Seeds that never
reached the target are counted (k/n converged) but left out of time statistics.
"""

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from replibench import results
from replibench.results import RunResult

OLYMPIC_MIN_SEEDS = 5  # MLPerf: at least 5 runs, drop fastest and slowest.

# What a sweep file's `judge` may list: convergence (k/n seeds reaching the target)
# and the per-seed metrics compared against a baseline.
METRICS = ("time_to_target_s", "steps_to_target", "examples_per_s", "final_metric")
JUDGEABLE = ("converged", *METRICS)

# What each scaling kind measures, for tables and plot legends.
SCALING_KINDS = {
    "logical_replicas": "logical replicas in one process, sharing the cores",
    "worker_processes": "worker processes, pinned if cpus_per_worker is set",
    "tpu": "TPU cores",
}


@dataclasses.dataclass
class Stats:
  """Summary of one metric over seeds. std is the sample std (ddof=1) of the values
  the score used (for an olympic mean: without the fastest and slowest), 0 for n=1."""
  n: int
  mean: float
  std: float
  min: float
  max: float
  method: str = "mean"   # "olympic" or "mean"


def mean_stats(values: Sequence[float | None]) -> Stats | None:
  """Mean and std of the values that are not None (None when there are none)."""
  xs = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
  if xs.size == 0:
    return None
  std = float(xs.std(ddof=1)) if xs.size > 1 else 0.0
  return Stats(int(xs.size), float(xs.mean()), std, float(xs.min()), float(xs.max()))


def time_stats(values: Sequence[float | None]) -> Stats | None:
  """MLPerf-style score of time-to-target over seeds; None marks a seed that did not converge."""
  xs = sorted(v for v in values if v is not None and math.isfinite(v))
  if len(xs) < OLYMPIC_MIN_SEEDS:
    return mean_stats(xs)
  kept = np.array(xs[1:-1], dtype=np.float64)
  return Stats(len(xs), float(kept.mean()), float(kept.std(ddof=1)), xs[0], xs[-1], "olympic")


@dataclasses.dataclass
class SeedRun:
  """One trial's numbers, copied from its result.json."""
  seed: int
  status: str
  trial: str                              # trial dir relative to the sweep dir
  time_to_target_s: float | None
  steps_to_target: int | None
  epochs_to_target: float | None
  examples_per_s: float | None
  final_metric: float | None
  total_s: float | None
  curve: list[list[float]]                # [[step, seconds_since_run_start, metric], ...]
  bytes_per_step: float | None = None     # the regime's bytes sent per replica and step
  wire_bytes_per_step: float | None = None   # measured on a launched cluster's wire, per worker

  @property
  def converged(self) -> bool:
    return self.status == results.REACHED and self.time_to_target_s is not None


@dataclasses.dataclass
class ConfigRow:
  """One configuration aggregated over its seeds."""
  config: str
  scaling_kind: str
  topology: str
  num_replicas: int
  num_workers: int
  global_batch_size: int
  seeds: list[SeedRun]
  time_to_target_s: Stats | None = None
  steps_to_target: Stats | None = None
  epochs_to_target: Stats | None = None
  examples_per_s: Stats | None = None
  final_metric: Stats | None = None
  bytes_per_step: Stats | None = None
  wire_bytes_per_step: Stats | None = None
  reference: str | None = None            # the 1-replica config of the same kind
  efficiency: float | None = None         # throughput_N / (N * throughput_1)
  speedup: float | None = None            # time_to_target_1 / time_to_target_N
  hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
  operative_config: str = ""
  git_sha: str = ""

  @property
  def n(self) -> int:
    return len(self.seeds)

  @property
  def converged(self) -> int:
    return sum(s.converged for s in self.seeds)


def seed_run(trial: str, result: RunResult) -> SeedRun:
  return SeedRun(
      seed=result.seed, status=result.status, trial=trial,
      time_to_target_s=result.time_to_target_s if result.converged else None,
      steps_to_target=result.steps_to_target, epochs_to_target=result.epochs_to_target,
      examples_per_s=result.examples_per_s, final_metric=result.final_metric,
      total_s=result.total_s, curve=[list(p) for p in result.curve],
      bytes_per_step=result.regime_metrics.get("regime/bytes_communicated"),
      wire_bytes_per_step=_wire_bytes_per_worker(result))


def _wire_bytes_per_worker(result: RunResult) -> float | None:
  """The cluster's measured bytes on the wire per step, per worker task."""
  per_step = result.network.bytes_on_wire_per_step if result.network else None
  return None if per_step is None else per_step / max(result.num_workers, 1)


def summarize(row: ConfigRow) -> None:
  """Fills the row's statistics from its seeds."""
  converged = [s for s in row.seeds if s.converged]
  finished = [s for s in row.seeds if s.status != results.FAILED]
  row.time_to_target_s = time_stats([s.time_to_target_s for s in converged])
  row.steps_to_target = mean_stats([s.steps_to_target for s in converged])
  row.epochs_to_target = mean_stats([s.epochs_to_target for s in converged])
  row.examples_per_s = mean_stats([s.examples_per_s for s in finished])
  row.final_metric = mean_stats([s.final_metric for s in finished])
  row.bytes_per_step = mean_stats([s.bytes_per_step for s in finished])
  row.wire_bytes_per_step = mean_stats([s.wire_bytes_per_step for s in finished])


def _reference(row: ConfigRow, rows: Sequence[ConfigRow]) -> ConfigRow | None:
  """The 1-replica row of the same scaling kind; with several, the one whose
  global batch matches, else whose per-replica batch matches."""
  ones = [r for r in rows if r.scaling_kind == row.scaling_kind and r.num_replicas == 1]
  for same in (lambda r: r.global_batch_size == row.global_batch_size,
               lambda r: r.global_batch_size * row.num_replicas == row.global_batch_size):
    matches = [r for r in ones if same(r)]
    if matches:
      return matches[0]
  return ones[0] if len(ones) == 1 else None


def add_scaling(rows: Sequence[ConfigRow]) -> None:
  """Sets reference, efficiency and speed-up on every row that has a reference."""
  for row in rows:
    ref = _reference(row, rows)
    if ref is None:
      continue
    row.reference = ref.config
    if row.examples_per_s and ref.examples_per_s and ref.examples_per_s.mean > 0:
      row.efficiency = row.examples_per_s.mean / (row.num_replicas * ref.examples_per_s.mean)
    if row.time_to_target_s and ref.time_to_target_s and row.time_to_target_s.mean > 0:
      row.speedup = ref.time_to_target_s.mean / row.time_to_target_s.mean


def _stats_or_none(d: dict | None) -> Stats | None:
  return Stats(**d) if d else None


def row_from_dict(d: dict[str, Any]) -> ConfigRow:
  """Inverse of dataclasses.asdict for a ConfigRow read from report.json."""
  fields = {f.name for f in dataclasses.fields(ConfigRow)}
  d = {k: v for k, v in d.items() if k in fields}
  d["seeds"] = [SeedRun(**s) for s in d["seeds"]]
  for key in ("time_to_target_s", "steps_to_target", "epochs_to_target",
              "examples_per_s", "final_metric", "bytes_per_step", "wire_bytes_per_step"):
    d[key] = _stats_or_none(d.get(key))
  return ConfigRow(**d)
