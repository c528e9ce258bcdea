"""The tracker's statistics model what the A/B design knows: the pairs' order and
round (paired.order_estimate) and reaching the target judged on counts (McNemar's
exact test). Synthetic series, seeded, no timing."""

import dataclasses
import math

import numpy as np
import pytest

from replibench.tracking import ab, ab_report, paired, verdicts

PAIRS = 21                    # ResNet's default design: 3 configurations x 7 seeds
ORDERS = ["AB" if i % 2 == 0 else "BA" for i in range(PAIRS)]
# The measured ResNet A/A (issue 43): the second run of a pair ~12% faster than the
# first on the ratio's scale (1.003 base first, 0.893 head first), sd ~0.08-0.13 within.
ORDER_GAP, NOISE = math.log(1.12), 0.09


def _series(rng, effect, gap=ORDER_GAP, orders=ORDERS, noise=NOISE, rounds=None,
            round_shift=0.0):
  sign = np.array([0.5 if o == "AB" else -0.5 for o in orders])
  shift = 0.0 if rounds is None else round_shift * (np.asarray(rounds) - np.mean(rounds))
  return math.log(effect) + gap * sign + shift + noise * rng.standard_normal(len(orders))


def _coverage_and_width(fit, effect=0.95, runs=2000, seed=0, **kw):
  rng = np.random.default_rng(seed)
  hits, widths = 0, []
  for _ in range(runs):
    est = fit(_series(rng, effect, **kw))
    hits += est.low <= effect <= est.high
    widths.append(math.log(est.high / est.low))
  return hits / runs, float(np.mean(widths))


def test_an_order_effect_narrows_the_interval_and_coverage_holds():
  plain = _coverage_and_width(lambda x: paired.estimate(x))
  ordered = _coverage_and_width(lambda x: paired.order_estimate(x, ORDERS))
  assert 0.93 <= ordered[0] <= 0.97      # 95% intervals cover the true ratio 95% of the time
  assert plain[0] >= 0.95                # the plain one is valid too, only wider
  assert ordered[1] < 0.9 * plain[1]     # sd 0.09 against ~0.105 with the order as noise


def test_without_an_order_effect_the_model_costs_almost_nothing():
  plain = _coverage_and_width(lambda x: paired.estimate(x), gap=0.0, seed=1)
  ordered = _coverage_and_width(lambda x: paired.order_estimate(x, ORDERS), gap=0.0, seed=1)
  assert 0.93 <= ordered[0] <= 0.97 and 0.93 <= plain[0] <= 0.97
  assert ordered[1] < 1.03 * plain[1]    # one degree of freedom of 20


def test_unbalanced_orders_are_weighted_to_the_balanced_effect():
  """11 pairs base-first, 7 head-first: the plain mean leans to the base-first ratio,
  the model's intercept does not."""
  orders = ["AB"] * 11 + ["BA"] * 7
  rng = np.random.default_rng(2)
  plain, ordered = [], []
  for _ in range(500):
    x = _series(rng, 1.0, orders=orders)
    plain.append(math.log(paired.estimate(x).ratio))
    ordered.append(math.log(paired.order_estimate(x, orders).ratio))
  assert abs(np.mean(ordered)) < 0.005
  assert np.mean(plain) > 0.01           # (11 - 7) / 18 x half the gap
  est = paired.order_estimate(_series(rng, 1.0, orders=orders, noise=1e-6), orders)
  assert est.model == "order" and est.order_effect == pytest.approx(1.12, rel=1e-3)


def test_rounds_enter_the_model_when_the_design_separates_them_from_the_order():
  rounds = [0] * PAIRS + [1] * PAIRS
  orders = ORDERS + ORDERS[::-1]
  fit = lambda x: paired.order_estimate(x, orders, rounds)  # noqa: E731
  cover, width = _coverage_and_width(fit, orders=orders, rounds=rounds, round_shift=0.1,
                                     seed=3, runs=1000)
  assert fit(np.zeros(2 * PAIRS) + 0.01 * np.arange(2 * PAIRS) % 3).model == "order+round"
  assert 0.93 <= cover <= 0.97
  plain = _coverage_and_width(lambda x: paired.estimate(x), orders=orders, rounds=rounds,
                              round_shift=0.1, seed=3, runs=1000)
  assert width < plain[1]
  # One trial over 8 rounds: its order alternates with the round, so only the order is
  # modelled; one order only, or too few pairs: the plain interval.
  assert paired.order_estimate(np.arange(8.0), ["AB", "BA"] * 4, list(range(8))).model \
      == "order"
  assert paired.order_estimate(np.arange(8.0), ["AB"] * 8).model == "paired"
  assert paired.order_estimate(np.arange(7.0), ["AB", "BA"] * 3 + ["AB"]).model == "paired"


def test_a_small_design_keeps_its_degrees_of_freedom():
  """D4PG's 4 pairs of a real 10% slowdown (examples/s head/base, 2026-11-27, 5c823dc
  against Experiment.inject_slowdown = 0.1): with the order in the model (2 residual
  degrees of freedom) the interval crossed 1 and the slowdown passed; the plain
  interval, which the design keeps valid, calls it."""
  ratios, orders = [0.927, 0.893, 0.913, 0.937], ["AB", "BA", "AB", "BA"]
  est, verdict = paired.judge([1.0] * 4, ratios, lower_is_better=False, min_effect=0.05,
                              level=paired.bonferroni(0.95, 4), orders=orders)
  assert est.model == "paired" and est.high < 1 and verdict == paired.REGRESSION
  for pairs in (4, 6):      # D4PG's and SN-GAN's designs
    orders = ["AB", "BA"] * (pairs // 2)
    assert paired.order_estimate(np.zeros(pairs) + 0.01 * np.arange(pairs), orders).model \
        == "paired"


def test_the_order_model_gains_power_at_the_measured_order_effect():
  kw = dict(effect=0.92, noise=NOISE, pairs=PAIRS, runs=500, lower_is_better=False,
            min_effect=0.05, level=paired.bonferroni(0.95, 5), order_effect=1.12, seed=4)
  plain = paired.simulate(**kw)[paired.REGRESSION]
  ordered = paired.simulate(**kw, model_order=True)[paired.REGRESSION]
  assert ordered > plain + 0.1           # measured here: 0.89 against 0.69
  alarms = paired.simulate(**{**kw, "effect": 1.0}, model_order=True)[paired.REGRESSION]
  assert alarms <= 0.01


def _pair(config, seed, order, ratio, base_ok=True, head_ok=True):
  side = lambda ok, v: verdicts.Side("reached" if ok else "budget_exhausted",  # noqa: E731
                                     {"examples_per_s": v,
                                      "time_to_target_s": 10.0 if ok else None})
  return verdicts.Pair(config, seed, 0, order, side(base_ok, 100.0),
                       side(head_ok, 100.0 * ratio))


def test_rows_model_the_order_and_say_so():
  rng = np.random.default_rng(5)
  logs = _series(rng, 0.9)
  pairs = [_pair("c", i, o, math.exp(x)) for i, (o, x) in enumerate(zip(ORDERS, logs))]
  row = verdicts.rows(pairs, ["examples_per_s"], True)[0]
  assert row.estimate.model == "order" and "order effect" in row.note
  assert row.verdict == paired.REGRESSION


def test_the_exact_count_test():
  assert paired.discordant_test(6, 0).p_worse == pytest.approx(1 / 64)
  assert paired.discordant_test(5, 1).p_worse == pytest.approx(7 / 64)
  assert paired.discordant_test(0, 0) == paired.CountTest(0, 0, 1.0, 1.0)
  assert paired.count_verdict(paired.discordant_test(6, 0)) == paired.REGRESSION
  assert paired.count_verdict(paired.discordant_test(0, 6)) == paired.IMPROVEMENT
  assert paired.count_verdict(paired.discordant_test(5, 1)) == paired.NO_CHANGE


def test_the_pooled_converged_row_decides_where_each_configuration_cannot():
  """Head misses the target in 3 of 7 seeds of each of 3 configurations that base
  reaches: no configuration alone is beyond chance, the suite's 9 of 9 is."""
  pairs = [_pair(c, s, ORDERS[s], 1.0, head_ok=s >= 3) for c in "xyz" for s in range(7)]
  rows = [r for r in verdicts.rows(pairs, ["converged", "examples_per_s"], True)
          if r.metric == "converged"]
  assert [r.config for r in rows] == [verdicts.ALL_CONFIGS, "x", "y", "z"]
  assert rows[0].verdict == paired.REGRESSION and "9 pair(s)" in rows[0].note
  assert all(r.verdict == paired.NO_CHANGE for r in rows[1:])
  same = [_pair(c, s, ORDERS[s], 1.0) for c in "xyz" for s in range(7)]
  assert all(r.verdict == paired.NO_CHANGE for r in verdicts.rows(same, ["converged"], True))


def test_reaching_the_target_counts_in_the_family():
  pairs = [_pair("c", s, ORDERS[s], 0.9) for s in range(6)]
  est = lambda judged: verdicts.rows(pairs, judged, True)[-1].estimate  # noqa: E731
  assert est(["examples_per_s"]).level == pytest.approx(0.95)
  assert est(["converged", "examples_per_s"]).level == pytest.approx(0.975)


def test_every_configuration_runs_both_orders():
  """With two configurations, alternating by position made the order the configuration
  (D4PG: replicas=1 always base first); now each configuration alternates by seed."""
  names = [f"{c}/seed={s}" for s in (1, 2) for c in ("replicas=1", "workers=2")]
  plan = ab.schedule(names, rounds=1)
  by_config = {}
  for _, name, order in plan:
    by_config.setdefault(name.split("/")[0], []).append(order)
  assert by_config == {"replicas=1": ["AB", "BA"], "workers=2": ["BA", "AB"]}
  # Three configurations (ResNet's, SN-GAN's): the same order as by position.
  names = [f"c{c}/seed={s}" for s in (1, 2, 3, 4) for c in range(3)]
  assert [o for _, _, o in ab.schedule(names, 2)] == \
      ["AB" if (r + i) % 2 == 0 else "BA" for r in range(2) for i in range(12)]


def _slowed_processes(rng, effect, pairs, orders=None, gap=0.0):
  """The probe's measured noise shape (results/tracking/README.md): most pairs within
  2-3% (sd 0.02), one in ten off by 10-30% either way (a process the machine slowed)."""
  e = rng.normal(0.0, 0.02, pairs)
  bad = rng.random(pairs) < 0.1
  e[bad] = rng.choice([-1.0, 1.0], bad.sum()) * rng.uniform(0.1, 0.3, bad.sum())
  if orders is not None:
    e += gap * np.array([0.5 if o == "AB" else -0.5 for o in orders])
  return math.log(effect) + e


def test_the_trimmed_interval_is_yuens():
  from scipy.stats import mstats
  logs = np.random.default_rng(3).normal(0.0, 0.03, 10)
  est = paired.trimmed_estimate(logs, 0.95)
  low, high = mstats.trimmed_mean_ci(logs, limits=(0.2, 0.2), alpha=0.05)
  assert est.model == "trimmed"
  assert math.log(est.ratio) == pytest.approx(float(mstats.trimmed_mean(logs, (0.2, 0.2))))
  assert (math.log(est.low), math.log(est.high)) == pytest.approx((low, high))
  # Nothing to cut under 5 pairs: the plain interval.
  assert paired.trimmed_estimate(logs[:4], 0.95) == paired.estimate(logs[:4], 0.95)


def test_the_trimmed_interval_leaves_a_slowed_process_out_and_keeps_its_coverage():
  rng = np.random.default_rng(0)
  hits, trimmed_w, mean_w = 0, [], []
  for _ in range(2000):
    logs = _slowed_processes(rng, 0.95, 8)
    est, plain = paired.trimmed_estimate(logs, 0.95), paired.estimate(logs, 0.95)
    hits += est.low <= 0.95 <= est.high
    trimmed_w.append(math.log(est.high / est.low))
    mean_w.append(math.log(plain.high / plain.low))
  assert hits / 2000 >= 0.93
  assert np.median(trimmed_w) < 0.6 * np.median(mean_w)


def test_the_trimmed_interval_models_the_order_where_it_has_the_pairs():
  orders12 = ORDERS[:12]
  rng = np.random.default_rng(1)
  hits, gaps = 0, []
  for _ in range(1000):
    est = paired.trimmed_estimate(_slowed_processes(rng, 0.95, 12, orders12, math.log(1.08)),
                                  0.95, orders=orders12)
    assert est.model == "trimmed+order"
    hits += est.low <= 0.95 <= est.high
    gaps.append(est.order_effect)
  assert hits / 1000 >= 0.93 and np.median(gaps) == pytest.approx(1.08, rel=0.01)
  # 8 pairs: the order would leave 4 degrees of freedom (< ORDER_DF), so it stays out.
  est = paired.trimmed_estimate(_slowed_processes(rng, 0.95, 8), 0.95, orders=ORDERS[:8])
  assert est.model == "trimmed" and est.order_effect is None


def test_a_no_change_that_could_not_see_a_loss_says_so():
  """An interval too wide to exclude a loss beyond the minimum effect is "no change" with
  a note that says it could not tell."""
  rng = np.random.default_rng(5)
  def row(noise):
    pairs = [verdicts.Pair("c", s, 0, "AB" if s % 2 else "BA",
                           verdicts.Side("reached", {"examples_per_s": 100.0}),
                           verdicts.Side("reached", {"examples_per_s": 100.0 * math.exp(
                               noise * rng.standard_normal())}))
             for s in range(8)]
    return verdicts.metric_row("c", "examples_per_s", pairs, False, 0.03, 0.95, "ex/s")
  noisy, quiet = row(0.15), row(0.002)
  assert noisy.verdict == paired.NO_CHANGE and noisy.note.startswith(verdicts.UNRESOLVED)
  assert quiet.verdict == paired.NO_CHANGE and verdicts.UNRESOLVED not in quiet.note
  assert noisy.unresolved and not quiet.unresolved and noisy.to_dict()["unresolved"]
  # The summary counts the flag, not the note's wording (an order note may come first).
  reworded = dataclasses.replace(noisy, note="order effect 1.050 modelled; " + noisy.note)
  suite = ab.SuiteAB("s", "w", "m", True, ["examples_per_s"], 1, [], [reworded, quiet],
                     [], [], 1.0)
  assert "2 unchanged (1 unresolved" in ab_report._summary([suite])
  worst = paired.worst_case_loss(noisy.estimate, False)
  assert worst == pytest.approx(1 / noisy.estimate.low - 1) and f"{worst:.0%}" in noisy.note
