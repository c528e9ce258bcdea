"""PNG plots of a sweep report (matplotlib, Agg backend: no display needed).

- time_to_target.png: time to target vs replicas, one line per scaling kind,
  mean with std error bars and every converged seed as a dot.
- curves.png: the target metric vs wall-clock seconds since run start, one
  panel per configuration, every seed, with the target as a dashed line.
- throughput.png: examples/s vs replicas per scaling kind, with the ideal
  (linear from the 1-replica point) dashed.
- time_vs_bandwidth.png (sweeps over `network` rates): time to target against
  the link's bandwidth, one line per regime; an unlimited link sits at the right.
"""

import io
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from replibench.suite import aggregate  # noqa: E402
from replibench import atomic, rates  # noqa: E402
from replibench.suite.aggregate import ConfigRow  # noqa: E402

DPI = 110


def series(rows: list[ConfigRow]) -> dict[str, list[ConfigRow]]:
  """Rows grouped into lines over replicas: one per scaling kind, split further
  by global batch (then by config) when a kind has two rows at one replica count."""
  out: dict[str, list[ConfigRow]] = {}
  for kind in sorted({r.scaling_kind for r in rows}):
    members = sorted((r for r in rows if r.scaling_kind == kind), key=lambda r: r.num_replicas)
    counts = [r.num_replicas for r in members]
    if len(set(counts)) == len(counts):
      out[kind] = members
      continue
    for r in members:
      batches = {m.global_batch_size for m in members if m.num_replicas == r.num_replicas}
      clash = len(batches) < counts.count(r.num_replicas)
      key = f"{kind}, {r.config}" if clash else f"{kind}, batch {r.global_batch_size}"
      out.setdefault(key, []).append(r)
  return out


def _replica_axis(ax, rows: list[ConfigRow]) -> None:
  ticks = sorted({r.num_replicas for r in rows})
  ax.set_xscale("log", base=2)
  ax.set_xticks(ticks, [str(t) for t in ticks])
  ax.minorticks_off()
  ax.set_xlabel("replicas")
  ax.grid(True, alpha=0.3)


def _dodge(index: int, count: int) -> float:
  """A small multiplicative x offset per series, so overlapping error bars stay
  readable on the log-2 replica axis."""
  return 2 ** (0.04 * (index - (count - 1) / 2))


def _save(fig, out_dir: str, name: str) -> str:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
  plt.close(fig)
  atomic.write_atomic(os.path.join(out_dir, name), lambda f: f.write(buf.getvalue()))
  return name


def _save_over_replicas(fig, ax, report, ylabel: str, title: str, out_dir: str,
                        name: str) -> str:
  """Labels a plot against the replica count (from 0 up) and saves it as name."""
  _replica_axis(ax, report.configs)
  ax.set_ylabel(ylabel)
  ax.set_ylim(bottom=0)
  ax.set_title(f"{report.workload}: {title}")
  ax.legend(fontsize=8)
  return _save(fig, out_dir, name)


def _label(key: str) -> str:
  kind = key.split(",")[0]
  return key.replace(kind, f"{kind} ({aggregate.SCALING_KINDS[kind]})", 1) \
      if kind in aggregate.SCALING_KINDS else key


def _metric_lines(ax, report, metric: str):
  """One errorbar line (mean and std of metric against the replicas) per series of the
  report's configs; yields (key, its rows with the metric, their x positions, the line)."""
  lines = series(report.configs)
  for i, (key, rows) in enumerate(lines.items()):
    done = [r for r in rows if getattr(r, metric)]
    if not done:
      continue
    dx = _dodge(i, len(lines))
    xs = [r.num_replicas * dx for r in done]
    line = ax.errorbar(xs, [getattr(r, metric).mean for r in done],
                       yerr=[getattr(r, metric).std for r in done], marker="o", capsize=4,
                       label=_label(key))
    yield key, done, xs, line


def plot_time_to_target(report, out_dir: str) -> str:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for _, done, xs, line in _metric_lines(ax, report, "time_to_target_s"):
    for r, x in zip(done, xs):
      seeds = [s.time_to_target_s for s in r.seeds if s.converged]
      ax.scatter([x] * len(seeds), seeds, s=12, alpha=0.5, color=line.lines[0].get_color())
      if r.converged < r.n:
        ax.annotate(f"{r.converged}/{r.n} converged", (x, r.time_to_target_s.mean),
                    textcoords="offset points", xytext=(6, 6), fontsize=8)
  return _save_over_replicas(fig, ax, report, "time to target (s)",
                             f"time to {report.target_metric} {report.target}",
                             out_dir, "time_to_target.png")


def plot_throughput(report, out_dir: str) -> str:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for key, done, xs, line in _metric_lines(ax, report, "examples_per_s"):
    one = next((r for r in done if r.num_replicas == 1), None)
    if one is not None and len(done) > 1:
      ax.plot(xs, [one.examples_per_s.mean * r.num_replicas for r in done], linestyle="--",
              linewidth=1, color=line.lines[0].get_color(), alpha=0.6,
              label=f"ideal linear scaling ({key})")
  return _save_over_replicas(fig, ax, report, "training examples/s", "training throughput",
                             out_dir, "throughput.png")


def plot_curves(report, out_dir: str) -> str:
  rows = report.configs
  cols = min(3, len(rows))
  nrows = math.ceil(len(rows) / cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False,
                           sharey=True)
  for ax, row in zip(axes.flat, rows):
    for s in row.seeds:
      if s.curve:
        ax.plot([p[1] for p in s.curve], [p[2] for p in s.curve], marker=".", markersize=3,
                linewidth=1, label=f"seed {s.seed} ({s.status})")
    ax.axhline(report.target, color="grey", linestyle="--", linewidth=1)
    ax.set_title(f"{row.config} ({row.converged}/{row.n} converged)", fontsize=9)
    ax.set_xlabel("seconds since run start")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  for ax in axes[:, 0]:
    ax.set_ylabel(report.target_metric)
  for ax in list(axes.flat)[len(rows):]:
    ax.set_visible(False)
  fig.suptitle(f"{report.workload}: {report.target_metric} vs wall-clock "
               f"(dashed: target {report.target})")
  fig.tight_layout()
  return _save(fig, out_dir, "curves.png")


def rate_mbit(rate: str) -> float:
  """A link rate ('100mbit', '1gbit'; 'none', unlimited: inf) in Mbit/s."""
  return rates.bits_per_second(rate) / 1e6


def by_regime_over_network(rows: list[ConfigRow]) -> dict[str, list[ConfigRow]]:
  """Rows with a measured network, grouped by regime setting, sorted by bandwidth."""
  out: dict[str, list[ConfigRow]] = {}
  for r in rows:
    if "network" in r.hparams:
      out.setdefault(r.hparams.get("regime_setting", r.hparams.get("regime", "?")), []).append(r)
  return {k: sorted(v, key=lambda r: rate_mbit(r.hparams["network"])) for k, v in out.items()}


def plot_time_vs_bandwidth(report, out_dir: str) -> str:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  lines = by_regime_over_network(report.configs)
  finite = [rate_mbit(r.hparams["network"]) for rows in lines.values() for r in rows
            if math.isfinite(rate_mbit(r.hparams["network"]))]
  unlimited_x = 10 * max(finite, default=1.0)   # Where 'none' (unlimited) is drawn.
  for key, rows in lines.items():
    done = [r for r in rows if r.time_to_target_s]
    xs = [min(rate_mbit(r.hparams["network"]), unlimited_x) for r in done]
    ax.errorbar(xs, [r.time_to_target_s.mean for r in done],
                yerr=[r.time_to_target_s.std for r in done], marker="o", capsize=4, label=key)
  ax.set_xscale("log")
  ticks = sorted(set(finite)) + [unlimited_x]
  ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["unlimited"])
  ax.set_xlabel("link bandwidth (Mbit/s, shared by the cluster)")
  ax.set_ylabel("time to target (s)")
  ax.set_ylim(bottom=0)
  ax.set_title(f"{report.workload}: time to {report.target_metric} {report.target} "
               f"vs bandwidth")
  ax.legend(fontsize=8)
  return _save(fig, out_dir, "time_vs_bandwidth.png")


def write_plots(report, out_dir: str) -> dict[str, str]:
  """Writes the PNGs into out_dir; returns {title: file name}."""
  plots = {"Time to target vs replicas": plot_time_to_target(report, out_dir),
           "Metric vs wall-clock": plot_curves(report, out_dir),
           "Throughput vs replicas": plot_throughput(report, out_dir)}
  if len({r.hparams.get("network") for r in report.configs if "network" in r.hparams}) > 1:
    plots["Time to target vs bandwidth"] = plot_time_vs_bandwidth(report, out_dir)
  return plots
