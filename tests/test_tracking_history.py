"""The results history's integrity: the reader on damaged lines, what enters a series
(the main line, a sweep only under its own suite, no failed trial), what leaves the
tree clean, and commits compared on the seeds they share."""

import json
import os

import pytest

from replibench import dirty
from replibench.errors import UserError
from replibench.tracking import ab, commands, dashboard, history, revisions, store
from tests import tracking_fakes as fakes


@pytest.fixture
def repo(tmp_path, monkeypatch):
  monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "history"))
  return fakes.make_repo(tmp_path / "repo")


def _record(commit="a" * 40, seed=1, value=100.0, **fields):
  return store.Record(**{
      "commit": commit, "commit_time": "2026-01-01T00:00:00+00:00", "machine": "m1",
      "suite": "s", "config": "replicas=1", "seed": seed, "status": "reached",
      "metrics": {"examples_per_s": value}, "source": "bench", "run_id": "r",
      "recorded": "2026-01-02T00:00:00", **fields})


@pytest.mark.parametrize("line, said", [
    (b"\x00\xff\xfe binary garbage", "not UTF-8"),
    (b"{not json", "not a JSON line"),
    (b'["a list"]', "a JSON list, not a history record"),
    (json.dumps({"schema": store.SCHEMA + 1}).encode(), "record schema 2, not one"),
    (json.dumps({"schema": 1, "commit": "x"}).encode(), "missing field(s)"),
    (json.dumps({**vars(_record()), "seed": "one"}).encode(), "field 'seed' is str"),
    (json.dumps({**vars(_record()), "seed": True}).encode(), "field 'seed' is bool"),
    (json.dumps({**vars(_record()), "metrics": {"examples_per_s": "fast"}}).encode(),
     "'examples_per_s' not a number"),
    (json.dumps({**vars(_record()), "machine_info": "a string"}).encode(),
     "field 'machine_info' is str"),
    (json.dumps({**vars(_record()), "commit": "--output=/tmp/x"}).encode(),
     "not a full commit id"),
    (json.dumps({**vars(_record()), "suite": "d4pg"}).encode(),
     "suite 'd4pg' in another machine's or suite's file"),
])
def test_a_bad_line_is_skipped_with_a_warning_naming_its_file_and_line(tmp_path, line, said):
  root = tmp_path / "history"
  store.append([_record(seed=s) for s in (1, 2, 3)], str(root))
  path = root / "m1" / "s.jsonl"
  path.write_bytes(path.read_bytes() + line + b"\n" + path.read_bytes())
  warnings = []
  records = store.read(str(root), warn=warnings.append)
  assert len(records) == 6                   # the lines around the bad one are kept
  assert len(warnings) == 1 and f"{path}:4: " in warnings[0] and said in warnings[0]
  # The page renders from what is left, with no traceback.
  dashboard.render(records, str(tmp_path / "page"), source="t")


def test_the_store_refuses_a_file_for_its_root_and_skips_a_directory_for_a_suite(tmp_path,
                                                                                 monkeypatch):
  monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "a-file"))
  (tmp_path / "a-file").write_text("x")
  with pytest.raises(UserError, match=r"REPLIBENCH_HISTORY=.*a-file: is a file"):
    store.read()
  root = tmp_path / "history"
  os.makedirs(root / "m1" / "resnet.jsonl")
  warnings = []
  assert store.read(str(root), warn=warnings.append) == []
  assert "resnet.jsonl: not a regular file" in warnings[0]
  with pytest.raises(UserError, match="not a regular file"):
    store.append([_record(suite="resnet") for _ in range(1)], str(root))
  root2 = tmp_path / "h2"
  store.append([_record(suite="resnet")], str(root2))
  assert store.read(str(root2))[0].tf_version == ""


def test_commits_are_compared_on_the_seeds_they_share():
  """ResNet's case: commit a ran seeds 1-5, b seeds 1-7; each seed gave the same steps at
  both, and seeds 6 and 7 need more: the level must not move, and the series says why."""
  steps = {1: 100, 2: 110, 3: 120, 4: 130, 5: 140, 6: 200, 7: 210}
  records = ([_record("a" * 40, s, steps[s]) for s in range(1, 6)]
             + [_record("b" * 40, s, steps[s]) for s in range(1, 8)])
  points = history.series(records, "examples_per_s")
  assert points[0].median == pytest.approx(points[1].median)
  assert points[0].seeds == (1, 2, 3, 4, 5) and points[1].seeds == tuple(range(1, 8))
  s = history.Series("m1", "s", "replicas=1", "examples_per_s", points)
  assert "seed sets differ" in s.seed_note and "1-5" in s.seed_note and "1-7" in s.seed_note
  # A real change on the shared seeds still shows, at its size.
  slower = [_record("c" * 40, s, steps[s] * 0.8) for s in range(3, 8)]
  points = history.series(records + slower, "examples_per_s")
  assert points[2].median / points[1].median == pytest.approx(0.8, rel=0.01)
  # One seed set throughout: no note.
  same = history.series(records[:5] + [_record("d" * 40, s, steps[s]) for s in range(1, 6)],
                        "examples_per_s")
  assert history.Series("m", "s", "c", "examples_per_s", same).seed_note == ""


def test_the_page_says_when_seed_or_configuration_sets_differ(tmp_path):
  records = [_record("a" * 40, s) for s in (1, 2)] + [_record("b" * 40, s) for s in (1, 2, 3)]
  other = _record("a" * 40, 1, config="replicas=2")
  page = open(dashboard.render(records + [other], str(tmp_path), source="t")).read()
  assert "seed sets differ between commits" in page
  assert "configuration sets differ between commits (bbbbbbb lacks replicas=2)" in page


def _bench(path, sha, speed=1.0, seeds=(1, 2, 3), failed=(), sweep=fakes.SUITE.sweep,
           threads=None):
  return fakes.write_bench_sweep(path, sha, speed, seeds, failed, sweep, threads)


def test_a_sweep_is_recorded_only_under_its_own_suite_and_never_its_failed_trials(repo,
                                                                                  tmp_path):
  sha = fakes.git(repo, "rev-parse", "HEAD")
  other = _bench(tmp_path / "b1", sha, sweep="configs/other/other.sweep")
  with pytest.raises(UserError, match=r"--suite=fake: .* ran .*other.sweep, not the suite's"):
    commands.history_record(other, fakes.SUITE, repo)
  with pytest.raises(UserError, match="no such directory"):
    commands.history_compare(str(tmp_path / "missing"), fakes.SUITE, {}, repo)
  smoke = tmp_path / "smoke"
  fakes.write_manifest(str(smoke), extra_bindings=("include 'configs/fake/smoke.gin'",))
  with pytest.raises(UserError, match=r"with include 'configs/fake/smoke.gin' added"):
    commands.history_record(str(smoke), fakes.SUITE, repo)
  no_manifest = tmp_path / "b0"
  fakes.write_result(str(no_manifest / "replicas=1" / "seed=1"), 1, 1.0, git_sha=sha)
  with pytest.raises(UserError, match="sweep.json"):
    commands.history_record(str(no_manifest), fakes.SUITE, repo)
  text, code = commands.history_record(_bench(tmp_path / "b2", sha, failed=(2,)),
                                       fakes.SUITE, repo)
  assert code == 1 and text.count("failed trial") == 2 and "4 trials of fake" in text
  assert store.read() and all(r.status != "failed" for r in store.read())
  assert {r.tf_version for r in store.read()} == {"2.21.0"}
  # A trial that died before writing result.json is named from the sweep's plan.
  crashed = _bench(tmp_path / "b3", sha)
  fakes.write_manifest(crashed, trials=("replicas=1/seed=1", "replicas=1/seed=9"))
  text, code = commands.history_record(crashed, fakes.SUITE, repo)
  assert code == 1 and "failed trial replicas=1/seed=9 (no result.json)" in text


def test_a_sweep_is_recorded_on_the_machine_that_ran_it(repo, tmp_path):
  sha = fakes.git(repo, "rev-parse", "HEAD")
  sweep = _bench(tmp_path / "b1", sha)
  path = os.path.join(sweep, "replicas=1", "seed=1", "result.json")
  result = json.load(open(path))
  result["machine"] = {"cpu": "Another CPU 9000", "isa_flags": ["sse4_2"]}
  json.dump(result, open(path, "w"))
  with pytest.raises(UserError, match=r"trial replicas=1/seed=1 ran on Another CPU 9000"):
    commands.history_record(sweep, fakes.SUITE, repo)
  with pytest.raises(UserError, match=r"ran on Another CPU 9000"):
    commands.history_compare(sweep, fakes.SUITE, {}, repo)
  assert store.read() == []


def test_make_bench_after_an_ab_records_and_compares_with_the_main_line(repo, tmp_path,
                                                                        monkeypatch):
  """The history's own appends leave the tree clean, an A/B's throwaway head is not the
  entry `make bench` compares with, and the page holds the main line's commits."""
  monkeypatch.setenv(store.ENV_ROOT, os.path.join(repo, "results", "history"))
  main = fakes.commit(repo, "history tracked", files={"results/history/README": "x\n"})
  text, _ = commands.history_record(_bench(tmp_path / "b1", main), fakes.SUITE, repo)
  fakes.commit(repo, "the first bench's records")   # the .jsonl is tracked from now on
  main = fakes.git(repo, "rev-parse", "HEAD")
  fakes.git(repo, "checkout", "-q", "--detach")
  throwaway = fakes.commit(repo, "an experiment", speed=0.5)
  fakes.git(repo, "checkout", "-q", "main")
  commands.run_ab(revisions.resolve(repo, main, "--base"),
                  revisions.resolve(repo, throwaway, "--head"), [fakes.SUITE], ab.Options(),
                  repo, os.path.join(repo, "runs", "ab", "x"), history=True,
                  runner=fakes.FakeRunner(), validator=fakes.validate, log=lambda line: None)
  assert fakes.git(repo, "status", "--porcelain", "--untracked-files=no")   # appended ...
  assert dirty.relevant_changes(repo) == []                              # ... yet clean
  text, code = commands.history_record(_bench(tmp_path / "b2", main), fakes.SUITE, repo)
  assert code == 0 and "6 trials of fake" in text
  compared = commands.history_compare(_bench(tmp_path / "b3", main), fakes.SUITE, {}, repo)
  assert "on the main line (main) of this machine" in compared
  assert f"commit {main[:10]}" in compared and throwaway[:10] not in compared
  page = open(commands.history_render(str(tmp_path / "page"), repo)).read()
  assert "not on the main line" in page and throwaway[:7] not in page.split("<h2>")[0]


def test_compare_names_other_thread_pools_rather_than_another_machine(repo, tmp_path):
  """The calibration runs in the trial's own pools, so the history must keep them: a
  config that changed Experiment.intra_op_threads is not called another machine."""
  sha = fakes.git(repo, "rev-parse", "HEAD")
  before, after = {"intra_op": 2, "inter_op": 2}, {"intra_op": 1, "inter_op": 2}
  commands.history_record(_bench(tmp_path / "b1", sha, threads=before), fakes.SUITE, repo)
  assert all(r.thread_pools == before for r in store.read()) and store.read()
  same = commands.history_compare(_bench(tmp_path / "b2", sha, threads=before),
                                  fakes.SUITE, {}, repo)
  assert "pools differ" not in same and "not judged" not in same
  other = commands.history_compare(_bench(tmp_path / "b3", sha, threads=after),
                                   fakes.SUITE, {}, repo)
  assert "TensorFlow's thread pools differ (baseline intra-op 2 / inter-op 2; new " \
         "intra-op 1 / inter-op 2)" in other and "not judged" in other


def test_the_history_page_refuses_a_file_for_out(repo, tmp_path):
  store.append([_record()])
  (tmp_path / "f").write_text("")
  with pytest.raises(UserError, match=r"--out=.*is a file"):
    commands.history_render(str(tmp_path / "f"), None)


def test_recording_again_adds_nothing_and_an_aa_keeps_both_sides(repo, tmp_path):
  sha = fakes.git(repo, "rev-parse", "HEAD")
  sweep = _bench(tmp_path / "bench-1" / "fake", sha)
  assert commands.history_record(sweep, fakes.SUITE, repo)[0].count("6 trials") == 1
  text, code = commands.history_record(sweep, fakes.SUITE, repo)   # a resumed make bench
  assert code == 0 and "0 trials" in text and "6 recorded before" in text
  assert len(store.read()) == 6
  rev = revisions.resolve(repo, sha, "--base")
  for _ in range(2):   # An A/A recorded, then run again on its directory.
    commands.run_ab(rev, rev, [fakes.SUITE], ab.Options(), repo,
                    os.path.join(repo, "runs", "ab", "aa"), history=True,
                    runner=fakes.FakeRunner(), validator=fakes.validate, log=lambda line: None)
  assert sorted(r.side for r in store.read() if r.source == "ab") == ["base"] * 6 + ["head"] * 6


def test_a_store_that_cannot_be_written_is_refused_before_any_trial(repo, tmp_path,
                                                                    monkeypatch):
  (tmp_path / "a-file").write_text("")
  monkeypatch.setenv(store.ENV_ROOT, str(tmp_path / "a-file" / "history"))
  rev = revisions.resolve(repo, "HEAD", "--base")
  runner = fakes.FakeRunner()
  with pytest.raises(UserError, match=r"REPLIBENCH_HISTORY.*a-file is a file"):
    commands.run_ab(rev, rev, [fakes.SUITE], ab.Options(), repo,
                    os.path.join(repo, "runs", "ab", "w"), history=True, runner=runner,
                    validator=fakes.validate, log=lambda line: None)
  assert runner.calls == [] and not os.path.exists(os.path.join(repo, "runs", "ab"))
  with pytest.raises(UserError, match=r"REPLIBENCH_HISTORY"):
    commands.history_record(_bench(tmp_path / "b" / "fake", rev.sha), fakes.SUITE, repo)
