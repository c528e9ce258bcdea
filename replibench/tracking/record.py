"""Turning runs into history records: an A/B's trials and a `make bench` sweep's."""

import os

from replibench import results
from replibench.errors import UserError
from replibench.suite import results as suite_results
from replibench.tracking import machine, revisions, store

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
      machine_info=info, jit_compile=result.jit_compile if result else None)


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
  """Records for every trial of one suite's A/B; kept: (side, pair, result) triples."""
  info = machine.describe()
  fingerprint = machine.fingerprint(info)
  return [from_result(result, commit=side.rev.sha, commit_time=side.rev.time, suite=suite,
                      config=pair.config, seed=pair.seed, round_=pair.round, source="ab",
                      run_id=run_id, fingerprint=fingerprint, info=info)
          for side, pair, result in kept]


def from_sweep(sweep_dir: str, suite: str, repo: str) -> tuple[list[store.Record], str]:
  """Records for a finished sweep's trials, and why any were left out ('' if none).

  The commit is the one every trial's result.json names; a sweep whose trials ran
  from a dirty checkout or from several commits is not recorded (its figures
  belong to no commit).
  """
  found = suite_results.find_results(sweep_dir)
  if not found:
    raise UserError(f"{sweep_dir} holds no result.json: nothing to record.")
  shas = {r.git_sha for _, r in found if r is not None}
  if len(shas) != 1 or not next(iter(shas)) or next(iter(shas)).endswith("-dirty") \
      or next(iter(shas)) == "unknown":
    return [], (f"not recorded in the history: its trials ran from {', '.join(sorted(shas))} "
                f"(a history entry needs one committed revision)")
  rev = revisions.resolve(repo, next(iter(shas)), "git_sha")
  info = machine.describe()
  fingerprint = machine.fingerprint(info)
  run_id = os.path.basename(os.path.normpath(os.path.dirname(os.path.abspath(sweep_dir))))
  records = []
  for trial_dir, result in found:
    config, _, seed_part = trial_dir.rpartition(os.sep)
    seed = result.seed if result else int(seed_part.partition("=")[2] or 0)
    records.append(from_result(result, commit=rev.sha, commit_time=rev.time, suite=suite,
                               config=config or "default", seed=seed, round_=0,
                               source="bench", run_id=run_id, fingerprint=fingerprint,
                               info=info))
  return records, ""

