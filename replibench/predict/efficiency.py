"""Statistical efficiency: steps to target as a function of the global batch.

Shallue et al. 2018 and McCandlish et al. 2018: steps(B) = S_min * (1 + B_crit / B).
Below B_crit doubling the batch nearly halves the steps (perfect scaling); above
it the steps approach S_min (diminishing returns). The fit is linear in 1 / B,

    steps = a + c / B,   a = S_min,  c = S_min * B_crit,

so weighted least squares over every (batch, seed) point (relative residuals: the
seed-to-seed scatter grows with the steps) gives a, c and their covariance;
intervals are Student-t over the points' residual scatter (seed noise included),
and B_crit's by the delta method. Replication does not change the
math, so the fit holds on any hardware for the same config.
"""

import dataclasses
import json
import math
import os

import numpy as np
from scipy import stats

from replibench.errors import UserError

LEVEL = 0.9   # Two-sided level of every interval reported.


@dataclasses.dataclass(frozen=True)
class StepsFit:
  """steps(B) = s_min * (1 + b_crit / B); cov is the covariance of (a, c) above."""

  s_min: float
  b_crit: float
  cov: tuple
  dof: int
  batches: tuple   # The batches the fit saw (min and max bound its trusted range).
  relative_sd: float = 0.0   # One run's scatter about the fit, relative (seeds, float order).

  def steps(self, batch: float) -> tuple[float, float, float]:
    """(predicted steps, low, high) at global batch `batch`: a LEVEL interval for
    the mean steps to target (one run scatters more: run_steps)."""
    mean, se = self._mean_and_se(batch)
    half = _t(self.dof) * se
    return mean, mean - half, mean + half

  def run_steps(self, batch: float) -> tuple[float, float]:
    """A LEVEL prediction interval for ONE run's steps to target at `batch`: the
    mean's uncertainty and a run's own scatter about it (relative_sd)."""
    mean, se = self._mean_and_se(batch)
    half = _t(self.dof) * math.hypot(se, self.relative_sd * mean)
    return mean - half, mean + half

  def _mean_and_se(self, batch: float) -> tuple[float, float]:
    x = np.array([1.0, 1.0 / batch])
    mean = float(x @ np.array([self.s_min, self.s_min * self.b_crit]))
    return mean, math.sqrt(max(float(x @ np.array(self.cov) @ x), 0.0))

  def b_crit_interval(self) -> tuple[float, float]:
    """A LEVEL interval for B_crit = c / a (delta method)."""
    a, c = self.s_min, self.s_min * self.b_crit
    grad = np.array([-c / a**2, 1.0 / a])
    half = _t(self.dof) * math.sqrt(max(float(grad @ np.array(self.cov) @ grad), 0.0))
    return self.b_crit - half, self.b_crit + half

  def extrapolates(self, batch: float) -> bool:
    return not min(self.batches) <= batch <= max(self.batches)


def _t(dof: int) -> float:
  return float(stats.t.ppf(0.5 + LEVEL / 2, max(dof, 1)))


def fit_steps(batches, steps) -> StepsFit:
  """Least-squares fit of steps(B) to points (batches[i], steps[i]); >= 3 points
  at >= 2 distinct batches."""
  b = np.asarray(batches, dtype=float)
  y = np.asarray(steps, dtype=float)
  if len(b) < 3 or len(set(b.tolist())) < 2:
    raise ValueError(f"need >= 3 points at >= 2 batch sizes, got batches {sorted(b.tolist())}")
  # Relative residuals: seed-to-seed scatter (and the evaluation interval that
  # quantizes steps to target) grow with the steps, so each point weighs 1 / steps^2.
  x = np.stack([np.ones_like(b), 1.0 / b], axis=1) / y[:, None]
  coef, _, _, _ = np.linalg.lstsq(x, np.ones_like(y), rcond=None)
  dof = len(b) - 2
  residual = 1.0 - x @ coef
  sigma_sq = float(residual @ residual) / dof if dof else 0.0
  cov = sigma_sq * np.linalg.inv(x.T @ x)
  a, c = (float(v) for v in coef)
  return StepsFit(s_min=a, b_crit=c / a, cov=tuple(map(tuple, cov.tolist())), dof=dof,
                  batches=tuple(sorted(set(b.tolist()))), relative_sd=math.sqrt(sigma_sq))


@dataclasses.dataclass(frozen=True)
class PublishedRecipe:
  """Steps to target from a published recipe instead of a sweep: a fixed number of
  epochs that reached the target at every batch in `batches` (the source's perfect-
  scaling range: Goyal et al. 2017 kept 90 epochs and ~76.3% up to batch 8k), so
  steps(B) = epochs * train_examples / B there. The recipe ends at those steps; a
  config whose target is easier than the recipe's final metric reaches it no later,
  so steps are an upper bound (`at_most`). No interval: the source gives none."""

  epochs: float
  train_examples: int
  batches: tuple
  source: str
  b_crit = None   # Not reached within the source's batches: no diminishing returns seen.

  def steps(self, batch: float) -> tuple[float, float, float]:
    steps = self.epochs * self.train_examples / batch
    return steps, steps, steps

  def run_steps(self, batch: float) -> tuple[float, float]:
    return self.steps(batch)[1:]

  def b_crit_interval(self) -> tuple[float, None]:
    """At least the largest batch the source reports; no upper end."""
    return max(self.batches), None

  def extrapolates(self, batch: float) -> bool:
    return not min(self.batches) <= batch <= max(self.batches)


def load(path: str) -> dict:
  """An efficiency file (JSON: workload, target, and a sweep's `fit` or a `published`
  recipe); UserError naming it."""
  if not os.path.exists(path):
    raise UserError(f"{path}: no such statistical-efficiency file. Make one from a batch-size "
                    f"sweep: python benchmarks/statistical_efficiency.py SWEEP_DIR --out={path}")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if "published" in data:
      fit = PublishedRecipe(**{**data["published"], "batches": tuple(data["published"]["batches"])})
    else:
      fit = StepsFit(**{**data["fit"], "cov": tuple(map(tuple, data["fit"]["cov"])),
                        "batches": tuple(data["fit"]["batches"])})
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f"{path}: not a statistical-efficiency file ({type(e).__name__}: {e}); "
                    f"it needs 'workload', 'target' and either 'fit' (s_min, b_crit, cov, dof, "
                    f"batches) or 'published' (epochs, train_examples, batches, source).") from e
  return {**data, "fit": fit}
