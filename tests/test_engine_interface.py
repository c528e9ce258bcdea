"""The engine's declared interface: one TrainSpec that splits the batch, replicators
that implement BaseReplicator and check the spec they are given, metrics that
apply_gradients returns (and that add up over a step's calls), and the process's
role decided in one place."""

import json
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import model_parallel, ps, regimes
from replibench.engine.regimes import gossip
from replibench.errors import UserError


def test_the_spec_splits_the_global_batch_once():
  spec = engine.TrainSpec(256, 4, steps_per_call=2)
  assert spec.per_replica_batch_size == 64
  assert spec.input_context(1, 2, start_step=3) == engine.InputContext(64, 1, 2, 4, 3)
  with pytest.raises(UserError, match="global batch size 30 does not divide over 4"):
    engine.TrainSpec(30, 4)
  with pytest.raises(UserError, match="steps_per_call must be >= 1"):
    engine.TrainSpec(8, 1, steps_per_call=0)


def test_every_replicator_implements_the_interface():
  for replicator in (engine.Replicator, ps.AsyncReplicator, ps.BackupReplicator,
                     model_parallel.MeshReplicator):
    assert issubclass(replicator, engine.BaseReplicator)
    assert not getattr(replicator, "__abstractmethods__", None), replicator


def test_a_replicator_refuses_a_spec_planned_for_other_replicas():
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))
  spec = replicator.as_spec(8, steps_per_call=3)
  assert (spec.num_replicas, spec.per_replica_batch_size, spec.steps_per_call) == (2, 4, 3)
  assert spec.regime is replicator.regime
  with pytest.raises(UserError, match="plans 4 replica"):
    replicator.as_spec(engine.TrainSpec(8, 4, regime=replicator.regime))
  with pytest.raises(UserError, match="runs 2 under sync"):
    replicator.as_spec(engine.TrainSpec(8, 2, regime=regimes.Sync()))


def test_metrics_of_several_calls_add_their_sums_before_deriving():
  ratio = lambda s: s["regime/sync"] / s["regime/bytes"]   # noqa: E731
  first = engine.StepMetrics({"regime/bytes": 1.0, "regime/sync": 4.0},
                             {"regime/ratio": (ratio, ("regime/sync",))})
  second = engine.StepMetrics({"regime/bytes": 3.0, "regime/sync": 4.0},
                              {"regime/ratio": (ratio, ("regime/sync",))})
  assert set(first) == {"regime/bytes", "regime/ratio"} and float(first["regime/ratio"]) == 4.0
  both = sum([first, second], engine.StepMetrics())
  assert {k: float(v) for k, v in both.items()} == {"regime/bytes": 4.0, "regime/ratio": 2.0}
  distance = gossip.consensus_distance(9.0) + gossip.consensus_distance(16.0)
  assert float(distance["regime/consensus_distance"]) == 5.0


def test_a_replica_step_returns_what_apply_gradients_returns():
  """No regime state is read back after the step: the metrics come out of step_fn."""
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))
  with replicator.scope():
    w = tf.Variable(tf.zeros([3]))
    optimizer = keras.optimizers.SGD(0.5)
    replicator.regime.build_optimizer(optimizer, [w])

  def step():
    return replicator.regime.apply_gradients(optimizer, [tf.ones([3])], [w])

  metrics = replicator.reduce(tf.function(lambda: replicator.run(step))(), "mean")
  assert float(metrics["regime/bytes_communicated"]) == 12.0   # Three float32 entries.
  np.testing.assert_allclose(w.numpy(), -np.ones(3))            # 0.5 * (1 + 1), all-reduced.


def _cluster(task: str) -> str:
  return json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                                 "ps": ["127.0.0.1:3"]}, "task": {"type": task, "index": 0}})


def test_the_process_role_is_decided_in_one_place(monkeypatch):
  assert engine.process_role(engine.Local(num_replicas=2), regimes.Sync()) == engine.Role(
      trains=True, is_chief=True)
  assert engine.process_role(model_parallel.Mesh(), regimes.Sync()) == engine.Role(True, True)
  topology = engine.MultiWorker(ps=1)
  monkeypatch.setenv("TF_CONFIG", _cluster("worker"))
  assert engine.process_role(topology, regimes.AsyncPS()) == engine.Role(False, False)
  assert engine.process_role(topology, regimes.BackupPS()) == engine.Role(False, False)
  monkeypatch.setenv("TF_CONFIG", _cluster("chief"))
  assert engine.process_role(topology, regimes.AsyncPS()) == engine.Role(True, True)


def test_engine_code_runs_unconverted_by_autograph_and_the_step_fn_is_converted():
  """Regimes and collectives are engine code, left alone by AutoGraph as TensorFlow's
  and Keras' own (regimes/base.py: converting them cost each process ~a fifth); the
  workload's step_fn that calls them is converted, so its Python `if` on a tensor works."""
  ran_from = []

  class Probe(regimes.Sync):   # A regime of a later author: no decorator of its own.
    def apply_gradients(self, optimizer, grads, variables):
      ran_from.append(sys._getframe().f_code.co_filename)   # pylint: disable=W0212
      return engine.StepMetrics({"regime/replicas": float(engine.num_replicas())})

  replicator, probe = engine.Replicator(engine.Local(num_replicas=2, device="cpu")), Probe()

  def step_fn(x):
    metrics = probe.apply_gradients(None, [], [])
    if tf.reduce_sum(x) > 0:   # Converted: a tf.cond, not a Python bool of a tensor.
      x = -x
    return {"x": x, **metrics}

  run = tf.function(lambda: replicator.reduce(replicator.run(step_fn, tf.ones([2])), "sum"))
  out = run()
  # Once a replica (each traces step_fn), called from this file's code as written (in a
  # converted copy the call itself goes through AutoGraph's converted_call).
  assert ran_from == [__file__] * 2, ran_from
  np.testing.assert_array_equal(out["x"], [-2.0, -2.0])
  assert float(out["regime/replicas"]) == 4.0
