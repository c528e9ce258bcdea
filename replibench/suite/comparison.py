"""Comparing a sweep against a baseline report: regression, improvement or no change.

For every configuration and metric the seeds of both sides are compared with
Welch's t-test (two-sided, alpha 0.05) AND a minimum effect size, asv style: a
change counts only when the means differ by more than a factor (10% by
default; 1% for the final metric, whose useful range is narrow) in one
direction. With fewer than 2 seeds on a side there is no verdict: one seed
against one seed says nothing about the seed-to-seed spread, which can exceed
any factor (a D4PG return after 2,000 learner steps moves 20x between seeds).
(Welch rather than Mann-Whitney: with the usual 3 seeds per side, Mann-Whitney's
smallest attainable p-value is 0.1, so it could never detect anything.)

A suite judges only the metrics its sweep file lists under `judge` (default:
all); the others are shown without a verdict. Times and throughputs depend on
the machine: each side's calibration (GFLOP/s measured at each run's start, see
harness/provenance.py; a report holds its trials' median) tells how far apart the
two machines are. Within 10%: judged as they are. Between 10% and 1.5x: judged,
and every such row and the warnings say the machines differ (a suite's median
calibration moved 14-40% between runs of one commit on one shared VM, while
machine generations differ ~4x). Beyond 1.5x, or where both reports name their
machines' fingerprints (replibench/machine.py: CPU family, model, kernel flags, cores)
and these differ: no verdict ("not comparable"). The
calibration runs in the run's own TensorFlow thread pools (Experiment.*_op_threads),
so reports whose trials ran in different pools are not comparable on time either,
and say why, rather than calling it a change of machine.
With normalize=True, whenever the calibrations differ by more than 10%, the new
side is rescaled to the baseline's machine by the ratio of the conv-net
calibrations. Steps to target, convergence and metrics are compared as they are.

A configuration that no longer reaches its target is a regression; a drop in
the converged fraction is one when Fisher's exact test finds it significant.
Configurations present on one side only are listed. Exit code: 1 on any
regression, else 0.
"""

import dataclasses
import math
import os
import warnings
from typing import Sequence

import numpy as np
from scipy import stats

from replibench.errors import UserError
from replibench.results import FAILED
from replibench.suite import report as report_lib
from replibench.suite import aggregate
from replibench.suite.aggregate import ConfigRow
from replibench.suite.report import Report

ALPHA = 0.05
MIN_SEEDS_FOR_TEST = 2
DEFAULT_FACTORS = {"time_to_target_s": 0.10, "steps_to_target": 0.10,
                   "examples_per_s": 0.10, "final_metric": 0.01}
JUDGEABLE = aggregate.JUDGEABLE
REGRESSION, IMPROVEMENT, NO_CHANGE, NOT_AVAILABLE = (
    "regression", "improvement", "no change", "n/a")
NO_VERDICT, NOT_JUDGED, NOT_COMPARABLE = "no verdict", "not judged", "not comparable"
# Metrics that depend on the machine's speed (steps and metrics do not).
MACHINE_METRICS = ("time_to_target_s", "examples_per_s")
MACHINE_TOLERANCE = 0.10   # Calibrations further apart than this: flagged.
MACHINE_LIMIT = 1.5        # Further apart than this factor: different machines, not judged.
NORMALIZE_KEY = "convnet_gflops"


@dataclasses.dataclass
class Decision:
  verdict: str
  ratio: float | None = None      # mean(new) / mean(baseline)
  p_value: float | None = None
  note: str = ""


def _p_value(base: np.ndarray, new: np.ndarray) -> float:
  """Welch's two-sided p-value; exact 0/1 when both sides have no spread."""
  if np.ptp(base) == 0 and np.ptp(new) == 0:
    return 1.0 if base.mean() == new.mean() else 0.0
  with warnings.catch_warnings():
    # One side constant (e.g. equal step counts) is handled fine by Welch, but
    # scipy warns about precision loss in that side's variance.
    warnings.simplefilter("ignore", RuntimeWarning)
    p = stats.ttest_ind(new, base, equal_var=False).pvalue
  return 1.0 if math.isnan(p) else float(p)


def decide(base: Sequence[float], new: Sequence[float], lower_is_better: bool,
           factor: float = 0.10, alpha: float = ALPHA) -> Decision:
  """Regression / improvement / no change between two samples of one metric.

  A change must be statistically significant (Welch, p < alpha) and its mean
  ratio must exceed 1 + factor in one direction (for lower-is-better metrics
  new/base > 1 + factor is worse; for higher-is-better, base/new > 1 + factor).
  """
  b, n = np.asarray(base, np.float64), np.asarray(new, np.float64)
  if b.size == 0 or n.size == 0:
    side = "baseline" if b.size == 0 else "new run"
    return Decision(NOT_AVAILABLE, note=f"no values in the {side}")
  if b.mean() <= 0 or n.mean() <= 0:
    return Decision(NOT_AVAILABLE, note="non-positive mean; ratio undefined")
  ratio = float(n.mean() / b.mean())
  worse = ratio if lower_is_better else 1 / ratio      # > 1 means worse
  if min(b.size, n.size) < MIN_SEEDS_FOR_TEST:
    return Decision(NO_VERDICT, ratio, note=(
        f"{b.size} vs {n.size} seed(s): the seed-to-seed spread is unknown, so no verdict; "
        f"run --seeds={MIN_SEEDS_FOR_TEST} or more"))
  p = _p_value(b, n)
  significant, note = p < alpha, ""
  if significant and worse > 1 + factor:
    return Decision(REGRESSION, ratio, p, note)
  if significant and 1 / worse > 1 + factor:
    return Decision(IMPROVEMENT, ratio, p, note)
  if not note:
    if significant:
      note = f"significant but within {factor:.0%}"
    elif max(worse, 1 / worse) > 1 + factor:
      note = f"beyond {factor:.0%} but not significant"
  return Decision(NO_CHANGE, ratio, p, note)


def decide_convergence(base_k: int, base_n: int, new_k: int, new_n: int,
                       alpha: float = ALPHA) -> Decision:
  """Compares converged fractions k/n; losing every converged seed is a regression."""
  note = f"{base_k}/{base_n} -> {new_k}/{new_n} converged"
  if base_k > 0 and new_k == 0:
    return Decision(REGRESSION, note=note + ": no longer reaches the target")
  if base_k == 0 and new_k > 0:
    return Decision(IMPROVEMENT, note=note + ": now reaches the target")
  if base_n and new_n and new_k / new_n != base_k / base_n:
    table = [[new_k, new_n - new_k], [base_k, base_n - base_k]]
    worse = new_k / new_n < base_k / base_n
    p = float(stats.fisher_exact(table, alternative="less" if worse else "greater").pvalue)
    if p < alpha:
      return Decision(REGRESSION if worse else IMPROVEMENT, p_value=p, note=note)
    return Decision(NO_CHANGE, p_value=p, note=note + ", not significant")
  return Decision(NO_CHANGE, note=note)


@dataclasses.dataclass
class Row:
  config: str
  metric: str
  baseline: str
  new: str
  decision: Decision


@dataclasses.dataclass
class Comparison:
  """The outcome of `compare`; print it for the table, use exit_code for the shell."""
  workload: str
  rows: list[Row]
  missing_in_new: list[str]
  missing_in_baseline: list[str]
  warnings: list[str]

  def count(self, verdict: str) -> int:
    return sum(r.decision.verdict == verdict for r in self.rows)

  @property
  def regressions(self) -> list[Row]:
    return [r for r in self.rows if r.decision.verdict == REGRESSION]

  @property
  def exit_code(self) -> int:
    return 1 if self.regressions else 0

  def format_table(self) -> str:
    header = ("config", "metric", "baseline", "new", "change", "p", "verdict", "note")
    cells = [header]
    for r in self.rows:
      d = r.decision
      change = "-" if d.ratio is None else f"{d.ratio - 1:+.1%}"
      p = "-" if d.p_value is None else f"{d.p_value:.3f}"
      verdict = d.verdict.upper() if d.verdict == REGRESSION else d.verdict
      cells.append((r.config, r.metric, r.baseline, r.new, change, p, verdict, d.note))
    lines = [f"{self.workload}: new vs baseline"]
    lines += [f"warning: {w}" for w in self.warnings]
    lines += report_lib.text_table(cells)
    lines += [f"only in the baseline (not run): {c}" for c in self.missing_in_new]
    lines += [f"only in the new run (no baseline): {c}" for c in self.missing_in_baseline]
    unjudged = sum(self.count(v) for v in (NOT_AVAILABLE, NO_VERDICT, NOT_JUDGED,
                                           NOT_COMPARABLE))
    lines.append(f"{self.count(REGRESSION)} regression(s), {self.count(IMPROVEMENT)} "
                 f"improvement(s), {self.count(NO_CHANGE)} unchanged, {unjudged} without a "
                 f"verdict; exit code {self.exit_code}")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.format_table()


def _sample(row: ConfigRow, metric: str) -> list[float]:
  """Per-seed values: target metrics over converged seeds, others over finished ones."""
  if metric in ("time_to_target_s", "steps_to_target"):
    seeds = [s for s in row.seeds if s.converged]
  else:
    seeds = [s for s in row.seeds if s.status != FAILED]
  return [getattr(s, metric) for s in seeds if getattr(s, metric) is not None]


def _describe(values: list[float], fmt: str) -> str:
  if not values:
    return "-"
  if len(values) == 1:
    return f"{fmt.format(values[0])} (n=1)"
  return f"{fmt.format(np.mean(values))} ± {fmt.format(np.std(values, ddof=1))} (n={len(values)})"


def _load(x: "str | Report") -> tuple[Report, str]:
  """A Report from a Report, a report.json path, or a sweep/report directory."""
  if isinstance(x, Report):
    return x, x.sweep_dir or "report"
  if os.path.isdir(x):
    path = os.path.join(x, report_lib.REPORT_JSON)
    return (report_lib.load_report(path) if os.path.isfile(path)
            else report_lib.build_report(x)), x
  return report_lib.load_report(x), x


def _check_same_workload(new: Report, new_src: str, base: Report, base_src: str) -> None:
  for key in ("workload", "target_metric", "target", "higher_is_better"):
    if getattr(new, key) != getattr(base, key):
      raise UserError(
          f"The baseline {base_src} is for {key} {getattr(base, key)!r} but {new_src} has "
          f"{getattr(new, key)!r} (baseline: {base.workload} {base.target_metric} "
          f"{base.target}; new: {new.workload} {new.target_metric} {new.target}). Compare "
          f"against results/{new.workload}/baseline.json or a report of the same workload.")


@dataclasses.dataclass(frozen=True)
class MachineMatch:
  """Whether two reports' machines may be compared on time, and the rescaling factor.

  speed: new machine's conv-net GFLOP/s over the baseline's (None if either side
  has no calibration). comparable: calibrations within MACHINE_LIMIT (times are
  judged); flagged: comparable but further apart than MACHINE_TOLERANCE.
  """
  comparable: bool
  speed: float | None
  note: str
  flagged: bool = False


def match_machines(new: Report, base: Report) -> MachineMatch:
  if new.thread_pools and base.thread_pools and new.thread_pools != base.thread_pools:
    # The calibration runs in the run's own pools: it would report a config change
    # (Experiment.*_op_threads) as a change of machine.
    return MachineMatch(False, None, f"TensorFlow's thread pools differ (baseline "
                        f"{_pools(base.thread_pools)}; new {_pools(new.thread_pools)}), "
                        f"and the calibration ran in them, so it cannot tell the machine "
                        f"apart from the config; `replibench ab` judges such a change")
  new_cal, base_cal = new.calibration or {}, base.calibration or {}
  if not all(new_cal.get(k) and base_cal.get(k) for k in (NORMALIZE_KEY, "matmul_gflops")):
    side = "baseline" if not base_cal else "new run" if not new_cal else "either side"
    return MachineMatch(False, None, f"no machine calibration in the {side} (recorded before "
                        f"fingerprints existed?): re-run or re-accept the baseline")
  ratios = {k: new_cal[k] / base_cal[k] for k in (NORMALIZE_KEY, "matmul_gflops")}
  text = ", ".join(f"{k} {base_cal[k]:.0f} -> {new_cal[k]:.0f}" for k in ratios)
  apart = max(max(r, 1 / r) for r in ratios.values())
  base_fp, new_fp = base.machine.get("fingerprint"), new.machine.get("fingerprint")
  if base_fp and new_fp and base_fp != new_fp:
    # Another CPU kind (a Zen 4 and a Zen 5 share a name and every AVX-512 flag): the
    # calibration's gap can be inside the shared-VM drift while a workload's is not.
    return MachineMatch(False, ratios[NORMALIZE_KEY],
                        f"machines differ: fingerprint {base_fp} -> {new_fp} (calibration "
                        f"{text} GFLOP/s)")
  if apart <= 1 + MACHINE_TOLERANCE:
    return MachineMatch(True, ratios[NORMALIZE_KEY],
                        f"calibrations within {MACHINE_TOLERANCE:.0%} ({text})")
  if apart <= MACHINE_LIMIT:
    return MachineMatch(True, ratios[NORMALIZE_KEY],
                        f"calibrations {apart - 1:.0%} apart ({text} GFLOP/s): judged, but the "
                        f"machine may differ", flagged=True)
  return MachineMatch(False, ratios[NORMALIZE_KEY],
                      f"machines differ: calibration {text} GFLOP/s")


def _pools(pools: list[dict]) -> str:
  return ", ".join(f"intra-op {p.get('intra_op')} / inter-op {p.get('inter_op')}" for p in pools)


def _rescale(values: list[float], metric: str, speed: float) -> list[float]:
  """New-side values as they would be on the baseline's machine (speed = new / base)."""
  return [v * speed if metric == "time_to_target_s" else v / speed for v in values]


def _rescaled(machines: MachineMatch, normalize: bool) -> bool:
  """Whether the new side's times are rescaled: asked for, and the machines differ."""
  return normalize and bool(machines.speed) and (machines.flagged or not machines.comparable)


def _warnings(new: Report, base: Report, machines: MachineMatch, normalize: bool) -> list[str]:
  out = []
  for key, label in (("cpu", "CPU models"), ("isa_flags", "ISA flags"),
                     ("accelerators", "accelerators")):
    b, n = base.machine.get(key), new.machine.get(key)
    if b is not None and n is not None and b != n:
      out.append(f"{label} differ (baseline {b}, new {n}).")
  if _rescaled(machines, normalize):
    out.append(f"{machines.note}: new times and throughputs rescaled by {machines.speed:.2f} "
               f"to the baseline's machine (--normalize).")
  elif machines.flagged:
    out.append(f"{machines.note}: a time or throughput verdict may be the machine's, not the "
               f"code's (--normalize rescales them).")
  elif not machines.comparable:
    out.append(f"{machines.note}: time and throughput are not judged"
               f"{' (--normalize rescales them)' if machines.speed else ''}.")
  if new.tf_versions != base.tf_versions:
    out.append(f"TensorFlow versions differ (baseline {base.tf_versions}, new "
               f"{new.tf_versions}).")
  if new.git_shas != base.git_shas:
    out.append(f"git {', '.join(base.git_shas) or '?'} -> {', '.join(new.git_shas) or '?'}")
  return out


def _metric_decision(metric: str, b: list[float], n: list[float], lower_is_better: bool,
                     factor: float, alpha: float, judged: bool,
                     machines: MachineMatch, normalize: bool) -> tuple[list[float], Decision]:
  """(the new values as compared, the decision) for one configuration and metric."""
  on_machine = metric in MACHINE_METRICS
  if on_machine and _rescaled(machines, normalize):
    n = _rescale(n, metric, machines.speed)
  elif on_machine and not machines.comparable:
    ratio = float(np.mean(n) / np.mean(b)) if b and n and np.mean(b) > 0 else None
    return n, Decision(NOT_COMPARABLE, ratio, note=machines.note)
  decision = decide(b, n, lower_is_better, factor, alpha)
  if not judged:
    decision = Decision(NOT_JUDGED, decision.ratio, decision.p_value,
                        "reported only (not in the sweep file's judge list)")
  elif on_machine and machines.flagged and not normalize:
    decision.note = "; ".join(filter(None, (decision.note, machines.note)))
  return n, decision


def compare(new: "str | Report", baseline: "str | Report",
            factors: dict[str, float] | None = None, alpha: float = ALPHA,
            normalize: bool = False, judge: list[str] | None = None) -> Comparison:
  """Compares a new sweep (dir, report.json or Report) against a baseline report.

  normalize: where the machines' calibrations differ, rescale the new side's time
  and throughput to the baseline's machine instead of leaving them unjudged.
  judge: the metrics to decide on; default the new sweep's own list, else all.
  """
  new_report, new_src = _load(new)
  base_report, base_src = _load(baseline)
  _check_same_workload(new_report, new_src, base_report, base_src)
  factors = {**DEFAULT_FACTORS, **(factors or {})}
  judged = set(judge or (new_report.judged if new_report.judged is not None
                         else base_report.judged if base_report.judged is not None
                         else JUDGEABLE))
  machines = match_machines(new_report, base_report)
  metrics = (("time_to_target_s", "time to target (s)", True, "{:.1f}"),
             ("steps_to_target", "steps to target", True, "{:.0f}"),
             ("examples_per_s", "examples/s", False, "{:.0f}"),
             ("final_metric", f"final {new_report.target_metric}",
              not new_report.higher_is_better, "{:.4f}"))
  rows = []
  for base_row in base_report.configs:
    new_row = new_report.config(base_row.config)
    if new_row is None:
      continue
    convergence = decide_convergence(base_row.converged, base_row.n, new_row.converged,
                                     new_row.n, alpha)
    if "converged" not in judged:
      convergence = Decision(NOT_JUDGED, note=convergence.note)
    rows.append(Row(base_row.config, "converged", f"{base_row.converged}/{base_row.n}",
                    f"{new_row.converged}/{new_row.n}", convergence))
    for metric, label, lower_is_better, fmt in metrics:
      b = _sample(base_row, metric)
      n, decision = _metric_decision(metric, b, _sample(new_row, metric), lower_is_better,
                                     factors[metric], alpha, metric in judged, machines,
                                     normalize)
      rows.append(Row(base_row.config, label, _describe(b, fmt), _describe(n, fmt), decision))
  base_names = [c.config for c in base_report.configs]
  new_names = [c.config for c in new_report.configs]
  return Comparison(
      workload=new_report.workload, rows=rows,
      missing_in_new=[c for c in base_names if c not in new_names],
      missing_in_baseline=[c for c in new_names if c not in base_names],
      warnings=_warnings(new_report, base_report, machines, normalize))
