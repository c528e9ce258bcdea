"""Aggregation over seeds and the regression decision, on constructed numbers."""

import pytest

from replibench.suite import aggregate
from replibench.suite import comparison as compare


def test_olympic_mean_drops_fastest_and_slowest_with_five_seeds():
  s = aggregate.time_stats([10.0, 100.0, 12.0, 11.0, 1.0])
  assert s.method == "olympic"
  assert s.n == 5
  assert s.mean == pytest.approx(11.0)           # mean of 10, 11, 12
  assert s.std == pytest.approx(1.0)
  assert (s.min, s.max) == (1.0, 100.0)


def test_fewer_than_five_seeds_give_mean_and_std():
  s = aggregate.time_stats([10.0, 12.0, 14.0])
  assert s.method == "mean"
  assert s.mean == pytest.approx(12.0)
  assert s.std == pytest.approx(2.0)


def test_unconverged_seeds_are_excluded_and_can_drop_below_olympic():
  # Six seeds, two never converged: four converged values -> mean, not olympic.
  s = aggregate.time_stats([10.0, None, 12.0, 14.0, None, 16.0])
  assert (s.method, s.n) == ("mean", 4)
  assert s.mean == pytest.approx(13.0)
  assert aggregate.time_stats([None, None]) is None


def test_row_counts_converged_seeds_and_scaling_efficiency():
  def run(seed, ttt, eps):
    return aggregate.SeedRun(seed, "reached" if ttt else "budget_exhausted", f"s{seed}", ttt,
                             100 if ttt else None, 1.0 if ttt else None, eps, 0.93, 50.0, [])
  one = aggregate.ConfigRow("replicas=1", "logical_replicas", "", 1, 1, 256,
                            [run(1, 100.0, 1000.0), run(2, 120.0, 1000.0)])
  two = aggregate.ConfigRow("replicas=2", "logical_replicas", "", 2, 1, 256,
                            [run(1, 55.0, 1500.0), run(2, None, 1500.0), run(3, 55.0, 1500.0)])
  for row in (one, two):
    aggregate.summarize(row)
  aggregate.add_scaling([one, two])
  assert (two.converged, two.n) == (2, 3)
  assert two.time_to_target_s.mean == pytest.approx(55.0)
  assert two.examples_per_s.mean == pytest.approx(1500.0)   # throughput counts all seeds
  assert two.reference == "replicas=1"
  assert two.efficiency == pytest.approx(1500.0 / (2 * 1000.0))
  assert two.speedup == pytest.approx(110.0 / 55.0)
  assert one.efficiency == pytest.approx(1.0)


BASE = [100.0, 103.0, 98.0, 101.0, 99.0]


def test_clear_regression_in_time():
  d = compare.decide(BASE, [130.0, 128.0, 133.0, 131.0, 129.0], lower_is_better=True)
  assert d.verdict == compare.REGRESSION
  assert d.p_value < 0.05


def test_clear_improvement_in_throughput():
  d = compare.decide(BASE, [150.0, 149.0, 152.0], lower_is_better=False)
  assert d.verdict == compare.IMPROVEMENT


def test_noise_within_spread_is_no_change():
  d = compare.decide(BASE, [102.0, 97.0, 104.0, 99.0, 100.0], lower_is_better=True)
  assert d.verdict == compare.NO_CHANGE


def test_significant_but_small_change_is_no_change():
  # 5% slower with tiny spread: significant, but under the 10% factor.
  d = compare.decide([100.0, 100.1, 99.9], [105.0, 105.1, 104.9], lower_is_better=True)
  assert d.verdict == compare.NO_CHANGE
  assert "within" in d.note


def test_large_but_noisy_change_is_not_significant():
  d = compare.decide([100.0, 60.0, 140.0], [130.0, 80.0, 180.0], lower_is_better=True)
  assert d.verdict == compare.NO_CHANGE
  assert "not significant" in d.note


@pytest.mark.parametrize("base,new", [([100.0], [130.0]), ([1.54], [0.25]),
                                      ([100.0, 101.0], [300.0])])
def test_one_seed_on_a_side_gives_no_verdict_whatever_the_factor(base, new):
  # One seed says nothing about the seed-to-seed spread (a D4PG return after 2,000
  # learner steps moved from 1.54 to 0.25 between two seeds of one config).
  d = compare.decide(base, new, lower_is_better=False)
  assert d.verdict == compare.NO_VERDICT
  assert d.p_value is None and "spread is unknown" in d.note
  assert d.ratio == pytest.approx(sum(new) / len(new) / (sum(base) / len(base)))


def test_config_that_stopped_converging_is_a_regression():
  assert compare.decide_convergence(3, 3, 0, 3).verdict == compare.REGRESSION
  assert compare.decide_convergence(0, 3, 2, 3).verdict == compare.IMPROVEMENT
  assert compare.decide_convergence(3, 3, 2, 3).verdict == compare.NO_CHANGE
  assert compare.decide_convergence(10, 10, 2, 10).verdict == compare.REGRESSION
