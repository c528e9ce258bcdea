"""Where a profiled step's time goes (harness/step_split.py): compute, exchange and
waiting from TensorFlow's trace, summing to the step; the exchange is there when
replicas exchange gradients."""

import importlib
import json
import os
import sys

import pytest

from replibench.config import load_experiment
from replibench.harness import step_split
from replibench.harness.loop import run_experiment
from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
DEVICE_A, DEVICE_B = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:w/task:1/device:CPU:0"


def _thread(tid, name):
  return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}


def _op(tid, kind, ts, dur, **args):
  """A traced op as Trace Viewer writes it: its type as the name, 'node:Type' as its frame."""
  return {"ph": "X", "pid": 1, "tid": tid, "name": kind, "ts": ts, "dur": dur,
          "sf": f"{kind}{ts}", "args": args}


def _async(tid, kind, node, start, done):
  return [{"ph": "X", "pid": 1, "tid": tid, "name": f"ExecutorState::ProcessAsync::{p}",
           "ts": ts, "dur": 1.0, "args": {"name": node, "kernel_type": kind}}
          for p, ts in (("Start", start), ("Done", done))]


def _trace(events):
  frames = {e["sf"]: {"name": f"node_{e['ts']}:{e['name']}"} for e in events if "sf" in e}
  return {"traceEvents": [_thread(1, "python"), _thread(2, "tf_Compute/1"),
                          _thread(3, "tf_Compute/2"), _thread(4, "tf_data_private_threadpool"),
                          *events], "stackFrames": frames}


def test_a_step_splits_into_compute_exchange_and_waiting():
  # A call of 2 steps, 0-1000 µs: compute 0-400 (two threads overlapping), a collective
  # started at 300 and done at 799 (hidden 300-400, exposed 400-800), a send between
  # devices 900-950, a send on one device (not exchange: compute) 950-960; tf.data
  # and the Python thread's own events count in nothing.
  trace = _trace([
      {"ph": "X", "pid": 1, "tid": 1, "name": "train", "ts": 0, "dur": 1000,
       "args": {"step_num": 7}},
      _op(1, "EagerExecute", 0, 1000, long_name="x"),
      _op(2, "Conv2D", 0, 300), _op(3, "Mul", 100, 300),
      *_async(2, "CollectiveReduceV2", "allreduce", 300, 799),
      _op(3, "_Send", 900, 50, key=f"{DEVICE_B};1;{DEVICE_A};edge_1;0:0"),
      _op(3, "_Send", 950, 10, key=f"{DEVICE_A};1;{DEVICE_A};edge_2;0:0"),
      _op(4, "Map", 0, 1000),
      {"ph": "X", "pid": 1, "tid": 2, "name": "ThreadpoolListener::Region", "ts": 0,
       "dur": 1000, "args": {}}])
  [call] = step_split.split_trace(trace, steps_per_call=2)
  assert call.step_num == 7 and call.wall_ms == pytest.approx(0.5)
  assert call.compute_ms == pytest.approx((400 + 10) / 2e3)
  assert call.exchange_ms == pytest.approx((400 + 50) / 2e3)
  assert call.exchange_hidden_ms == pytest.approx(100 / 2e3)
  assert call.wait_ms == pytest.approx((1000 - 860) / 2e3)
  assert sum(call.shares().values()) == pytest.approx(1.0)


def test_a_trace_without_step_markers_has_no_calls():
  assert step_split.split_trace(_trace([_op(2, "Conv2D", 0, 300)])) == []
  assert step_split.summary([]) == {}


@pytest.fixture(scope="module")
def two_replica_run(tmp_path_factory):
  """Steps 2-3 of the tiny ResNet on 2 logical replicas, profiled (one call a step)."""
  workdir = str(tmp_path_factory.mktemp("two_replicas"))
  experiment = load_experiment(
      [os.path.join(helpers.REPO, CONFIG)],
      # Two blocks, not three: the split needs an exchange, not depth.
      [*helpers.TINY[CONFIG], "small_resnet.widths = (4, 8)",
       "small_resnet.blocks_per_stage = (1, 1)", "Experiment.profile_steps = (2, 3)",
       "Experiment.topology = @topology.Local()", "topology.Local.num_replicas = 2",
       "topology.Local.device = 'cpu'"])
  run_experiment(experiment, workdir, max_steps=3)
  return workdir


def test_two_replicas_spend_part_of_each_step_in_the_exchange(two_replica_run):
  splits = step_split.split_run(two_replica_run)
  assert list(splits) == ["chief"] and [c.step_num for c in splits["chief"]] == [2, 3]
  for call in splits["chief"]:
    assert sum(call.shares().values()) == pytest.approx(1.0)
    assert call.compute_ms > 0 and call.exchange_ms > 0 and call.wait_ms >= 0
  mean = step_split.summary(splits["chief"])
  assert 0 < mean["exchange_share"] < 1 and mean["calls"] == 2
  assert "| mean |" in step_split.format_table(splits)


def _cli(monkeypatch, *args) -> int:
  """benchmarks/scaling/step_split.py's main() in this process (its TensorFlow already loaded)."""
  monkeypatch.setattr(sys, "argv", ["step_split.py", *args])
  return importlib.import_module("benchmarks.scaling.step_split").main()


def test_the_cli_prints_the_table_and_refuses_a_run_without_a_profile(
    two_replica_run, tmp_path, monkeypatch, capsys):
  assert _cli(monkeypatch, two_replica_run, f"--json={tmp_path / 'split.json'}") == 0
  assert "### chief" in capsys.readouterr().out
  assert json.load(open(tmp_path / "split.json"))["chief"]["mean"]["calls"] == 2
  assert _cli(monkeypatch, str(tmp_path)) == 2
  assert "--profile_steps" in capsys.readouterr().err
