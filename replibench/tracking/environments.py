"""The Python environment each side of an A/B runs in.

A revision runs with this process's interpreter (its code put first on the path,
PYTHONPATH=<worktree>) when the interpreter's installed packages satisfy every
requirement in that revision's pyproject.toml: the common case, and then both
sides share one set of libraries, so only the code differs. Otherwise the
revision gets an environment of its own, made once per distinct set of
requirements under runs/ab/envs/ (`python -m venv` + `pip install`), and the
report says which side ran where and why.
"""

import dataclasses
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib

from packaging.requirements import InvalidRequirement, Requirement

from replibench.errors import UserError
from replibench.tracking import revisions

ENVS = os.path.join("runs", "ab", "envs")


@dataclasses.dataclass(frozen=True)
class Environment:
  python: str            # the interpreter that runs the side's trials
  code: str              # the worktree put first on PYTHONPATH
  note: str              # which environment, and why

  def variables(self) -> dict[str, str]:
    """os.environ with this side's code first on the path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": self.code + (os.pathsep + path if path else "")}


def requirements(pyproject_text: str, source: str) -> list[str]:
  """The dependencies (and the dev extra) a pyproject.toml declares."""
  try:
    project = tomllib.loads(pyproject_text).get("project", {})
  except tomllib.TOMLDecodeError as e:
    raise UserError(f"{source} is not valid TOML ({e}): cannot tell what that revision "
                    f"needs installed.") from None
  extras = project.get("optional-dependencies", {})
  return [*project.get("dependencies", []), *extras.get("dev", [])]


def unmet(reqs: list[str]) -> list[str]:
  """The requirements this interpreter's installed distributions do not satisfy."""
  missing = []
  for text in reqs:
    try:
      req = Requirement(text)
    except InvalidRequirement:
      missing.append(text)
      continue
    if req.marker is not None and not req.marker.evaluate():
      continue
    try:
      version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
      missing.append(f"{text} (not installed)")
      continue
    if req.specifier and not req.specifier.contains(version, prereleases=True):
      missing.append(f"{text} (installed: {version})")
  return missing


def for_revision(repo: str, rev: revisions.Revision, code: str,
                 log=print) -> Environment:
  """The environment that runs rev's code (checked out at `code`)."""
  text = revisions.read_file(repo, rev.sha, "pyproject.toml")
  if text is None:
    raise UserError(f"Revision {rev.describe()} has no pyproject.toml: it is not a "
                    f"replibench revision the tracker can install.")
  reqs = requirements(text, f"pyproject.toml at {rev.short}")
  missing = unmet(reqs)
  if not missing:
    return Environment(sys.executable, code,
                       f"this environment ({sys.prefix}) meets its pyproject.toml")
  return _own_environment(repo, code, reqs, missing, log)


def _env_path(repo: str, reqs: list[str]) -> str:
  key = hashlib.sha256("\n".join(sorted(reqs)).encode()).hexdigest()[:12]
  return os.path.join(repo, ENVS, key)


def built(repo: str, reqs: list[str]) -> str | None:
  """The interpreter of the environment made for reqs, if it is built (else None)."""
  path = _env_path(repo, reqs)
  return os.path.join(path, "bin", "python") if os.path.exists(
      os.path.join(path, ".installed")) else None


def _own_environment(repo: str, code: str, reqs: list[str], missing: list[str],
                     log) -> Environment:
  path = _env_path(repo, reqs)
  python = os.path.join(path, "bin", "python")
  stamp = os.path.join(path, ".installed")
  if not os.path.exists(stamp):
    log(f"building an environment for requirements this one does not meet "
        f"({'; '.join(missing)}) in {path} (once; pip install from the registry)")
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    done = subprocess.run([python, "-m", "pip", "install", "-q", *reqs], capture_output=True,
                          text=True)
    if done.returncode != 0:
      raise UserError(f"Could not install the requirements of {code} into {path}: pip "
                      f"said: {' '.join(done.stderr.split())[-600:]}")
    open(stamp, "w").close()
  return Environment(python, code, f"its own environment {path} (this one lacks "
                                   f"{'; '.join(missing)})")
