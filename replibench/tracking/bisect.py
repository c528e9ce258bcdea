"""`replibench bisect`: the first commit that moved a metric, by A/B runs at midpoints.

Between a good revision and a later bad one (first-parent history), each step
runs an A/B of the good revision against the midpoint of the range still in
doubt (ab.run_suite, so the same pairing, order and verdicts) and asks one
question: did the metric move? A regression or an improvement beyond the
minimum effect means it moved (the culprit is at or before the midpoint);
otherwise it did not (the culprit is after it). The bad revision is taken as
moved, as `git bisect` takes it, so n commits need ceil(log2 n) steps.

Both ends are validated before anything is checked out (validate.py: the suite's
sweep file at each, its configurations compiling with each one's code), and each
midpoint before its step. A step in which a trial failed, or with no pair to judge,
stops the bisect with errors.Failure (exit 1) naming the trials: a step that could
not measure must not steer the search.
"""

import dataclasses
import math
import os
import time

from replibench.errors import Failure, UserError
from replibench.tracking import ab as ab_lib
from replibench.tracking import paired, revisions, validate
from replibench.tracking import workdir as workdir_lib
from replibench.tracking.suites import Suite
from replibench.tracking.verdicts import ALL_CONFIGS


@dataclasses.dataclass(frozen=True)
class Step:
  commit: revisions.Revision
  estimate: paired.Estimate | None
  verdict: str
  moved: bool
  seconds: float

  def line(self, i: int, n: int, metric: str) -> str:
    est = self.estimate.text() if self.estimate else "no estimate"
    return (f"step {i}/{n}: {self.commit.describe()}: {metric} head/base {est} -> "
            f"{self.verdict}: {'moved' if self.moved else 'not moved'} "
            f"({self.seconds / 60:.1f} min)")


@dataclasses.dataclass(frozen=True)
class Outcome:
  first_moved: revisions.Revision
  steps: list[Step]
  seconds: float


def _suite_row(ab: ab_lib.SuiteAB, metric: str):
  rows = [r for r in ab.rows if r.metric == metric]
  pooled = [r for r in rows if r.config == ALL_CONFIGS]
  return (pooled or rows)[0]


def _check_step(ab: ab_lib.SuiteAB, commit: revisions.Revision, step: int) -> None:
  if ab.failed or not ab.judgeable:
    why = ("; ".join(ab.failed) if ab.failed
           else "no pair of trials both ran to a result")
    raise Failure(f"bisect step {step} ({commit.describe()}) could not judge: {why}. "
                  f"Fix what failed (see the trials' logs) and run the bisect again; "
                  f"finished trials are kept.")


def bisect(repo: str, good: revisions.Revision, bad: revisions.Revision, suite: Suite,
           metric: str, options: ab_lib.Options, workdir: str,
           runner: ab_lib.Runner = ab_lib.subprocess_runner,
           validator: validate.Validator = validate.subprocess_validator,
           log=print) -> Outcome:
  """Finds the first commit after good (up to bad) whose A/B against good moves metric."""
  commits = revisions.commits_between(repo, good, bad)
  options = dataclasses.replace(options, metrics=(metric,))
  plan = {"good": good.sha, "bad": bad.sha, "suite": suite.name, "metric": metric,
          "options": dataclasses.asdict(options)}
  workdir_lib.check_plan(workdir, plan, "a bisect")
  lacking = [c for c in commits if not revisions.has_path(repo, c.sha, suite.sweep)]
  if lacking:   # A midpoint without the suite would stop the bisect half-way: refused now.
    raise UserError(f"--suite={suite.name}: {len(lacking)} commit(s) between --good and --bad "
                    f"have no {suite.sweep} ({', '.join(c.short for c in lacking[:5])}): "
                    f"bisect a range in which every commit has the suite.")
  deferred = validate.check_revisions(repo, {"good": good, "bad": bad}, [suite], options,
                                      validator, log)
  good_side = ab_lib.prepare_side(repo, "base", good, [suite], options,
                                  deferred.get("good", ()), validator, log)
  workdir_lib.claim_workdir(workdir, plan, "a bisect")
  lo, hi = 0, len(commits) - 1     # the culprit lies in commits[lo..hi]; commits[hi] moved
  budget = math.ceil(math.log2(len(commits))) if len(commits) > 1 else 0
  log(f"bisect: {len(commits)} commits after {good.describe()} up to {bad.describe()}; "
      f"{budget} A/B step(s) at most, each judging {metric} on suite {suite.name}")
  steps, started = [], time.monotonic()
  while lo < hi:
    mid = (lo + hi) // 2
    commit = commits[mid]
    step_start = time.monotonic()
    try:   # Good and bad compile; a midpoint that does not is the history's, not input's.
      later = validate.check_revisions(repo, {"head": commit}, [suite], options, validator,
                                       log)
      head_side = ab_lib.prepare_side(repo, "head", commit, [suite], options,
                                      later.get("head", ()), validator, log)
    except UserError as e:
      raise Failure(f"bisect step {len(steps) + 1}: the midpoint cannot run the suite, so "
                    f"the search cannot go on: {e}. Bisect a narrower range on either side "
                    f"of {commit.short}.") from None
    ab, _ = ab_lib.run_suite(suite, (good_side, head_side),
                             os.path.join(workdir, f"step{len(steps) + 1}-{commit.sha[:7]}"),
                             options, runner, log=lambda line: log(f"  {line}"))
    _check_step(ab, commit, len(steps) + 1)
    row = _suite_row(ab, metric)
    moved = row.verdict in (paired.REGRESSION, paired.IMPROVEMENT)
    steps.append(Step(commit, row.estimate, row.verdict, moved, time.monotonic() - step_start))
    log(steps[-1].line(len(steps), budget, metric))
    if moved:
      hi = mid
    else:
      lo = mid + 1
  return Outcome(commits[lo], steps, time.monotonic() - started)
