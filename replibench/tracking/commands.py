"""The tracker's commands as the CLI calls them: ab, bisect, history."""

import dataclasses
import datetime
import json
import os
from typing import Sequence

import numpy as np

from replibench import atomic, inputs
from replibench.errors import UserError
from replibench.suite import aggregate
from replibench.suite import comparison as compare_lib
from replibench.suite import report as report_lib
from replibench.tracking import ab as ab_lib
from replibench.tracking import ab_report, dashboard, machine, record, revisions, store
from replibench.tracking import suites, verdicts

AB_ROOT = os.path.join("runs", "ab")


def parse_min_effects(items: Sequence[str]) -> dict[str, float]:
  """['examples_per_s=0.05', ...] -> {metric: fraction}; a UserError naming the bad item."""
  return inputs.metric_fractions("--min_effect", items, verdicts.METRICS, 0, 1,
                                 high_open=True, example="examples_per_s=0.05 for 5%")


def parse_metrics(items: Sequence[str]) -> tuple[str, ...] | None:
  allowed = ("converged", *verdicts.METRICS)
  unknown = [m for m in items if m not in allowed]
  if unknown:
    raise UserError(f"--metric={','.join(items)}: unknown {unknown}; choose from "
                    f"{', '.join(allowed)}.")
  return tuple(items) or None


def resolve_sides(repo: str, base: str | None, head: str | None):
  """The two revisions; HEAD (by default) only from a checkout without relevant changes."""
  if head is None:
    revisions.check_clean_for_head(repo)
  head_rev = revisions.resolve(repo, head or "HEAD", "--head")
  base_rev = revisions.resolve(repo, base or revisions.default_base(repo), "--base")
  return base_rev, head_rev


def _default_workdir(repo: str, base: revisions.Revision, head: revisions.Revision) -> str:
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
  return os.path.join(repo, AB_ROOT, f"{stamp}-{base.sha[:7]}-{head.sha[:7]}")


PLAN_FILE = "ab-plan.json"


def check_workdir(path: str) -> None:
  inputs.output_directory("--workdir", path)


def claim_workdir(path: str, plan: dict) -> None:
  """Records what this A/B runs in its directory; resuming one made for other revisions,
  suites or options would mix their trials into this A/B's pairs: refused."""
  check_workdir(path)
  plan = json.loads(json.dumps(plan))   # As it reads back (tuples become lists).
  file = os.path.join(path, PLAN_FILE)
  before = atomic.read_json(file, None)
  if before is not None and before != plan:
    changed = sorted(k for k in set(before) | set(plan) if before.get(k) != plan.get(k))
    raise UserError(f"--workdir={path} holds an A/B of other {', '.join(changed)} "
                    f"({before.get(changed[0])!r} there, {plan.get(changed[0])!r} now): its "
                    f"finished trials would be taken as this A/B's. Give a new --workdir.")
  atomic.write_json(file, plan)


def run_ab(base: revisions.Revision, head: revisions.Revision,
           suite_list: Sequence[suites.Suite], options: ab_lib.Options, repo: str,
           workdir: str | None = None, history: bool = True,
           runner: ab_lib.Runner = ab_lib.subprocess_runner,
           log=print) -> tuple[list[ab_lib.SuiteAB], str]:
  """Runs the A/B of every suite; returns the suites' outcomes and the text report."""
  if options.rounds is not None and options.rounds < 1:
    raise UserError(f"--rounds={options.rounds}: need at least one round.")
  workdir = workdir or _default_workdir(repo, base, head)
  check_workdir(workdir)
  ab_lib.check_suites(repo, {"base": base, "head": head}, suite_list)
  claim_workdir(workdir, {"base": base.sha, "head": head.sha,
                          "suites": [s.name for s in suite_list],
                          "options": dataclasses.asdict(options)})
  if base.sha == head.sha:
    log(f"A/A: base and head are the same commit {base.short}; any verdict is noise.")
  sides = ab_lib.prepare_sides(repo, base, head, log)
  info = machine.describe()
  fingerprint = machine.fingerprint(info)
  outcomes = []
  for suite in suite_list:
    ab, kept = ab_lib.run_suite(suite, sides, workdir, options, runner, log)
    outcomes.append(ab)
    if history:
      n = store.append(record.from_ab(kept, suite.name, os.path.basename(workdir)))
      log(f"{suite.name}: {n} trials appended to the history ({store.root()}/{fingerprint}/)")
  paths = ab_report.write(workdir, outcomes, sides, fingerprint, info)
  text = ab_report.format_text(outcomes, sides, fingerprint)
  return outcomes, text + "\n" + "\n".join(f"wrote {k}: {p}" for k, p in paths.items())


def _report_from_records(records: Sequence[store.Record], judged) -> report_lib.Report:
  """A suite Report of history records, for `compare` (one row a configuration)."""
  rows = {}
  for r in records:
    seed = aggregate.SeedRun(
        seed=r.seed, status=r.status, trial=f"{r.config}/seed={r.seed}",
        time_to_target_s=r.metrics.get("time_to_target_s"),
        steps_to_target=r.metrics.get("steps_to_target"), epochs_to_target=None,
        examples_per_s=r.metrics.get("examples_per_s"),
        final_metric=r.metrics.get("final_metric"), total_s=None, curve=[])
    rows.setdefault(r.config, []).append(seed)
  configs = []
  for name, seeds in rows.items():
    row = aggregate.ConfigRow(name, "unknown", "", 0, 0, 0, sorted(seeds, key=lambda s: s.seed))
    aggregate.summarize(row)
    configs.append(row)
  calibrations: dict[str, list[float]] = {}
  for r in records:
    for key, value in (r.calibration or {}).items():
      calibrations.setdefault(key, []).append(float(value))
  first = records[0]
  return report_lib.Report(
      workload=first.workload, target_metric=first.target_metric, target=first.target,
      higher_is_better=first.higher_is_better, configs=configs, git_shas=[first.commit],
      machine={"cpu": (first.machine_info or {}).get("cpu")},
      calibration={k: float(np.median(v)) for k, v in calibrations.items()} or None,
      judged=judged)


def history_record(sweep_dir: str, suite: str, repo: str) -> str:
  """Appends a finished sweep's trials to the history; returns what it did."""
  records, why_not = record.from_sweep(sweep_dir, suite, repo)
  if not records:
    return f"history: {sweep_dir} {why_not}"
  n = store.append(records)
  return (f"history: {n} trials of {suite} at {records[0].commit[:10]} appended to "
          f"{store.root()}/{records[0].machine}/{suite}.jsonl")


def history_compare(sweep_dir: str, suite: str, factors: dict[str, float]) -> str:
  """The sweep against the newest history entry of this machine and suite (informative)."""
  fingerprint = machine.fingerprint()
  past = store.read(machine=fingerprint, suite=suite)
  commit = store.newest_commit(past)
  if commit is None:
    return (f"history: no entry yet for suite {suite} on this machine ({fingerprint}): "
            f"nothing to compare over time. To compare two revisions on this machine now: "
            f"make bench-ab BASE=REV (replibench ab --base=REV --suite={suite}).")
  entry = [r for r in past if r.commit == commit]
  new = report_lib.build_report(sweep_dir)
  comparison = compare_lib.compare(new, _report_from_records(entry, new.judged),
                                   factors=factors)
  when = max(r.recorded for r in entry)
  text = str(comparison).replace(": new vs baseline", ": new vs the history's newest entry", 1)
  advice = (f"\nA time or throughput verdict across time on a shared machine may be the "
            f"machine's: confirm with make bench-ab BASE={commit[:10]}."
            if comparison.regressions else "")
  return (f"history: compared with the newest entry of this machine ({fingerprint}): "
          f"commit {commit[:10]}, {len(entry)} trials recorded {when}\n{text}{advice}")


def history_render(out_dir: str, repo: str | None) -> str:
  records = store.read()
  if not records:
    raise UserError(f"The history store {store.root()} holds no records yet: `make bench` "
                    f"and `replibench ab` append to it.")
  return dashboard.render(records, out_dir, repo, source=store.root())
