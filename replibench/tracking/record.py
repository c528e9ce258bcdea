"""Turning runs into history records: an A/B's trials and a `make bench` sweep's.

Only trials that ran to a result enter the history: a failed trial (no result.json,
or status 'failed') measured nothing; the command that ran it exits 1 and names it.
A sweep is recorded only under the suite whose sweep file it ran (its sweep.json
names the file), and only when every trial ran from one committed revision.
"""

import dataclasses
import os

from replibench import atomic, machine, results
from replibench.errors import UserError
from replibench.suite import results as suite_results
from replibench.tracking import revisions, store
from replibench.tracking.suites import Suite

SWEEP_MANIFEST = suite_results.MANIFEST_FILE


def metrics_of(result: results.RunResult | None) -> dict:
  """The tracked metrics of a run (times and steps only when it reached the target)."""
  if result is None or result.status == results.FAILED:
    return {m: None for m in store.METRICS}
  converged = result.converged
  return {"time_to_target_s": result.time_to_target_s if converged else None,
          "steps_to_target": result.steps_to_target if converged else None,
          "examples_per_s": result.examples_per_s, "final_metric": result.final_metric}


def from_result(result: results.RunResult | None, *, commit: str, commit_time: str,
                suite: str, config: str, seed: int, round_: int, source: str,
                run_id: str, fingerprint: str, info: dict) -> store.Record:
  """One trial's record (a missing result is recorded as failed)."""
  return store.Record(
      commit=commit, commit_time=commit_time, machine=fingerprint, suite=suite,
      config=config, seed=seed, round=round_, status=result.status if result else "failed",
      metrics=metrics_of(result), source=source, run_id=run_id, recorded=store.now(),
      workload=result.workload if result else "",
      target_metric=result.target_metric if result else "",
      target=result.target if result else None,
      higher_is_better=result.higher_is_better if result else True,
      calibration=(result.machine or {}).get("calibration") if result else None,
      machine_info=info, tf_version=(result.tf_version or "") if result else "",
      jit_compile=result.jit_compile if result else None,
      thread_pools=(result.machine or {}).get("threads") if result else None)


def failed(result: results.RunResult | None) -> bool:
  """A trial that measured nothing: no readable result, or status 'failed'."""
  return result is None or result.status == results.FAILED


def check_same_compilation(name: str, base: results.RunResult | None,
                           head: results.RunResult | None) -> None:
  """UserError where an A/B pair's two trials did not both run compiled or both not: a
  pair must measure the code's effect on one step, not XLA's (Experiment.jit_compile;
  null, a result from before the choice, ran uncompiled)."""
  if base is None or head is None or bool(base.jit_compile) == bool(head.jit_compile):
    return
  raise UserError(
      f"A/B trial {name}: the base ran with Experiment.jit_compile resolved to "
      f"{bool(base.jit_compile)}, the head to {bool(head.jit_compile)} (their configs or "
      f"'auto''s table in replibench/config/compile_choice.py differ), and a pair must "
      f"not compare a compiled step with an uncompiled one; pin Experiment.jit_compile "
      f"in the suite's bindings (the same on both sides) and run the A/B again.")


def from_ab(kept: list, suite: str, run_id: str) -> list[store.Record]:
  """Records for every trial of one suite's A/B that ran to a result; kept: (side, pair,
  result) triples."""
  info = machine.describe()
  fingerprint = machine.fingerprint(info)
  return [dataclasses.replace(
              from_result(result, commit=side.rev.sha, commit_time=side.rev.time, suite=suite,
                          config=pair.config, seed=pair.seed, round_=pair.round, source="ab",
                          run_id=run_id, fingerprint=fingerprint, info=info), side=side.label)
          for side, pair, result in kept if not failed(result)]


# The kernel flags result.json's machine record lists too (harness/provenance.ISA_FLAGS).
_COMPARED_FLAGS = set(machine.KERNEL_FLAGS) - {"avx_vnni"}


def check_ran_here(sweep_dir: str, found: list, info: dict) -> None:
  """UserError when a trial's result.json names another CPU or other kernel flags than
  this machine's: its figures belong to another machine's series (results that name no
  CPU are taken as this machine's)."""
  here = (info["cpu"], set(info["flags"]) & _COMPARED_FLAGS)
  for trial, result in found:
    ran = result.machine if result is not None else None
    if ran is None or not ran.cpu:
      continue
    there = (ran.cpu, set(ran.isa_flags) & _COMPARED_FLAGS)
    if there != here:
      raise UserError(f"{sweep_dir}: trial {trial} ran on {ran.cpu} "
                      f"({' '.join(sorted(there[1]))}), not on this machine ({here[0]}, "
                      f"{' '.join(sorted(here[1]))}); the history records a sweep on the "
                      f"machine that ran it: record it there.")


def check_sweep_of_suite(sweep_dir: str, suite: Suite) -> list[str]:
  """The trial names the sweep planned; UserError unless sweep_dir is a sweep directory
  that ran suite's sweep file as the file defines it."""
  if not os.path.isdir(sweep_dir):
    what = "is not a directory" if os.path.exists(sweep_dir) else "no such directory"
    raise UserError(f"{sweep_dir}: {what} (give the sweep directory of a finished "
                    f"`make bench` suite, e.g. runs/bench-<id>/{suite.name}).")
  manifest = os.path.join(sweep_dir, SWEEP_MANIFEST)
  try:
    data = atomic.read_json(manifest, None)
  except (OSError, ValueError):   # A directory or garbage (JSON, Unicode errors: ValueError).
    data = None
  ran = data.get("sweep_file") if isinstance(data, dict) else None
  if not isinstance(ran, str):
    raise UserError(f"{sweep_dir}: has no readable {SWEEP_MANIFEST} naming its sweep file, so "
                    f"which suite it ran cannot be told; the history records only sweeps "
                    f"`replibench sweep` made.")
  if not os.path.normpath(ran).endswith(os.sep + os.path.normpath(suite.sweep)):
    raise UserError(f"--suite={suite.name}: {sweep_dir} ran {ran}, not the suite's "
                    f"{suite.sweep}; record it under the suite whose sweep file it ran.")
  extras = [*(data.get("extra_gin_files") or []), *(data.get("extra_bindings") or [])]
  if extras:   # e.g. bench-smoke's toy scale: not the suite's measurement.
    raise UserError(f"--suite={suite.name}: {sweep_dir} ran {suite.sweep} with "
                    f"{'; '.join(map(str, extras))[:200]} added to every trial, so its "
                    f"figures are not the suite's; the history records the suite as its "
                    f"sweep file defines it (make bench).")
  return [t["name"] for t in data.get("trials") or []
          if isinstance(t, dict) and isinstance(t.get("name"), str)]


def from_sweep(sweep_dir: str, suite: Suite, repo: str) -> tuple[list[store.Record], str,
                                                                  list[str]]:
  """(records for a finished sweep's trials that ran to a result, why none were kept
  ('' if some were), the failed trials left out).

  The commit is the one every trial's result.json names; a sweep whose trials ran
  from a dirty checkout or from several commits is not recorded (its figures
  belong to no commit).
  """
  planned = check_sweep_of_suite(sweep_dir, suite)
  found = suite_results.find_results(sweep_dir)
  if not found:
    raise UserError(f"{sweep_dir} holds no result.json: nothing to record.")
  info = machine.describe()
  check_ran_here(sweep_dir, found, info)
  left_out = [trial for trial, result in found if failed(result)]
  # A trial that died before writing result.json failed too: the manifest names it.
  left_out += [f"{name} (no result.json)" for name in planned
               if name not in {trial for trial, _ in found}]
  found = [(trial, result) for trial, result in found if not failed(result)]
  if not found:
    return [], "not recorded in the history: every trial failed", left_out
  shas = {r.git_sha for _, r in found}
  sha = next(iter(shas))
  if len(shas) != 1 or not sha or sha.endswith("-dirty") or sha == "unknown":
    return [], (f"not recorded in the history: its trials ran from {', '.join(sorted(shas))} "
                f"(a history entry needs one committed revision)"), left_out
  rev = revisions.resolve(repo, sha, "git_sha")
  fingerprint = machine.fingerprint(info)
  run_id = os.path.basename(os.path.normpath(os.path.dirname(os.path.abspath(sweep_dir))))
  records = []
  for trial_dir, result in found:
    config = trial_dir.rpartition(os.sep)[0]
    records.append(from_result(result, commit=rev.sha, commit_time=rev.time, suite=suite.name,
                               config=config or "default", seed=result.seed, round_=0,
                               source="bench", run_id=run_id, fingerprint=fingerprint,
                               info=info))
  return records, "", left_out
