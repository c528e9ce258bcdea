"""Git revisions for the tracker: resolving them, checking the tree, checking them out.

Each side of an A/B runs from its own `git worktree` of the exact commit (asv
builds each revision apart the same way), kept under the repository's ignored
runs/ directory and reused by later A/Bs of the same commit. Git is driven
through its command line: no library.
"""

import dataclasses
import os
import subprocess

from replibench import dirty
from replibench.errors import UserError

WORKTREES = os.path.join("runs", "ab", "worktrees")


@dataclasses.dataclass(frozen=True)
class Revision:
  """A commit as the user named it."""
  name: str      # what the user wrote: a branch, tag, HEAD~1, a sha
  sha: str       # the full commit id
  subject: str   # its first line
  time: str      # committer date, ISO 8601

  @property
  def short(self) -> str:
    return self.sha[:10]

  def describe(self) -> str:
    given = "" if self.sha.startswith(self.name) else f"{self.name} = "
    subject = self.subject if len(self.subject) <= 72 else self.subject[:69] + "..."
    return f"{given}{self.short} ({subject})"


def git(repo: str, *args: str, check: bool = True) -> str:
  """Runs `git -C repo args...` and returns its stdout without trailing newlines."""
  try:
    done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          timeout=120)
  except FileNotFoundError:
    raise UserError("git is not installed: the tracker needs it to check out revisions.") from None
  if check and done.returncode != 0:
    raise subprocess.CalledProcessError(done.returncode, ["git", *args], done.stdout,
                                        done.stderr)
  return done.stdout.rstrip("\n")


def repo_root(path: str = ".") -> str:
  """The top of the git checkout holding path."""
  try:
    return git(path, "rev-parse", "--show-toplevel")
  except subprocess.CalledProcessError:
    raise UserError(f"{os.path.abspath(path)} is not inside a git checkout: the tracker "
                    f"compares commits of a replibench repository; run it from one.") from None


def resolve(repo: str, name: str, flag: str) -> Revision:
  """The commit `name` means in repo; a UserError naming the flag when it means none."""
  if not name or name.startswith("-"):
    raise UserError(f"{flag}={name!r}: give a revision (a branch, tag, sha or HEAD~N).")
  try:
    sha = git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
  except subprocess.CalledProcessError:
    raise UserError(f"{flag}={name}: no such revision in {repo} (`git rev-parse {name}` "
                    f"finds no commit). Give a branch, tag, sha or HEAD~N that exists "
                    f"here; `git log --oneline` lists them.") from None
  subject, time = git(repo, "show", "-s", "--format=%s%n%cI", sha).split("\n", 1)
  return Revision(name, sha, subject, time)


def default_base(repo: str) -> str:
  """The merge base with main when HEAD is elsewhere, else HEAD~1."""
  head = git(repo, "rev-parse", "HEAD")
  try:
    base = git(repo, "merge-base", "HEAD", "main")
  except subprocess.CalledProcessError:
    base = head
  return base if base != head else "HEAD~1"


# The branch whose first-parent history is "the main line": the commits a machine's
# history series hold and `make bench` compares with (a branch's or an A/B's commits
# are not on it). The first of these that exists names it.
MAIN_BRANCHES = ("main", "origin/main", "master", "origin/master")


def main_line(repo: str) -> tuple[str, list[str]]:
  """(the branch, its first-parent commits oldest first); HEAD's when none of
  MAIN_BRANCHES exists."""
  for branch in (*MAIN_BRANCHES, "HEAD"):
    done = subprocess.run(["git", "-C", repo, "rev-list", "--first-parent", "--reverse",
                           branch, "--"], capture_output=True, text=True, timeout=120)
    if done.returncode == 0:
      return branch, done.stdout.split()
  return "HEAD", []


def relevant_changes(repo: str) -> list[str]:
  """Tracked files with uncommitted changes that could change a measurement (the rule
  provenance's '-dirty' follows too: replibench/dirty.py)."""
  return dirty.relevant_changes(repo)


def check_clean_for_head(repo: str, flag: str = "--head") -> None:
  """Refuses to measure HEAD while the checkout holds changes HEAD does not."""
  changed = relevant_changes(repo)
  if changed:
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    raise UserError(
        f"The checkout {repo} has uncommitted changes to {shown}. Both sides are measured "
        f"from committed revisions, so these changes would not be measured, while the "
        f"result would name HEAD. Commit them (or stash them) and run again, or name the "
        f"revision to measure with {flag}=REV.")


def has_path(repo: str, sha: str, path: str) -> bool:
  done = subprocess.run(["git", "-C", repo, "cat-file", "-e", f"{sha}:{path}"],
                        capture_output=True, timeout=60)
  return done.returncode == 0


def read_file(repo: str, sha: str, path: str) -> str | None:
  """A file's text at a commit, or None if the commit has no such file."""
  done = subprocess.run(["git", "-C", repo, "show", f"{sha}:{path}"], capture_output=True,
                        text=True, timeout=60)
  return done.stdout if done.returncode == 0 else None


def worktree(repo: str, sha: str) -> str:
  """A checkout of commit sha (detached, reused when present) under runs/ab/worktrees/."""
  path = os.path.join(repo, WORKTREES, sha[:12])
  if os.path.isdir(os.path.join(path, ".git")) or os.path.isfile(os.path.join(path, ".git")):
    if git(path, "rev-parse", "HEAD") == sha and not git(path, "status", "--porcelain"):
      return path
    git(repo, "worktree", "remove", "--force", path)
  git(repo, "worktree", "prune")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  git(repo, "worktree", "add", "--detach", "--force", path, sha)
  return path


def commits_between(repo: str, good: Revision, bad: Revision) -> list[Revision]:
  """The commits after good up to and including bad, oldest first (good's descendants)."""
  ancestor = subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", good.sha,
                             bad.sha], capture_output=True, timeout=60).returncode == 0
  if not ancestor:
    raise UserError(f"--good={good.name} ({good.short}) is not an ancestor of --bad="
                    f"{bad.name} ({bad.short}): bisect searches the commits between a good "
                    f"revision and a later bad one.")
  shas = git(repo, "rev-list", "--reverse", "--ancestry-path", "--first-parent",
             f"{good.sha}..{bad.sha}").split()
  if not shas:
    raise UserError(f"--good={good.name} and --bad={bad.name} are the same commit "
                    f"({good.short}): nothing to bisect.")
  return [resolve(repo, sha, "commit") for sha in shas]
