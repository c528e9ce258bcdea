"""Series over commits from the history store, and the change points in them.

A series is one machine, suite, configuration and metric: its commits in
commit-date order, each with the values of every trial recorded for it (seeds,
rounds, bench runs and A/B sides alike) and their median. Change points are
found on the medians by E-divisive means with a t-test (Matteson & James 2014;
Fleming et al. 2023, "Hunter": MongoDB's method, maintained as Apache Otava),
through `otava.analysis.compute_change_points`.
"""

import dataclasses
from typing import Sequence

import numpy as np

from replibench.errors import UserError
from replibench.tracking import store

JUDGED = ("time_to_target_s", "steps_to_target", "examples_per_s")
LOWER_IS_BETTER = {"time_to_target_s": True, "steps_to_target": True, "examples_per_s": False}
# A change point must pass both (Otava's merge step): p below MAX_PVALUE, and a relative
# change of the level above MIN_MAGNITUDE. tests/test_tracking_history.py measures the
# detection and false-alarm rates of these settings on synthetic series.
MAX_PVALUE = 0.001
MIN_MAGNITUDE = 0.05
WINDOW = 30


@dataclasses.dataclass(frozen=True)
class Point:
  commit: str
  commit_time: str
  values: tuple[float, ...]

  @property
  def median(self) -> float:
    return float(np.median(self.values))


@dataclasses.dataclass(frozen=True)
class Change:
  """A change point: the level moved at `commit` (the first commit of the new level)."""
  index: int
  commit: str
  before: float
  after: float
  pvalue: float
  kind: str                 # 'regression' | 'improvement'

  @property
  def change(self) -> float:
    return self.after / self.before - 1 if self.before else float("nan")


@dataclasses.dataclass(frozen=True)
class Series:
  machine: str
  suite: str
  config: str
  metric: str
  points: tuple[Point, ...]
  changes: tuple[Change, ...] = ()


def series(records: Sequence[store.Record], metric: str) -> tuple[Point, ...]:
  """One series' points: commits ordered by commit date (then first record)."""
  by_commit: dict[str, list[store.Record]] = {}
  for r in sorted(records, key=lambda r: (r.commit_time, r.recorded)):
    value = r.metrics.get(metric)
    if value is not None and np.isfinite(value):
      by_commit.setdefault(r.commit, []).append(r)
  return tuple(Point(c, rs[0].commit_time, tuple(float(r.metrics[metric]) for r in rs))
               for c, rs in by_commit.items())


def _detector():
  try:
    from otava.analysis import compute_change_points  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError("Change points need Apache Otava's E-divisive: `.venv/bin/pip install "
                    "--no-deps apache-otava==0.8.0` (make install does this; its own "
                    "requirements pin old numpy and scipy releases and cloud clients that "
                    "its analysis module does not use).") from None
  return compute_change_points


def change_points(points: Sequence[Point], metric: str, max_pvalue: float = MAX_PVALUE,
                  min_magnitude: float = MIN_MAGNITUDE) -> tuple[Change, ...]:
  """The change points of a series' medians, each called a regression or an improvement."""
  if len(points) < 4:
    return ()
  medians = [p.median for p in points]
  found, _ = _detector()(medians, window_len=WINDOW, max_pvalue=max_pvalue,
                         min_magnitude=min_magnitude)
  out = []
  for cp in found:
    i = int(cp.index)
    before, after = float(cp.stats.mean_1), float(cp.stats.mean_2)
    worse = after > before if LOWER_IS_BETTER.get(metric, False) else after < before
    out.append(Change(i, points[i].commit, before, after, float(cp.stats.pvalue),
                      "regression" if worse else "improvement"))
  return tuple(out)


def all_series(records: Sequence[store.Record], metrics: Sequence[str] = JUDGED) -> list[Series]:
  """Every (machine, suite, config, metric) series in records, with its change points."""
  groups: dict[tuple, list[store.Record]] = {}
  for r in records:
    groups.setdefault((r.machine, r.suite, r.series_config), []).append(r)
  out = []
  for (machine, suite, config), rs in sorted(groups.items()):
    for metric in metrics:
      points = series(rs, metric)
      if points:
        out.append(Series(machine, suite, config, metric, points,
                          change_points(points, metric)))
  return out
