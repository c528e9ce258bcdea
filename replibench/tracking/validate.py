"""One validation pass before an A/B (or a bisect) does anything: nothing checked out,
nothing written, until every input holds.

`sweep` checks every trial's config before its first trial starts; the tracker does
the same for both revisions, without a worktree: each revision is exported
(`git archive`, results/ left out) into a temporary directory that is removed
afterwards, and there, for each suite,

  - the suite's sweep file exists (a base that predates the suite is refused),
  - the trials expand (a bad sweep file, an unknown --configs or default
    configuration, seeds) and the two revisions share at least one,
  - every distinct configuration (the trial with the A/B's --gin_bindings) compiles
    with that revision's code, as `replibench run` would load it (`validator`: by
    default a subprocess of the revision's interpreter, replibench.config's
    load_experiment and check_models),
  - and, for an A/B, each shared configuration resolves Experiment.jit_compile the same
    way on both sides (a compiled step is never paired with an uncompiled one: refused
    here, before any trial, where record.check_same_compilation would refuse only after
    the pair had run).

A revision whose requirements this interpreter does not meet and whose own
environment is not built yet cannot be compiled here without installing it: its
configs are compiled as soon as its environment exists, still before any trial
(ab.prepare_sides), and the log says so.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Callable, Iterator, Sequence

from replibench.errors import UserError
from replibench.suite import sweep_file
from replibench.suite.sweep_file import Trial
from replibench.tracking import environments, revisions
from replibench.tracking.suites import ALL_CONFIGS, Suite

# validator(python, code, trials) -> {trial name: whether its step compiles with XLA, as
# Experiment.jit_compile resolves on this machine} (None: not known, nothing loaded), or a
# UserError naming the trial that does not compile; python None: no interpreter can load
# this revision's code yet (skip).
Validator = Callable[[str | None, str, Sequence[Trial]], dict[str, bool] | None]

# Run by the revision's interpreter with its code first on the path: each trial's
# config loaded as `replibench run` loads it; prints one JSON line. A revision from before
# Experiment.jit_compile (no compile_choice) ran uncompiled, as its results say (null).
_SNIPPET = r"""
import json, sys
try:
  from replibench.config import load_experiment
except ImportError as e:
  print(json.dumps({"skip": f"its replibench has no config loader ({e})"})); sys.exit(0)
compiled = {}
for t in json.load(sys.stdin):
  try:
    exp = load_experiment(t["gin_files"], t["bindings"])
    if hasattr(exp, "check_models"):
      exp.check_models()
    choice = getattr(exp, "compile_choice", None)
    compiled[t["name"]] = bool(choice.enabled) if choice is not None else False
  except Exception as e:
    print(json.dumps({"trial": t["name"], "error": " ".join(f"{type(e).__name__}: {e}".split())
                      if type(e).__name__ != "UserError" else " ".join(str(e).split())}))
    sys.exit(0)
print(json.dumps({"ok": True, "jit_compile": compiled}))
"""


def subprocess_validator(python: str | None, code: str,
                         trials: Sequence[Trial]) -> dict[str, bool] | None:
  """Loads each trial's config with the revision's code (at `code`) and interpreter;
  returns {trial name: whether it compiles its step with XLA}."""
  if python is None or not trials:
    return None
  env = {**os.environ, "PYTHONPATH": code, "TF_CPP_MIN_LOG_LEVEL": "3"}
  done = subprocess.run([python, "-c", _SNIPPET], input=json.dumps([t.to_dict() for t in trials]),
                        capture_output=True, text=True, cwd=code, env=env, timeout=900)
  last = (done.stdout.strip().splitlines() or [""])[-1]
  try:
    said = json.loads(last)
  except json.JSONDecodeError:
    said = {"error": f"the check itself failed (exit {done.returncode}): "
                     f"{' '.join(done.stderr.split())[-400:]}", "trial": trials[0].name}
  if "error" in said:
    raise UserError(f"trial {said.get('trial')} does not compile: {said['error']}")
  return said.get("jit_compile")


@contextlib.contextmanager
def exported(repo: str, rev: revisions.Revision) -> Iterator[str]:
  """A temporary copy of rev's files (no git metadata, no results/), removed after."""
  path = tempfile.mkdtemp(prefix=f"replibench-check-{rev.sha[:7]}-")
  try:
    proc = subprocess.Popen(["git", "-C", repo, "archive", "--format=tar", rev.sha, "--",
                             ".", ":(exclude)results"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
      tar.extractall(path, filter="data")
    if proc.wait(timeout=120) != 0:
      raise UserError(f"git archive {rev.short} failed: cannot read revision {rev.describe()}.")
    yield path
  finally:
    shutil.rmtree(path, ignore_errors=True)


def missing_suite(suite: Suite, label: str, rev: revisions.Revision) -> UserError:
  return UserError(
      f"--suite={suite.name}: the {label} revision {rev.describe()} has no {suite.sweep}, so "
      f"it cannot run that suite (it was added or renamed later). Choose a {label} "
      f"revision that has it, or A/B the other suites.")


def design(suite: Suite, options) -> tuple[tuple | None, tuple | None]:
  """(configurations or None for all, seeds or None for the sweep's) an A/B runs: the
  options' where given, else the suite's default design."""
  configs = suite.configs if options.configs is None else options.configs
  if configs is not None and ALL_CONFIGS in configs:
    configs = None
  return configs, suite.seeds if options.seeds is None else options.seeds


def trials_at(code: str, suite: Suite, options, label: str,
              rev: revisions.Revision) -> tuple[sweep_file.Sweep, dict[str, Trial]]:
  """The suite's trials at a revision checked out (or exported) at `code`, as the A/B
  runs them ({name: trial}); a UserError naming the flag or file at fault."""
  if not os.path.isfile(os.path.join(code, suite.sweep)):
    raise missing_suite(suite, label, rev)
  try:
    sweep = sweep_file.load(os.path.join(code, suite.sweep))
  except UserError as e:
    raise UserError(f"--suite={suite.name} at the {label} revision {rev.short}: "
                    f"{str(e).replace(code + os.sep, '')}") from None
  configs, seeds = design(suite, options)
  trials = sweep_file.expand(sweep, seeds=seeds, extra_bindings=options.bindings)
  if configs is not None:
    known = {t.config for t in trials}
    unknown = [c for c in configs if c not in known]
    if unknown:
      given = (f"--configs={','.join(configs)}" if options.configs is not None
               else f"suite {suite.name}'s default configurations ({', '.join(configs)})")
      raise UserError(f"{given}: {unknown} not in {suite.sweep} at {label} {rev.short} (it "
                      f"has {', '.join(sorted(known))}; --configs=all runs every one).")
    trials = [t for t in trials if t.config in configs]
  return sweep, {t.name: t for t in trials}


def distinct_configs(trials: Sequence[Trial]) -> list[Trial]:
  """One trial per configuration (seeds aside): what a compile check needs."""
  return list({t.config: t for t in reversed(trials)}.values())[::-1]


def interpreter(repo: str, rev: revisions.Revision, code: str) -> tuple[str | None, str]:
  """(the interpreter that can load rev's code now or None, why) without building one."""
  text = revisions.read_file(repo, rev.sha, "pyproject.toml")
  if text is None:
    raise UserError(f"Revision {rev.describe()} has no pyproject.toml: it is not a "
                    f"replibench revision the tracker can install.")
  reqs = environments.requirements(text, f"pyproject.toml at {rev.short}")
  if not environments.unmet(reqs):
    return sys.executable, ""
  built = environments.built(repo, reqs)
  if built:
    return built, ""
  return None, (f"its configs compile once its own environment is built (this interpreter "
                f"does not meet its pyproject.toml)")


def _tagged(suite: Suite, trials: dict[str, Trial]) -> list[Trial]:
  """One trial per configuration, its name led by the suite's ('resnet:replicas=1/seed=1'),
  so that one compile check per revision covers every suite and still names the trial."""
  return [dataclasses.replace(t, config=f"{suite.name}:{t.config}")
          for t in distinct_configs(list(trials.values()))]


def check_revisions(repo: str, revs: dict[str, revisions.Revision], suite_list: Sequence[Suite],
                    options, validator: Validator = subprocess_validator,
                    log=print) -> dict[str, list[str]]:
  """Every check above for every revision ({label: revision}) and suite, cheapest first;
  returns {label: [suite names whose configs wait for the revision's environment]}."""
  for label, rev in revs.items():
    for suite in suite_list:   # No export at all when a sweep file is missing.
      if not revisions.has_path(repo, rev.sha, suite.sweep):
        raise missing_suite(suite, label, rev)
  with contextlib.ExitStack() as stack:
    by_sha = {rev.sha: stack.enter_context(exported(repo, rev))   # An A/A: one export.
              for rev in {r.sha: r for r in revs.values()}.values()}
    codes = {label: by_sha[rev.sha] for label, rev in revs.items()}
    trials = {(label, suite.name): trials_at(codes[label], suite, options, label, rev)[1]
              for label, rev in revs.items() for suite in suite_list}
    _check_shared(list(revs), suite_list, trials)
    deferred: dict[str, list[str]] = {}
    compiled: dict[str, dict[str, bool]] = {}
    checked = set()
    for label, rev in revs.items():
      if rev.sha in checked:   # An A/A's second side is the first's code.
        continue
      checked.add(rev.sha)
      python, why = interpreter(repo, rev, codes[label])
      if python is None:
        log(f"{label} {rev.short}: {why}")
        deferred[label] = [suite.name for suite in suite_list]
        continue
      try:
        compiled[label] = validator(python, codes[label],
                                    [t for suite in suite_list
                                     for t in _tagged(suite, trials[(label, suite.name)])]) or {}
      except UserError as e:
        text = str(e).replace(codes[label] + os.sep, "")
        suite = next((s.name for s in suite_list if f"trial {s.name}:" in text),
                     ",".join(s.name for s in suite_list))
        raise UserError(f"--suite={suite} at the {label} revision {rev.describe()}: "
                        f"{text.replace(f'trial {suite}:', 'trial ')}"
                        + (f" (with --gin_bindings {'; '.join(options.bindings)})"
                           if options.bindings and "--gin_bindings" not in text else "")
                        ) from None
    _check_same_compilation(revs, compiled)
  return deferred


def _check_same_compilation(revs: dict[str, revisions.Revision],
                            compiled: dict[str, dict[str, bool]]) -> None:
  """The two revisions resolve Experiment.jit_compile alike for every configuration both
  could say it of (compiled: {label: {trial name 'suite:config/seed=N': compiles}}); a
  UserError naming the first that differs. A side deferred, or a validator that says
  nothing: record.check_same_compilation refuses such a pair once it has run."""
  if len(compiled) != 2:
    return
  (a, b), (first, second) = compiled, (
      {name.rsplit("/seed=", 1)[0]: on for name, on in said.items()}
      for said in compiled.values())
  for tagged in sorted(set(first) & set(second)):   # The seed aside: one per configuration.
    if first[tagged] != second[tagged]:
      suite, config = tagged.split(":", 1)
      raise UserError(
          f"--suite={suite}: configuration {config} resolves Experiment.jit_compile to "
          f"{first[tagged]} at the {a} revision {revs[a].short} and to {second[tagged]} at the {b} "
          f"revision {revs[b].short}: their configs or 'auto''s table (CPU_DEFAULTS in "
          f"replibench/config/compile_choice.py) differ, and an A/B "
          f"must not pair a compiled step with an uncompiled one. Pin it on both sides "
          f"(--gin_bindings='Experiment.jit_compile = False', or True) to measure the code's "
          f"effect on one kind of step; XLA against the graph executor is "
          f"benchmarks/compile/compile.py's (make bench-compile) paired measurement. Nothing was run.")


def _check_shared(labels: list[str], suite_list: Sequence[Suite], trials: dict) -> None:
  """The two revisions' trials of each suite have at least one in common (a pair)."""
  if len(labels) != 2:
    return
  for suite in suite_list:
    sides = [trials[(label, suite.name)] for label in labels]
    if not set(sides[0]) & set(sides[1]):
      raise UserError(f"--suite={suite.name}: the two revisions' {suite.sweep} share no trial "
                      f"({labels[0]} has {sorted(sides[0])[:3]}..., {labels[1]} "
                      f"{sorted(sides[1])[:3]}...): there is nothing to pair.")
