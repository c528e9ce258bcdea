"""The history dashboard on a series with a known step, rendered and photographed.

Builds a history store in a temporary directory: the last N commits of this repo's
main branch, each with three seeds' examples/s for one ResNet configuration, drawn
with the paired noise measured on this machine (results/tracking/README.md) and a
step of --step (e.g. -0.15) from commit --at on. Renders it with `replibench
history`'s renderer, checks that the change point it reports sits at that commit, and
photographs the page with headless Chromium (Debian's chromium, with the flags this
machine needs) into --png.

  python tools/docs/history_demo.py --png=results/tracking/dashboard.png
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, REPO)

from replibench import machine  # noqa: E402
from replibench.tracking import dashboard, store  # noqa: E402

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def commits(n: int) -> list[tuple[str, str]]:
  out = subprocess.run(["git", "-C", REPO, "log", "--first-parent", f"-{n}", "--format=%H %cI",
                        "main"], check=True, capture_output=True, text=True).stdout.split("\n")
  return [tuple(line.split()) for line in reversed(out) if line.strip()]


def records(n: int, at: int, step: float, noise: float, seed: int) -> list[store.Record]:
  rng = np.random.default_rng(seed)
  info = machine.describe()
  out = []
  for i, (sha, when) in enumerate(commits(n)):
    for s in (1, 2, 3):
      level = 9000.0 * (1 + step if i >= at else 1.0) * (1 + 0.02 * s)
      value = level * math.exp(noise * rng.standard_normal())
      out.append(store.Record(
          commit=sha, commit_time=when, machine=machine.fingerprint(info), suite="resnet",
          config="replicas=1", seed=s, status="reached", metrics={"examples_per_s": value},
          source="demo", run_id="history_demo", recorded=when, machine_info=info))
  return out


def photograph(page: str, png: str) -> None:
  with tempfile.TemporaryDirectory() as profile:
    subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                    "--window-size=1100,900", f"--screenshot={os.path.abspath(png)}",
                    f"file://{os.path.abspath(page)}"], check=True, capture_output=True,
                   timeout=120)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--commits", type=int, default=16)
  parser.add_argument("--at", type=int, default=10)
  parser.add_argument("--step", type=float, default=-0.15)
  parser.add_argument("--noise", type=float, default=0.04)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--png", default=None)
  args = parser.parse_args()
  recs = records(args.commits, args.at, args.step, args.noise, args.seed)
  with tempfile.TemporaryDirectory() as out:
    page = dashboard.render(recs, out, REPO, source="tools/docs/history_demo.py (synthetic)")
    text = open(page).read()
    expected = commits(args.commits)[args.at][0]
    changes = json.loads(text.split("id='changes'>")[1].split("</script>")[0])
    print(f"step of {args.step:+.0%} injected at commit {args.at} ({expected[:10]}); "
          f"change points reported: {[(c['commit'][:10], round(c['change'], 3)) for c in changes]}")
    ok = [c["commit"] for c in changes] == [expected]
    if args.png:
      photograph(page, args.png)
      print(f"wrote {args.png}")
  print("the change point is at the injected commit" if ok else "NOT FOUND at that commit")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
