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

from replibench import inputs
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
  recipe); UserError naming it, and the field at fault, if it is not one."""
  if not os.path.exists(path):
    raise UserError(f"{path}: no such statistical-efficiency file. Make one from a batch-size "
                    f"sweep: python benchmarks/predict/statistical_efficiency.py SWEEP_DIR --out={path}")
  inputs.input_file("--efficiency", path)
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path}: not a statistical-efficiency file ({type(e).__name__}: {e}); "
                    f"{_SHAPE}") from None
  if not isinstance(data, dict) or not ("fit" in data or "published" in data):
    raise UserError(f"{path}: not a statistical-efficiency file; {_SHAPE}")
  _check_fields(path, data)
  if "published" in data:
    fit = PublishedRecipe(**{**data["published"], "batches": tuple(data["published"]["batches"])})
  else:
    fit = StepsFit(**{**data["fit"], "cov": tuple(map(tuple, data["fit"]["cov"])),
                      "batches": tuple(data["fit"]["batches"])})
  return {**data, "fit": fit}


_SHAPE = ("it needs 'workload', 'target' and either 'fit' (s_min, b_crit, cov, dof, batches) "
          "or 'published' (epochs, train_examples, batches, source).")


def _check_fields(path: str, data: dict) -> None:
  """Every field an efficiency file's reader uses, of its type and in its range, each
  named as '<file>: <key>' (a wrong type fails here, not in the middle of a prediction)."""
  def number(key, value, *args, **kwargs):
    return inputs.number(f"{path}: {key}", value, *args, **kwargs)

  def strings(key, value):
    if not isinstance(value, str):
      raise UserError(f"{inputs.binding(f'{path}: {key}', value)}: must be a string.")

  def batches(key, value):
    if not isinstance(value, list) or not value:
      raise UserError(f"{inputs.binding(f'{path}: {key}', value)}: must be a non-empty list "
                      f"of global batch sizes.")
    for i, batch in enumerate(value):
      number(f"{key}[{i}]", batch, 0, low_open=True)

  strings("workload", data.get("workload"))
  number("target", data.get("target"))
  for key in ("eval_s", "eval_achieved_flops"):
    if data.get(key) is not None:
      number(key, data[key], 0)
  if "higher_is_better" in data and not isinstance(data["higher_is_better"], bool):
    raise UserError(f"{inputs.binding(f'{path}: higher_is_better', data['higher_is_better'])}"
                    f": must be true or false.")
  noise = data.get("noise_scale")
  if noise is not None and (not isinstance(noise, dict) or noise.get("b_simple") is not None
                            and not isinstance(noise.get("b_simple"), (int, float))
                            or not isinstance(noise.get("caveat", ""), str)):
    raise UserError(f"{path}: noise_scale must be an object whose b_simple is a number or "
                    f"null (and caveat, if any, a string), got {inputs.shown(noise)}.")
  if "published" in data:
    recipe = data["published"]
    if not isinstance(recipe, dict):
      raise UserError(f"{inputs.binding(f'{path}: published', recipe)}: must be an object; "
                      f"{_SHAPE}")
    number("published.epochs", recipe.get("epochs"), 0, low_open=True)
    number("published.train_examples", recipe.get("train_examples"), 1, integer=True)
    batches("published.batches", recipe.get("batches"))
    strings("published.source", recipe.get("source"))
    _no_unknown(path, "published", recipe, PublishedRecipe)
    return
  fit = data["fit"]
  if not isinstance(fit, dict):
    raise UserError(f"{inputs.binding(f'{path}: fit', fit)}: must be an object; {_SHAPE}")
  number("fit.s_min", fit.get("s_min"))
  number("fit.b_crit", fit.get("b_crit"))
  number("fit.dof", fit.get("dof"), 0, integer=True)
  number("fit.relative_sd", fit.get("relative_sd", 0.0), 0)
  batches("fit.batches", fit.get("batches"))
  cov = fit.get("cov")
  if not (isinstance(cov, list) and len(cov) == 2 and all(
      isinstance(row, list) and len(row) == 2 for row in cov)):
    raise UserError(f"{inputs.binding(f'{path}: fit.cov', cov)}: must be the 2 x 2 "
                    f"covariance of (S_min, S_min B_crit), [[a, b], [b, c]].")
  for i, row in enumerate(cov):
    for j, value in enumerate(row):
      number(f"fit.cov[{i}][{j}]", value)
  _no_unknown(path, "fit", fit, StepsFit)


def _no_unknown(path: str, key: str, fields: dict, cls) -> None:
  unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
  if unknown:
    raise UserError(f"{path}: {key} has unknown field(s) {', '.join(sorted(unknown))}; {_SHAPE}")
