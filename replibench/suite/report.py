"""The sweep report: a table per configuration, report.json, report.md and plots.

`build_report(sweep_dir)` reads every trial's result.json; `write_report(report,
out_dir)` writes report.json (the format `compare` takes as a baseline: it keeps
every seed's numbers, the operative config, git sha, TF version and machine),
report.md and the PNG plots, each file atomically.
"""

import dataclasses
import datetime
import json
import os
from typing import Any

import numpy as np

from replibench.errors import UserError
from replibench.suite import aggregate
from replibench import atomic
from replibench.suite import results
from replibench.results import RunResult, configuration
from replibench.suite.aggregate import ConfigRow, Stats

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
FORMAT_VERSION = 1


@dataclasses.dataclass
class Report:
  workload: str
  target_metric: str
  target: float
  higher_is_better: bool
  configs: list[ConfigRow]
  git_shas: list[str] = dataclasses.field(default_factory=list)
  tf_versions: list[str] = dataclasses.field(default_factory=list)
  machine: dict[str, Any] = dataclasses.field(default_factory=dict)
  # Median over the trials of each calibration figure (GFLOP/s at run start).
  calibration: dict[str, float] | None = None
  # The distinct TensorFlow thread pools the trials ran (and calibrated) in,
  # [{'intra_op': n, 'inter_op': n}, ...]; None where no trial recorded them.
  thread_pools: list[dict] | None = None
  # The metrics `compare` judges (the sweep file's `judge`); None: all of them.
  judged: list[str] | None = None
  sweep_dir: str = ""
  created: str = ""
  warnings: list[str] = dataclasses.field(default_factory=list)
  format_version: int = FORMAT_VERSION

  def config(self, name: str) -> ConfigRow | None:
    return next((c for c in self.configs if c.config == name), None)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any], source: str = "report") -> "Report":
    if not isinstance(d, dict):
      raise UserError(f"{source} holds a JSON {type(d).__name__}, not a replibench report; "
                      f"make one with `replibench report` on a sweep directory.")
    try:
      fields = {f.name for f in dataclasses.fields(cls)}
      d = {k: v for k, v in d.items() if k in fields}
      d["configs"] = [aggregate.row_from_dict(c) for c in d["configs"]]
      return cls(**d)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
      raise UserError(f"{source} is not a replibench report.json ({type(e).__name__}: {e}); "
                      f"make one with `replibench report` on a sweep directory.") from None


def load_report(path: str) -> Report:
  """Reads a report.json (a sweep's report, or a results/<workload>/baseline.json)."""
  try:
    with open(path, "rb") as f:
      data = json.loads(f.read().decode("utf-8"))
  except FileNotFoundError:
    raise UserError(f"{path}: no such report file.") from None
  except IsADirectoryError:
    raise UserError(f"{path} is a directory; give its report.json.") from None
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path} is not a JSON report ({type(e).__name__}: {e}).") from None
  return Report.from_dict(data, path)


def config_name(trial: str) -> str:
  """The configuration part of a trial dir: `a=1,b=2/seed=3` -> `a=1,b=2`."""
  head, tail = os.path.split(trial)
  return head if tail.startswith("seed=") and head else trial


def _one(found: list[tuple[str, RunResult]], key: str, sweep_dir: str) -> Any:
  values = {json.dumps(getattr(r, key)) for _, r in found}
  if len(values) > 1:
    raise UserError(f"{sweep_dir} mixes trials with different {key} "
                    f"({', '.join(sorted(values))}); report one workload per sweep directory.")
  return getattr(found[0][1], key)


def _seed_warnings(found: list[tuple[str, RunResult]]) -> list[str]:
  """Trials whose recorded seed is not the one their directory names: the sweep's
  seed_binding probably does not reach the harness, so 'seeds' are repeats."""
  out = []
  for trial, result in found:
    tail = os.path.basename(trial)
    if tail.startswith("seed=") and tail[5:] != str(result.seed):
      out.append(f"{trial}/result.json records seed {result.seed!r}, not {tail[5:]}: "
                 f"check the sweep file's seed_binding.")
  return out


def _row(name: str, trials: list[tuple[str, RunResult]]) -> ConfigRow:
  first = trials[0][1]
  seeds = sorted((aggregate.seed_run(t, r) for t, r in trials), key=lambda s: s.seed)
  hparams = configuration(first.hparams)
  row = ConfigRow(
      config=name, scaling_kind=first.scaling_kind, topology=first.topology,
      num_replicas=first.num_replicas, num_workers=first.num_workers,
      global_batch_size=first.global_batch_size, seeds=seeds, hparams=hparams,
      operative_config=first.operative_config, git_sha=first.git_sha)
  aggregate.summarize(row)
  return row


def _calibration(found: list[tuple[str, RunResult]]) -> dict[str, float] | None:
  """Per-key median of the trials' calibrations (None if no trial recorded one)."""
  values: dict[str, list[float]] = {}
  for _, result in found:
    for key, value in ((result.machine or {}).get("calibration") or {}).items():
      values.setdefault(key, []).append(float(value))
  return {k: float(np.median(v)) for k, v in values.items()} or None


def _thread_pools(found: list[tuple[str, RunResult]]) -> list[dict] | None:
  """The distinct machine.threads of the trials, sorted (None if no trial recorded one)."""
  return distinct_pools((r.machine or {}).get("threads") for _, r in found)


def distinct_pools(pools) -> list[dict] | None:
  """The distinct {intra_op, inter_op} dicts among pools (None entries skipped), sorted;
  None if there are none."""
  found = {tuple(sorted(p.items())) for p in pools if p}
  return [dict(p) for p in sorted(found)] or None


def _judged(sweep_dir: str) -> list[str] | None:
  """The sweep file's `judge` list, as `replibench sweep` recorded it in sweep.json."""
  manifest = atomic.read_json(os.path.join(sweep_dir, results.MANIFEST_FILE), {}) or {}
  return manifest.get("judge")


def build_report(sweep_dir: str) -> Report:
  """Aggregates every result.json under sweep_dir into a Report."""
  found = results.find_results(sweep_dir)
  if not found:
    raise UserError(f"{sweep_dir} holds no result.json: run `replibench sweep` on it first.")
  by_config: dict[str, list[tuple[str, RunResult]]] = {}
  for trial, result in found:
    by_config.setdefault(config_name(trial), []).append((trial, result))
  rows = [_row(name, trials) for name, trials in by_config.items()]
  rows.sort(key=lambda r: (r.scaling_kind, r.num_replicas, r.global_batch_size, r.config))
  aggregate.add_scaling(rows)
  return Report(
      workload=_one(found, "workload", sweep_dir),
      target_metric=_one(found, "target_metric", sweep_dir),
      target=_one(found, "target", sweep_dir),
      higher_is_better=_one(found, "higher_is_better", sweep_dir),
      configs=rows,
      git_shas=sorted({r.git_sha for _, r in found} - {""}),
      tf_versions=sorted({r.tf_version for _, r in found} - {""}),
      machine=dataclasses.asdict(found[0][1].machine) if found[0][1].machine else {},
      calibration=_calibration(found), thread_pools=_thread_pools(found),
      judged=_judged(sweep_dir),
      sweep_dir=os.path.abspath(sweep_dir),
      created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      warnings=_seed_warnings(found))


def _stat(s: Stats | None, fmt: str = "{:.1f}") -> str:
  if s is None:
    return "-"
  if s.n == 1:
    return fmt.format(s.mean)
  text = f"{fmt.format(s.mean)} ± {fmt.format(s.std)}"
  return text + " (olympic)" if s.method == "olympic" else text


def _ratio(x: float | None) -> str:
  return "-" if x is None else f"{x:.2f}"


TABLE_HEADER = ("config", "scaling", "N", "converged", "time to target (s)", "steps",
                "epochs", "examples/s", "efficiency", "speed-up", "final metric")


BYTES_HEADER = "bytes/step"
WIRE_HEADER = "wire bytes/step/worker"


def _has_bytes(report: Report) -> bool:
  """Whether any configuration ran a regime that reports bytes communicated."""
  return any(c.bytes_per_step is not None for c in report.configs)


def _has_wire(report: Report) -> bool:
  """Whether any configuration ran on a launched cluster whose wire was measured."""
  return any(c.wire_bytes_per_step is not None for c in report.configs)


def table_header(report: Report) -> tuple[str, ...]:
  return (TABLE_HEADER + ((BYTES_HEADER,) if _has_bytes(report) else ())
          + ((WIRE_HEADER,) if _has_wire(report) else ()))


def table_rows(report: Report) -> list[tuple[str, ...]]:
  """One tuple of cell strings per configuration, matching table_header(report)."""
  rows = []
  for c in report.configs:
    mark = "" if c.converged == c.n else " *"
    row = (c.config, c.scaling_kind, str(c.num_replicas), f"{c.converged}/{c.n}{mark}",
           _stat(c.time_to_target_s), _stat(c.steps_to_target, "{:.0f}"),
           _stat(c.epochs_to_target, "{:.2f}"), _stat(c.examples_per_s, "{:.0f}"),
           _ratio(c.efficiency), _ratio(c.speedup), _stat(c.final_metric, "{:.4f}"))
    if _has_bytes(report):
      row += (_bytes(c.bytes_per_step),)
    if _has_wire(report):
      row += (_bytes(c.wire_bytes_per_step),)
    rows.append(row)
  return rows


def _bytes(stats) -> str:
  return "-" if stats is None else f"{stats.mean:,.0f}"


def _notes(report: Report) -> list[str]:
  notes = [f"Time to target: MLPerf timed span to the first eval with {report.target_metric} "
           f"{'>=' if report.higher_is_better else '<='} {report.target}; olympic mean "
           f"(drop fastest and slowest) with >= {aggregate.OLYMPIC_MIN_SEEDS} converged seeds, "
           f"mean ± std otherwise.",
           "Efficiency = examples/s at N replicas / (N x examples/s of the 1-replica "
           "configuration of the same scaling kind); speed-up = its time to target / this one's."]
  if any(c.converged != c.n for c in report.configs):   # The rows marked * in the table.
    notes.insert(1, "* Not every seed reached the target: time, steps and epochs are over "
                    "the converged seeds only.")
  if _has_bytes(report):
    notes.append("bytes/step: what the training regime sends per replica and step "
                 "(regime/bytes_communicated, averaged over the run); compressed formats are "
                 "counted at their wire size.")
  if _has_wire(report):
    notes.append("wire bytes/step/worker: measured on the launched cluster's private link "
                 "(loopback counters of its namespace, evaluations excluded), divided by the "
                 "worker tasks; a ring all-reduce over n workers sends 2(n-1)/n x the payload, "
                 "an all-gather (n-1) x, plus RPC framing.")
  kinds = sorted({c.scaling_kind for c in report.configs})
  notes += [f"{k}: {aggregate.SCALING_KINDS.get(k, k)}." for k in kinds]
  return notes


def format_table(report: Report) -> str:
  """The report as a fixed-width text table with notes, for the terminal."""
  lines = [f"{report.workload}: {report.target_metric} target {report.target}"]
  lines += [f"warning: {w}" for w in report.warnings]
  lines += text_table([table_header(report), *table_rows(report)])
  return "\n".join(lines + [""] + _notes(report))


def text_table(rows: list) -> list[str]:
  """Rows of string cells as left-aligned columns, the first row underlined."""
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = []
  for i, r in enumerate(rows):
    lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    if i == 0:
      lines.append("  ".join("-" * w for w in widths))
  return lines


def format_markdown(report: Report, images: dict[str, str]) -> str:
  """report.md: context, the table, notes and links to the plots."""
  machine = report.machine
  lines = [f"# {report.workload}: scaling report", "",
           f"- Target: {report.target_metric} {'>=' if report.higher_is_better else '<='} "
           f"{report.target}",
           f"- Git: {', '.join(report.git_shas) or 'unknown'}; TensorFlow "
           f"{', '.join(report.tf_versions) or 'unknown'}",
           f"- Machine: {machine.get('cpu', 'unknown')}, {machine.get('cores', '?')} cores"
           f"{', ' + ', '.join(machine['accelerators']) if machine.get('accelerators') else ''}",
           f"- Sweep: `{report.sweep_dir}`, report made {report.created}",
           *(f"- **Warning**: {w}" for w in report.warnings), "",
           "| " + " | ".join(table_header(report)) + " |",
           "|" + "|".join("---" for _ in table_header(report)) + "|"]
  lines += ["| " + " | ".join(r).replace("*", r"\*") + " |" for r in table_rows(report)]
  lines += [""] + [n.replace("*", r"\*") + "  " for n in _notes(report)] + [""]
  lines += _trial_lines(report)
  for title, file in images.items():
    lines += [f"## {title}", "", f"![{title}]({file})", ""]
  return "\n".join(lines)


def _trial_lines(report: Report) -> list[str]:
  """report.md's every trial: the seeds behind each row's mean (time to target in s of
  the timed span; steps to target; examples/s; the last evaluation)."""
  fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
  lines = ["## Every trial", "",
           "| config | seed | status | time to target (s) | steps to target | examples/s | "
           "final metric |", "|---|---|---|---|---|---|---|"]
  for row in report.configs:
    for s in sorted(row.seeds, key=lambda s: s.seed):
      lines.append(f"| {row.config} | {s.seed} | {s.status} | {fmt(s.time_to_target_s, '.1f')} "
                   f"| {fmt(s.steps_to_target, ',.0f')} | {fmt(s.examples_per_s, ',.0f')} | "
                   f"{fmt(s.final_metric, '.4g')} |")
  return lines + [""]


def write_report(report: Report, out_dir: str) -> dict[str, str]:
  """Writes report.json, report.md and the plots to out_dir; returns {kind: path}."""
  from replibench.suite import plots  # matplotlib only when writing.
  os.makedirs(out_dir, exist_ok=True)
  images = plots.write_plots(report, out_dir)
  paths = {"json": os.path.join(out_dir, REPORT_JSON), "markdown": os.path.join(out_dir, REPORT_MD)}
  atomic.write_json(paths["json"], report.to_dict())
  atomic.write_text(paths["markdown"], format_markdown(report, images))
  paths.update({title: os.path.join(out_dir, f) for title, f in images.items()})
  return paths
