"""The A/B's throughput probe: its bookkeeping (windows -> estimators -> pairs ->
rows and paired noise) on the fake suite's repository, with a fake runner that
writes windows (no TensorFlow, no timing)."""

import hashlib
import math
import os

import numpy as np
import pytest

from replibench import results
from replibench.tracking import ab, paired, probe, revisions
from tests import tracking_fakes as fakes

DESIGN = probe.Design(processes=4, steps=100, window_steps=10, warmup_windows=2)


def _result(windows, batch=10, eps=None):
  return results.RunResult(status="budget_exhausted", workload="fake",
                           target_metric="eval/top1", target=0.5, higher_is_better=True,
                           global_batch_size=batch, examples_per_s=eps, windows=windows)


def test_estimators_leave_out_the_warm_up_windows():
  windows = [[10, 10.0, 5.0], [10, 2.0, 4.0],              # warm-up: left out
             [10, 1.0, 2.0], [10, 0.5, 1.0], [10, 1.0, 2.0], [10, 2.0, 4.0]]
  v = probe.values(_result(windows, eps=42.0), DESIGN)
  # 100 examples a window: 100, 200, 100, 50 examples/s
  assert v["run"] == 42.0
  assert v["mean"] == pytest.approx(400 / 4.5)
  assert v["median"] == pytest.approx(100.0)
  assert v["best"] == pytest.approx(200.0)
  assert v["trimmed"] == pytest.approx(100.0)
  assert v["cpu"] == pytest.approx(400 / 9.0)
  short = probe.values(_result(windows[:3]), DESIGN)        # one steady window
  assert short["median"] is None and short["run"] is None


def test_a_design_needs_processes_and_steady_windows():
  probe.Design().check()
  for bad in (dict(processes=1), dict(steps=40, window_steps=20), dict(judged="fastest")):
    with pytest.raises(ValueError):
      probe.Design(**bad).check()


class WindowRunner:
  """Writes a probe trial's windows: examples/s = 1000 x speed.txt x a process's own
  factor (sigma_process) x each window's (sigma_window); the warm-up windows run a
  random 5-70% slower; the second process of a pair is `order` faster."""

  def __init__(self, sigma_process=0.01, sigma_window=0.02, order=1.0):
    self.sigma_process, self.sigma_window, self.order = sigma_process, sigma_window, order
    self.trials, self.started = [], set()

  def __call__(self, side, trial, trial_dir):
    with open(os.path.join(side.env.code, "speed.txt")) as f:
      speed = float(f.read())
    self.trials.append(trial)
    key = (trial.name, os.path.basename(trial_dir))
    second = key in self.started
    self.started.add(key)
    rng = np.random.default_rng(int(hashlib.sha256(repr((side.label, key)).encode())
                                    .hexdigest()[:8], 16))
    windows_steps = DESIGN.window_steps
    base = 1000 * speed * math.exp(self.sigma_process * rng.standard_normal())
    base *= self.order if second else 1.0
    slow = rng.uniform(0.3, 0.95)
    windows, examples, seconds = [], 0, 0.0
    for i in range(DESIGN.steps // windows_steps):
      eps = base * math.exp(self.sigma_window * rng.standard_normal())
      eps *= slow if i < DESIGN.warmup_windows else 1.0
      wall = windows_steps * 10 / eps
      windows.append([windows_steps, wall, 2 * wall])
      examples, seconds = examples + windows_steps * 10, seconds + wall
    results.write(trial_dir, results.RunResult(
        status="budget_exhausted", workload="fake", target_metric="eval/top1", target=0.5,
        higher_is_better=True, global_batch_size=10, examples_per_s=examples / seconds,
        windows=windows, seed=trial.seed))
    return 0


def _sides(repo, base, head):
  return ab.prepare_sides(repo, revisions.resolve(repo, base, "--base"),
                          revisions.resolve(repo, head, "--head"), log=lambda line: None)


@pytest.fixture
def repo(tmp_path):
  return fakes.make_repo(tmp_path / "repo")


def test_the_probe_runs_interleaved_processes_and_judges_the_steady_windows(repo, tmp_path):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "slower", speed=0.9)
  runner = WindowRunner()
  outcome = probe.run(fakes.SUITE, _sides(repo, good, "HEAD"), str(tmp_path / "ab"),
                      ab.Options(), DESIGN, trial_runner=runner, log=lambda line: None)
  # 2 configurations x 1 seed x 4 processes a side, each with the probe's bindings.
  assert len(runner.trials) == 16 and len(outcome.pairs) == 8
  assert all("Experiment.log_every_steps = 10" in t.bindings and t.seed == 1
             for t in runner.trials)
  pooled = outcome.rows[0]
  assert pooled.metric == probe.JUDGED and pooled.verdict == paired.REGRESSION
  assert pooled.estimate.ratio == pytest.approx(0.9, abs=0.03)
  # The trial's own examples/s carries the random warm-up; the steady windows do not.
  assert outcome.noise["median"]["sd"] < outcome.noise["run"]["sd"] / 1.5
  assert set(outcome.noise) == {"run", *probe.ESTIMATORS}


def test_identical_code_with_an_order_effect_is_no_regression(repo, tmp_path):
  sides = _sides(repo, "HEAD", "HEAD")
  outcome = probe.run(fakes.SUITE, sides, str(tmp_path / "aa"), ab.Options(), DESIGN,
                      trial_runner=WindowRunner(order=1.08), log=lambda line: None)
  assert all(r.verdict != paired.REGRESSION for r in outcome.rows)
  # 8 pairs: Yuen's trimmed interval, the order left to ABBA's balance.
  assert outcome.rows[0].estimate.model == "trimmed" and "Yuen" in outcome.rows[0].note
  six = probe.Design(processes=6, steps=100, window_steps=10, warmup_windows=2)
  outcome = probe.run(fakes.SUITE, sides, str(tmp_path / "aa12"), ab.Options(), six,
                      trial_runner=WindowRunner(order=1.08), log=lambda line: None)
  # 12 pairs: the order enters the trimmed estimate.
  assert all(r.verdict != paired.REGRESSION for r in outcome.rows)
  assert outcome.rows[0].estimate.model == "trimmed+order"
  assert outcome.rows[0].estimate.order_effect == pytest.approx(1.08 ** 2, rel=0.05)


def test_the_runner_adds_max_steps_to_the_trials_command(repo, tmp_path, monkeypatch):
  seen = []

  class Proc:
    def wait(self):
      return 0
  monkeypatch.setattr(probe.processes, "popen",
                      lambda command, **kw: seen.append(command) or Proc())
  base, _ = _sides(repo, "HEAD", "HEAD")
  trial = ab._trials(base, fakes.SUITE, ab.Options())[1]["replicas=1/seed=1"]
  os.makedirs(tmp_path / "t")
  assert probe.runner(300)(base, trial, str(tmp_path / "t")) == 0
  assert seen[0][-1] == "--max_steps=300" and "run" in seen[0]


def test_probe_power_reads_the_pairs_an_ab_wrote(repo, tmp_path):
  """benchmarks/tracking/probe_study.py power resamples the pairs of A/A runs: it must read back from an
  A/B's directories the pairs the A/B judged, with their order."""
  from tests import helpers
  script = helpers.benchmark_script("tracking/probe_study")
  outcome = probe.run(fakes.SUITE, _sides(repo, "HEAD", "HEAD"), str(tmp_path / "aa"),
                      ab.Options(), DESIGN, trial_runner=WindowRunner(), log=lambda line: None)
  configs = list(dict.fromkeys(p.config for p in outcome.pairs))   # the sweep's order
  read = script.from_ab_dir(str(tmp_path / "aa"), DESIGN, configs)
  judged = sorted((math.log(p.head.metrics[DESIGN.judged] / p.base.metrics[DESIGN.judged]),
                   p.order) for p in outcome.pairs)
  assert len(read) == 8
  assert [o for _, o in sorted(read)] == [o for _, o in judged]
  assert [x for x, _ in sorted(read)] == pytest.approx([x for x, _ in judged])
