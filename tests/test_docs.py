"""The docs cannot rot: the site builds strictly, every command it shows exists, every
repository path it names exists, and the generated reference pages are current.

- The site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken link, a
  missing page or a mkdocstrings reference to code that is gone fails.
- Every `replibench ...` and `make ...` command shown in docs/ and README.md, in code
  blocks and inline code, names a command of replibench/cli_help.py's COMMANDS with
  flags that command takes (as replibench/cli.py defines them; after `launch ... --`
  the flags belong to the inner command), or Makefile targets that exist.
- Every path like `benchmarks/foo.py`, `configs/...gin` or `results/...` they mention
  exists.
- docs/reference/{cli,gin,result-json}.md equal what tools/docs/gen_reference.py
  writes now (a stale page names the command that regenerates it).
"""

import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO

GENERATED = ("docs/reference/cli.md", "docs/reference/gin.md", "docs/reference/result-json.md")
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


def test_generated_reference_pages_are_current():
  proc = subprocess.run([sys.executable, "tools/docs/gen_reference.py", "--check"], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=300)
  said = [line for line in proc.stderr.splitlines()
          if not re.match(r"(I|W)\d{4} |WARNING: All log messages", line)]
  assert proc.returncode == 0, (
      f"generated docs are stale: run `{REGENERATE}` and commit the pages.\n"
      + "\n".join(said)[-3000:])


# ------------------------------------------------------------------ what the docs show
def _doc_files() -> list[str]:
  files = sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
  files = [f for f in files if os.path.relpath(f, REPO) not in GENERATED]
  return files + [os.path.join(REPO, "README.md")]


@functools.cache
def _snippets() -> tuple[tuple[str, str], ...]:
  """(where, text) of every code block (shell-like ones) and inline code span."""
  out = []
  for path in _doc_files():
    rel = os.path.relpath(path, REPO)
    text = open(path).read()
    for match in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
      language, body = match.group(1), match.group(2)
      if language in ("python", "py", "toml", "yaml", "json"):
        continue
      line = text.count("\n", 0, match.start()) + 2
      body = re.sub(r"\\\n", " ", body)     # Continuation lines: one command.
      for offset, command in enumerate(body.split("\n")):
        out.append((f"{rel}:{line + offset}", command))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
      out.append((f"{rel} (inline)", " ".join(match.group(1).split())))
  return tuple(out)


def _tokens(command: str) -> list[str]:
  command = re.sub(r"<[^<>]*>", "<_>", command)   # `BASE=<commit before>`: one word.
  try:
    return shlex.split(command, comments=True)
  except ValueError:   # An unbalanced quote in a fragment: split on blanks.
    return command.split("#", 1)[0].split()


_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
_PREFIXES = {"sudo", "time", "nohup", "exec", "env"}


def _commands(program: str) -> list[tuple[str, list[str]]]:
  """(where, argv after the program) of every command of `program` the docs show."""
  found = []
  for where, snippet in _snippets():
    segment = []
    for token in _tokens(snippet) + [";"]:
      if token in _SEPARATORS or token.endswith(";"):
        if token.endswith(";") and token != ";":
          segment.append(token[:-1])
        words = [w for w in segment if w not in _PREFIXES]
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):   # VAR=x cmd
          words = words[1:]
        if words and (words[0] == program or words[0].endswith("/" + program)):
          found.append((where, words[1:]))
        segment = []
      else:
        segment.append(token)
  return found


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


def test_paths_mentioned_exist():
  missing = []
  for path in _doc_files():
    rel = os.path.relpath(path, REPO)
    # Links between pages (`](results/index.md)`) are mkdocs' to check, as pages.
    text = re.sub(r"\]\([^)]*\)", "]", open(path).read())
    for match in _PATH.finditer(text):
      mentioned = match.group(1).rstrip(".,:;'")
      if "<" in mentioned or mentioned.startswith(_GENERATED_OUTPUTS) or \
          mentioned.endswith("/...") or re.search(r"/[A-Z][A-Z_]+[./]", mentioned):
        continue
      for candidate in _expand(mentioned):
        full = os.path.join(REPO, candidate)
        if not (glob.glob(full) if "*" in candidate else os.path.exists(full)):
          missing.append(f"{rel}: {candidate}")
  # README.md is no page of the site: its links are checked here.
  readme = open(os.path.join(REPO, "README.md")).read()
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
    if not re.match(r"[a-z]+:", target) and not os.path.exists(os.path.join(REPO, target)):
      missing.append(f"README.md: link to {target}")
  assert not missing, "paths the docs name that do not exist:\n" + "\n".join(
      sorted(set(missing)))


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
