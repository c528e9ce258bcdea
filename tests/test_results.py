"""result.json: a result is made from a session's facts alone, results written by
earlier schema versions still load, and the committed reports
(results/**/baseline.json, report.json) hold what they held.

tests/data/results_v1/ holds result.json files written by replibench at
schema_version 1 (commit 719cabc): a run on 2 logical replicas, a launched
2-worker run (a network record) and an asynchronous parameter-server run.
tests/data/results_v2/ holds schema-2 files of earlier writers (a launched 2-worker
run at commit 454de3a, before communication.model_parallel existed).
"""

import dataclasses
import glob
import json
import os
import shutil

import pytest

from replibench import results
from replibench.errors import UserError
from replibench.harness import outcome
from replibench.suite import report
from tests import helpers

V1 = sorted(glob.glob(os.path.join(helpers.REPO, "tests", "data", "results_v1", "*.json")))
# Sweep reports by the names `replibench report` and `make bench` give them (results/
# also holds other JSON: statistical efficiency, benchmarks' tables).
REPORTS = sorted(p for p in glob.glob(os.path.join(helpers.REPO, "results", "**", "*.json"),
                                      recursive=True)
                 if os.path.basename(p) in ("report.json", "baseline.json", "smoke_baseline.json"))


def _read(path, tmp_path):
  shutil.copy(path, tmp_path / results.FILE)
  return results.read(str(tmp_path))


@pytest.mark.parametrize("path", V1, ids=os.path.basename)
def test_a_version_1_result_loads_with_its_facts_and_writes_back_at_version_2(path, tmp_path):
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
  results.write(str(tmp_path), result)
  again = results.read(str(tmp_path))
  assert again.schema_version == results.SCHEMA_VERSION == 2
  assert again.to_dict() == {**result.to_dict(), "schema_version": results.SCHEMA_VERSION}


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(
    helpers.REPO, "tests", "data", "results_v2", "*.json"))), ids=os.path.basename)
def test_an_earlier_version_2_result_loads_with_the_fields_added_since_as_null(path, tmp_path):
  raw = json.load(open(path))
  result = _read(path, tmp_path)
  assert "model_parallel" not in raw["communication"]
  assert result.communication.model_parallel is None
  assert "profile" not in raw and result.profile is None   # Before --profile_steps.
  assert (result.status, result.examples_per_s) == (raw["status"], raw["examples_per_s"])


def test_a_result_missing_a_required_field_is_refused(tmp_path):
  raw = json.load(open(V1[0]))
  del raw["status"]
  (tmp_path / results.FILE).write_text(json.dumps(raw))
  with pytest.raises(UserError, match="lacks the field"):
    results.read(str(tmp_path))


def test_committed_reports_load():
  for path in REPORTS:
    loaded = report.load_report(path)
    assert loaded.configs and all(row.seeds for row in loaded.configs), path


def _facts() -> outcome.RunFacts:
  """A session that reached its target at step 30 on 2 replicas."""
  machine = results.Machine(cpu="cpu", cores=2, isa_flags=["avx2"], accelerators=[],
                            accelerator_peak_memory_bytes={}, calibration={"matmul_gflops": 1.0},
                            malloc=None)
  return outcome.RunFacts(
      workload="w", target_metric="eval/top1", higher_is_better=True, target=0.9,
      topology="Local(num_replicas=2)", scaling_kind="logical_replicas", num_workers=1,
      num_replicas=2, global_batch_size=64, per_replica_batch_size=32, steps_per_epoch=10.0,
      seed=1, regime={"regime": "sync"}, hparams={"seed": 1}, budget=results.Budget(100, 100),
      operative_config="", git_sha="0" * 40, tf_version="2.21.0", final_step=30,
      elapsed_s=12.5, init_s=3.25, curve=[[10, 4.0, 0.5], [30, 12.5, 0.95]],
      last_eval={"eval/top1": 0.95}, at_target={"eval/top1": 0.95}, reached_at=30,
      regime_means={"regime/bytes_communicated": 400.0, "regime/noise_small_sq": 2.0,
                    "regime/noise_big_sq": 1.5},
      eval_s=0.5, sessions=[{"start_step": 0, "end_step": 30, "init_s": 3.25, "timed_s": 12.5}],
      examples_per_s=160.0, first_call_s=1.0, network=None, machine=machine, throughput=None,
      communication={"collectives_per_step": 1.0, "bytes_per_step": 400,
                     "by_kind": {"gradients": {"count": 1.0, "bytes": 400}},
                     "collective_s_per_step": 0.1})


def test_a_result_is_made_from_the_facts_alone(tmp_path):
  facts = _facts()
  result = outcome.make_result(facts, results.REACHED)
  assert result == outcome.make_result(facts, results.REACHED)   # Nothing else is read.
  assert (result.steps_to_target, result.epochs_to_target, result.examples_to_target) == (
      30, 3.0, 1920)
  assert (result.communication.step_s, result.communication.collective_fraction) == (0.4, 0.25)
  assert (result.noise_scale.per_replica_batch, result.noise_scale.caveat) == (32, None)
  assert result.sessions == [results.Session(0, 30, 3.25, 12.5)] and result.resumed == 0
  results.write(str(tmp_path), result)
  assert results.read(str(tmp_path)) == result
  failed = outcome.failed_result(facts, OSError("disk"))
  assert (failed.status, failed.error, failed.curve) == (results.FAILED, "OSError: disk",
                                                          facts.curve)


def test_a_profile_record_round_trips_and_a_newer_writers_fields_are_skipped(tmp_path):
  """result.json's `profile` (run --profile_steps) reads back as a Profile; a field this
  reader does not know (as `profile` is to readers from before it) is skipped."""
  raw = json.load(open(V1[0]))
  result = _read(V1[0], tmp_path)
  profile = results.Profile(steps=[2, 3], traced_steps=[2, 3], calls=2, logdir=".",
                            trace_dir="plugins/profile/2026_11_27_08_19_59", overhead_s=0.1)
  results.write(str(tmp_path), dataclasses.replace(result, profile=profile))
  assert results.read(str(tmp_path)).profile == profile
  newer = {**json.load(open(tmp_path / results.FILE)), "a_later_record": {"x": 1}}
  (tmp_path / results.FILE).write_text(json.dumps(newer))
  assert results.read(str(tmp_path)).status == raw["status"]
