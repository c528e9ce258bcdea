"""Which uncommitted changes make a checkout "dirty": one rule for provenance and tracker.

A run's result.json names the commit it ran (`git_sha`), with "-dirty" when the
checkout held changes that commit does not; the history records only runs of one
committed revision, and `replibench ab` measures HEAD only from a clean checkout.
Changes under results/ (the committed baselines and the history store, which
`make bench` and `replibench ab --record` themselves append to) and runs/, and to
prose (*.md), do not change what a run measures, so they never make it dirty:
otherwise the history's own appends would stop the next `make bench` from being
recorded.
"""

import subprocess

IRRELEVANT_PREFIXES = ("results/", "runs/")
IRRELEVANT_SUFFIXES = (".md",)


def is_relevant(path: str) -> bool:
  """Whether a change to path (relative to the repository root) can change a run."""
  return not path.startswith(IRRELEVANT_PREFIXES) and not path.endswith(IRRELEVANT_SUFFIXES)


def relevant_changes(repo: str, timeout: float = 60) -> list[str]:
  """Tracked files of the checkout at repo with uncommitted changes that can change a
  run (raises subprocess.CalledProcessError / OSError when git cannot tell)."""
  done = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                        capture_output=True, text=True, timeout=timeout, check=True)
  paths = [line[3:].split(" -> ")[-1].strip('"') for line in done.stdout.splitlines()
           if line.strip()]
  return [p for p in paths if is_relevant(p)]
