"""benchmarks/tracking/noise_budget.py's arithmetic on synthetic processes (no process runs): the
split of the variance, the slowed processes it counts, and the `together` pairs."""

import math

import numpy as np
import pytest

from tests import helpers


@pytest.fixture(scope="module")
def budget():
  return helpers.benchmark_script("tracking/noise_budget")


def _process(rates, batch=10, steps=20):
  """A process whose windows ran at these examples/s (wall = CPU seconds)."""
  return {"windows": [[steps, steps * batch / r, steps * batch / r] for r in rates],
          "batch": batch}


def test_the_split_and_the_fastest_window(budget):
  rng = np.random.default_rng(0)
  # 3 warm-up windows at half speed, then 10 steady ones around each process's level.
  levels = [100.0, 110.0, 100.0, 110.0]        # the second of each pair 10% faster
  steady = [level * np.exp(rng.normal(0, 0.01, 10)) for level in levels]
  x = budget.split([_process([50.0] * 3 + list(r)) for r in steady], warmup=3)
  assert x["processes"] == 4
  assert x["within_sd"] == pytest.approx(0.01, rel=0.4)
  assert x["order_gap"] == pytest.approx(math.log(1.1), abs=0.01)
  assert x["warmup_gap"] == pytest.approx(math.log(50 / 105), abs=0.05)
  best = [math.log(r.max()) for r in steady]    # the probe's `best`: the fastest window
  assert x["best_between_sd"] == pytest.approx(np.std(best, ddof=1))


def test_tails_count_the_processes_slowed_for_their_whole_run(budget):
  series = {"c/split/baseline": [_process([100.0 + i % 3] * 5) for i in range(9)],
            "c/pin/baseline": [_process([60.0] * 5)],       # slowed: 60 / 101
            "c/pin/pin": [_process([10.0] * 5)]}             # not a baseline: not counted
  line = "".join(budget.tail_lines(series, warmup=1))
  assert "every baseline process (10)" in line
  assert "1 slowed > 7% for their whole run (0.59x)" in line


def test_together_pairs_give_the_paired_sd_of_core_0_against_core_1(budget):
  series = {"c/together/core0": [_process([100.0, 101.0, 99.0]) for _ in range(3)],
            "c/together/core1": [_process([r, r + 1, r - 1]) for r in (100.0, 90.0, 110.0)]}
  text = "\n".join(budget.together_lines(series, warmup=0))
  gaps = [math.log(100 / r) for r in (100.0, 90.0, 110.0)]
  assert f"paired sd of median {np.std(gaps, ddof=1):.4f}" in text
  assert "3 pairs" in text and "correlation" in text
  assert budget.together_lines({}, warmup=0) == []


def test_conditions_flag_all_none_or_a_list(budget):
  available = {"baseline": ({}, []), "pin": ({}, []), "warmup": ({}, [])}
  assert budget.wanted_conditions(None, available) == ["pin", "warmup"]
  assert budget.wanted_conditions("none", available) == []          # the split alone
  assert budget.wanted_conditions("warmup,pin", available) == ["warmup", "pin"]
  for bad in ("spin", ",", ""):
    with pytest.raises(SystemExit, match="--conditions"):
      budget.wanted_conditions(bad, available)
