"""benchmarks/tracking/tracking_power_real.py's bookkeeping: the committed ledger of real power
runs that accumulates across sessions (skips what this machine has done, re-runs a
failed A/B, keys runs by machine), and its report. Fake A/B runs (no real A/B)."""

import argparse
import json

import pytest

from tests import helpers


@pytest.fixture(scope="module")
def script():
  return helpers.benchmark_script("tracking/tracking_power_real")


def _ab(ratio: float, low: float, high: float, verdict: str, failed=(),
        config_row=None) -> dict:
  """An ab.json as `replibench ab` writes it: the pooled rows, and config_row (a
  configuration's row: (config, verdict, ratio, low, high)) where given."""
  row = lambda metric, v: {"config": "all configs", "metric": metric, "verdict": v,  # noqa: E731
                           "estimate": {"ratio": ratio, "low": low, "high": high}}
  rows = [row("median", verdict), row("time_to_target_s", "no change")]
  if config_row:
    config, v, r, lo, hi = config_row
    rows.append({"config": config, "metric": "median", "verdict": v,
                 "estimate": {"ratio": r, "low": lo, "high": hi}})
  return {"suites": [{"suite": "resnet", "failed": list(failed),
                      "pairs": [{"config": "replicas=1"}, {"config": "workers=2"}],
                      "rows": rows}]}


class FakeAB:
  """ab_runner: a slowdown's head is caught, an A/A is not; the runs named in
  fail_first fail once (a failed trial)."""

  def __init__(self, fail_first=()):
    self.calls, self.fail_first = [], set(fail_first)

  def __call__(self, base, head, workdir, args):
    self.calls.append((base, head, workdir))
    kind = "aa" if base == head else "slow"
    if kind in self.fail_first:
      self.fail_first.discard(kind)
      return {"exit_code": 1, "minutes": 1.0,
              "ab": _ab(1.0, 0.9, 1.1, "no change", failed=["head x round=0"])}
    if kind == "aa":
      return {"exit_code": 0, "minutes": 12.0, "ab": _ab(1.0, 0.97, 1.03, "no change")}
    return {"exit_code": 1, "minutes": 13.0, "ab": _ab(0.9, 0.86, 0.94, "regression")}


def _args(tmp_path, **kw):
  return argparse.Namespace(**{"targets": "0.10", "runs": 2, "aa_runs": 3, "suite": "resnet",
                               "ledger": str(tmp_path / "power_real" / "runs.jsonl"),
                               "out": str(tmp_path / "runs"), **kw})


@pytest.fixture
def ledger(script, tmp_path, monkeypatch):
  """A ledger with this machine's calibration of 10% (K=12), another machine's of 5%."""
  monkeypatch.setattr(script.machine, "fingerprint", lambda info=None: "fp-a")
  monkeypatch.setattr(script, "slow_head", lambda base, head, k: head)
  path = _args(tmp_path).ledger
  script.append(path, {"kind": "calibration", "target": "0.1", "k": 12, "commit": "b" * 40,
                       "head": "h" * 40, "cost": 0.098, "low": 0.08, "high": 0.11,
                       "machine": "fp-a", "date": "2026-11-27T10:00:00Z"})
  script.append(path, {"kind": "calibration", "target": "0.05", "k": 5, "commit": "c" * 40,
                       "head": "i" * 40, "cost": 0.05, "low": 0.03, "high": 0.07,
                       "machine": "fp-b", "date": "2026-11-27T10:00:00Z"})
  return path


def test_runs_accumulate_and_a_rerun_goes_on_where_this_machine_stopped(script, tmp_path,
                                                                       ledger):
  fake = FakeAB()
  script.runs(_args(tmp_path), ab_runner=fake)
  assert [(b[0], h[0]) for b, h, _ in fake.calls] == [("b", "b")] * 3 + [("b", "h")] * 2
  lines = script.read_ledger(ledger)
  runs = [line for line in lines if line["kind"] != "calibration"]
  assert [(r["kind"], r["target"], r["verdict"]) for r in runs] == \
      [("aa", "0", "none")] * 3 + [("slowdown", "0.1", "regression")] * 2
  first = runs[-1]
  assert first["machine"] == "fp-a" and first["commit"] == "b" * 40 and first["k"] == 12
  assert first["judged"] == {"metric": "median", "ratio": 0.9, "low": 0.86, "high": 0.94,
                             "verdict": "regression"}
  assert first["minutes"] == 13.0 and first["date"].endswith("Z")
  # Again: nothing left; with more runs asked for, only the missing ones.
  again = FakeAB()
  script.runs(_args(tmp_path), ab_runner=again)
  assert not again.calls
  script.runs(_args(tmp_path, runs=3, aa_runs=3), ab_runner=again)
  assert len(again.calls) == 1 and again.calls[0][1][0] == "h"
  assert len(set(w for _, _, w in fake.calls + again.calls)) == 6   # a fresh directory each


def test_a_failed_ab_is_recorded_and_run_again(script, tmp_path, ledger):
  fake = FakeAB(fail_first=("aa",))
  script.runs(_args(tmp_path, aa_runs=2, runs=0), ab_runner=fake)
  verdicts = [line["verdict"] for line in script.read_ledger(ledger) if line["kind"] == "aa"]
  assert verdicts == ["failed", "none", "none"] and len(fake.calls) == 3
  fake = FakeAB()
  script.runs(_args(tmp_path, aa_runs=2, runs=0), ab_runner=fake)
  assert not fake.calls


def test_failing_again_and_again_stops_the_runs(script, tmp_path, ledger):
  class Broken(FakeAB):
    def __call__(self, base, head, workdir, args):
      self.fail_first = {"aa"}
      return super().__call__(base, head, workdir, args)
  with pytest.raises(SystemExit, match=r"aa 0: 3 A/B runs in a row had failed trials"):
    script.runs(_args(tmp_path, aa_runs=2, runs=0), ab_runner=Broken())


def test_a_machine_without_a_calibration_is_told_to_calibrate(script, tmp_path, ledger,
                                                              monkeypatch):
  monkeypatch.setattr(script.machine, "fingerprint", lambda info=None: "fp-b")
  with pytest.raises(SystemExit, match=r"no calibration on this machine \(fp-b\) for "
                                       r"target\(s\) 0.1"):
    script.runs(_args(tmp_path), ab_runner=FakeAB())


def test_the_report_gives_each_machines_power_table(script, tmp_path, ledger):
  script.runs(_args(tmp_path, runs=2, aa_runs=2), ab_runner=FakeAB(fail_first=("slow",)))
  with open(ledger, "a") as f:
    f.write('{"damaged\n')
    f.write(json.dumps({"kind": "aa", "target": "0", "k": 0, "verdict": "regression",
                        "machine": "fp-b", "commit": "c" * 40, "minutes": 14.0,
                        "judged": {"metric": "median", "ratio": 0.93, "low": 0.9,
                                   "high": 0.96}}) + "\n")
  text = script.report(script.read_ledger(ledger), markdown=True)
  a, b = text.split("## machine fp-b")
  assert "## machine fp-a" in a
  assert "| aa | - | - | alarms 0 of 2 | <= 1 of 20 | 0 |" in a
  assert "| slowdown | 0.1 | 12 (9.8%) | caught 2 of 2 | >= 9 of 10 | 1 | 13.0 |" in a
  assert "0.900 [0.860, 0.940] R" in a
  assert "alarms 1 of 1" in b and "0.930 [0.900, 0.960] R" in b
  # The A/As of one design summed over machines (the fake line has no design: "-").
  assert "## A/A across machines" not in text   # fp-a's runs are of the suite's design


def test_a_new_design_starts_a_new_count(script, tmp_path, ledger, monkeypatch):
  """Runs of the suite's earlier default design are kept and reported, not counted
  towards the current design's."""
  script.runs(_args(tmp_path, runs=0, aa_runs=2), ab_runner=FakeAB())
  monkeypatch.setattr(script, "design_key", lambda suite: "a smaller design")
  fake = FakeAB()
  script.runs(_args(tmp_path, runs=0, aa_runs=2), ab_runner=fake)
  assert len(fake.calls) == 2
  text = script.report(script.read_ledger(ledger))
  assert text.count("alarms 0 of 2") == 2 and "| a smaller design |" in text


def test_aa_runs_need_no_calibration_and_sum_over_machines(script, tmp_path, ledger,
                                                           monkeypatch):
  """A machine without a calibration runs A/As of HEAD with --targets= ; the report sums
  each design's A/A alarms over machines, with each machine's count beside it."""
  script.runs(_args(tmp_path, runs=0, aa_runs=2), ab_runner=FakeAB())
  monkeypatch.setattr(script.machine, "fingerprint", lambda info=None: "fp-b")
  monkeypatch.setattr(script.tracking_power, "git", lambda *a: "d" * 40)
  fake = FakeAB()
  script.runs(_args(tmp_path, targets="", runs=0, aa_runs=3), ab_runner=fake)
  assert [(b, h) for b, h, _ in fake.calls] == [("d" * 40, "d" * 40)] * 3
  text = script.report(script.read_ledger(ledger), markdown=True)
  across = text.split("## A/A across machines")[1]
  assert "alarms 0 of 5 | <= 1 of 20 | fp-a: 0 of 2; fp-b: 0 of 3 |" in across


def test_a_regression_called_by_a_configurations_row_is_named(script, tmp_path, ledger):
  """The ledger keeps every row that called a regression; the report names them where
  the judged (pooled) row did not call it."""
  class OneConfig(FakeAB):
    def __call__(self, base, head, workdir, args):
      self.calls.append((base, head, workdir))
      return {"exit_code": 1, "minutes": 9.0,
              "ab": _ab(0.983, 0.936, 1.032, "no change",
                        config_row=("workers=2", "regression", 0.959, 0.922, 0.997))}
  script.runs(_args(tmp_path, runs=0, aa_runs=1), ab_runner=OneConfig())
  line = [x for x in script.read_ledger(ledger) if x["kind"] == "aa"][0]
  assert line["verdict"] == "regression"
  assert line["called_by"] == [{"config": "workers=2", "metric": "median", "ratio": 0.959,
                                "low": 0.922, "high": 0.997}]
  text = script.report(script.read_ledger(ledger))
  assert "0.983 [0.936, 1.032] R: workers=2 median 0.959 [0.922, 0.997]" in text
