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
  probe/<suite>/<base|head>/<config>/seed=<s>/round=<r>/   the throughput probe's
                                     processes (a suite whose design has one: probe.py)
An A/B run again on the same directory skips the trials that already finished.

Every input is checked before anything is checked out or written (validate.py).
A trial that fails (no result, or status 'failed') is named in the outcome and
makes the A/B exit 1, whatever the verdicts; so does a suite without one pair whose
two trials both ran to a result (nothing could be judged). Failed trials never
enter the history (record.py).
"""

import dataclasses
import os
import time
from typing import Callable, Sequence

from replibench import results
from replibench.errors import UserError
from replibench.suite import report
from replibench.suite import sweep as sweep_lib
from replibench.suite import sweep_file
from replibench.suite.sweep_file import Trial
from replibench.tracking import environments, record, revisions, validate, verdicts
from replibench.tracking.suites import Suite


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
  probe_processes: int | None = None  # None: the suite's probe design; 0: no probe


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
  failed: list[str] = dataclasses.field(default_factory=list)   # 'side trial round=r: dir'
  probe: dict | None = None   # the throughput probe's design, noise, time (probe.attach)

  @property
  def regressions(self) -> list[verdicts.Row]:
    return [r for r in self.rows if r.verdict == "regression"]

  @property
  def judgeable(self) -> int:
    """Pairs whose two trials both ran to a result."""
    return sum(p.base.status != "failed" and p.head.status != "failed" for p in self.pairs)


# runner(side, trial, trial_dir): runs one trial, leaving trial_dir/result.json.
Runner = Callable[[SideSpec, Trial, str], object]


def subprocess_runner(side: SideSpec, trial: Trial, trial_dir: str) -> object:
  """The side's `replibench run` (or `launch`) in its checkout, with its interpreter."""
  return sweep_lib.subprocess_runner(trial, trial_dir, python=side.env.python,
                                     cwd=side.env.code, env=side.env.variables())


def prepare_side(repo: str, label: str, rev: revisions.Revision, suites: Sequence[Suite],
                 options: "Options", deferred: Sequence[str] = (),
                 validator: validate.Validator = validate.subprocess_validator,
                 log=print) -> SideSpec:
  """Checks out one revision and picks its environment; compiles the configs of the
  suites named in `deferred` (those validate.check_revisions could not: no
  environment could load that revision's code before it was built)."""
  code = revisions.worktree(repo, rev.sha)
  env = environments.for_revision(repo, rev, code, log)
  log(f"{label}: {rev.describe()} in {code}; runs in {env.note}")
  side = SideSpec(label, rev, env)
  for suite in suites:
    if suite.name in deferred:
      trials = validate.trials_at(code, suite, options, label, rev)[1]
      try:
        validator(env.python, code, validate.distinct_configs(list(trials.values())))
      except UserError as e:
        raise UserError(f"--suite={suite.name} at the {label} revision {rev.describe()}: "
                        f"{e}") from None
  return side


def prepare_sides(repo: str, base: revisions.Revision, head: revisions.Revision,
                  suites: Sequence[Suite] = (), options: "Options | None" = None,
                  deferred: dict | None = None,
                  validator: validate.Validator = validate.subprocess_validator,
                  log=print) -> tuple[SideSpec, SideSpec]:
  """Checks out both revisions and picks each one's environment."""
  deferred = deferred or {}
  return tuple(prepare_side(repo, label, rev, suites, options or Options(),
                            deferred.get(label, ()), validator, log)
               for label, rev in (("base", base), ("head", head)))


def design(suite: Suite, options: Options) -> tuple[tuple | None, tuple | None, int]:
  """(configurations or None for all, seeds or None for the sweep's, rounds) an A/B runs:
  the options' where given, else the suite's default design."""
  configs, seeds = validate.design(suite, options)
  return configs, seeds, options.rounds or suite.rounds


def trials_of(side: SideSpec, suite: Suite, options: Options) -> tuple[sweep_file.Sweep, dict]:
  """The suite's trials as this A/B runs them at the side's checkout ({name: trial})."""
  return validate.trials_at(side.env.code, suite, options, side.label, side.rev)


_trials = trials_of


def _judged(sweep: sweep_file.Sweep, options: Options) -> list[str]:
  if options.metrics is not None:
    return list(options.metrics)
  listed = sweep.judge if sweep.judge is not None else ("converged", *verdicts.METRICS)
  return [m for m in listed if m == "converged" or m in verdicts.METRICS]


def schedule(names: Sequence[str], rounds: int) -> list[tuple[int, str, str]]:
  """(round, trial name, order) in run order: ABBA, alternating from configuration to
  configuration, within each configuration from seed to seed, and by round.

  Alternating by position alone made the order the configuration wherever a design has
  an even number of them (D4PG's replicas=1 always base first, workers=2 always head
  first), so an order effect could not be told from the configuration's own ratio. With
  an odd number of configurations, seed-major, this is the same order as by position.
  """
  out = []
  configs: dict[str, int] = {}
  for r in range(rounds):
    seen: dict[int, int] = {}
    for name in names:
      c = configs.setdefault(report.config_name(name), len(configs))
      k = seen[c] = seen.get(c, -1) + 1
      out.append((r, name, "AB" if (r + c + k) % 2 == 0 else "BA"))
  return out


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
  if not names:   # validate.check_revisions refuses this before anything runs.
    raise UserError(f"--suite={suite.name}: the two revisions' {suite.sweep} share no trial "
                    f"(base has {sorted(base_trials)[:3]}..., head {sorted(head_trials)[:3]}...).")
  rounds = design(suite, options)[2]
  plan = schedule(names, rounds)
  started, pairs, kept, failed = time.monotonic(), [], [], []
  log(f"{suite.name}: {len(names)} trials x {rounds} round(s) x 2 sides = {2 * len(plan)} "
      f"runs, ABBA order")
  for i, (r, name, order) in enumerate(plan, 1):
    outcome = {}
    for side in (sides if order == "AB" else sides[::-1]):
      trial = (base_trials if side.label == "base" else head_trials)[name]
      trial_dir = os.path.join(workdir, suite.name, side.label, name, f"round={r}")
      outcome[side.label] = _run_side(side, trial, trial_dir, runner)
      if outcome[side.label][0].status == "failed":
        failed.append(f"{side.label} {side.rev.short} {name} round={r} (see "
                      f"{os.path.join(trial_dir, sweep_lib.LOG_FILE)})")
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
               sorted(set(head_trials) - set(base_trials)), time.monotonic() - started,
               failed)
  return ab, kept
