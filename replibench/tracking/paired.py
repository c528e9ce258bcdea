"""Paired statistics for A/B runs: ratios of head over base with confidence intervals.

The two sides run interleaved on one machine (ABBA), so each pair of trials shares
the machine's state at that moment, and drift cancels in the pair's ratio. The
estimate is the geometric mean of the paired ratios head/base, with a Student t
interval on the mean log ratio (the log makes a 10% slowdown and a 10% speed-up
symmetric, and ratios of times are close to log-normal). A row's verdict needs both:

- the whole interval on one side of 1 (the change is not the pairs' noise), and
- the estimate beyond a minimum effect (a change too small to matter is not
  reported as a regression, however sure).

Several rows judged at once multiply the chances of a false alarm, so the caller
widens each interval for the number of rows it judges (Bonferroni).
"""

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

REGRESSION, IMPROVEMENT, NO_CHANGE, NO_VERDICT = (
    "regression", "improvement", "no change", "no verdict")
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The geometric mean of n paired ratios head/base and its confidence interval."""
  n: int
  ratio: float
  low: float | None      # None with fewer than 2 pairs
  high: float | None
  level: float = LEVEL

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
  half = float(stats.t.ppf(0.5 + level / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n))
  return Estimate(n, math.exp(mean), math.exp(mean - half), math.exp(mean + half), level)


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


def bonferroni(level: float, rows: int) -> float:
  """The per-row confidence level that keeps the family's at `level` over `rows`."""
  return 1 - (1 - level) / max(rows, 1)


def judge(base: Sequence[float], head: Sequence[float], lower_is_better: bool,
          min_effect: float, level: float = LEVEL) -> tuple[Estimate | None, str]:
  """(estimate, verdict) for one row of paired values."""
  est = estimate(log_ratios(base, head), level)
  return est, verdict(est, lower_is_better, min_effect)


def simulate(effect: float, noise: float, pairs: int, runs: int, lower_is_better: bool,
             min_effect: float, level: float = LEVEL, seed: int = 0,
             tail_df: float | None = None) -> dict[str, float]:
  """Share of simulated A/B runs with each verdict, for a true ratio `effect`.

  Each pair's log ratio is log(effect) + noise x e, e standard normal (or Student t
  with tail_df degrees of freedom scaled to unit variance, for heavier tails).
  Power is the share of REGRESSION at a harmful effect; the false-alarm rate the
  share of REGRESSION at effect 1.
  """
  rng = np.random.default_rng(seed)
  if tail_df is None:
    e = rng.standard_normal((runs, pairs))
  else:
    e = rng.standard_t(tail_df, (runs, pairs)) / math.sqrt(tail_df / (tail_df - 2))
  logs = math.log(effect) + noise * e
  counts = {REGRESSION: 0, IMPROVEMENT: 0, NO_CHANGE: 0, NO_VERDICT: 0}
  for row in logs:
    counts[verdict(estimate(row, level), lower_is_better, min_effect)] += 1
  return {k: v / runs for k, v in counts.items()}
