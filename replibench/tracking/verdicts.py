"""From an A/B's pairs of trials to rows: metric, base, head, ratio and interval, verdict.

Rows come per configuration and, for each metric, one row for the whole suite that
pools every configuration's pairs (a change in the code usually moves every
configuration, and the pooled row has the most pairs). Family-wise error: the
suite rows share a 5% budget over the metrics judged, the configuration rows
another over metrics x configurations (Bonferroni), so an A/A run of identical
code calls a regression in fewer than 5% of runs by construction, before the
minimum effect lowers that further (results/tracking/README.md measures it).
Reaching the target counts as one of the metrics judged when it is judged.

Each row's estimate models the design: the pairs' order (base or head first) and
round enter a linear model of the log ratios (paired.order_estimate), so the
systematic gap between a pair's first and second run is not counted as noise.
"""

import dataclasses
from typing import Sequence

import numpy as np

from replibench.tracking import paired

ALL_CONFIGS = "all configs"
UNRESOLVED = "unresolved"   # how the note of a Row.unresolved starts
# metric -> (label, lower is better); final_metric's direction comes from the workload.
METRICS = {"time_to_target_s": ("time to target (s)", True),
           "steps_to_target": ("steps to target", True),
           "examples_per_s": ("examples/s", False),
           "final_metric": ("final metric", None)}
DEFAULT_MIN_EFFECT = {"time_to_target_s": 0.05, "steps_to_target": 0.05,
                      "examples_per_s": 0.05, "final_metric": 0.01}


@dataclasses.dataclass(frozen=True)
class Side:
  """One trial's outcome as the verdicts need it."""
  status: str                          # result.json status, or 'failed'
  metrics: dict                        # {metric: value or None}

  @property
  def converged(self) -> bool:
    return self.status == "reached" and self.metrics.get("time_to_target_s") is not None


@dataclasses.dataclass(frozen=True)
class Pair:
  config: str
  seed: int
  round: int
  order: str            # 'AB' (base ran first) or 'BA'
  base: Side
  head: Side


@dataclasses.dataclass(frozen=True)
class Row:
  config: str
  metric: str
  label: str
  base: str             # the base side's values, described
  head: str
  estimate: paired.Estimate | None
  verdict: str
  note: str = ""
  unresolved: bool = False   # "no change" whose interval admits a loss beyond the minimum

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["estimate"] = dataclasses.asdict(self.estimate) if self.estimate else None
    return d


def _values(pairs: Sequence[Pair], metric: str) -> tuple[list[float], list[float], list[Pair]]:
  """Both sides' values over the pairs where both have one (times: both converged), and
  those pairs."""
  needs_target = metric in ("time_to_target_s", "steps_to_target")
  base, head, kept = [], [], []
  for p in pairs:
    if needs_target and not (p.base.converged and p.head.converged):
      continue
    b, h = p.base.metrics.get(metric), p.head.metrics.get(metric)
    if b is not None and h is not None:
      base.append(float(b))
      head.append(float(h))
      kept.append(p)
  return base, head, kept


def _describe(values: list[float]) -> str:
  if not values:
    return "-"
  median = float(np.median(values))
  text = f"{median:.4g}" if abs(median) < 10 else f"{median:,.0f}" if median >= 1000 \
      else f"{median:.1f}"
  return f"{text} (median of {len(values)})"


def _row_note(est: paired.Estimate | None, unresolved: bool, lower_is_better: bool,
              min_effect: float) -> str:
  """What the row's reader must know beside its numbers: how the pairs were pooled, an
  order effect, and whether a "no change" could see a loss of the minimum effect."""
  note = "" if est is not None else "no pair with a value on both sides"
  if est is not None and est.low is None:
    note = "one pair: no interval, no verdict (run more rounds or seeds)"
  elif est is not None and est.model.startswith("trimmed"):
    cut = int(paired.TRIM * est.n)
    note = (f"trimmed mean: the {cut} highest and {cut} lowest of {est.n} pair ratios left "
            f"out (Yuen)")
    if est.order_effect is not None:
      note += f"; order effect {est.order_effect:.3f} modelled"
  elif est is not None and est.order_effect is not None and abs(est.order_effect - 1) >= 0.02:
    note = (f"order effect {est.order_effect:.3f} (ratio when base ran first / when head "
            f"ran first), modelled")
  if unresolved:
    # "No change" here means the pairs could not tell, not that nothing changed: say so,
    # so that a gate does not read a noisy run as a clean one.
    worst = paired.worst_case_loss(est, lower_is_better)
    note = "; ".join(x for x in (
        f"{UNRESOLVED}: the interval admits a loss of up to {worst:.0%} (the minimum "
        f"effect is {min_effect:.0%}); more pairs or a quieter machine", note) if x)
  return note


def _unresolved(est: paired.Estimate | None, verdict: str, lower_is_better: bool,
                min_effect: float) -> bool:
  """A "no change" whose interval admits a loss larger than the minimum effect."""
  worst = paired.worst_case_loss(est, lower_is_better)
  return verdict == paired.NO_CHANGE and worst is not None and worst > min_effect


def metric_row(config: str, metric: str, pairs: Sequence[Pair], lower_is_better: bool,
               min_effect: float, level: float, label: str, trimmed: bool = False) -> Row:
  """One metric's row over these pairs; trimmed: Yuen's trimmed interval (the
  throughput probe's rows, paired.trimmed_estimate) instead of the order model."""
  base, head, kept = _values(pairs, metric)
  est, verdict = paired.judge(base, head, lower_is_better, min_effect, level,
                              orders=[p.order for p in kept], rounds=[p.round for p in kept],
                              trimmed=trimmed)
  unresolved = _unresolved(est, verdict, lower_is_better, min_effect)
  note = _row_note(est, unresolved, lower_is_better, min_effect)
  return Row(config, metric, label, _describe(base), _describe(head), est, verdict, note,
             unresolved)


def convergence_row(config: str, pairs: Sequence[Pair], level: float = paired.LEVEL) -> Row:
  """Reaching the target, judged on counts: a regression when head fails (crashes, no
  result) in more trials than base, or misses the target in pairs where base reached
  it more often than chance allows (McNemar's exact test on the discordant pairs,
  one-sided at (1 - level) / 2, as a row's interval)."""
  n = len(pairs)
  base_k = sum(p.base.converged for p in pairs)
  head_k = sum(p.head.converged for p in pairs)
  base_failed = sum(p.base.status == "failed" for p in pairs)
  head_failed = sum(p.head.status == "failed" for p in pairs)
  text = lambda k: f"{k}/{n} converged"  # noqa: E731
  if head_failed > base_failed:
    return Row(config, "converged", "converged", text(base_k), text(head_k), None,
               paired.REGRESSION, f"head failed in {head_failed} of {n} trials (see their "
               f"trial.log)")
  lost = sum(p.base.converged and not p.head.converged for p in pairs)
  gained = sum(p.head.converged and not p.base.converged for p in pairs)
  test = paired.discordant_test(lost, gained)
  verdict = paired.count_verdict(test, level)
  note = ""
  if lost or gained:
    note = (f"head missed the target in {lost} pair(s) base reached, reached it in "
            f"{gained} base missed (exact p {min(test.p_worse, test.p_better):.3g}; "
            f"needs <= {(1 - level) / 2:.3g})")
  if base_failed and base_failed == head_failed:
    note = "; ".join(x for x in (note, f"{base_failed} trial(s) failed on both sides") if x)
  return Row(config, "converged", "converged", text(base_k), text(head_k), None, verdict, note)


def rows(pairs: Sequence[Pair], judged: Sequence[str], higher_is_better: bool,
         min_effects: dict[str, float] | None = None,
         family_level: float = paired.LEVEL, extra_rows: int = 0) -> list[Row]:
  """Every row of one suite's A/B: per metric, the pooled suite row first, then each
  configuration's; convergence per configuration when judged. extra_rows: rows judged
  in the same family elsewhere (the throughput probe's, probe.attach)."""
  min_effects = {**DEFAULT_MIN_EFFECT, **(min_effects or {})}
  configs = list(dict.fromkeys(p.config for p in pairs))
  metrics = [m for m in METRICS if m in judged]
  family = len(metrics) + ("converged" in judged) + extra_rows
  suite_level = paired.bonferroni(family_level, family)
  config_level = paired.bonferroni(family_level, family * len(configs))
  out = []
  if "converged" in judged:
    if len(configs) > 1:
      out.append(convergence_row(ALL_CONFIGS, pairs, suite_level))
    level = config_level if len(configs) > 1 else suite_level
    out += [convergence_row(c, [p for p in pairs if p.config == c], level) for c in configs]
  for metric in metrics:
    label, lower = METRICS[metric]
    if lower is None:
      lower = not higher_is_better
    if len(configs) > 1:
      out.append(metric_row(ALL_CONFIGS, metric, pairs, lower, min_effects[metric],
                            suite_level, label))
    level = config_level if len(configs) > 1 else suite_level
    out += [metric_row(c, metric, [p for p in pairs if p.config == c], lower,
                       min_effects[metric], level, label) for c in configs]
  return out
