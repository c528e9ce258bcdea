"""benchmarks/throughput/gpu_goals.py: issue 41's GPU goals judged from a lent machine's files, and
every row it cannot compare said as not measured, never as a figure."""

import json
import subprocess
import sys

import pytest

from tests import helpers

goals = helpers.benchmark_script("throughput/gpu_goals")
GPU = "/physical_device:GPU:0"


def _keras(tmp_path, jit_true: dict | None = None):
  rows = [{"precision": "mixed_bfloat16", "jit_compile": False, "batch": 256,
           "images_per_s": 779.0, "device": GPU},
          {"precision": "mixed_bfloat16", "jit_compile": True, "batch": 256,
           "images_per_s": 2889.0, "device": GPU, **(jit_true or {})}]
  (tmp_path / "keras-peer.json").write_text(json.dumps({"rows": rows}))


def _ours(tmp_path, compiled: bool, **row):
  base = {"model": "resnet50", "precision": "mixed_bfloat16", "setup": "replicas=1",
          "global_batch": 256, "examples_per_s": 4500.0 if compiled else 901.0,
          "memory_kind": "GPU"}
  folder = tmp_path / "xla-resnet50"
  folder.mkdir(exist_ok=True)
  (folder / f"throughput-gpu-resnet50-xla-{compiled}.json").write_text(
      json.dumps({"rows": [{**base, **row}]}))


def _by_goal(tmp_path) -> dict:
  return {g["goal"]: g for g in goals.judge(str(tmp_path))}


def test_a_complete_run_is_judged_against_keras_and_the_absolute_goal(tmp_path):
  _keras(tmp_path); _ours(tmp_path, False); _ours(tmp_path, True)
  got = _by_goal(tmp_path)
  ratio = got["compiled / Keras jit_compile=True"]
  assert ratio["measured"] == pytest.approx(4500 / 2889) and ratio["met"]
  assert got["compiled images/s"]["met"] and got["compiled images/s"]["measured"] == 4500
  assert got["context: replibench jit_compile=False"]["measured"] == 901
  table = goals.render(goals.judge(str(tmp_path)))
  assert "| compiled / Keras jit_compile=True | >= 1.5 | 1.56 | met |" in table


def test_a_slow_step_is_said_as_not_met(tmp_path):
  _keras(tmp_path); _ours(tmp_path, True, examples_per_s=4100.0)
  got = _by_goal(tmp_path)
  assert not got["compiled images/s"]["met"] and not got["compiled / Keras jit_compile=True"]["met"]
  assert "NOT met" in goals.render(goals.judge(str(tmp_path)))


@pytest.mark.parametrize("case", ["no_files", "keras_failed", "keras_on_cpu", "ours_failed",
                                  "ours_other_batch"])
def test_what_cannot_be_compared_is_not_measured(tmp_path, case):
  if case != "no_files":
    _keras(tmp_path, {"keras_failed": {"error": "OOM"}, "keras_on_cpu": {"device": "CPU"}}
           .get(case))
    _ours(tmp_path, True, **{"ours_failed": {"bench_failure": "Traceback\nResourceExhausted",
                                            "examples_per_s": None},
                             "ours_other_batch": {"global_batch": 1024}}.get(case, {}))
  got = _by_goal(tmp_path)["compiled / Keras jit_compile=True"]
  assert got["measured"] is None and not got["met"]
  assert {"no_files": "absent", "keras_failed": "OOM", "keras_on_cpu": "CPU",
          "ours_failed": "ResourceExhausted", "ours_other_batch": "1024"}[case] in got["how"]


def test_the_script_exits_by_its_verdict_and_refuses_an_unreadable_file(tmp_path):
  def run():
    return subprocess.run([sys.executable, "benchmarks/throughput/gpu_goals.py", f"--dir={tmp_path}"],
                          cwd=helpers.REPO, capture_output=True, text=True, timeout=60)
  empty = run()
  assert empty.returncode == 1 and "not measured" in empty.stdout
  _keras(tmp_path); _ours(tmp_path, True)
  assert run().returncode == 0
  (tmp_path / "keras-peer.json").write_text("{ cut")
  bad = run()
  assert bad.returncode == 2 and "keras-peer.json" in bad.stderr and not bad.stdout
