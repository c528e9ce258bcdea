"""regimes.GradientTracking: one replica is plain SGD; on non-IID objectives it reaches
the global optimum where plain gossip settles beside it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import regimes
from replibench.errors import UserError
from tests.regime_runs import LOOSE_CLIP, Run, assert_same_training


@pytest.mark.parametrize("n", [None, 1], ids=["no_strategy", "1"])
def test_one_replica_is_plain_sgd(n):
  reference = Run(regimes.Sync(), n, LOOSE_CLIP)
  reference.run()
  run = Run(regimes.GradientTracking(), n, LOOSE_CLIP)
  metrics = run.run()
  assert all(np.isfinite(m["loss"]) for m in metrics)
  assert_same_training(run, reference, exact=False)


def _quadratic_copies(regime, targets: np.ndarray, steps: int) -> np.ndarray:
  """Replica i minimises 0.5 |x - targets[i]|^2 by SGD (lr 0.2) under regime: [n, dim]."""
  n = len(targets)
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"), regime)
  with replicator.scope():
    x = keras.Variable(np.zeros(targets.shape[1], np.float32))
    optimizer = keras.optimizers.SGD(0.2)
    regime.build_optimizer(optimizer, [x])
  target = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(targets[ctx.replica_id_in_sync_group]))

  def step(c):
    with tf.GradientTape() as tape:
      loss = engine.average_loss(tf.reshape(0.5 * tf.reduce_sum(tf.square(x - c)), [1]), n)
    return regime.apply_gradients(optimizer, tape.gradient(loss, [x]), [x])

  train = tf.function(lambda c: replicator.run(step, c))
  for _ in range(steps):
    metrics = train(target)
  assert all(np.isfinite(replicator.strategy.experimental_local_results(v)[0])
             for v in metrics.values())
  return np.array([c.numpy() for c in replicator.strategy.experimental_local_results(x.value)])


@pytest.mark.parametrize("graph", [regimes.Ring, regimes.RandomMatching])
def test_tracking_reaches_the_global_optimum_where_gossip_stalls(graph):
  targets = np.array([[4.0, 0.0], [0.0, 4.0], [-4.0, 0.0], [0.0, -4.0]], np.float32) + 1.0
  optimum = targets.mean(axis=0)
  tracked = _quadratic_copies(regimes.GradientTracking(graph=graph()), targets, 150)
  gossip = _quadratic_copies(regimes.Gossip(graph=graph()), targets, 150)
  np.testing.assert_allclose(tracked, np.broadcast_to(optimum, tracked.shape), atol=1e-4)
  # Plain gossip with a constant step keeps each copy pulled towards its own target.
  assert np.abs(gossip - optimum).max() > 0.1


def test_tracking_sends_parameters_and_tracker_per_neighbour():
  run = Run(regimes.GradientTracking(graph=regimes.Ring()), 4)
  metrics = run.train()
  params = sum(v.numpy().size for v in run.model.trainable_variables)
  assert metrics["regime/bytes_communicated"] == 2 * 2 * 4 * params   # 2 neighbours
  assert metrics["regime/consensus_distance"] == 0   # Equal before the first mix.
  assert run.train()["regime/consensus_distance"] > 0


def test_tracking_is_not_a_mixing_rule_for_local_sgd():
  with pytest.raises(UserError, match="regimes.LocalSGD.average"):
    regimes.LocalSGD(sync_every=2, average=regimes.GradientTracking())
