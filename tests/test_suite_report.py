"""Report generation and comparison on small fake sweeps (nothing is trained)."""

import json
import os

import pytest

from replibench.errors import UserError
from replibench.suite import build_report, compare, format_table, load_report, write_report
from tests import fakes as fake
from replibench.suite import run_sweep

SWEEP = """
gin_files = ["base.gin"]
seeds = [1, 2, 3]
seed_binding = "SEED"

[[axes]]
name = "setup"
points = [
  {label = "replicas=1", gin_files = ["base.gin"]},
  {label = "replicas=2", gin_files = ["base.gin"]},
  {label = "replicas=4", gin_files = ["base.gin"]},
  {label = "workers=1", workers = 1},
  {label = "workers=2", workers = 2},
]
"""


def fake_sweep(root, outcome=lambda t: {}):
  """A 5 configuration x 3 seed sweep written by the fake runner; returns its dir."""
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "base.gin"), "w") as f:
    f.write("")
  with open(os.path.join(root, "s.sweep"), "w") as f:
    f.write(SWEEP)
  workdir = os.path.join(root, "run")
  run_sweep([], os.path.join(root, "s.sweep"), workdir, runner=fake.FakeRunner(outcome),
            log=lambda s: None)
  return workdir


def no_convergence(config, seeds=(1, 2, 3)):
  return lambda t: {"time_to_target_s": None} if t.config == config and t.seed in seeds else {}


def test_report_groups_seeds_and_computes_scaling(tmp_path):
  report = build_report(fake_sweep(str(tmp_path), no_convergence("replicas=4", seeds=(2,))))
  assert [c.config for c in report.configs] == [
      "replicas=1", "replicas=2", "replicas=4", "workers=1", "workers=2"]
  r4 = report.config("replicas=4")
  assert (r4.converged, r4.n) == (2, 3) and r4.scaling_kind == "logical_replicas"
  assert r4.reference == "replicas=1"
  assert r4.efficiency == pytest.approx(4 ** 0.8 / 4, rel=0.01)
  w2 = report.config("workers=2")
  assert w2.reference == "workers=1" and w2.scaling_kind == "worker_processes"
  assert w2.speedup == pytest.approx(2 ** 0.5, rel=0.01)
  table = format_table(report)
  assert "2/3 *" in table and "3/3" in table
  assert report.warnings == []


def test_write_report_makes_json_markdown_and_pngs(tmp_path):
  report = build_report(fake_sweep(str(tmp_path), no_convergence("workers=2", seeds=(1,))))
  out = str(tmp_path / "report")
  paths = write_report(report, out)
  for name in ("report.json", "report.md", "time_to_target.png", "curves.png", "throughput.png"):
    path = os.path.join(out, name)
    assert os.path.getsize(path) > 0, name
  with open(os.path.join(out, "time_to_target.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  md = open(paths["markdown"]).read()
  assert "| replicas=2 |" in md and "](throughput.png)" in md
  # Every trial under the table: the unconverged seed has no time to target.
  trials = md.split("## Every trial")[1].split("##")[0]
  assert sum(line.startswith("| workers=2 | 1 |") for line in trials.splitlines()) == 1
  assert [line for line in trials.splitlines()
          if line.startswith("| workers=2 | 1 |")][0].split(" | ")[3] == "-"
  assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]
  again = load_report(paths["json"])
  assert again.config("workers=2").seeds[0].time_to_target_s is None
  assert again.to_dict() == json.load(open(paths["json"]))


def test_report_warns_when_a_result_has_another_seed_than_its_directory(tmp_path):
  fake.write_result(str(tmp_path / "replicas=1" / "seed=1"), fake.fake_result(seed=1))
  fake.write_result(str(tmp_path / "replicas=1" / "seed=2"), fake.fake_result(seed=1))
  report = build_report(str(tmp_path))
  assert report.config("replicas=1").n == 2
  assert len(report.warnings) == 1 and "seed_binding" in report.warnings[0]


def test_compare_same_sweep_passes_and_regression_fails(tmp_path):
  base_dir = fake_sweep(str(tmp_path / "a"))
  baseline = str(tmp_path / "baseline.json")
  write_report(build_report(base_dir), str(tmp_path / "base_report"))
  os.replace(str(tmp_path / "base_report" / "report.json"), baseline)

  same = compare(fake_sweep(str(tmp_path / "b")), baseline)
  assert same.exit_code == 0 and not same.regressions
  assert "0 regression(s)" in same.format_table()

  # replicas=2 twice as slow and no longer converging for workers=1.
  def worse(t):
    if t.config == "replicas=2":
      return {"time_to_target_s": 150.0 + t.seed, "examples_per_s": 500.0 + t.seed}
    return no_convergence("workers=1")(t)
  result = compare(fake_sweep(str(tmp_path / "c"), worse), baseline)
  assert result.exit_code == 1
  bad = {(r.config, r.metric) for r in result.regressions}
  assert ("replicas=2", "time to target (s)") in bad
  assert ("replicas=2", "examples/s") in bad
  assert ("workers=1", "converged") in bad
  assert "REGRESSION" in str(result)


def test_compare_reports_missing_configurations(tmp_path):
  base = build_report(fake_sweep(str(tmp_path / "a")))
  new = build_report(fake_sweep(str(tmp_path / "b")))
  new.configs = [c for c in new.configs if c.config != "replicas=4"]
  result = compare(new, base)
  assert result.missing_in_new == ["replicas=4"] and result.exit_code == 0
  assert "only in the baseline (not run): replicas=4" in str(result)


def test_baseline_of_another_workload_is_a_user_error(tmp_path):
  base = build_report(fake_sweep(str(tmp_path / "a"), lambda t: {"workload": "sngan_fmnist"}))
  with pytest.raises(UserError, match="sngan_fmnist"):
    compare(build_report(fake_sweep(str(tmp_path / "b"))), base)


def test_report_of_an_empty_dir_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="no result.json"):
    build_report(str(tmp_path))


def _on_machine(convnet_gflops, slowdown=1.0):
  """Outcome: every trial ran on a machine of this calibration, times scaled by slowdown."""
  def outcome(t):
    machine = {"cpu": "AMD EPYC", "cores": 2, "isa_flags": ["avx2", "fma"], "accelerators": [],
               "calibration": {"matmul_gflops": 2 * convnet_gflops,
                               "convnet_gflops": convnet_gflops}}
    n = 2 if "2" in t.config else 4 if "4" in t.config else 1
    jitter = 1 + 0.03 * (t.seed % 3 - 1)
    return {"machine": machine, "time_to_target_s": 100.0 / n ** 0.5 * jitter * slowdown,
            "examples_per_s": 1000.0 * n ** 0.8 / jitter / slowdown}
  return outcome


def test_a_4x_faster_machine_is_flagged_not_called_an_improvement(tmp_path):
  # The same code on an AVX-512 EPYC that trains 4x faster than the AVX2 baseline.
  base = build_report(fake_sweep(str(tmp_path / "a"), _on_machine(40.0)))
  new = build_report(fake_sweep(str(tmp_path / "b"), _on_machine(160.0, slowdown=0.25)))
  result = compare(new, base)
  time_rows = [r for r in result.rows if r.metric in ("time to target (s)", "examples/s")]
  assert time_rows and all(r.decision.verdict == "not comparable" for r in time_rows)
  assert "machines differ" in str(result) and result.exit_code == 0
  assert result.count("improvement") == 0
  steps = [r for r in result.rows if r.metric == "steps to target"]
  assert all(r.decision.verdict == "no change" for r in steps)
  # --normalize rescales to the baseline's machine: unchanged code, no change.
  normalized = compare(new, base, normalize=True)
  assert normalized.count("improvement") == normalized.count("regression") == 0
  assert "rescaled by 4.00" in str(normalized)


def test_a_real_slowdown_on_the_same_machine_is_still_caught(tmp_path):
  base = build_report(fake_sweep(str(tmp_path / "a"), _on_machine(160.0)))
  new = build_report(fake_sweep(str(tmp_path / "b"), _on_machine(165.0, slowdown=1.5)))
  result = compare(new, base)
  assert ("replicas=1", "time to target (s)") in {(r.config, r.metric)
                                                  for r in result.regressions}


def test_a_machine_within_the_noise_of_the_calibration_is_judged_and_flagged(tmp_path):
  # One shared VM, two runs of one commit: the suite's calibration moved 27%.
  base = build_report(fake_sweep(str(tmp_path / "a"), _on_machine(52.0)))
  same = build_report(fake_sweep(str(tmp_path / "b"), _on_machine(66.0)))
  result = compare(same, base)
  assert result.exit_code == 0 and result.count("not comparable") == 0
  time_rows = [r for r in result.rows if r.metric == "time to target (s)"]
  assert all(r.decision.verdict == "no change" and "27% apart" in r.decision.note
             for r in time_rows)
  assert any("may be the machine's" in w for w in result.warnings)
  slower = build_report(fake_sweep(str(tmp_path / "c"), _on_machine(66.0, slowdown=1.5)))
  assert ("replicas=1", "time to target (s)") in {(r.config, r.metric)
                                                  for r in compare(slower, base).regressions}
  assert "rescaled by 1.27" in str(compare(same, base, normalize=True))


def test_other_thread_pools_are_named_not_called_another_machine(tmp_path):
  """One intra-op thread halves the calibration's matmul rate on 2 cores: a config
  change, which the comparison names instead of judging (or blaming the machine)."""
  def pools(intra, convnet_gflops):
    def outcome(t):
      out = _on_machine(convnet_gflops)(t)
      out["machine"]["threads"] = {"intra_op": intra, "inter_op": 2}
      return out
    return outcome
  base = build_report(fake_sweep(str(tmp_path / "a"), pools(2, 100.0)))
  new = build_report(fake_sweep(str(tmp_path / "b"), pools(1, 55.0)))
  assert new.thread_pools == [{"inter_op": 2, "intra_op": 1}]
  result = compare(new, base)
  time_rows = [r for r in result.rows if r.metric in ("time to target (s)", "examples/s")]
  assert time_rows and all(r.decision.verdict == "not comparable" for r in time_rows)
  assert "thread pools differ" in str(result) and "machines differ" not in str(result)
  assert "intra-op 2 / inter-op 2" in str(result) and "rescales" not in str(result)
  same = build_report(fake_sweep(str(tmp_path / "c"), pools(1, 56.0)))
  assert compare(same, new).count("not comparable") == 0


def test_another_cpu_kind_is_not_judged_on_time_whatever_its_calibration(tmp_path):
  """Two CPU kinds of one name (a Zen 4 and a Zen 5 "AMD EPYC") whose calibrations are
  27% apart, within a shared VM's drift: the fingerprints tell them apart, so time and
  throughput get no verdict; one fingerprint keeps the calibration's rule."""
  def kind(fp, convnet_gflops, slowdown=1.0):
    def outcome(t):
      out = _on_machine(convnet_gflops, slowdown)(t)
      out["machine"]["fingerprint"] = fp
      return out
    return outcome
  base = build_report(fake_sweep(str(tmp_path / "a"), kind("amd-epyc-f25m17-2c-aa", 52.0)))
  other = build_report(fake_sweep(str(tmp_path / "b"),
                                  kind("amd-epyc-f26m2-2c-bb", 66.0, slowdown=1.5)))
  result = compare(other, base)
  time_rows = [r for r in result.rows if r.metric in ("time to target (s)", "examples/s")]
  assert time_rows and all(r.decision.verdict == "not comparable" for r in time_rows)
  assert result.exit_code == 0 and "fingerprint amd-epyc-f25m17-2c-aa -> " in str(result)
  same = build_report(fake_sweep(str(tmp_path / "c"),
                                 kind("amd-epyc-f25m17-2c-aa", 66.0, slowdown=1.5)))
  assert ("replicas=1", "time to target (s)") in {(r.config, r.metric)
                                                  for r in compare(same, base).regressions}


def test_a_baseline_without_calibration_judges_no_time(tmp_path):
  base = build_report(fake_sweep(str(tmp_path / "a")))
  base.calibration = None
  result = compare(build_report(fake_sweep(str(tmp_path / "b"), _on_machine(50.0, 2.0))), base)
  assert result.exit_code == 0
  assert "no machine calibration in the baseline" in str(result)


def test_only_the_judged_metrics_can_regress(tmp_path):
  sweep = SWEEP.replace('seed_binding = "SEED"', 'seed_binding = "SEED"\njudge = ["examples_per_s"]')
  root = tmp_path / "judged"
  reports = []
  for name, outcome in (("a", lambda t: {}),
                        ("b", lambda t: {"final_metric": 0.5, "time_to_target_s": 300.0})):
    os.makedirs(root / name)
    (root / name / "base.gin").write_text("")
    (root / name / "s.sweep").write_text(sweep)
    run_sweep([], str(root / name / "s.sweep"), str(root / name / "run"),
              runner=fake.FakeRunner(outcome), log=lambda s: None)
    reports.append(build_report(str(root / name / "run")))
  assert reports[1].judged == ["examples_per_s"]
  result = compare(reports[1], reports[0])
  assert result.exit_code == 0 and not result.regressions
  assert {r.decision.verdict for r in result.rows if r.metric != "examples/s"} == {"not judged"}


def test_judge_must_name_known_metrics(tmp_path):
  (tmp_path / "base.gin").write_text("")
  (tmp_path / "s.sweep").write_text(SWEEP.replace('seed_binding = "SEED"',
                                                  'seed_binding = "SEED"\njudge = ["speed"]'))
  with pytest.raises(UserError, match="key 'judge' must list some of converged"):
    run_sweep([], str(tmp_path / "s.sweep"), str(tmp_path / "run"),
              runner=fake.FakeRunner(), log=lambda s: None)


def test_the_unconverged_footnote_stands_under_a_table_with_a_marked_row_only(tmp_path):
  every_seed = format_table(build_report(fake_sweep(str(tmp_path / "all"))))
  assert " *" not in every_seed and "Not every seed" not in every_seed
  one_missed = format_table(build_report(
      fake_sweep(str(tmp_path / "one"), no_convergence("replicas=4", seeds=(2,)))))
  assert "2/3 *" in one_missed and "* Not every seed reached the target" in one_missed
