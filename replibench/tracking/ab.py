"""`replibench ab`: two revisions' suite trials, interleaved on this machine, judged in pairs.

The design that removes a shared machine's drift (asv continuous, Chromium
Pinpoint): both revisions are checked out (revisions.worktree) and run on this
machine now, trial by trial, in ABBA order: for every configuration and seed
the base and the head run back to back, the one that goes first alternating
from pair to pair and from round to round, with the same seeds, bindings and
pinning. A pair shares the machine's state, so its ratio head/base carries the
code's effect and little of the machine's; verdicts come from the paired ratios
(verdicts.py). No calibration and no committed baseline are involved.

Layout of an A/B directory (--workdir, default runs/ab/<time>-<base>-<head>/):
  ab.json, report.md                 the outcome (written at the end)
  <suite>/<base|head>/<config>/seed=<s>/round=<r>/   each trial's run directory
An A/B run again on the same directory skips the trials that already finished.
"""

import dataclasses
import os
import time
from typing import Callable, Sequence

from replibench import results
from replibench.errors import UserError
from replibench.suite import sweep as sweep_lib
from replibench.suite import sweep_file
from replibench.suite.sweep_file import Trial
from replibench.tracking import environments, record, revisions, verdicts
from replibench.tracking.suites import ALL_CONFIGS, Suite


@dataclasses.dataclass(frozen=True)
class SideSpec:
  """One side of the A/B: a revision, its checkout and the environment that runs it."""
  label: str                          # 'base' or 'head'
  rev: revisions.Revision
  env: environments.Environment


@dataclasses.dataclass(frozen=True)
class Options:
  rounds: int | None = None           # None: the suite's default (suites.py)
  seeds: tuple[int, ...] | None = None   # None: the suite's default, else the sweep file's
  configs: tuple[str, ...] | None = None  # None: the suite's default; ('all',): every one
  bindings: tuple[str, ...] = ()      # gin bindings added to every trial on both sides
  metrics: tuple[str, ...] | None = None  # None: the head sweep file's judge list
  min_effects: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SuiteAB:
  suite: str
  workload: str
  target_metric: str
  higher_is_better: bool
  judged: list[str]
  rounds: int
  pairs: list[verdicts.Pair]
  rows: list[verdicts.Row]
  only_base: list[str]
  only_head: list[str]
  seconds: float

  @property
  def regressions(self) -> list[verdicts.Row]:
    return [r for r in self.rows if r.verdict == "regression"]


# runner(side, trial, trial_dir): runs one trial, leaving trial_dir/result.json.
Runner = Callable[[SideSpec, Trial, str], object]


def subprocess_runner(side: SideSpec, trial: Trial, trial_dir: str) -> object:
  """The side's `replibench run` (or `launch`) in its checkout, with its interpreter."""
  return sweep_lib.subprocess_runner(trial, trial_dir, python=side.env.python,
                                     cwd=side.env.code, env=side.env.variables())


def prepare_sides(repo: str, base: revisions.Revision, head: revisions.Revision,
                  log=print) -> tuple[SideSpec, SideSpec]:
  """Checks out both revisions and picks each one's environment."""
  sides = []
  for label, rev in (("base", base), ("head", head)):
    code = revisions.worktree(repo, rev.sha)
    env = environments.for_revision(repo, rev, code, log)
    log(f"{label}: {rev.describe()} in {code}; runs in {env.note}")
    sides.append(SideSpec(label, rev, env))
  return sides[0], sides[1]


def check_suites(repo: str, revs: dict[str, revisions.Revision],
                 suites: Sequence[Suite]) -> None:
  """Every suite's sweep file exists at every revision ({label: revision})."""
  for label, rev in revs.items():
    for suite in suites:
      if not revisions.has_path(repo, rev.sha, suite.sweep):
        raise UserError(
            f"--suite={suite.name}: the {label} revision {rev.describe()} has no "
            f"{suite.sweep}, so it cannot run that suite (it was added or renamed later). "
            f"Choose a {label} revision that has it, or A/B the other suites.")


def design(suite: Suite, options: Options) -> tuple[tuple | None, tuple | None, int]:
  """(configurations or None for all, seeds or None for the sweep's, rounds) an A/B runs:
  the options' where given, else the suite's default design."""
  configs = suite.configs if options.configs is None else options.configs
  if configs is not None and ALL_CONFIGS in configs:
    configs = None
  seeds = suite.seeds if options.seeds is None else options.seeds
  return configs, seeds, options.rounds or suite.rounds


def _trials(side: SideSpec, suite: Suite, options: Options) -> tuple[sweep_file.Sweep, dict]:
  sweep = sweep_file.load(os.path.join(side.env.code, suite.sweep))
  configs, seeds, _ = design(suite, options)
  trials = sweep_file.expand(sweep, seeds=seeds, extra_bindings=options.bindings)
  if configs is not None:
    known = {t.config for t in trials}
    unknown = [c for c in configs if c not in known]
    if unknown:
      given = (f"--configs={','.join(configs)}" if options.configs is not None
               else f"suite {suite.name}'s default configurations ({', '.join(configs)})")
      raise UserError(f"{given}: {unknown} not in {suite.sweep} at {side.label} "
                      f"{side.rev.short} (it has {', '.join(sorted(known))}; "
                      f"--configs=all runs every one).")
    trials = [t for t in trials if t.config in configs]
  return sweep, {t.name: t for t in trials}


def _judged(sweep: sweep_file.Sweep, options: Options) -> list[str]:
  if options.metrics is not None:
    return list(options.metrics)
  listed = sweep.judge if sweep.judge is not None else ("converged", *verdicts.METRICS)
  return [m for m in listed if m == "converged" or m in verdicts.METRICS]


def schedule(names: Sequence[str], rounds: int) -> list[tuple[int, str, str]]:
  """(round, trial name, order) in run order: ABBA, alternating by pair and by round."""
  return [(r, name, "AB" if (r + i) % 2 == 0 else "BA")
          for r in range(rounds) for i, name in enumerate(names)]


def _outcome(trial_dir: str) -> tuple[verdicts.Side, results.RunResult | None]:
  try:
    result = results.read(trial_dir)
  except UserError:   # A garbled result.json: the trial failed.
    result = None
  status = result.status if result is not None else "failed"
  return verdicts.Side(status, record.metrics_of(result)), result


def _run_side(side: SideSpec, trial: Trial, trial_dir: str, runner: Runner):
  """The trial's outcome; runs it unless an earlier run of this A/B finished it."""
  done = _outcome(trial_dir)
  if done[1] is not None and done[1].is_final:
    return done
  os.makedirs(trial_dir, exist_ok=True)
  runner(side, trial, trial_dir)
  return _outcome(trial_dir)


def _pair_line(i: int, n: int, r: int, name: str, base: verdicts.Side, head: verdicts.Side,
               started: float) -> str:
  def show(s: verdicts.Side) -> str:
    eps = s.metrics.get("examples_per_s")
    ttt = s.metrics.get("time_to_target_s")
    return (f"{s.status}" + (f", {eps:,.0f} ex/s" if eps else "")
            + (f", target in {ttt:.1f} s" if ttt is not None else ""))
  elapsed = time.monotonic() - started
  eta = elapsed / i * (n - i)
  ratio = ""
  if base.metrics.get("examples_per_s") and head.metrics.get("examples_per_s"):
    ratio = f"; examples/s head/base {head.metrics['examples_per_s'] / base.metrics['examples_per_s']:.3f}"
  return (f"[pair {i}/{n}, round {r + 1}] {name}: base {show(base)} | head {show(head)}"
          f"{ratio}; {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min")


def run_suite(suite: Suite, sides: tuple[SideSpec, SideSpec], workdir: str, options: Options,
              runner: Runner = subprocess_runner, log=print) -> tuple[SuiteAB, list]:
  """Runs one suite's pairs; returns its verdicts and (side, pair, result) for history."""
  base, head = sides
  workdir = os.path.abspath(workdir)   # The trials run from their revision's checkout.
  head_sweep, head_trials = _trials(head, suite, options)
  _, base_trials = _trials(base, suite, options)
  names = [n for n in head_trials if n in base_trials]
  if not names:
    raise UserError(f"--suite={suite.name}: the two revisions' {suite.sweep} share no trial "
                    f"(base has {sorted(base_trials)[:3]}..., head {sorted(head_trials)[:3]}...).")
  rounds = design(suite, options)[2]
  plan = schedule(names, rounds)
  started, pairs, kept = time.monotonic(), [], []
  log(f"{suite.name}: {len(names)} trials x {rounds} round(s) x 2 sides = {2 * len(plan)} "
      f"runs, ABBA order")
  for i, (r, name, order) in enumerate(plan, 1):
    outcome = {}
    for side in (sides if order == "AB" else sides[::-1]):
      trial = (base_trials if side.label == "base" else head_trials)[name]
      trial_dir = os.path.join(workdir, suite.name, side.label, name, f"round={r}")
      outcome[side.label] = _run_side(side, trial, trial_dir, runner)
    record.check_same_compilation(name, outcome["base"][1], outcome["head"][1])
    trial = head_trials[name]
    pair = verdicts.Pair(trial.config, trial.seed, r, order, outcome["base"][0],
                         outcome["head"][0])
    pairs.append(pair)
    kept += [(side, pair, outcome[side.label][1]) for side in sides]
    log(_pair_line(i, len(plan), r, name, pair.base, pair.head, started))
  result = next((res for _, _, res in kept if res is not None), None)
  higher = result.higher_is_better if result else True
  judged = _judged(head_sweep, options)
  ab = SuiteAB(suite.name, result.workload if result else "?",
               result.target_metric if result else "?", higher, judged, rounds, pairs,
               verdicts.rows(pairs, judged, higher, options.min_effects),
               sorted(set(base_trials) - set(head_trials)),
               sorted(set(head_trials) - set(base_trials)), time.monotonic() - started)
  return ab, kept
