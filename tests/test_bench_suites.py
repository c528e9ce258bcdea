"""The suites `make bench` runs: each sweep's trials compile at full and smoke scale,
and the committed baselines match the sweeps they track."""

import os
import re

import pytest

from replibench.config import load_experiment
from replibench.suite import report as report_lib
from replibench.suite import sweep_file
from tests import helpers


def makefile_suites() -> dict[str, str]:
  """{workload: sweep file} as the Makefile's SWEEP_<workload> variables declare them."""
  with open(os.path.join(helpers.REPO, "Makefile")) as f:
    return dict(re.findall(r"^SWEEP_(\w+) := (\S+)$", f.read(), flags=re.M))


def smoke_binding(workload: str) -> str:
  return f"include 'configs/{workload}/smoke.gin'"


def trials(workload: str, smoke: bool) -> list[sweep_file.Trial]:
  sweep = sweep_file.load(os.path.join(helpers.REPO, makefile_suites()[workload]))
  extra = [smoke_binding(workload)] if smoke else []
  return sweep_file.expand(sweep, (), [1] if smoke else None, extra)


def test_makefile_declares_a_suite_per_workload():
  suites = makefile_suites()
  assert set(suites) == {"resnet", "sngan", "d4pg"}
  for workload, path in suites.items():
    assert os.path.isfile(os.path.join(helpers.REPO, path)), path
    assert os.path.isfile(os.path.join(helpers.REPO, "configs", workload, "smoke.gin"))


@pytest.mark.parametrize("workload", ["resnet", "sngan", "d4pg"])
@pytest.mark.parametrize("smoke", [False, True], ids=["full", "smoke"])
def test_every_trial_compiles(workload, smoke):
  experiments = [load_experiment(list(t.gin_files), list(t.bindings))
                 for t in trials(workload, smoke)]
  assert len({e.workload.name for e in experiments}) == 1
  assert len({e.target for e in experiments}) == 1   # one target per suite: one report
  if smoke:   # tiny: a handful of steps per trial
    assert max(e.total_steps for e in experiments) <= 100


@pytest.mark.parametrize("workload", ["resnet", "sngan", "d4pg"])
@pytest.mark.parametrize("smoke", [False, True], ids=["full", "smoke"])
def test_committed_baseline_tracks_the_suite(workload, smoke):
  name = "smoke_baseline.json" if smoke else "baseline.json"
  path = os.path.join(helpers.REPO, "results", workload, name)
  if not os.path.isfile(path):
    pytest.fail(f"results/{workload}/{name} is missing: run `make bench` (or bench-smoke) "
                f"and `make bench-accept`")
  baseline = report_lib.load_report(path)
  experiment = load_experiment(list(trials(workload, smoke)[0].gin_files),
                                  list(trials(workload, smoke)[0].bindings))
  assert baseline.workload == experiment.workload.name
  assert baseline.target == pytest.approx(experiment.target)
  assert {c.config for c in baseline.configs} == {t.config for t in trials(workload, smoke)}
