"""The A/B, bisect and history commands on a small git repository with a fake suite
(tests/tracking_fakes.py): worktrees, environments, ABBA order, verdicts, bad input."""

import dataclasses
import json
import os
import sys

import pytest

from replibench.errors import Failure, UserError
from replibench.tracking import ab, ab_report, bisect, commands, environments, revisions, store
from replibench.tracking import suites, validate
from tests import helpers
from tests import tracking_fakes as fakes


@pytest.fixture
def repo(tmp_path, monkeypatch):
  monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "history"))
  return fakes.make_repo(tmp_path / "repo")


def _ab(repo, base, head, runner=None, workdir="t", suite=fakes.SUITE, history=False,
        **options):
  base_rev = revisions.resolve(repo, base, "--base")
  head_rev = revisions.resolve(repo, head, "--head")
  return commands.run_ab(base_rev, head_rev, [suite], ab.Options(**options), repo,
                         os.path.join(repo, "runs", "ab", workdir), history=history,
                         runner=runner or fakes.FakeRunner(), validator=fakes.validate,
                         log=lambda line: None)


def _row(outcome, metric, config="all configs"):
  return next(r for r in outcome.rows if r.metric == metric and r.config == config)


def test_a_slower_head_is_a_regression_and_the_same_code_is_not(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "slower", speed=0.9)
  # Trials 1% apart: 6 pairs at the Bonferroni level always see 10% (at the fake's
  # default 3% a trial, some draws of the noise leave the interval touching 1).
  (outcome,), text = _ab(repo, good, "HEAD", runner=fakes.FakeRunner(sigma=0.01))
  row = _row(outcome, "examples_per_s")
  assert row.verdict == "regression" and row.estimate.ratio == pytest.approx(0.9, abs=0.03)
  assert row.estimate.high < 1 and "REGRESSION" in text
  assert _row(outcome, "time_to_target_s").verdict == "regression"
  assert _row(outcome, "steps_to_target").verdict == "no change"
  (same,), _ = _ab(repo, "HEAD", "HEAD", workdir="aa")
  assert not same.regressions
  with pytest.raises(UserError, match="holds an A/B of other base"):
    _ab(repo, good, "HEAD", workdir="aa")


def test_a_suites_default_design_is_run_unless_the_options_say_otherwise(repo):
  suite = dataclasses.replace(fakes.SUITE, configs=("replicas=2",), seeds=(4, 5))
  pairs = lambda workdir, **options: sorted(   # noqa: E731
      (p.config, p.seed) for p in _ab(repo, "HEAD", "HEAD", workdir=workdir, suite=suite,
                                      **options)[0][0].pairs)
  assert pairs("default") == [("replicas=2", 4), ("replicas=2", 5)]
  assert pairs("all", configs=("all",)) == [("replicas=1", 4), ("replicas=1", 5),
                                            ("replicas=2", 4), ("replicas=2", 5)]
  assert pairs("seed", seeds=(1,)) == [("replicas=2", 1)]
  gone = dataclasses.replace(suite, configs=("replicas=8",))
  with pytest.raises(UserError, match=r"default configurations.*--configs=all"):
    _ab(repo, "HEAD", "HEAD", workdir="gone", suite=gone)


def test_trials_run_interleaved_abba_from_each_revisions_checkout(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "faster", speed=1.2)
  runner = fakes.FakeRunner()
  (outcome,), _ = _ab(repo, good, "HEAD", runner=runner, rounds=2)
  assert len(outcome.pairs) == 12 and len(runner.calls) == 24
  first = [(label, name) for label, name, _ in runner.calls[::2]]
  leaders = {}
  for label, name in first[:6]:
    leaders.setdefault(name.split("/")[0], []).append(label)
  assert len(leaders) > 1 and all(set(v) == {"base", "head"} for v in leaders.values())
  flip = {"base": "head", "head": "base"}                     # each configuration's leader
  assert first[6:] == [(flip[label], name) for label, name in first[:6]]  # alternates, and
  # flips each round
  for label, name, trial_dir in runner.calls:
    assert f"/fake/{label}/{name}/round=" in trial_dir
  assert _row(outcome, "examples_per_s").verdict == "improvement"
  # Run again on the same directory: every trial is final, none runs twice.
  again = fakes.FakeRunner()
  _ab(repo, good, "HEAD", runner=again, rounds=2)
  assert again.calls == []


def test_outputs_and_history_records_of_both_sides(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  head = fakes.commit(repo, "slower", speed=0.8)
  _ab(repo, good, head, workdir="unrecorded")
  assert store.read() == []              # An A/B's sides enter the history only when asked.
  _ab(repo, good, head, history=True)
  report = json.load(open(os.path.join(repo, "runs", "ab", "t", "ab.json")))
  assert report["exit_code"] == 1 and [s["sha"] for s in report["sides"]] == [good, head]
  assert "| fake | all configs | examples/s |" in open(
      os.path.join(repo, "runs", "ab", "t", "report.md")).read()
  records = store.read()
  assert {r.commit for r in records} == {good, head} and len(records) == 12
  assert {r.source for r in records} == {"ab"} and len({r.machine for r in records}) == 1
  assert {r.tf_version for r in records} == {"2.21.0"}


def test_the_worktree_holds_the_exact_commit_and_is_reused(repo):
  sha = fakes.git(repo, "rev-parse", "HEAD")
  path = revisions.worktree(repo, sha)
  assert fakes.git(path, "rev-parse", "HEAD") == sha
  assert revisions.worktree(repo, sha) == path
  fakes.commit(repo, "next", speed=2.0)
  assert open(os.path.join(path, "speed.txt")).read().strip() == "1.0"


def test_environment_is_this_one_when_it_meets_the_requirements(repo, monkeypatch):
  rev = revisions.resolve(repo, "HEAD", "--head")
  env = environments.for_revision(repo, rev, "/code")
  assert env.python == sys.executable and "meets" in env.note
  assert env.variables()["PYTHONPATH"].split(os.pathsep)[0] == "/code"
  fakes.commit(repo, "needs more", files={"pyproject.toml": fakes.PYPROJECT.replace(
      '"numpy"', '"numpy", "no-such-package-xyz>=1"')})
  built = {}
  monkeypatch.setattr(environments, "_own_environment",
                      lambda repo_, code, reqs, missing, log: built.setdefault("missing", missing))
  environments.for_revision(repo, revisions.resolve(repo, "HEAD", "--head"), "/code")
  assert built["missing"] == ["no-such-package-xyz>=1 (not installed)"]
  assert environments.unmet(["numpy<1"])[0].startswith("numpy<1 (installed:")


def test_bad_revisions_dirty_trees_and_missing_suites_are_clear_errors(repo):
  with pytest.raises(UserError, match="--base=nope: no such revision"):
    revisions.resolve(repo, "nope", "--base")
  with open(os.path.join(repo, "speed.txt"), "w") as f:
    f.write("0.5\n")
  with pytest.raises(UserError, match="uncommitted changes to speed.txt"):
    commands.resolve_sides(repo, "HEAD", None, aa=True)
  commands.resolve_sides(repo, "HEAD", "HEAD", aa=True)   # an explicit head is checked out
  with pytest.raises(UserError, match="same commit .* --aa"):
    commands.resolve_sides(repo, "HEAD", "HEAD")
  fakes.git(repo, "checkout", "-q", "--", "speed.txt")
  os.makedirs(os.path.join(repo, "results", "history"))   # results/ never makes it dirty
  fakes.commit(repo, "history", files={"results/history/x.jsonl": ""})
  with open(os.path.join(repo, "results", "history", "x.jsonl"), "w") as f:
    f.write("{}\n")
  commands.resolve_sides(repo, "HEAD", None, aa=True)
  first = fakes.git(repo, "rev-list", "--max-parents=0", "HEAD")
  fakes.git(repo, "checkout", "-q", "--orphan", "bare")
  fakes.git(repo, "rm", "-q", "-rf", "configs")
  fakes.commit(repo, "no suite")
  with pytest.raises(UserError, match="base revision .* has no configs/fake/fake.sweep"):
    _ab(repo, "HEAD", first)


def test_bisect_finds_the_commit_that_slowed_the_step(repo):
  """8 commits after good, the 5th 15% slower: found in 3 A/B steps."""
  good = fakes.git(repo, "rev-parse", "HEAD")
  shas = [fakes.commit(repo, f"commit {i}", speed=0.85 if i >= 5 else 1.0)
          for i in range(1, 9)]
  lines = []
  outcome = bisect.bisect(repo, revisions.resolve(repo, good, "--good"),
                          revisions.resolve(repo, "HEAD", "--bad"), fakes.SUITE,
                          "examples_per_s", ab.Options(), os.path.join(repo, "runs", "b"),
                          runner=fakes.FakeRunner(), validator=fakes.validate,
                          log=lines.append)
  assert outcome.first_moved.sha == shas[4] and len(outcome.steps) == 3
  assert sum(line.startswith("step ") for line in lines) == 3   # pairs are indented
  with pytest.raises(UserError, match="not an ancestor"):
    revisions.commits_between(repo, revisions.resolve(repo, "HEAD", "--good"),
                              revisions.resolve(repo, good, "--bad"))


@pytest.mark.parametrize("args, message", [
    (["ab", "--base=no-such-rev", "--head=HEAD", "--suite=resnet"], "--base=no-such-rev"),
    (["ab", "--suite=resnet,nope", "--base=HEAD", "--head=HEAD"], "--suite=resnet,nope"),
    (["ab", "--base=HEAD", "--head=HEAD", "--min_effect=examples_per_s=2"], "--min_effect"),
    (["ab", "--base=HEAD", "--head=HEAD", "--rounds=0", "--norecord", "--suite=resnet",
      "--workdir=/dev/null"], "--rounds=0"),
    (["bisect", "--good=HEAD~1", "--bad=HEAD", "--suite=resnet"], "--metric"),
    (["history", "compare", "x"], "--suite"),
])
def test_cli_bad_input_exits_2_with_one_paragraph(args, message):
  run = helpers.cli(*args, timeout=120)
  assert run.returncode == 2, helpers.failure_report(run)
  assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1


def _bench_sweep(path, sha, speed, seeds=(1, 2, 3), failed=()):
  """A finished bench sweep directory of the fake suite at commit sha (the seeds in
  `failed` failed)."""
  return fakes.write_bench_sweep(path, sha, speed, seeds, failed)


def test_bench_compares_with_the_newest_history_entry_then_records(repo, tmp_path):
  sha = fakes.git(repo, "rev-parse", "HEAD")
  first = _bench_sweep(tmp_path / "bench1" / "fake", sha, 1.0)
  assert "make bench-ab" in commands.history_compare(first, fakes.SUITE, {}, repo)
  text, code = commands.history_record(first, fakes.SUITE, repo)
  assert "6 trials of fake" in text and code == 0
  slower = _bench_sweep(tmp_path / "bench2" / "fake", sha, 0.5)
  text = commands.history_compare(slower, fakes.SUITE, {}, repo)
  assert f"commit {sha[:10]}, 6 trials" in text and "REGRESSION" in text
  assert "make bench-ab BASE=" in text and "TensorFlow versions differ" not in text
  dirty = _bench_sweep(tmp_path / "bench3" / "fake", sha + "-dirty", 1.0)
  assert "not recorded" in commands.history_record(dirty, fakes.SUITE, repo)[0]


def test_failed_trials_exit_1_are_named_and_never_enter_the_history(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "same speed", speed=1.0)
  # Base fails on seed 2: no verdict calls that a regression of the head, yet the A/B
  # could not measure what it was asked to: exit 1, the trials named.
  runner = fakes.FakeRunner(fail=lambda side, trial: side.label == "base" and trial.seed == 2)
  outcomes, text = _ab(repo, good, "HEAD", runner=runner, history=True)
  assert ab_report.exit_code(outcomes) == 1 and not outcomes[0].regressions
  assert len(outcomes[0].failed) == 2 and all(f.startswith("base ") for f in outcomes[0].failed)
  assert "FAILED trial base" in text and "2 failed trial(s); exit code 1" in text
  records = store.read()
  assert len(records) == 10 and all(r.status != "failed" for r in records)


def test_an_ab_with_no_judgeable_pair_says_so_and_exits_1(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "every trial fails", speed=1.0)
  outcomes, text = _ab(repo, good, "HEAD", history=True,
                       runner=fakes.FakeRunner(fail=lambda side, trial: True))
  assert ab_report.exit_code(outcomes) == 1 and outcomes[0].judgeable == 0
  assert "no judgeable pair" in text and "exit code 1" in text
  assert store.read() == []                  # the history is untouched


def _nothing_written(repo, workdir):
  assert not os.path.exists(os.path.join(repo, "runs", "ab", "worktrees"))
  assert len(fakes.git(repo, "worktree", "list").splitlines()) == 1
  assert not os.path.exists(os.path.join(repo, "runs", "ab", workdir, commands.PLAN_FILE))
  assert store.read() == []


@pytest.mark.parametrize("case, message", [
    ("configs", r"--configs=replicas=9: \['replicas=9'\] not in"),
    ("binding", r"at the base revision .* trial replicas=1/seed=1 does not compile.*"
                r"with --gin_bindings Fake.broken"),
    ("broken_base", r"at the base revision .* does not compile"),
    ("no_suite", r"base revision .* has no configs/fake/fake.sweep"),
    ("rounds", r"--rounds=0"),
    ("mixed_xla", r"configuration replicas=1 resolves Experiment.jit_compile to False at the "
                  r"base revision \w+ and to True at the head .*Nothing was run"),
    ("workdir_file", r"--workdir=.*is a file"),
    ("history_file", r"REPLIBENCH_HISTORY=.*is a file"),
])
def test_bad_input_is_refused_before_anything_is_checked_out_or_written(
    repo, monkeypatch, tmp_path, case, message):
  base = fakes.git(repo, "rev-parse", "HEAD")
  if case == "broken_base":
    base = fakes.commit(repo, "broken", files={"broken.txt": "x"})
  if case == "no_suite":
    fakes.git(repo, "checkout", "-q", "--orphan", "bare")
    fakes.git(repo, "rm", "-q", "-rf", "configs")
    base = fakes.commit(repo, "no suite")
    fakes.git(repo, "checkout", "-q", "main")
  fakes.commit(repo, "head", speed=0.9, files={"xla.txt": "x"} if case == "mixed_xla" else {})
  if case == "broken_base":
    fakes.git(repo, "rm", "-q", "broken.txt")
    fakes.commit(repo, "fixed")
  options = {"configs": {"configs": ("replicas=9",)}, "binding": {"bindings": (fakes.BROKEN,)},
             "rounds": {"rounds": 0}}.get(case, {})
  workdir = "w"
  if case == "workdir_file":
    os.makedirs(os.path.join(repo, "runs", "ab"))
    open(os.path.join(repo, "runs", "ab", "w"), "w").close()
  if case == "history_file":
    monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
  with pytest.raises(UserError, match=message):
    _ab(repo, base, "HEAD", workdir=workdir, history=True, **options)
  if case == "history_file":
    monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "history"))
  if case != "workdir_file":
    _nothing_written(repo, workdir)
  if case in ("configs", "binding", "rounds", "mixed_xla"):   # The corrected retry runs there.
    pinned = {"bindings": (fakes.GRAPH,)} if case == "mixed_xla" else {}
    (outcome,), _ = _ab(repo, base, "HEAD", workdir=workdir, history=True, **pinned)
    assert len(outcome.pairs) == 6 and len(store.read()) == 12


def test_a_corrupt_plan_is_a_clear_refusal_and_a_plan_without_trials_does_not_block(repo):
  base = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "head", speed=0.9)
  workdir = os.path.join(repo, "runs", "ab", "w")
  os.makedirs(workdir)
  with open(os.path.join(workdir, commands.PLAN_FILE), "wb") as f:
    f.write(b"{\x00\xff garbage")
  with pytest.raises(UserError, match=r"ab-plan.json is not readable JSON"):
    _ab(repo, base, "HEAD", workdir="w")
  assert not os.path.exists(os.path.join(repo, "runs", "ab", "worktrees"))
  # A plan of another A/B whose trials never ran does not block this one.
  with open(os.path.join(workdir, commands.PLAN_FILE), "w") as f:
    json.dump({"base": "0" * 40, "head": "1" * 40, "suites": ["fake"], "options": {}}, f)
  (outcome,), _ = _ab(repo, base, "HEAD", workdir="w")
  assert len(outcome.pairs) == 6


def test_a_bisect_step_with_failed_trials_stops_with_exit_1_naming_them(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  for i in range(1, 4):
    fakes.commit(repo, f"commit {i}", speed=1.0)
  runner = fakes.FakeRunner(fail=lambda side, trial: side.label == "head" and trial.seed == 1)
  with pytest.raises(Failure, match=r"bisect step 1 .* could not judge: head .*seed=1"):
    bisect.bisect(repo, revisions.resolve(repo, good, "--good"),
                  revisions.resolve(repo, "HEAD", "--bad"), fakes.SUITE, "examples_per_s",
                  ab.Options(), os.path.join(repo, "runs", "b"), runner=runner,
                  validator=fakes.validate, log=lambda line: None)
  fakes.commit(repo, "broken at bad", files={"broken.txt": "x"})
  with pytest.raises(UserError, match=r"bad revision .* does not compile"):
    bisect.bisect(repo, revisions.resolve(repo, good, "--good"),
                  revisions.resolve(repo, "HEAD", "--bad"), fakes.SUITE, "examples_per_s",
                  ab.Options(), os.path.join(repo, "runs", "b2"), runner=fakes.FakeRunner(),
                  validator=fakes.validate, log=lambda line: None)
  assert not os.path.exists(os.path.join(repo, "runs", "b2"))


def test_the_compile_check_loads_a_revisions_configs_with_its_code():
  """The default validator: a subprocess of the revision's interpreter loads each
  configuration as `replibench run` would and says whether its step compiles with XLA
  (Experiment.jit_compile resolved); a binding that cannot compile is named."""
  rev = revisions.resolve(helpers.REPO, "HEAD", "--head")
  _, trials = validate.trials_at(helpers.REPO, suites.SUITES["d4pg"], ab.Options(), "head", rev)
  plain = list(trials.values())[0]
  xla = dataclasses.replace(plain, config="xla",
                            bindings=(*plain.bindings, "Experiment.jit_compile = True"))
  assert validate.subprocess_validator(sys.executable, helpers.REPO, [plain, xla]) == {
      plain.name: False, xla.name: True}
  nope = dataclasses.replace(plain, bindings=(*plain.bindings, "Nope.x = 1"))
  with pytest.raises(UserError, match=r"trial .* does not compile: .*Nope"):
    validate.subprocess_validator(sys.executable, helpers.REPO, [nope])


def test_configs_are_compiled_once_a_sides_own_environment_exists(repo, monkeypatch):
  """A revision this interpreter cannot load (its own environment not built yet): its
  configs compile right after the environment is made, before any trial or plan."""
  base = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "broken head", files={"broken.txt": "x"})
  monkeypatch.setattr(validate, "interpreter", lambda repo_, rev, code: (None, "not built"))
  runner = fakes.FakeRunner()
  with pytest.raises(UserError, match=r"--suite=fake at the head revision .* does not compile"):
    _ab(repo, base, "HEAD", runner=runner, workdir="w")
  assert runner.calls == []
  assert not os.path.exists(os.path.join(repo, "runs", "ab", "w", commands.PLAN_FILE))


def test_a_bisect_range_must_hold_the_suite_and_a_midpoint_that_cannot_run_fails(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "suite renamed", files={})
  fakes.git(repo, "mv", "configs/fake/fake.sweep", "configs/fake/gone.sweep")
  fakes.commit(repo, "gone")
  fakes.git(repo, "mv", "configs/fake/gone.sweep", "configs/fake/fake.sweep")
  fakes.commit(repo, "back")
  run = lambda workdir, runner=None: bisect.bisect(  # noqa: E731
      repo, revisions.resolve(repo, good, "--good"), revisions.resolve(repo, "HEAD", "--bad"),
      fakes.SUITE, "examples_per_s", ab.Options(), os.path.join(repo, "runs", workdir),
      runner=runner or fakes.FakeRunner(), validator=fakes.validate, log=lambda line: None)
  with pytest.raises(UserError, match=r"1 commit\(s\) between --good and --bad have no"):
    run("b1")
  assert not os.path.exists(os.path.join(repo, "runs"))
  good = fakes.git(repo, "rev-parse", "HEAD")
  fakes.commit(repo, "1")
  fakes.commit(repo, "2: the midpoint, broken", files={"broken.txt": "x"})
  fakes.git(repo, "rm", "-q", "broken.txt")
  fakes.commit(repo, "3", speed=0.5)
  with pytest.raises(Failure, match=r"bisect step 1: the midpoint cannot run the suite"):
    run("b2")


def test_a_bisect_directory_holding_another_bisects_trials_is_refused(repo):
  good = fakes.git(repo, "rev-parse", "HEAD")
  for i in range(1, 3):
    fakes.commit(repo, f"commit {i}", speed=1.0)
  run = lambda metric: bisect.bisect(  # noqa: E731
      repo, revisions.resolve(repo, good, "--good"), revisions.resolve(repo, "HEAD", "--bad"),
      fakes.SUITE, metric, ab.Options(), os.path.join(repo, "runs", "b"),
      runner=fakes.FakeRunner(), validator=fakes.validate, log=lambda line: None)
  run("examples_per_s")
  with pytest.raises(UserError, match=r"holds a bisect of other metric"):
    run("time_to_target_s")
