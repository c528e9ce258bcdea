"""harness/cluster_exit.py: which processes leave early, and how (no process started;
the launched runs of test_multiworker go through it for real)."""

import json

import pytest
from tensorflow.python.eager import context

from replibench import cluster as cluster_lib
from replibench.harness import cluster_exit


class _Context:
  """An eager context with a coordination service; its barrier recorded or failing."""

  coordination_service = "standalone"

  def __init__(self, barrier_error=None):
    self.barriers, self.barrier_error = [], barrier_error
    self.keys_set, self.keys_waited = [], []

  def wait_at_barrier(self, barrier_id, timeout_in_ms):
    self.barriers.append((barrier_id, timeout_in_ms))
    if self.barrier_error:
      raise self.barrier_error

  def set_config_key_value(self, key, value):
    self.keys_set.append((key, value))

  def get_config_key_value(self, key, timeout_in_ms=0):
    self.keys_waited.append((key, timeout_in_ms))
    return "through"


class _Exited(Exception):
  pass


@pytest.fixture(name="exits")
def _exits(monkeypatch):
  """os._exit and the interpreter's exit handlers replaced: [('atexit',), ('exit', code)]."""
  calls = []

  def fake_exit(code):
    calls.append(("exit", code))
    raise _Exited

  monkeypatch.setattr(cluster_exit.atexit, "_run_exitfuncs", lambda: calls.append(("atexit",)))
  monkeypatch.setattr(cluster_exit.os, "_exit", fake_exit)
  return calls


def _cluster(monkeypatch, jobs, ctx, index=0):
  monkeypatch.setenv(cluster_lib.ENV, json.dumps({"cluster": jobs,
                                                  "task": {"type": "worker", "index": index}}))
  monkeypatch.setattr(context, "context", lambda: ctx)


WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


@pytest.mark.parametrize("index", [0, 1])
def test_a_finished_synchronous_task_waits_for_the_others_then_exits(monkeypatch, exits, index):
  ctx = _Context()
  _cluster(monkeypatch, WORKERS, ctx, index)
  with pytest.raises(_Exited):
    cluster_exit.leave(0)
  assert ctx.barriers == [(cluster_exit.BARRIER, cluster_exit.BARRIER_TIMEOUT_MS)]
  assert exits == [("atexit",), ("exit", 0)]   # The flushes first.
  # Worker 0 hosts the coordination service: it leaves only after worker 1 said it is
  # through the barrier (an earlier exit killed the service before worker 1's reply).
  key = f"{cluster_exit.BARRIER}/worker/1"
  if index == 0:
    assert ctx.keys_waited == [(key, cluster_exit.HAND_OVER_TIMEOUT_MS)] and not ctx.keys_set
  else:
    assert ctx.keys_set == [(key, "through")] and not ctx.keys_waited


def test_a_hand_over_that_fails_still_exits(monkeypatch, exits):
  ctx = _Context()
  def vanished(key, timeout_in_ms=0):
    raise RuntimeError("worker 1 is gone")
  ctx.get_config_key_value = vanished
  _cluster(monkeypatch, WORKERS, ctx)
  with pytest.raises(_Exited):
    cluster_exit.leave(0)
  assert exits == [("atexit",), ("exit", 0)]


@pytest.mark.parametrize("case", ["failed", "no_tf_config", "parameter_servers",
                                  "no_coordination_service", "barrier_fails"])
def test_everything_else_exits_the_ordinary_way(monkeypatch, exits, case):
  ctx = _Context(barrier_error=RuntimeError("task 1 failed") if case == "barrier_fails"
                 else None)
  jobs = dict(WORKERS, ps=["127.0.0.1:3"]) if case == "parameter_servers" else WORKERS
  _cluster(monkeypatch, jobs, ctx)
  if case == "no_tf_config":
    monkeypatch.delenv(cluster_lib.ENV)
  if case == "no_coordination_service":
    ctx.coordination_service = None
  cluster_exit.leave(1 if case == "failed" else 0)   # Returns: the caller exits.
  assert exits == []
  assert ctx.barriers == ([(cluster_exit.BARRIER, cluster_exit.BARRIER_TIMEOUT_MS)]
                          if case == "barrier_fails" else [])
