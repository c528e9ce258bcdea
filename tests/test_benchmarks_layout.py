"""benchmarks/ stays a tidy set (benchmarks/README.md): scripts grouped by concern, each
folder's README listing exactly its scripts as run or made, every script importable and
its docstring naming its own command, and every benchmark command the docs, the
scripts, the Makefile and the accelerator run show using flags the script defines."""

import ast
import functools
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest

from tests import docs_text
from tests.helpers import REPO

BENCHMARKS = os.path.join(REPO, "benchmarks")
SHARED = {"__init__.py", "bench_runs.py"}
_SCRIPT = re.compile(r"(?:^|/)(benchmarks/(?:[\w-]+/)*[\w-]+\.py)$")


def _folders() -> list[str]:
  return sorted(d for d in os.listdir(BENCHMARKS)
                if os.path.isdir(os.path.join(BENCHMARKS, d)) and not d.startswith(("_", ".")))


def _scripts(folder: str) -> set[str]:
  return {os.path.basename(p) for p in glob.glob(os.path.join(BENCHMARKS, folder, "*.py"))
          if not p.endswith("__init__.py")}


def _listed(folder: str) -> dict[str, str]:
  """{script: its run/made cell} of the table in benchmarks/<folder>/README.md."""
  text = open(os.path.join(BENCHMARKS, folder, "README.md")).read()
  return dict(re.findall(r"^\| `([\w-]+\.py)` \| ([^|]*) \|", text, re.M))


def test_no_script_sits_outside_a_concerns_folder():
  loose = {os.path.basename(p) for p in glob.glob(os.path.join(BENCHMARKS, "*.py"))} - SHARED
  assert not loose, f"benchmarks/{sorted(loose)}: move each into its concern's folder"
  index = open(os.path.join(BENCHMARKS, "README.md")).read()
  for folder in _folders():
    assert os.path.isfile(os.path.join(BENCHMARKS, folder, "__init__.py")), folder
    assert f"]({folder}/README.md)" in index, f"benchmarks/README.md does not link {folder}/"


@pytest.mark.parametrize("folder", _folders())
def test_each_folders_readme_lists_exactly_its_scripts(folder):
  listed = _listed(folder)
  assert set(listed) == _scripts(folder), (
      f"benchmarks/{folder}/README.md's table lists {sorted(listed)}; the folder holds "
      f"{sorted(_scripts(folder))}")
  for script, kind in listed.items():
    assert kind.strip().startswith(("run", "made")), f"{folder}/{script}: run or made? {kind}"


@pytest.mark.parametrize("folder", _folders())
def test_each_scripts_docstring_names_its_command(folder):
  for script in _scripts(folder):
    path = os.path.join(BENCHMARKS, folder, script)
    doc = ast.get_docstring(ast.parse(open(path).read())) or ""
    assert f"benchmarks/{folder}/{script}" in doc, f"{folder}/{script}: its command?"


def test_every_script_imports():
  """Each script as a module of the package, in one fresh process (nothing of theirs
  runs: their work is under `if __name__ == "__main__"`)."""
  modules = [f"benchmarks.{folder}.{script[:-3]}"
             for folder in _folders() for script in sorted(_scripts(folder))]
  code = "import importlib, sys\nfor m in sys.argv[1:]:\n  importlib.import_module(m)\n"
  done = subprocess.run([sys.executable, "-c", code, *modules], cwd=REPO, capture_output=True,
                        text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 0, done.stderr[-3000:]


# ------------------------------------------------------------------ commands shown
@functools.cache
def _flags(script: str) -> frozenset | None:
  """The --flags a script's argparse defines (read from its source), None if no such
  script (a retired one, which the docs' path check answers for)."""
  path = os.path.join(REPO, script)
  if not os.path.isfile(path):
    return None
  names = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
      names.update(a.value for a in node.args
                   if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
  return frozenset(names)


def _script_flag_problems(words: list[str]) -> list[str]:
  """Problems of one simple command: the flags after a benchmarks/ script's path."""
  for i, word in enumerate(words):
    match = _SCRIPT.search(word.strip("\"'"))
    if match:
      flags = _flags(match.group(1))
      if flags is None:
        return []
      problems = []
      for arg in words[i + 1:]:
        if arg == "--":
          break   # The command the script runs: its flags are its own.
        name = arg.strip("[]").split("=", 1)[0]
        if name.startswith("--") and len(name) > 2 and "$" not in name and name not in flags:
          problems.append(f"{name} is no flag of {match.group(1)} ({', '.join(sorted(flags))})")
      return problems
  return []


def _code_snippets() -> list[tuple[str, str]]:
  """Commands outside the pages: each benchmark's docstring, the Makefile's recipes and
  the accelerator run's script (a line ending in a backslash joined to the next)."""
  out = []
  paths = glob.glob(os.path.join(BENCHMARKS, "*", "*.py")) + [
      os.path.join(REPO, "Makefile"), os.path.join(REPO, "tools", "accelerator", "run.sh")]
  for path in sorted(paths):
    text = open(path).read()
    if path.endswith(".py"):
      text = ast.get_docstring(ast.parse(text)) or ""
    text = re.sub(r"\\\n", " ", text.replace("$(PY)", "python"))
    out += [(os.path.relpath(path, REPO), line) for line in text.split("\n")]
  return out


def test_benchmark_commands_shown_use_flags_the_script_defines():
  problems, checked = [], 0
  for where, snippet in list(docs_text.snippets()) + _code_snippets():
    if "benchmarks/" not in snippet:
      continue
    for words in docs_text.segments(snippet):
      checked += any(_SCRIPT.search(w) for w in words)
      problems += [f"{where}: {p}" for p in _script_flag_problems(words)]
  assert checked > 40, checked
  assert not problems, "benchmark commands with flags their script lacks:\n" + "\n".join(
      sorted(set(problems)))


def test_the_flag_checker_itself():
  ok = [".venv/bin/python", "benchmarks/tracking/tracking_budget.py", "--noise=0.1", "--pairs=6"]
  assert _script_flag_problems(ok) == []
  bad = ["python", "benchmarks/tracking/tracking_budget.py", "--noise=0.1", "--nonesuch=2"]
  assert "--nonesuch is no flag of" in _script_flag_problems(bad)[0]
  after = ["python", "benchmarks/d4pg/cpu_split.py", "--start_s=1", "--", "replibench", "--x"]
  assert _script_flag_problems(after) == []
  assert _script_flag_problems(["python", "benchmarks/pack_size.py", "--rounds=4"]) == []


# ------------------------------------------------------------------ the merged tracking_budget
def _ab_json(path, logs_by_config: dict[str, list[float]]):
  pairs = [{"config": c, "order": "AB" if i % 2 == 0 else "BA",
            "base": {"metrics": {"examples_per_s": 100.0, "time_to_target_s": 50.0}},
            "head": {"metrics": {"examples_per_s": 100.0 * math.exp(x),
                                 "time_to_target_s": 50.0}}}
           for c, logs in logs_by_config.items() for i, x in enumerate(logs)]
  path.write_text(json.dumps({"suites": [{"suite": "resnet", "pairs": pairs}]}))
  return str(path)


def _budget(monkeypatch, capsys, *args) -> tuple[int, str, str]:
  """benchmarks/tracking/tracking_budget.py's main() in this process: (exit code, out, err)."""
  from benchmarks.tracking import tracking_budget   # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(sys, "argv", ["tracking_budget.py", *args])
  try:
    code = tracking_budget.main()
  except SystemExit as exit_:   # argparse's error: exit 2.
    code = exit_.code
  out, err = capsys.readouterr()
  return code, out, err


def test_tracking_budget_reads_the_paired_noise_of_measured_aa_runs(tmp_path, monkeypatch,
                                                                    capsys):
  logs = {"replicas=1": [0.02, -0.02, 0.01, -0.01, 0.0, 0.03],
          "workers=2": [0.05, -0.05, 0.04, -0.04, 0.0, 0.02]}
  code, out, err = _budget(monkeypatch, capsys, _ab_json(tmp_path / "ab.json", logs),
                           "--pairs=6", "--runs=200")
  assert code == 0, err[-2000:]
  for config, values in logs.items():
    sd = float(re.search(rf"{re.escape(config)} +examples_per_s +n=  6  sd=([\d.]+)",
                         out).group(1))
    assert sd == pytest.approx(statistics.stdev(values), abs=1e-4)
  caught = re.search(r"examples_per_s: 6 pairs x 2 configs: a 10% loss called a regression "
                     r"in (\d+)% of resampled A/B runs; A/A in ([\d.]+)%", out)
  assert caught and int(caught.group(1)) > float(caught.group(2)), out


@pytest.mark.parametrize("args, said", [
    ([], "give either --noise"),
    (["--noise=0.1", "x.json"], "not both"),
    (["nonesuch.json"], "no such ab.json: nonesuch.json"),
    (["x.json", "--order_effect=1.1"], "--order_effect: flags of the simulated noise"),
])
def test_tracking_budget_refuses_a_mixed_or_missing_input(args, said, monkeypatch, capsys):
  code, _, err = _budget(monkeypatch, capsys, *args)
  assert code == 2 and said in err, err
