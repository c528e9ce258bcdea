"""The throughput probe inside `replibench ab` (commands.run_ab), on the fake suite's
repository (tests/tracking_fakes.py): the probe's processes and pairs beside the
time-to-target pairs, its row in the suite's family, the estimator read from
probe.JUDGED, a failed probe process named and exit 1, bad probe input refused
before anything is written. Fake runners write the results (no TensorFlow, no timing)."""

import dataclasses
import hashlib
import json
import math
import os

import numpy as np
import pytest

from replibench import results
from replibench.errors import UserError
from replibench.tracking import ab, ab_report, commands, paired, probe, revisions, store
from replibench.tracking import suites, validate
from tests import helpers
from tests import tracking_fakes as fakes

PROBE = suites.ProbeDesign(processes=3, steps=60, window_steps=10, warmup_windows=2)
SUITE = dataclasses.replace(fakes.SUITE, seeds=(1, 2), probe=PROBE)


class ProbeRunner:
  """Writes a probe process's windows: examples/s = 1000 x speed.txt x a process's own
  factor (1% log-normal) x each window's (1%); the warm-up windows run slower. A
  process fail(side, trial, trial_dir) names fails (no result)."""

  def __init__(self, fail=None):
    self.calls, self.fail = [], fail

  def __call__(self, side, trial, trial_dir):
    self.calls.append((side.label, trial, trial_dir))
    if self.fail is not None and self.fail(side, trial, trial_dir):
      return 1
    with open(os.path.join(side.env.code, "speed.txt")) as f:
      speed = float(f.read())
    key = repr((side.label, trial.name, os.path.basename(trial_dir)))
    rng = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
    rate = 1000 * speed * math.exp(0.01 * rng.standard_normal())
    windows = []
    for i in range(PROBE.steps // PROBE.window_steps):
      eps = rate * math.exp(0.01 * rng.standard_normal()) * (0.6 if i < 2 else 1.0)
      wall = PROBE.window_steps * 10 / eps
      windows.append([PROBE.window_steps, wall, 2 * wall])
    results.write(trial_dir, results.RunResult(
        status="budget_exhausted", workload="fake", target_metric="eval/top1", target=0.5,
        higher_is_better=True, global_batch_size=10, examples_per_s=rate * 0.8,
        windows=windows, seed=trial.seed))
    return 0


@pytest.fixture
def repo(tmp_path, monkeypatch):
  monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "history"))
  return fakes.make_repo(tmp_path / "repo")


def _ab(repo, base, head, workdir="t", suite=SUITE, probe_runner=None, **options):
  outcomes, text = commands.run_ab(
      revisions.resolve(repo, base, "--base"), revisions.resolve(repo, head, "--head"),
      [suite], ab.Options(**options), repo, os.path.join(repo, "runs", "ab", workdir),
      runner=fakes.FakeRunner(sigma=0.01), validator=fakes.validate, log=lambda line: None,
      probe_runner=probe_runner or ProbeRunner())
  return outcomes[0], text


def _rows(outcome, metric):
  return [r for r in outcome.rows if r.metric == metric]


def test_the_probe_runs_beside_the_time_to_target_pairs_and_its_row_judges_throughput(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "slower", speed=0.9)
  runner = ProbeRunner()
  outcome, text = _ab(repo, good, "HEAD", probe_runner=runner)
  # Time to target: 2 configurations x 2 seeds; the probe: 2 x 3 processes a side, seed 1,
  # in ABBA order (the processes are rounds), with the probe's bindings.
  assert len(outcome.pairs) == 4 and len(runner.calls) == 12
  leaders = [label for label, _, _ in runner.calls[::2]]
  assert leaders[:4] == ["base", "head", "head", "base"]
  assert all(t.seed == 1 and "Experiment.log_every_steps = 10" in t.bindings
             and "Experiment.train_epochs = 1000" in t.bindings for _, t, _ in runner.calls)
  assert all(f"{os.sep}probe{os.sep}fake{os.sep}{label}{os.sep}" in d
             for label, _, d in runner.calls)
  # The probe's row replaces the trials' own examples/s; it is one more row of the family.
  assert not _rows(outcome, "examples_per_s")
  pooled = _rows(outcome, probe.JUDGED)[0]
  assert pooled.config == "all configs" and pooled.label == f"examples/s (probe, {probe.JUDGED})"
  assert pooled.verdict == paired.REGRESSION
  assert pooled.estimate.ratio == pytest.approx(0.9, abs=0.02)
  family = 4   # converged, time to target, steps to target, the probe
  assert pooled.estimate.level == pytest.approx(paired.bonferroni(paired.LEVEL, family))
  assert _rows(outcome, "time_to_target_s")[0].estimate.level == pytest.approx(
      pooled.estimate.level)
  assert outcome.probe["pairs"] == 6 and outcome.probe["judged"] == probe.JUDGED
  assert set(outcome.probe["noise"]) == {"run", *probe.ESTIMATORS}
  assert ab_report.exit_code([outcome]) == 1
  assert "throughput probe: 6 pairs" in text and f"(probe, {probe.JUDGED})" in text
  written = json.load(open(os.path.join(repo, "runs", "ab", "t", ab_report.JSON_FILE)))
  assert written["suites"][0]["probe"]["design"]["processes"] == 3


def test_the_ab_judges_the_estimator_probe_judged_names(repo, monkeypatch):
  monkeypatch.setattr(probe, "JUDGED", "best")
  outcome, text = _ab(repo, "HEAD", "HEAD")
  assert [r.label for r in _rows(outcome, "best")][0] == "examples/s (probe, best)"
  assert not _rows(outcome, "median") and outcome.probe["judged"] == "best"
  assert "judged on the best (probe.JUDGED)" in text
  assert not outcome.regressions


def test_a_failed_probe_process_fails_the_ab_and_is_named(repo):
  fail = lambda side, trial, d: (side.label == "head" and trial.config == "replicas=2"  # noqa: E731
                                 and d.endswith("round=1"))
  outcome, text = _ab(repo, "HEAD", "HEAD", probe_runner=ProbeRunner(fail=fail))
  assert len(outcome.failed) == 1
  assert outcome.failed[0].startswith("probe head") and "replicas=2/seed=1 round=1" in \
      outcome.failed[0]
  assert ab_report.exit_code([outcome]) == 1
  assert "FAILED trial probe head" in text


def test_probe_processes_zero_leaves_the_probe_out_and_one_is_refused(repo):
  runner = ProbeRunner()
  outcome, _ = _ab(repo, "HEAD", "HEAD", probe_processes=0, probe_runner=runner)
  assert not runner.calls and outcome.probe is None
  assert _rows(outcome, "examples_per_s")
  more, _ = _ab(repo, "HEAD", "HEAD", workdir="four", probe_processes=4)
  assert more.probe["pairs"] == 8
  with pytest.raises(UserError, match=r"--probe_processes=1: .* at least 2"):
    _ab(repo, "HEAD", "HEAD", workdir="one", probe_processes=1)
  assert not os.path.exists(os.path.join(repo, "runs", "ab", "one"))


def test_a_probe_configuration_the_sweep_lacks_is_refused_before_anything_is_written(repo):
  gone = dataclasses.replace(SUITE, probe=dataclasses.replace(PROBE, configs=("replicas=8",)))
  with pytest.raises(UserError, match=r"throughput probe of suite fake .*replicas=8"):
    _ab(repo, "HEAD", "HEAD", workdir="gone", suite=gone)
  assert not os.path.exists(os.path.join(repo, "runs", "ab", "gone", commands.PLAN_FILE))


def test_every_suites_probe_names_configurations_of_its_sweep():
  rev = revisions.resolve(helpers.REPO, "HEAD", "--head")
  for suite in suites.SUITES.values():
    design = probe.design_of(suite, ab.Options())
    if design is None:
      continue
    design.check()
    _, trials = validate.trials_at(helpers.REPO, suite, design.options(ab.Options()), "head",
                                   rev)
    assert {t.config for t in trials.values()} == set(design.configs or suite.configs)


def test_probe_noise_names_the_estimator_with_the_lowest_paired_noise():
  """benchmarks/tracking/probe_study.py noise's last line: which estimator wins, and whether
  probe.JUDGED must change (the trial's own examples/s never competes)."""
  script = helpers.benchmark_script("tracking/probe_study")
  noise = {"run": {"sd": 0.001, "n": 24}, "median": {"sd": 0.030, "n": 24},
           "trimmed": {"sd": 0.020, "n": 24}, "cpu": {"sd": None, "n": 0}}
  best, line = script.choose(noise, judged="median")
  assert best == "trimmed"
  assert 'set JUDGED = "trimmed" in replibench/tracking/probe.py (now "median")' in line
  assert "within the sd's uncertainty" not in line
  best, line = script.choose({**noise, "median": {"sd": 0.021, "n": 24}}, judged="trimmed")
  assert best == "trimmed" and "already names it" in line and "within the sd's" in line


def test_the_probe_row_calls_a_loss_below_the_trials_minimum_effect(repo):
  """The probe's minimum effect is probe.MIN_EFFECT (3%), the trials' 5%: a 4% loss is
  called by the probe's row and by no trial row."""
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "4% slower", speed=0.96)
  outcome, _ = _ab(repo, good, "HEAD")
  assert probe.MIN_EFFECT == 0.03
  assert _rows(outcome, probe.JUDGED)[0].verdict == paired.REGRESSION
  assert _rows(outcome, "time_to_target_s")[0].verdict != paired.REGRESSION


@pytest.mark.parametrize("args, said", [
    (["ab", "--base=HEAD~1", "--head=HEAD", "--suite=resnet", "--probe_processes=1"],
     "--probe_processes=1: the throughput probe needs at least 2 processes"),
    (["bisect", "--good=HEAD~1", "--bad=HEAD", "--suite=resnet", "--metric=examples_per_s",
      "--probe_processes=4"], "--probe_processes not used by this command"),
])
def test_the_cli_refuses_a_bad_probe_flag_before_anything_runs(capsys, args, said):
  from tests import inprocess_cli
  done = inprocess_cli.cli(capsys, *args)
  assert done.returncode == 2 and said in done.stderr + done.stdout
