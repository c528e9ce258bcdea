"""The docs cannot rot: the site builds strictly, every command it shows exists, every
repository path it names exists, and the generated reference pages are current.

- The site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken link, a
  missing page or a mkdocstrings reference to code that is gone fails.
- Every `replibench ...` and `make ...` command shown in the pages (docs/, README.md,
  the committed results pages and the benchmarks' READMEs: tests/docs_text.py), in
  code blocks and inline code, names a command of replibench/cli_help.py's COMMANDS
  with flags that command takes (as replibench/cli.py defines them; after
  `launch ... --` the flags belong to the inner command), or Makefile targets that exist.
- Every path like `benchmarks/foo/bar.py`, `configs/...gin` or `results/...` they
  mention exists; a retired file is named with the commit that has it
  (`deaceb2:benchmarks/pack_size.py`), which git must hold.
- docs/reference/{cli,gin,result-json}.md equal what tools/docs/gen_reference.py
  writes now (a stale page names the command that regenerates it).
"""

import functools
import glob
import os
import re
import subprocess
import sys

import pytest

from tests import docs_text
from tests.helpers import REPO

GENERATED = docs_text.GENERATED
REGENERATE = "make docs-reference (= .venv/bin/python tools/docs/gen_reference.py)"


def _env():
  return {**os.environ, "NO_MKDOCS_2_WARNING": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def test_site_builds_strictly(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                         "--site-dir", str(tmp_path / "site")],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, (
      "mkdocs build --strict failed (a broken link, a missing page or reference):\n"
      + proc.stdout[-4000:] + proc.stderr[-4000:])
  assert (tmp_path / "site" / "index.html").is_file()
  assert (tmp_path / "site" / "results" / "scaling" / "index.html").is_file()
  assert (tmp_path / "site" / "benchmarks" / "tracking" / "index.html").is_file()


def test_generated_reference_pages_are_current():
  proc = subprocess.run([sys.executable, "tools/docs/gen_reference.py", "--check"], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=300)
  said = [line for line in proc.stderr.splitlines()
          if not re.match(r"(I|W)\d{4} |WARNING: All log messages", line)]
  assert proc.returncode == 0, (
      f"generated docs are stale: run `{REGENERATE}` and commit the pages.\n"
      + "\n".join(said)[-3000:])


# ------------------------------------------------------------------ what the docs show
def _commands(program: str) -> list[tuple[str, list[str]]]:
  """(where, argv after the program) of every command of `program` the docs show."""
  return [(where, words[1:]) for where, snippet in docs_text.snippets()
          for words in docs_text.segments(snippet)
          if words[0] == program or words[0].endswith("/" + program)]


def _placeholder(word: str) -> bool:
  return bool(re.search(r"<[^>]*>|\.\.\.", word)) or (word.isupper() and len(word) > 1)


@functools.cache
def _cli():
  from absl import flags
  from replibench import cli  # noqa: F401  (defines the flags)
  from replibench import cli_help
  return flags.FLAGS, cli_help.COMMANDS


def _flag_problem(flag_token: str, command: str) -> str | None:
  all_flags, commands = _cli()
  name = flag_token[2:].split("=", 1)[0].strip("[]")
  if not name or name in ("help", "helpfull"):
    return None
  allowed = set(commands[command].flags)
  if name not in all_flags and name.startswith("no") and name[2:] in all_flags:
    if all_flags[name[2:]].flag_type() == "bool":
      name = name[2:]
  if name not in all_flags:
    return f"--{name} is no flag of replibench/cli.py"
  if name not in allowed:
    return f"--{name} is not a flag of `replibench {command}` ({', '.join(sorted(allowed))})"
  return None


def _replibench_problems(argv: list[str]) -> list[str]:
  _, commands = _cli()
  problems, command, i = [], None, 0
  argv = [a.strip("[]") for a in argv]
  while i < len(argv):
    word = argv[i]
    if command is None:
      if word in ("-v", "--verbosity"):
        i += 2
        continue
      if word.startswith("-") or not word:
        i += 1
        continue
      if _placeholder(word):
        return problems   # `replibench COMMAND --help`.
      if word not in commands:
        return [f"`{word}` is no replibench command ({', '.join(commands)})"]
      command = word
    elif word == "--":
      command = None   # `launch ... -- run ...`: the inner command's own flags.
    elif word.startswith("--"):
      problem = _flag_problem(word, command)
      if problem:
        problems.append(problem)
    i += 1
  return problems


@functools.cache
def _make_targets() -> frozenset:
  proc = subprocess.run(["make", "-qpRr", "-f", "Makefile"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  targets = set()
  for line in proc.stdout.splitlines():
    match = re.match(r"^([A-Za-z][A-Za-z0-9_.%-]*(?: [A-Za-z][A-Za-z0-9_.%-]*)*):(?!=)", line)
    if match:
      targets.update(match.group(1).split())
  assert {"bench", "test", "docs"} <= targets, proc.stdout[-2000:]
  return frozenset(targets)


def _make_problems(argv: list[str]) -> list[str]:
  problems, targets = [], _make_targets()
  for word in argv:
    word = word.strip("[]")
    if not word or word.startswith("-") or "=" in word:
      continue
    if _placeholder(word):
      pattern = re.sub(r"<[^>]*>", ".+", re.escape(word).replace(r"\<", "<").replace(r"\>", ">"))
      if not any(re.fullmatch(pattern, t) for t in targets):
        problems.append(f"no Makefile target matches `{word}`")
    elif word not in targets:
      problems.append(f"`make {word}`: no such Makefile target")
  return problems


def test_commands_shown_exist():
  replibench, make = _commands("replibench"), _commands("make")
  assert len(replibench) > 30 and len(make) > 30, (len(replibench), len(make))
  problems = [f"{where}: replibench {' '.join(argv)}\n    {p}"
              for where, argv in replibench for p in _replibench_problems(argv)]
  problems += [f"{where}: make {' '.join(argv)}\n    {p}"
               for where, argv in make for p in _make_problems(argv)]
  assert not problems, "commands in the docs that do not exist:\n" + "\n".join(problems)


_PATH = re.compile(r"(?<![\w./-])((?:benchmarks|configs|results|replibench|models|tools|tests|"
                   r"docs)/[\w./{},*<>-]*)")
# Outputs that runs write, not files of the repo.
_GENERATED_OUTPUTS = ("results/latest/", "results/latest-smoke/", "results/latest")


def _expand(path: str) -> list[str]:
  match = re.search(r"\{([^{}]*)\}", path)
  if not match:
    return [path]
  return [p for alt in match.group(1).split(",")
          for p in _expand(path[:match.start()] + alt + path[match.end():])]


def _git(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


@functools.cache
def _history_is_whole() -> bool:
  """False in a shallow clone or a tree without git, where an old commit may be absent
  without being wrong (its files cannot be checked there)."""
  done = _git("rev-parse", "--is-shallow-repository")
  return done.returncode == 0 and done.stdout.strip() == "false"


def _in_git(rev: str, path: str) -> bool:
  """Whether commit rev has path; True where the history is not here to say."""
  return _git("cat-file", "-e", f"{rev}:{path}").returncode == 0 or not _history_is_whole()


def _path_problems(rel: str, text: str) -> list[str]:
  """The paths a page names that do not exist. A path gone from the tree (a retired
  script) is named with the commit that has it, `REV:path`, which git must hold; once
  so named, the page may show it bare in the commands run in a worktree of REV."""
  text = re.sub(r"\]\([^)]*\)", "]", text)   # Links: mkdocs' to check (README.md's: ours).
  found = [(m.group(1).rstrip(".,:;'"), text[max(0, m.start() - 41):m.start()])
           for m in _PATH.finditer(text)]
  retired = {path for path, before in found if re.search(r"[0-9a-f]{7,40}:$", before)}
  problems = []
  for mentioned, before in found:
    if "<" in mentioned or mentioned.startswith(_GENERATED_OUTPUTS) or \
        mentioned.endswith("/...") or re.search(r"/[A-Z][A-Z_]+[./]", mentioned) or \
        re.search(r"--out[= ]$", before):   # What a command will write.
      continue
    rev = re.search(r"([0-9a-f]{7,40}):$", before)
    if rev:
      if not _in_git(rev.group(1), mentioned):
        problems.append(f"{rel}: {rev.group(1)}:{mentioned} (git has no such file there)")
      continue
    listed = re.split(r",(?![^{]*\})", mentioned)   # A flag's list: a,b (not {a,b}).
    for candidate in (c for part in listed for c in _expand(part)):
      full = os.path.join(REPO, candidate)
      if not (glob.glob(full) if "*" in candidate else os.path.exists(full)) and \
          candidate not in retired:
        problems.append(f"{rel}: {candidate}")
  return problems


def _link_problems(rel: str, text: str) -> list[str]:
  """Relative links of README.md, the one page the site does not build."""
  base = os.path.dirname(os.path.join(REPO, rel))
  return [f"{rel}: link to {target}"
          for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
          if not re.match(r"[a-z]+:", target) and not os.path.exists(os.path.join(base, target))]


def test_paths_mentioned_exist():
  missing = []
  for path in docs_text.doc_files():
    rel = os.path.relpath(path, REPO).replace(os.sep, "/")
    text = open(path).read()
    missing += _path_problems(rel, text)
    if rel == "README.md":
      missing += _link_problems(rel, text)
  assert not missing, "paths the docs name that do not exist:\n" + "\n".join(
      sorted(set(missing)))


def test_the_path_checker_itself():
  assert _path_problems("x.md", "`deaceb2:benchmarks/pack_size.py`, then\n"
                        "    .venv/bin/python benchmarks/pack_size.py --rounds 4") == []
  assert _path_problems("x.md", "`benchmarks/pack_size.py`") == ["x.md: benchmarks/pack_size.py"]
  if _history_is_whole():   # A shallow clone cannot tell an absent file from an old one.
    assert "git has no such file" in _path_problems("x.md", "deaceb2:benchmarks/nonesuch.py")[0]
  assert _path_problems("x.md", "--out=results/nonesuch/table") == []


@pytest.mark.parametrize("argv, problem", [
    (["run", "--gin_file=a.gin", "--workdir=x"], None),
    (["launch", "--workers", "2", "--", "run", "--gin_file=a.gin"], None),
    (["launch", "--workers", "2", "--", "run", "--workers=2"], "not a flag of `replibench run`"),
    (["run", "--no_such_flag=1"], "no flag of"),
    (["plan", "--nojson"], None),
    (["plan", "--noworkdir"], "no flag of"),   # --no only for a boolean flag.
    (["frobnicate"], "no replibench command"),
    (["COMMAND", "--help"], None),
    (["-v", "0", "run", "--max_steps=3"], None),
])
def test_the_checker_itself(argv, problem):
  problems = _replibench_problems(argv)
  if problem is None:
    assert problems == []
  else:
    assert len(problems) == 1 and problem in problems[0], problems


def test_the_make_checker_itself():
  assert _make_problems(["bench-ab", "BASE=main", "SUITE=resnet"]) == []
  assert _make_problems(["bench-<suite>"]) == []
  assert "no such Makefile target" in _make_problems(["bench-nonesuch"])[0]
