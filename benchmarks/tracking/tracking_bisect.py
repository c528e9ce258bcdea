"""`replibench bisect` on a throwaway branch of 8 commits, one of which slows the step 15%.

Makes branch tracking/bisect-demo on top of HEAD (never checked out here): commits
1-8 each add a line to a scratch file under results/, and commit --culprit also sets
Experiment.inject_slowdown = 1 - 1/1.15 in the suite's gin file (each training call
takes 15% longer). Then runs

  replibench bisect --good=HEAD --bad=tracking/bisect-demo --suite=S --metric=examples_per_s

and prints its steps, the commit it names and the time it took.

  python benchmarks/tracking/tracking_bisect.py [--suite=resnet] [--configs=replicas=1] [--culprit=5]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tracking_power import GIN, git  # noqa: E402

SLOWDOWN = round(1 - 1 / 1.15, 4)   # examples/s x (1 - s) = step time x 1.15


def make_branch(good: str, suite: str, culprit: int, n: int = 8) -> list[str]:
  """The branch's commits on top of good, oldest first."""
  shas = []
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "wt")
    git("worktree", "add", "--detach", path, good)
    for i in range(1, n + 1):
      with open(os.path.join(path, "results", "bisect-demo.txt"), "a") as f:
        f.write(f"commit {i}\n")
      if i == culprit:
        with open(os.path.join(path, GIN[suite]), "a") as f:
          f.write(f"\n# The bisect demo's culprit: each step 15% slower.\n"
                  f"Experiment.inject_slowdown = {SLOWDOWN}\n")
      git("add", "-A", cwd=path)
      git("commit", "-q", "-m", f"bisect demo {i}" + (" (slows the step 15%)" if i == culprit
                                                       else ""), cwd=path)
      shas.append(git("rev-parse", "HEAD", cwd=path))
    git("branch", "-f", "tracking/bisect-demo", shas[-1])
    git("worktree", "remove", "--force", path)
  return shas


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite", default="resnet")
  parser.add_argument("--configs", default="replicas=1")
  parser.add_argument("--seeds", type=int, default=None)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--culprit", type=int, default=5)
  parser.add_argument("--good", default="HEAD")
  args = parser.parse_args()
  good = git("rev-parse", args.good)
  shas = make_branch(good, args.suite, args.culprit)
  print(f"branch tracking/bisect-demo: 8 commits on {good[:10]}; the culprit is commit "
        f"{args.culprit}, {shas[args.culprit - 1][:10]}", flush=True)
  command = [sys.executable, "-m", "replibench.cli", "bisect", f"--good={good}",
             "--bad=tracking/bisect-demo", f"--suite={args.suite}", "--metric=examples_per_s",
             f"--configs={args.configs}",
             f"--workdir={os.path.join(REPO, 'runs', 'bisect-demo', time.strftime('%H%M%S'))}"]
  command += [f"--seeds={args.seeds}"] if args.seeds else []
  command += [f"--rounds={args.rounds}"] if args.rounds else []
  start = time.monotonic()
  done = subprocess.run(command, cwd=REPO)
  print(f"bisect took {(time.monotonic() - start) / 60:.1f} min (exit {done.returncode})")
  return done.returncode


if __name__ == "__main__":
  sys.exit(main())
