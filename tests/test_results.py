"""result.json: results written by earlier schema versions still load, and the
committed reports (results/**/baseline.json, report.json) hold what they held.

tests/data/results_v1/ holds result.json files written by replibench at
schema_version 1 (commit 719cabc): a run on 2 logical replicas, a launched
2-worker run (a network record) and an asynchronous parameter-server run.
"""

import glob
import json
import os
import shutil

import pytest

from replibench import results
from replibench.suite import report
from tests import helpers

V1 = sorted(glob.glob(os.path.join(helpers.REPO, "tests", "data", "results_v1", "*.json")))
# Sweep reports (results/predict holds statistical-efficiency files, not reports).
REPORTS = sorted(p for p in glob.glob(os.path.join(helpers.REPO, "results", "**", "*.json"),
                                      recursive=True) if "predict" not in p)


def _read(path, tmp_path):
  shutil.copy(path, tmp_path / results.FILE)
  return results.read(str(tmp_path))


@pytest.mark.parametrize("path", V1, ids=os.path.basename)
def test_a_version_1_result_loads_with_its_facts(path, tmp_path):
  raw = json.load(open(path))
  assert raw["schema_version"] == 1
  result = _read(path, tmp_path)
  assert (result.status, result.final_step, result.num_replicas) == (
      raw["status"], raw["final_step"], raw["num_replicas"])
  assert result.budget["total_steps"] == raw["budget"]["total_steps"]
  assert [s["start_step"] for s in result.sessions] == [0]
  assert result.machine["calibration"] == raw["machine"]["calibration"]
  assert result.communication["bytes_per_step"] == raw["communication"]["bytes_per_step"]
  assert result.regime_metrics == raw["regime_metrics"]
  if raw["network"]:
    assert result.network["bytes_on_wire_per_step"] == raw["network"]["bytes_on_wire_per_step"]
  if raw["noise_scale"]:
    assert result.noise_scale["b_simple"] == raw["noise_scale"]["b_simple"]


@pytest.mark.parametrize("path", V1, ids=os.path.basename)
def test_a_version_1_result_is_written_back_at_the_current_version(path, tmp_path):
  first = _read(path, tmp_path)
  results.write(str(tmp_path), first)
  again = results.read(str(tmp_path))
  assert again.schema_version == results.SCHEMA_VERSION
  assert again.to_dict() == {**first.to_dict(), "schema_version": results.SCHEMA_VERSION}


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: os.path.relpath(p, helpers.REPO))
def test_committed_reports_load(path):
  loaded = report.load_report(path)
  assert loaded.configs and all(row.seeds for row in loaded.configs)
