"""`replibench history`: a static HTML page of every judged metric over commits.

One section per machine fingerprint, one chart per suite, configuration and
metric: each trial a dot, each commit's median a line, each change point a
dashed line at the first commit of the new level, labelled with its commit and
change (red: regression, green: improvement). On top, the list of detected
changes with their commits, and where commits are not comparable as they stand:
series whose commits ran different seeds (their levels compare each commit on the
seeds it shares, history.py) and commits that ran other configurations than the
rest of their suite. The page has no script and loads nothing: the
charts are inline SVG (matplotlib). The detected changes are also embedded as
JSON (`<script type="application/json" id="changes">`) for tools and tests.
"""

import html
import io
import json
import os
import subprocess
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from replibench import atomic  # noqa: E402
from replibench.tracking import history  # noqa: E402
from replibench.tracking import store  # noqa: E402

LABELS = {"time_to_target_s": "time to target (s)", "steps_to_target": "steps to target",
          "examples_per_s": "examples/s"}
COLOURS = {"regression": "#c62828", "improvement": "#2e7d32"}
STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:13px;text-align:left}th{background:#eee}.charts{display:flex;flex-wrap:wrap;gap:6px}
.chart{border:1px solid #ddd}.regression{color:#c62828;font-weight:bold}
.improvement{color:#2e7d32;font-weight:bold}code{font-size:12px}"""


def _subjects(repo: str | None, commits: Sequence[str]) -> dict[str, str]:
  """{sha: subject} for the commits git knows here (none without a repo)."""
  if not repo or not commits:
    return {}
  done = subprocess.run(["git", "-C", repo, "log", "--no-walk=unsorted", "--format=%H %s",
                         *commits], capture_output=True, text=True, timeout=60)
  if done.returncode != 0:   # Some commit unknown here (another clone's history): one by one.
    found = {}
    for c in commits:
      one = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%s", c],
                           capture_output=True, text=True, timeout=60)
      if one.returncode == 0:
        found[c] = one.stdout.strip()
    return found
  return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def _chart(s: history.Series) -> str:
  """One series as an inline SVG chart."""
  fig, ax = plt.subplots(figsize=(4.4, 2.6), dpi=80)
  xs = range(len(s.points))
  for x, p in zip(xs, s.points):
    ax.plot([x] * len(p.values), p.values, ".", color="#90a4ae", markersize=4)
  ax.plot(list(xs), [p.median for p in s.points], "-", color="#1565c0", linewidth=1.4)
  for x, p in zip(xs, s.points):
    if not p.shares_seeds:   # Its level is a plain median: not comparable, so marked.
      ax.plot([x], [p.median], "x", color="#ef6c00", markersize=6)
  for c in s.changes:
    ax.axvline(c.index - 0.5, color=COLOURS[c.kind], linestyle="--", linewidth=1.2)
    ax.annotate(f"{c.commit[:7]} {c.change:+.0%}", (c.index - 0.5, 1.0),
                xycoords=("data", "axes fraction"), fontsize=7, color=COLOURS[c.kind],
                ha="left", va="top")
  ax.set_xticks(list(xs))
  ax.set_xticklabels([p.commit[:7] for p in s.points], rotation=60, fontsize=6)
  ax.tick_params(axis="y", labelsize=7)
  ax.set_title(f"{s.config}: {LABELS.get(s.metric, s.metric)}"
               + (" (seed-adjusted: seed sets differ)" if s.seed_note else ""), fontsize=8)
  fig.tight_layout()
  buffer = io.StringIO()
  fig.savefig(buffer, format="svg")
  plt.close(fig)
  svg = buffer.getvalue()
  return svg[svg.index("<svg"):]


def _changes_table(series: Sequence[history.Series], subjects: dict[str, str]) -> list[str]:
  rows = [(s, c) for s in series for c in s.changes]
  if not rows:
    return ["<p>No change point found in any series.</p>"]
  out = ["<table><tr><th>machine</th><th>suite</th><th>config</th><th>metric</th>"
         "<th>commit</th><th>before</th><th>after</th><th>change</th><th>p</th><th>kind</th>"
         "</tr>"]
  for s, c in rows:
    subject = html.escape(subjects.get(c.commit, ""))
    out.append(f"<tr><td>{html.escape(s.machine)}</td><td>{s.suite}</td>"
               f"<td>{html.escape(s.config)}</td><td>{LABELS.get(s.metric, s.metric)}</td>"
               f"<td><code>{c.commit[:10]}</code> {subject}</td><td>{c.before:.4g}</td>"
               f"<td>{c.after:.4g}</td><td>{c.change:+.1%}</td><td>{c.pvalue:.1e}</td>"
               f"<td class='{c.kind}'>{c.kind}</td></tr>")
  return out + ["</table>"]


def _changes_json(series: Sequence[history.Series]) -> str:
  data = [{"machine": s.machine, "suite": s.suite, "config": s.config, "metric": s.metric,
           "commit": c.commit, "index": c.index, "before": c.before, "after": c.after,
           "change": c.change, "pvalue": c.pvalue, "kind": c.kind}
          for s in series for c in s.changes]
  return json.dumps(data).replace("</", "<\\/")


def _config_notes(records: Sequence[store.Record]) -> list[str]:
  """One line per (machine, suite) whose commits ran different sets of configurations."""
  notes = []
  groups: dict[tuple, dict[str, set]] = {}
  for r in records:
    groups.setdefault((r.machine, r.suite), {}).setdefault(r.commit, set()).add(r.config)
  for (machine, suite), by_commit in sorted(groups.items()):
    every = set().union(*by_commit.values())
    short = {c[:7]: sorted(every - cs) for c, cs in by_commit.items() if cs != every}
    if short:
      lacking = "; ".join(f"{c} lacks {', '.join(m)}" for c, m in short.items())
      notes.append(f"{machine} / {suite}: configuration sets differ between commits "
                   f"({lacking}): each chart holds the commits that ran its configuration.")
  return notes


def _notes(series: Sequence[history.Series], records: Sequence[store.Record],
           left_out: str) -> list[str]:
  lines = [html.escape(left_out)] if left_out else []
  lines += [html.escape(n) for n in _config_notes(records)]
  lines += [html.escape(f"{s.machine} / {s.suite} / {s.config} / {LABELS.get(s.metric, s.metric)}"
                        f": {s.seed_note}") for s in series if s.seed_note]
  if not lines:
    return ["<p>Every commit of each series ran the same seeds and configurations.</p>"]
  return ["<ul>"] + [f"<li>{line}</li>" for line in lines] + ["</ul>"]


def render(records: Sequence[store.Record], out_dir: str, repo: str | None = None,
           source: str = "", left_out: str = "") -> str:
  """Writes out_dir/index.html for these records; returns its path."""
  series = history.all_series(records)
  subjects = _subjects(repo, sorted({p.commit for s in series for p in s.points}))
  body = [f"<h1>replibench results history</h1><p>{len(records)} trials from "
          f"{html.escape(source)}; {len({r.commit for r in records})} commits, "
          f"{len({r.machine for r in records})} machine(s). Change points: E-divisive means "
          f"with a t-test (Apache Otava), p &lt; {history.MAX_PVALUE}, level change above "
          f"{history.MIN_MAGNITUDE:.0%}. A change point says when to look; "
          f"<code>make bench-ab BASE=&lt;commit before&gt; HEAD=&lt;commit&gt;</code> decides.</p>",
          "<h2>Detected changes</h2>", *_changes_table(series, subjects),
          "<h2>Comparability</h2>", *_notes(series, records, left_out)]
  for machine in sorted({s.machine for s in series}):
    info = next((r.machine_info for r in records if r.machine == machine and r.machine_info), {})
    flags = " ".join(map(str, info.get("flags") or [])) if isinstance(
        info.get("flags"), list) else ""
    body.append(f"<h2>{html.escape(machine)}</h2><p>{html.escape(str(info.get('cpu', '')))}, "
                f"{html.escape(str(info.get('cores', '?')))} cores, flags: "
                f"{html.escape(flags)}</p>")
    for suite in sorted({s.suite for s in series if s.machine == machine}):
      body.append(f"<h3>{suite}</h3>")
      for metric in history.JUDGED:
        charts = [_chart(s) for s in series
                  if s.machine == machine and s.suite == suite and s.metric == metric]
        if charts:
          body.append(f"<h4>{LABELS[metric]}</h4><div class='charts'>"
                      + "".join(f"<div class='chart'>{c}</div>" for c in charts) + "</div>")
  page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>replibench history"
          f"</title><style>{STYLE}</style></head><body>{''.join(body)}"
          f"<script type='application/json' id='changes'>{_changes_json(series)}</script>"
          f"</body></html>\n")
  path = os.path.join(out_dir, "index.html")
  atomic.write_text(path, page)
  return path
