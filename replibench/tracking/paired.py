"""Paired statistics for A/B runs: ratios of head over base with confidence intervals.

The two sides run interleaved on one machine (ABBA), so each pair of trials shares
the machine's state at that moment, and drift cancels in the pair's ratio. The
estimate is the geometric mean of the paired ratios head/base, with a Student t
interval on the mean log ratio (the log makes a 10% slowdown and a 10% speed-up
symmetric, and ratios of times are close to log-normal). A row's verdict needs both:

- the whole interval on one side of 1 (the change is not the pairs' noise), and
- the estimate beyond a minimum effect (a change too small to matter is not
  reported as a regression, however sure).

The design is known, so the estimate models it (order_estimate): the second run of
a pair is systematically faster or slower than the first (measured: 5.7% on ResNet's
examples/s, a 2-core VM), which ABBA cancels from the mean but a plain interval counts
as noise. A linear model of the log ratios with an order term (and a round term when
there are several rounds) takes that out of the residuals; its intercept is the
effect with the orders balanced, its t interval has the residuals' degrees of freedom.
With no order effect it costs one degree of freedom (intervals ~1% wider at 21 pairs),
which a small design cannot spare: under 8 pairs the plain interval is used (ORDER_DF).

Several rows judged at once multiply the chances of a false alarm, so the caller
widens each interval for the number of rows it judges (Bonferroni). Reaching the
target is judged on counts (discordant_test: McNemar's exact test on the pairs where
one side reached it and the other did not).
"""

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

REGRESSION, IMPROVEMENT, NO_CHANGE, NO_VERDICT = (
    "regression", "improvement", "no change", "no verdict")
LEVEL = 0.95
# Residual degrees of freedom a term must leave to enter the model (order_estimate). A
# term costs one: with no such effect the interval widens by t(df) / t(df + 1), at the
# Bonferroni level of four rows 1.64x at df 2, 1.25x at 3, 1.13x at 4, 1.08x at 5 and
# 1.06x at 6. Measured where it mattered: D4PG's 4 pairs (df 2 with the order) called a
# real 10% slowdown of examples/s "no change", 0.917 [0.819, 1.027], where the plain
# interval on the same pairs is [0.866, 0.971] (results/tracking/README.md). So the
# order enters at 8 pairs and up (the probe's 8, ResNet's 12); SN-GAN's 6 and D4PG's 4
# keep the plain interval, which ABBA's balance keeps valid with an order effect (the
# effect cancels from the mean and only widens the interval).
ORDER_DF = 6
ROUND_DF = 10
# The share of pairs cut from each end by trimmed_estimate (Yuen's 20%, the usual
# choice: Wilcox). 8 pairs lose 1 at each end, 12 lose 2; under 5 pairs none.
TRIM = 0.2


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The geometric mean of n paired ratios head/base and its confidence interval."""
  n: int
  ratio: float
  low: float | None      # None with fewer than 2 pairs
  high: float | None
  level: float = LEVEL
  # 'paired' (a plain t interval on the mean log ratio), 'order' / 'order+round' (the
  # linear model with those terms, order_estimate) or 'trimmed' / 'trimmed+order'
  # (trimmed_estimate).
  model: str = "paired"
  # exp(mean log ratio when base ran first - when head ran first): 1 without an order
  # effect; None where the model has no order term.
  order_effect: float | None = None
  sd: float | None = None   # The residual sd of the log ratios (the paired noise).

  def text(self) -> str:
    if self.low is None:
      return f"{self.ratio:.3f} (n={self.n}, no interval)"
    bound = lambda x: "<0.01" if x < 0.01 else ">100" if x > 100 else f"{x:.3f}"  # noqa: E731
    return f"{self.ratio:.3f} [{bound(self.low)}, {bound(self.high)}]"


def log_ratios(base: Sequence[float], head: Sequence[float]) -> np.ndarray:
  """log(head_i / base_i) over the pairs where both are positive and finite."""
  b, h = np.asarray(base, np.float64), np.asarray(head, np.float64)
  ok = np.isfinite(b) & np.isfinite(h) & (b > 0) & (h > 0)
  return np.log(h[ok] / b[ok])


def estimate(logs: np.ndarray, level: float = LEVEL) -> Estimate | None:
  """Geometric-mean ratio and its t interval at `level` (None without pairs)."""
  n = int(logs.size)
  if n == 0:
    return None
  mean = float(logs.mean())
  if n < 2:
    return Estimate(n, math.exp(mean), None, None, level)
  sd = float(logs.std(ddof=1))
  half = float(stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))
  return Estimate(n, math.exp(mean), math.exp(mean - half), math.exp(mean + half), level,
                  sd=sd)


def _yuen(logs: np.ndarray, trim: float) -> tuple[float, float, int]:
  """(trimmed mean, winsorized sd, values kept) of the values, in any order."""
  logs = np.sort(logs)
  n = int(logs.size)
  k = int(math.floor(trim * n))
  kept = logs[k:n - k]
  return float(kept.mean()), float(np.clip(logs, kept[0], kept[-1]).std(ddof=1)), n - 2 * k


def trimmed_estimate(logs: np.ndarray, level: float = LEVEL, trim: float = TRIM,
                     orders: Sequence[str] | None = None) -> Estimate | None:
  """Yuen's trimmed-mean interval on the log ratios: the mean of the pairs left after
  floor(trim * n) are cut from each end, its standard error from the winsorized
  variance (the cut values replaced by the nearest kept one), t on h - 1 degrees of
  freedom where h pairs are kept (Yuen 1974; Wilcox, Introduction to Robust Estimation,
  ch. 4). For noise with heavy tails: a pair whose process the machine slowed for its
  whole run (the throughput probe's, measured: most pairs within 2-3%, one in ten off
  by 7-25%) moves a mean and inflates its sd; the trimmed mean leaves it out and the
  winsorized sd counts it as the edge of the rest. With no pair to cut (n < 1 / trim)
  it is the plain interval.

  orders ('AB'/'BA', one a pair): where the order term leaves ORDER_DF degrees of
  freedom (h - 2 >= ORDER_DF: 12 pairs and up at 20%) and each order has 3 pairs or
  more, half the gap between the two orders' trimmed means is taken off each pair
  first (the order effect, as order_estimate's, robustly), and the interval has h - 2
  degrees of freedom.
  sd: the winsorized sd (of the order-adjusted ratios where the order is modelled).
  """
  logs = np.asarray(logs, np.float64)
  n = int(logs.size)
  if n < 3 or int(math.floor(trim * n)) == 0:
    return estimate(logs, level)
  name, gap, df_cost = "trimmed", None, 1
  signs = np.where(np.asarray(orders) == "AB", 1.0, -1.0) if orders is not None else None
  if signs is not None and min((signs > 0).sum(), (signs < 0).sum()) >= 3 and \
      _yuen(logs, trim)[2] - 2 >= ORDER_DF:
    half_gap = (_yuen(logs[signs > 0], trim)[0] - _yuen(logs[signs < 0], trim)[0]) / 2
    logs = logs - signs * half_gap
    name, gap, df_cost = "trimmed+order", math.exp(2 * half_gap), 2
  mean, sd, h = _yuen(logs, trim)
  se = sd / ((h / n) * math.sqrt(n))
  half = float(stats.t.ppf(0.5 + level / 2, h - df_cost) * se)
  return Estimate(n, math.exp(mean), math.exp(mean - half), math.exp(mean + half), level,
                  name, gap, sd)


def _contrasts(levels: Sequence) -> np.ndarray:
  """Sum-to-zero (effect) coding of a factor: (n, k-1) columns for its k levels, so that
  the model's intercept is the mean over the levels, whatever their counts."""
  values = list(dict.fromkeys(levels))
  cols = np.zeros((len(levels), len(values) - 1))
  for i, v in enumerate(levels):
    j = values.index(v)
    cols[i] = -1.0 if j == len(values) - 1 else np.eye(len(values) - 1)[j]
  return cols


def _design(orders: Sequence[str], rounds: Sequence[int] | None) -> tuple[np.ndarray, str]:
  """The design matrix [1, order, rounds...] for these pairs and its model's name; a
  term is left out when its factor has one level, when it makes the matrix singular
  (order and round coincide when one trial runs several rounds), or when it would leave
  too few residual degrees of freedom: ORDER_DF for the order, ROUND_DF for the rounds
  (a round term fits drift between rounds that the pairs already cancel, so it is only
  worth its degrees of freedom where they are many)."""
  n = len(orders)
  x, name = np.ones((n, 1)), "paired"
  if len(set(orders)) == 2:
    candidate = np.hstack([x, _contrasts(orders)])
    if n - candidate.shape[1] >= ORDER_DF:
      x, name = candidate, "order"
  if rounds is not None and len(set(rounds)) > 1 and name == "order":
    candidate = np.hstack([x, _contrasts(list(rounds))])
    if n - candidate.shape[1] >= ROUND_DF and \
        np.linalg.matrix_rank(candidate) == candidate.shape[1]:
      x, name = candidate, "order+round"
  return x, name


def order_estimate(logs: np.ndarray, orders: Sequence[str], rounds: Sequence[int] | None = None,
                   level: float = LEVEL) -> Estimate | None:
  """The ratio with the pair order (and round) in the model: log ratio = mu + order +
  round + noise, by least squares, mu's t interval on the residual degrees of freedom.

  logs: (n,) log(head/base); orders: 'AB' (base first) or 'BA' per pair; rounds: the
  round of each pair (None: not modelled). Falls back to estimate() (a plain paired
  interval) where the design has one order only or too few pairs.
  """
  logs = np.asarray(logs, np.float64)
  if logs.size != len(orders) or (rounds is not None and len(rounds) != logs.size):
    raise ValueError("order_estimate: one order (and round) per log ratio")
  x, name = _design(list(orders), None if rounds is None else list(rounds))
  if name == "paired":
    return estimate(logs, level)
  n, k = x.shape
  beta, *_ = np.linalg.lstsq(x, logs, rcond=None)
  resid = logs - x @ beta
  df = n - k
  sd = float(math.sqrt(resid @ resid / df))
  se = sd * math.sqrt(float(np.linalg.inv(x.T @ x)[0, 0]))
  half = float(stats.t.ppf(0.5 + level / 2, df) * se)
  mu = float(beta[0])
  # Order column: +1 for the first order seen, -1 for the other; AB minus BA is 2 beta.
  first = list(dict.fromkeys(orders))[0]
  gap = 2 * float(beta[1]) * (1 if first == "AB" else -1)
  return Estimate(n, math.exp(mu), math.exp(mu - half), math.exp(mu + half), level, name,
                  math.exp(gap), sd)


def verdict(est: Estimate | None, lower_is_better: bool, min_effect: float) -> str:
  """Regression / improvement / no change / no verdict for one row's estimate.

  min_effect is a fraction: 0.05 asks for the estimate to be at least 5% worse
  (time x1.05, or throughput x1/1.05) before it is called a regression.
  """
  if est is None or est.low is None:
    return NO_VERDICT
  worse = est.ratio if lower_is_better else 1 / est.ratio   # > 1: head is worse
  worse_low = est.low if lower_is_better else 1 / est.high  # the interval's best case
  better_low = 1 / est.high if lower_is_better else est.low  # > 1: head surely better
  if worse_low > 1 and worse > 1 + min_effect:
    return REGRESSION
  if better_low > 1 and 1 / worse > 1 + min_effect:
    return IMPROVEMENT
  return NO_CHANGE


def worst_case_loss(est: Estimate | None, lower_is_better: bool) -> float | None:
  """The largest loss the interval admits, as a fraction (0.14: head may be 14% worse:
  time x1.14, or throughput x1/1.14); None without an interval. A "no change" whose
  worst case is beyond the minimum effect could not tell a loss that matters from the
  noise: the pairs said nothing either way."""
  if est is None or est.low is None:
    return None
  return (est.high if lower_is_better else 1 / est.low) - 1


def bonferroni(level: float, rows: int) -> float:
  """The per-row confidence level that keeps the family's at `level` over `rows`."""
  return 1 - (1 - level) / max(rows, 1)


def judge(base: Sequence[float], head: Sequence[float], lower_is_better: bool,
          min_effect: float, level: float = LEVEL, orders: Sequence[str] | None = None,
          rounds: Sequence[int] | None = None,
          trimmed: bool = False) -> tuple[Estimate | None, str]:
  """(estimate, verdict) for one row of paired values; with orders (and rounds), one a
  pair, the estimate models them (order_estimate); trimmed: Yuen's trimmed interval
  instead (trimmed_estimate; ABBA's balance keeps it valid with an order effect)."""
  b, h = np.asarray(base, np.float64), np.asarray(head, np.float64)
  ok = np.isfinite(b) & np.isfinite(h) & (b > 0) & (h > 0)
  logs = np.log(h[ok] / b[ok])
  if trimmed and logs.size:
    keep = np.flatnonzero(ok)
    est = trimmed_estimate(logs, level,
                           orders=None if orders is None else [orders[i] for i in keep])
  elif orders is None or logs.size == 0:
    est = estimate(logs, level)
  else:
    keep = np.flatnonzero(ok)
    est = order_estimate(logs, [orders[i] for i in keep],
                         None if rounds is None else [rounds[i] for i in keep], level)
  return est, verdict(est, lower_is_better, min_effect)


@dataclasses.dataclass(frozen=True)
class CountTest:
  """McNemar's exact test on the discordant pairs of a yes/no outcome (reached the
  target): lost = pairs where base had it and head not, gained = the reverse."""
  lost: int
  gained: int
  p_worse: float    # P(>= lost of the discordant pairs go against head | no change)
  p_better: float   # P(>= gained go for head | no change)


def discordant_test(lost: int, gained: int) -> CountTest:
  """Under no change each discordant pair is equally likely to go either way, so lost
  is Binomial(lost + gained, 1/2); the one-sided tails are exact."""
  n = lost + gained
  if n == 0:
    return CountTest(0, 0, 1.0, 1.0)
  return CountTest(lost, gained, float(stats.binom.sf(lost - 1, n, 0.5)),
                   float(stats.binom.sf(gained - 1, n, 0.5)))


def count_verdict(test: CountTest, level: float = LEVEL) -> str:
  """Regression when the lost targets are beyond chance at the tracker's level: the
  one-sided tail below (1 - level) / 2, the same share as one side of a row's interval."""
  alpha = (1 - level) / 2
  if test.p_worse <= alpha:
    return REGRESSION
  if test.p_better <= alpha:
    return IMPROVEMENT
  return NO_CHANGE


def simulate(effect: float, noise: float, pairs: int, runs: int, lower_is_better: bool,
             min_effect: float, level: float = LEVEL, seed: int = 0,
             tail_df: float | None = None, order_effect: float = 1.0,
             model_order: bool = False) -> dict[str, float]:
  """Share of simulated A/B runs with each verdict, for a true ratio `effect`.

  Each pair's log ratio is log(effect) + noise x e, e standard normal (or Student t
  with tail_df degrees of freedom scaled to unit variance, for heavier tails).
  Power is the share of REGRESSION at a harmful effect; the false-alarm rate the
  share of REGRESSION at effect 1. order_effect: the ratio when base runs first over
  the ratio when head runs first (pairs alternate AB, BA); model_order: judge with
  order_estimate instead of the plain interval.
  """
  rng = np.random.default_rng(seed)
  if tail_df is None:
    e = rng.standard_normal((runs, pairs))
  else:
    e = rng.standard_t(tail_df, (runs, pairs)) / math.sqrt(tail_df / (tail_df - 2))
  orders = ["AB" if i % 2 == 0 else "BA" for i in range(pairs)]
  sign = np.array([0.5 if o == "AB" else -0.5 for o in orders])
  logs = math.log(effect) + math.log(order_effect) * sign + noise * e
  counts = {REGRESSION: 0, IMPROVEMENT: 0, NO_CHANGE: 0, NO_VERDICT: 0}
  for row in logs:
    est = order_estimate(row, orders, None, level) if model_order else estimate(row, level)
    counts[verdict(est, lower_is_better, min_effect)] += 1
  return {k: v / runs for k, v in counts.items()}
