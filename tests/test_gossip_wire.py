"""Gossip's neighbour-only exchange: pairwise all-reduces (collectives.pair_all_reduce)
give the ring's and the matchings' mixing exactly, and send one copy per neighbour."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import collectives, regimes
from replibench.engine.measure import communication
from replibench.engine.regimes import gossip
from tests import helpers


def _values(n, size=5):
  """Replica i's vector: distinct powers of ten, so every sum names its terms."""
  return [np.full(size, 10.0 ** i, np.float32) for i in range(n)]


def test_pair_all_reduce_sums_a_fixed_matching():
  values = _values(4)
  matching = [1, 0, 3, 2]
  (got,) = helpers.replicated_calls(4, lambda x: collectives.pair_all_reduce(
      x, tf.gather(matching, collectives.replica_id())), values)
  for i, partner in enumerate(matching):
    np.testing.assert_array_equal(got[i], values[i] + values[partner])


@pytest.mark.parametrize("n", [3, 4])
def test_pair_all_reduce_sums_a_random_matching_every_step(n):
  """Partners drawn at run time, new each call; with 3 replicas one sits out and
  gets its own x back."""
  step = tf.Variable(0, dtype=tf.int64)

  def exchange(x):
    seed = tf.stack([tf.constant(5, tf.int64), step.read_value()])
    return collectives.pair_all_reduce(
        x, gossip.random_partner(collectives.replica_id(), n, seed))

  values = _values(n)
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"))
  inputs = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(values[ctx.replica_id_in_sync_group]))
  run = tf.function(lambda x: replicator.run(exchange, x))
  matchings = set()
  for s in range(4):
    step.assign(s)
    got = replicator.strategy.experimental_local_results(run(inputs))
    seed = tf.constant([5, s], tf.int64)
    partner = [int(gossip.random_partner(tf.constant(i), n, seed)) for i in range(n)]
    matchings.add(tuple(partner))
    for i in range(n):
      want = values[i] if partner[i] == i else values[i] + values[partner[i]]
      np.testing.assert_array_equal(got[i].numpy(), want, err_msg=f"step {s} {partner}")
  assert len(matchings) > 1   # The pairs changed between calls of one traced function.


def _ring_matrix(n):
  """The ring's mixing matrix: each replica averages itself and its neighbours."""
  w = np.zeros((n, n))
  for i in range(n):
    sources = {(i - 1) % n, i, (i + 1) % n}
    for j in sources:
      w[i, j] = 1.0 / len(sources)
  return w


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_mixing_is_the_mixing_matrix(n):
  states = np.random.default_rng(n).normal(size=(n, 7)).astype(np.float32)

  def mix(x):
    return regimes.Ring().mix(x, collectives.replica_id(), n, tf.constant(0, tf.int64))

  calls = helpers.replicated_calls(n, mix, list(states), calls=2)
  want = _ring_matrix(n) @ states.astype(np.float64)
  for got in calls:   # The second call reuses the traced instance keys.
    np.testing.assert_allclose(np.stack(got), want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.mean(calls[0], axis=0), np.mean(states, axis=0), atol=1e-6)


@pytest.mark.parametrize("graph,n", [(regimes.Ring(), 4), (regimes.Ring(), 3),
                                     (regimes.RandomMatching(seed=3), 4)],
                         ids=["ring4", "ring3", "matching4"])
def test_gossip_step_sends_a_state_copy_per_neighbour(graph, n):
  """The ledger of a gossip step: group-of-2 all-reduces, one state copy per
  neighbour (not one per replica), agreeing with regime/bytes_communicated."""
  regime = regimes.Gossip(graph=graph, report_consensus=False)
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"), regime)
  with replicator.scope():
    kernel = keras.Variable(np.ones((3, 2), np.float32))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    regime.build_optimizer(optimizer, [kernel])

  def step():
    grad = tf.ones((3, 2)) * tf.cast(collectives.replica_id() + 1, tf.float32)
    return regime.apply_gradients(optimizer, [grad], [kernel])

  run = tf.function(lambda: replicator.run(step))
  with communication.Ledger() as ledger:
    outputs = run()
  state_bytes = 2 * 6 * 4   # The kernel and its momentum, float32.
  sent = [e for e in ledger.entries() if e.kind == "parameters"]
  assert [(e.collective, e.group_size, e.payload) for e in sent] == (
      [("all_reduce", 2, state_bytes)] * round(graph.neighbours(n)))
  wire = sum(e.wire_bytes(n) for e in sent)
  assert wire == graph.neighbours(n) * state_bytes   # An all-gather's: (n - 1) copies.
  for metric in replicator.strategy.experimental_local_results(
      outputs["regime/bytes_communicated"]):
    assert float(metric) == wire
