"""The tracker's commands as the CLI calls them: ab, bisect, history."""

import dataclasses
import datetime
import os
from typing import Sequence

import numpy as np

from replibench import inputs, machine
from replibench.errors import UserError
from replibench.suite import aggregate
from replibench.suite import comparison as compare_lib
from replibench.suite import report as report_lib
from replibench.suite import results as suite_results
from replibench.tracking import ab as ab_lib
from replibench.tracking import ab_report, dashboard, probe, record, revisions, store
from replibench.tracking import suites, validate, verdicts
from replibench.tracking import workdir as workdir_lib

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


def resolve_sides(repo: str, base: str | None, head: str | None, aa: bool = False):
  """The two revisions; HEAD (by default) only from a checkout without relevant changes;
  the same commit on both sides only when an A/A is asked for (aa)."""
  if head is None:
    revisions.check_clean_for_head(repo)
  head_rev = revisions.resolve(repo, "HEAD" if head is None else head, "--head")
  base_rev = revisions.resolve(repo, revisions.default_base(repo) if base is None else base,
                               "--base")
  if base_rev.sha == head_rev.sha and not aa:
    raise UserError(f"--base={base_rev.name} and --head={head_rev.name} are the same commit "
                    f"({head_rev.short}): an A/B of a commit against itself judges only the "
                    f"machine's noise. Name two different revisions, or pass --aa to run that "
                    f"A/A deliberately.")
  if base_rev.sha != head_rev.sha and aa:
    raise UserError(f"--aa: an A/A runs one commit on both sides, but --base={base_rev.name} "
                    f"({base_rev.short}) and --head={head_rev.name} ({head_rev.short}) differ.")
  return base_rev, head_rev


def _default_workdir(repo: str, base: revisions.Revision, head: revisions.Revision) -> str:
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
  return os.path.join(repo, AB_ROOT, f"{stamp}-{base.sha[:7]}-{head.sha[:7]}")


PLAN_FILE = workdir_lib.PLAN_FILE
check_workdir, check_plan, claim_workdir = (workdir_lib.check_workdir, workdir_lib.check_plan,
                                            workdir_lib.claim_workdir)


def check_options(options: ab_lib.Options) -> None:
  if options.rounds is not None and options.rounds < 1:
    raise UserError(f"--rounds={options.rounds}: need at least one round.")
  if options.seeds is not None and not options.seeds:
    raise UserError("--seeds: need at least one seed.")
  if options.probe_processes is not None and options.probe_processes not in range(0, 1001) \
      or options.probe_processes == 1:
    raise UserError(f"--probe_processes={options.probe_processes}: the throughput probe "
                    f"needs at least 2 processes a side to pair (0 turns it off).")


def check_probes(suite_list: Sequence[suites.Suite], sides, options: ab_lib.Options) -> None:
  """Each suite's probe configurations exist at both revisions (a UserError naming them,
  before the A/B's plan is written)."""
  for suite in suite_list:
    design = probe.design_of(suite, options)
    if design is not None:
      for side in sides:
        try:
          ab_lib.trials_of(side, suite, design.options(options))
        except UserError as e:
          raise UserError(f"the throughput probe of suite {suite.name} (suites.py): "
                          f"{e}") from None


def run_suite_and_probe(suite: suites.Suite, sides, workdir: str, options: ab_lib.Options,
                        runner: ab_lib.Runner, probe_runner: ab_lib.Runner | None,
                        log=print) -> tuple[ab_lib.SuiteAB, list]:
  """One suite's time-to-target pairs, then its throughput probe where its design has
  one (probe.py), the probe's row joined to the suite's family."""
  ab, kept = ab_lib.run_suite(suite, sides, workdir, options, runner, log)
  design = probe.design_of(suite, options)
  if design is None:
    return ab, kept
  family = probe.family_size(probe.main_judged(ab, options))
  outcome = probe.run(suite, sides, workdir, options, design,
                      probe_runner, log, family=family)
  return probe.attach(ab, outcome, design, options), kept


def run_ab(base: revisions.Revision, head: revisions.Revision,
           suite_list: Sequence[suites.Suite], options: ab_lib.Options, repo: str,
           workdir: str | None = None, history: bool = False,
           runner: ab_lib.Runner = ab_lib.subprocess_runner,
           validator: validate.Validator = validate.subprocess_validator,
           log=print, probe_runner: ab_lib.Runner | None = None
           ) -> tuple[list[ab_lib.SuiteAB], str]:
  """Runs the A/B of every suite; returns the suites' outcomes and the text report.

  Every input is checked first (options, workdir, the history store when recording,
  both revisions: validate.py); only then is anything checked out or written.
  history: append the trials that ran to a result to the history (asked for with
  --record: an A/B's sides are not the main line's series by default).
  probe_runner: runs the throughput probe's processes (default probe.runner).
  """
  check_options(options)
  given = workdir is not None
  workdir = workdir or _default_workdir(repo, base, head)
  check_workdir(workdir, given)
  plan = {"base": base.sha, "head": head.sha, "suites": [s.name for s in suite_list],
          "options": dataclasses.asdict(options)}
  check_plan(workdir, plan)
  if history:   # A store that cannot be written: refused now, not after the trials.
    store.check_writable()
  deferred = validate.check_revisions(repo, {"base": base, "head": head}, suite_list,
                                      options, validator, log)
  # Worktrees and environments (where a side's configs could not be compiled before its
  # environment existed, they are compiled here), then the plan: a refusal here still
  # leaves no plan to block the corrected retry.
  sides = ab_lib.prepare_sides(repo, base, head, suite_list, options, deferred, validator, log)
  check_probes(suite_list, sides, options)
  claim_workdir(workdir, plan)
  if base.sha == head.sha:
    log(f"A/A: base and head are the same commit {base.short}; any verdict is noise.")
  info = machine.describe()
  fingerprint = machine.fingerprint(info)
  outcomes = []
  for suite in suite_list:
    ab, kept = run_suite_and_probe(suite, sides, workdir, options, runner, probe_runner, log)
    outcomes.append(ab)
    if history:
      records = record.from_ab(kept, suite.name, os.path.basename(workdir))
      n = store.append(records)
      left = f"; {len(ab.failed)} failed trial(s) left out" if ab.failed else ""
      again = f"; {len(records) - n} recorded before" if len(records) > n else ""
      log(f"{suite.name}: {n} trials appended to the history ({store.root()}/{fingerprint}/)"
          f"{left}{again}")
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
      if isinstance(value, (int, float)):
        calibrations.setdefault(key, []).append(float(value))
  first = records[0]
  return report_lib.Report(
      workload=first.workload, target_metric=first.target_metric, target=first.target,
      higher_is_better=first.higher_is_better, configs=configs,
      git_shas=sorted({r.commit for r in records}),
      tf_versions=sorted({r.tf_version for r in records} - {""}),
      machine={"cpu": (first.machine_info or {}).get("cpu")},
      calibration={k: float(np.median(v)) for k, v in calibrations.items()} or None,
      thread_pools=report_lib.distinct_pools(r.thread_pools for r in records), judged=judged)


def _main_line(repo: str | None) -> tuple[str, list[str] | None]:
  if repo is None:
    return "", None
  return revisions.main_line(repo)


def history_record(sweep_dir: str, suite: suites.Suite, repo: str) -> tuple[str, int]:
  """Appends a finished sweep's trials that ran to a result to the history; returns
  what it did and the exit code (1 when trials failed: they are named, not recorded)."""
  store.check_writable()   # Before reading the sweep: a store that cannot take it.
  records, why_not, failed = record.from_sweep(sweep_dir, suite, repo)
  lines = [f"history: failed trial {t} of {sweep_dir}: not recorded" for t in failed]
  if not records:
    lines.append(f"history: {sweep_dir} {why_not}")
  else:
    n = store.append(records)
    again = (f" ({len(records) - n} recorded before: a sweep is recorded once)"
             if len(records) > n else "")
    lines.append(f"history: {n} trials of {suite.name} at {records[0].commit[:10]} appended "
                 f"to {store.root()}/{records[0].machine}/{suite.name}.jsonl{again}")
  return "\n".join(lines), 1 if failed else 0


def _sweep_records(sweep_dir: str, suite: suites.Suite) -> list[store.Record]:
  """The sweep's trials that ran to a result, as records (not stored: for comparing)."""
  record.check_sweep_of_suite(sweep_dir, suite)
  found = suite_results.find_results(sweep_dir)
  record.check_ran_here(sweep_dir, found, machine.describe())
  out = []
  for trial, result in found:
    if not record.failed(result):
      out.append(record.from_result(
          result, commit=result.git_sha, commit_time="", suite=suite.name,
          config=trial.rpartition(os.sep)[0] or "default", seed=result.seed, round_=0,
          source="bench", run_id="", fingerprint="", info={}))
  return out


def history_compare(sweep_dir: str, suite: suites.Suite, factors: dict[str, float],
                    repo: str | None = None) -> str:
  """The sweep against this machine's newest main-line history entry (informative),
  on the configurations and seeds both ran."""
  fingerprint = machine.fingerprint()
  new_records = _sweep_records(sweep_dir, suite)
  if not new_records:   # The sweep itself fails (exit 1); here there is nothing to say.
    return f"history: {sweep_dir}: no trial ran to a result, so there is nothing to compare."
  past = store.read(machine=fingerprint, suite=suite.name)
  branch, line = _main_line(repo)
  commit = store.newest_commit(past, main_line=line)
  if commit is None:
    where = f"on the main line ({branch}) " if line is not None else ""
    return (f"history: no entry yet for suite {suite.name} {where}on this machine "
            f"({fingerprint}): nothing to compare over time. To compare two revisions on "
            f"this machine now: make bench-ab BASE=REV (replibench ab --base=REV "
            f"--suite={suite.name}).")
  entry = [r for r in past if r.commit == commit]
  shared = {(r.config, r.seed) for r in entry} & {(r.config, r.seed) for r in new_records}
  if not shared:
    return (f"history: the newest main-line entry of this machine ({fingerprint}), commit "
            f"{commit[:10]}, shares no configuration and seed with {sweep_dir}: nothing "
            f"to compare.")
  differ = _set_difference(entry, new_records, shared)
  judged = report_lib.build_report(sweep_dir).judged
  comparison = compare_lib.compare(
      _report_from_records([r for r in new_records if (r.config, r.seed) in shared], judged),
      _report_from_records([r for r in entry if (r.config, r.seed) in shared], judged),
      factors=factors)
  when = max(r.recorded for r in entry)
  text = str(comparison).replace(": new vs baseline", ": new vs the history's newest entry", 1)
  advice = (f"\nA time or throughput verdict across time on a shared machine may be the "
            f"machine's: confirm with make bench-ab BASE={commit[:10]}."
            if comparison.regressions else "")
  on = f" on the main line ({branch})" if line is not None else ""
  return (f"history: compared with the newest entry{on} of this machine ({fingerprint}): "
          f"commit {commit[:10]}, {len(entry)} trials recorded {when}; compared on the "
          f"{len(shared)} configuration/seed trials both ran{differ}\n{text}{advice}")


def _set_difference(entry, new_records, shared) -> str:
  """'' when both ran the same trials; else what each ran that the other did not."""
  def only(records):
    left = sorted({(r.config, r.seed) for r in records} - shared)
    return ", ".join(f"{c}/seed={s}" for c, s in left[:6]) + (" ..." if len(left) > 6 else "")
  parts = [f"only the entry: {only(entry)}" if only(entry) else "",
           f"only this sweep: {only(new_records)}" if only(new_records) else ""]
  parts = [p for p in parts if p]
  return f" (the sets differ; left out, {'; '.join(parts)})" if parts else ""


def history_render(out_dir: str, repo: str | None, given: bool = True) -> str:
  """The dashboard of the main line's records (every record outside a checkout); given:
  whether the user named out_dir (--out) or it is the default."""
  inputs.output_directory("--out" if given else "the default output directory (--out)",
                          out_dir)
  records = store.read()
  if not records:
    raise UserError(f"The history store {store.root()} holds no records yet: `make bench` "
                    f"and `replibench ab --record` append to it.")
  branch, line = _main_line(repo)
  left_out = ""
  if line is not None:
    on = set(line)
    kept = [r for r in records if r.commit in on]
    others = {r.commit for r in records} - on
    if others:
      left_out = (f"{len(records) - len(kept)} trial(s) of {len(others)} commit(s) not on the "
                  f"main line ({branch}'s first-parent history) are left out: a series holds "
                  f"the main line's commits.")
    if not kept:
      raise UserError(f"The history store {store.root()} holds no record of a commit on the "
                      f"main line ({branch}): {left_out}")
    records = kept
  return dashboard.render(records, out_dir, repo, source=store.root(), left_out=left_out)
