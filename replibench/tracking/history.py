"""Series over commits from the history store, and the change points in them.

A series is one machine, suite, configuration and metric: its commits in
commit-date order, each with the values of every trial recorded for it (seeds,
rounds, bench runs and recorded A/B sides alike) and its level. Which commits the
callers give it is their rule (commands.py: the main line's by default).

Commits are compared on the seeds they share, never on whichever seeds each ran: a
seed's value is a property of the seed as much as of the code (ResNet's steps to
target differ by seed and are identical for a seed on unchanged code), so a
commit that ran seeds 1-7 after one that ran 1-5 would otherwise "move" by the
change of seed set alone. A commit's level is therefore seed-adjusted: the median
over its seeds that some other commit of the series also ran of value / (that
seed's median over the series' commits), times the median of those seed medians
(a two-way fixed-effects level; with one seed set throughout it is the usual
median up to a constant). A commit that shares no seed with another keeps its
plain median and is flagged. Where the seed sets differ the series says so
(`seed_note`), and the page shows it. Change points are found on the levels by
E-divisive means with a t-test (Matteson & James 2014;
Fleming et al. 2023, "Hunter": MongoDB's method, maintained as Apache Otava),
through `otava.analysis.compute_change_points`.
"""

import dataclasses
import math
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
  values: tuple[float, ...]     # every trial's value (for the dots)
  seeds: tuple[int, ...] = ()   # the seeds those trials ran
  level: float = math.nan       # seed-adjusted (module docstring); NaN: plain median
  shares_seeds: bool = True     # False: no seed in common with another commit

  @property
  def median(self) -> float:
    """The point's level: seed-adjusted where it shares seeds, else the plain median."""
    return self.level if math.isfinite(self.level) else float(np.median(self.values))


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

  @property
  def seed_note(self) -> str:
    """'' when every commit ran the same seeds; else which ran which (for the page)."""
    sets = {p.seeds for p in self.points}
    if len(sets) <= 1:
      return ""
    shown = "; ".join(f"{p.commit[:7]}: {_ranges(p.seeds)}" for p in self.points)
    lone = [p.commit[:7] for p in self.points if not p.shares_seeds]
    return (f"seed sets differ between commits ({shown}): levels compare each commit on "
            f"the seeds it shares with the others"
            + (f"; {', '.join(lone)} share(s) none (plain median, not comparable)"
               if lone else ""))


def _ranges(seeds: Sequence[int]) -> str:
  """(1, 2, 3, 5) -> '1-3, 5'."""
  out, run = [], []
  for s in sorted(seeds):
    if run and s == run[-1] + 1:
      run.append(s)
      continue
    if run:
      out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    run = [s]
  if run:
    out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
  return ", ".join(out) or "none"


def series(records: Sequence[store.Record], metric: str) -> tuple[Point, ...]:
  """One series' points: commits ordered by commit date (then first record), each
  with its seed-adjusted level (module docstring)."""
  by_commit: dict[str, list[store.Record]] = {}
  for r in sorted(records, key=lambda r: (r.commit_time, r.recorded)):
    value = r.metrics.get(metric)
    if value is not None and np.isfinite(value):
      by_commit.setdefault(r.commit, []).append(r)
  # {commit: {seed: median of that seed's trials (rounds, repeated runs)}}
  per_seed = {c: {s: float(np.median([float(r.metrics[metric]) for r in rs if r.seed == s]))
                  for s in {r.seed for r in rs}} for c, rs in by_commit.items()}
  commits_of: dict[int, list[str]] = {}
  for c, values in per_seed.items():
    for s in values:
      commits_of.setdefault(s, []).append(c)
  shared = {s for s, cs in commits_of.items() if len(cs) > 1}
  seed_ref = {s: float(np.median([per_seed[c][s] for c in commits_of[s]])) for s in shared}
  scale = float(np.median(list(seed_ref.values()))) if seed_ref else math.nan
  points = []
  for c, rs in by_commit.items():
    mine = [s for s in per_seed[c] if s in shared and seed_ref[s] > 0]
    level = (scale * float(np.median([per_seed[c][s] / seed_ref[s] for s in mine]))
             if mine else math.nan)
    points.append(Point(c, rs[0].commit_time, tuple(float(r.metrics[metric]) for r in rs),
                        tuple(sorted(per_seed[c])), level, bool(mine) or len(by_commit) == 1))
  return tuple(points)


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
