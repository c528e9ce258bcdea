"""Experiment.inject_slowdown's extra work: sized to remove the asked fraction, carried
as a debt from call to call (no timing thresholds: the loop's own bookkeeping)."""

import pytest

from replibench.harness import progress, slowdown


def test_the_work_owed_removes_the_asked_fraction_of_the_rate():
  call = 0.02
  for fraction in (0.05, 0.1, 0.3):
    owed = slowdown.owed_seconds(call, fraction)
    assert call / (call + owed) == pytest.approx(1 - fraction)
  assert slowdown.owed_seconds(call, 0.0) == 0.0
  with pytest.raises(ValueError):
    slowdown.owed_seconds(call, 1.0)


def test_the_work_runs_at_least_what_is_owed_and_carries_the_rest():
  work = slowdown._Work()
  ran = work.burn(0.002)
  assert ran >= 0.002 and work.debt_s <= 0   # over-ran by at most one matmul: a credit
  credit = -work.debt_s
  ran_next = work.burn(credit / 2)           # already paid: no work at all
  assert ran_next == 0.0 and work.debt_s == pytest.approx(-credit / 2)


def test_the_meter_sums_the_calls_after_the_first_in_windows():
  meter = progress.Meter(0, 100, global_batch_size=8, window_steps=4)
  meter.trained(2, 5.0, 9.0)                 # the first call: apart
  for _ in range(5):
    meter.trained(2, 0.5, 0.9)
  assert meter.first_call_s == 5.0
  assert meter.windows == [[4, 1.0, 1.8], [4, 1.0, 1.8]]   # the fifth call's window is open
  assert meter.examples_per_s() == pytest.approx(10 * 8 / 2.5)


def test_a_run_records_its_windows_and_runs_the_slowdown_work(tmp_path):
  """One tiny run: result.json carries [steps, wall s, CPU s] per window of
  log_every_steps steps, and the injected work ran inside the timed calls."""
  import os

  from replibench.config import load_experiment
  from replibench.harness.loop import run_experiment
  from tests import helpers
  config = "configs/resnet/fashion_mnist.gin"
  experiment = load_experiment([os.path.join(helpers.REPO, config)],
                               [*helpers.TINY[config], "Experiment.log_every_steps = 2",
                                "Experiment.inject_slowdown = 0.3"])
  result = run_experiment(experiment, str(tmp_path), max_steps=7)
  # The calls after the first, in whole windows (the last one may be open).
  assert [w[0] for w in result.windows] == [2] * ((result.final_step - 1) // 2)
  assert result.windows
  assert all(w[1] > 0 and w[2] > 0 for w in result.windows)
  assert slowdown._WORK.matrix is not None              # the work ran in this process
