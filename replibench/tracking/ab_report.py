"""An A/B's outcome as a table, report.md and ab.json."""

import dataclasses
import json
import os
from typing import Sequence

from replibench import atomic
from replibench.suite import report as report_lib
from replibench.tracking import paired
from replibench.tracking.ab import SideSpec, SuiteAB

JSON_FILE, MD_FILE = "ab.json", "report.md"
HEADER = ("suite", "config", "metric", "base", "head", "head/base [interval]", "level",
          "verdict", "note")


def _cells(ab: SuiteAB) -> list[tuple[str, ...]]:
  cells = []
  for row in ab.rows:
    est = row.estimate
    ratio = "-" if est is None else est.text()
    level = "-" if est is None or est.low is None else f"{est.level:.1%}"
    verdict = row.verdict.upper() if row.verdict == paired.REGRESSION else row.verdict
    cells.append((ab.suite, row.config, row.label, row.base, row.head, ratio, level, verdict,
                  row.note))
  return cells


def _sides(sides: Sequence[SideSpec]) -> list[str]:
  return [f"{s.label}: {s.rev.describe()}, runs in {s.env.note}" for s in sides]


def _summary(abs_: Sequence[SuiteAB]) -> str:
  count = lambda v: sum(r.verdict == v for ab in abs_ for r in ab.rows)  # noqa: E731
  failed = sum(len(ab.failed) for ab in abs_)
  unjudged = [ab.suite for ab in abs_ if not ab.judgeable]
  unresolved = sum(r.unresolved for ab in abs_ for r in ab.rows)
  return (f"{count(paired.REGRESSION)} regression(s), {count(paired.IMPROVEMENT)} "
          f"improvement(s), {count(paired.NO_CHANGE)} unchanged"
          + (f" ({unresolved} unresolved: their intervals admit a loss beyond the minimum "
             f"effect)" if unresolved else "")
          + f", {count(paired.NO_VERDICT)} without a verdict"
          + (f", {failed} failed trial(s)" if failed else "")
          + (f", no judgeable pair in {', '.join(unjudged)}" if unjudged else "")
          + f"; exit code {exit_code(abs_)}")


def exit_code(abs_: Sequence[SuiteAB]) -> int:
  """1 on a regression, a failed trial, or a suite with no pair to judge; else 0."""
  bad = any(ab.regressions or ab.failed or not ab.judgeable for ab in abs_)
  return 1 if bad else 0


def problems(abs_: Sequence[SuiteAB]) -> list[str]:
  """Why the A/B failed beyond its verdicts: each failed trial, each unjudgeable suite."""
  lines = []
  for ab in abs_:
    if not ab.judgeable:
      lines.append(f"{ab.suite}: no judgeable pair (no pair of trials both ran to a result): "
                   f"nothing was compared")
    lines += [f"{ab.suite}: FAILED trial {name}" for name in ab.failed]
  return lines


def _notes(ab: SuiteAB) -> list[str]:
  lines = [f"{ab.suite}: {len(ab.pairs)} pairs ({ab.rounds} round(s), ABBA), "
           f"{ab.seconds / 60:.1f} min; judged: {', '.join(ab.judged)}"]
  if ab.probe:
    lines.append(_probe_note(ab.suite, ab.probe))
  lines += [f"{ab.suite}: only at base (not run): {n}" for n in ab.only_base]
  lines += [f"{ab.suite}: only at head (not run): {n}" for n in ab.only_head]
  return lines


def _probe_note(suite: str, summary: dict) -> str:
  """One line on the throughput probe: its design, time and each estimator's paired
  noise (the residual sd of log head/base, order modelled), the judged one first."""
  d = summary["design"]
  configs = ", ".join(d["configs"]) if d.get("configs") else "the A/B's configurations"
  noise = summary["noise"]
  names = [summary["judged"], *(n for n in noise if n != summary["judged"])]
  sds = "; ".join(f"{n} {noise[n]['sd']:.3f}" for n in names
                  if n in noise and noise[n]["sd"] is not None)
  return (f"{suite}: throughput probe: {summary['pairs']} pairs ({d['processes']} processes a "
          f"side of {configs}, {d['steps']} steps in windows of {d['window_steps']}, "
          f"{d['warmup_windows']} of warm-up left out), {summary['seconds'] / 60:.1f} min; "
          f"judged on the {summary['judged']} (probe.JUDGED); paired noise {sds or '-'}")


def format_text(abs_: Sequence[SuiteAB], sides: Sequence[SideSpec], machine: str) -> str:
  lines = [f"A/B on {machine}", *_sides(sides)]
  cells = [HEADER] + [c for ab in abs_ for c in _cells(ab)]
  for ab in abs_:
    lines += _notes(ab)
  lines += report_lib.text_table(cells)
  lines.append("Ratios are geometric means of paired head/base values, with t intervals (the pair "
               "order and round modelled, paired.order_estimate) at "
               "the row's level (95% over the rows judged together, Bonferroni); a verdict "
               "needs the interval clear of 1 and the ratio beyond the minimum effect.")
  lines += problems(abs_)
  lines.append(_summary(abs_))
  return "\n".join(lines)


def _markdown(abs_: Sequence[SuiteAB], sides: Sequence[SideSpec], machine: str) -> str:
  out = ["# A/B", "", f"Machine: `{machine}`", ""]
  out += [f"- {line}" for line in _sides(sides)]
  for ab in abs_:
    out += [f"- {line}" for line in _notes(ab)]
  out += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
  out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
          for ab in abs_ for row in _cells(ab)]
  out += [""] + [f"- {line}" for line in problems(abs_)] + ["", _summary(abs_), ""]
  return "\n".join(out)


def _to_dict(ab: SuiteAB) -> dict:
  d = {k: v for k, v in dataclasses.asdict(ab).items() if k not in ("rows", "pairs")}
  d["judgeable_pairs"] = ab.judgeable
  d["rows"] = [r.to_dict() for r in ab.rows]
  d["pairs"] = [dataclasses.asdict(p) for p in ab.pairs]
  return d


def write(workdir: str, abs_: Sequence[SuiteAB], sides: Sequence[SideSpec], machine: str,
          machine_info: dict) -> dict[str, str]:
  """Writes ab.json and report.md into workdir; returns {kind: path}."""
  record = {"machine": machine, "machine_info": machine_info,
            "sides": [{"label": s.label, **dataclasses.asdict(s.rev), "environment": s.env.note,
                       "python": s.env.python} for s in sides],
            "suites": [_to_dict(ab) for ab in abs_], "exit_code": exit_code(abs_)}
  paths = {"json": os.path.join(workdir, JSON_FILE), "markdown": os.path.join(workdir, MD_FILE)}
  atomic.write_text(paths["json"], json.dumps(record, indent=1) + "\n")
  atomic.write_text(paths["markdown"], _markdown(abs_, sides, machine))
  return paths
