"""Training regimes: local SGD, compressed gradients and gossip against sync, and their parts."""

import contextlib
import gc
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.config import load_experiment
from replibench.config.plan import format_plan, make_plan
from replibench.engine import collectives, regimes
from replibench.engine.regimes import compressed, gossip, quantization
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from tests import helpers

from tests.regime_runs import (GLOBAL_BATCH, LOOSE_CLIP, STEPS, TIGHT_CLIP, Run,
                                assert_replicas_equal, assert_same_training, mlp)


def test_tight_clip_binds():
  model = mlp()
  x, y = helpers.random_images(GLOBAL_BATCH * STEPS)
  with tf.GradientTape() as tape:
    logits = model(x[:GLOBAL_BATCH], training=True)
    loss = tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(y[:GLOBAL_BATCH], logits, from_logits=True))
  norm = tf.linalg.global_norm(tape.gradient(loss, model.trainable_variables))
  assert TIGHT_CLIP < float(norm) < LOOSE_CLIP


# Lossless compression and averaging every step must reproduce sync, in every
# variable (parameters and momenta), with and without a strategy.
EQUIVALENT = [
    ("local_sgd_h1", lambda: regimes.LocalSGD(sync_every=1), LOOSE_CLIP, False),
    ("gossip_complete", lambda: regimes.Gossip(graph=regimes.Complete()), LOOSE_CLIP, False),
    ("compressed_32bit", lambda: regimes.Compressed(bits=32), TIGHT_CLIP, True),
    ("compressed_top_all", lambda: regimes.Compressed(top_k=1.0), TIGHT_CLIP, True),
]


@pytest.mark.parametrize("n", [None, 1, 2, 4], ids=["no_strategy", "1", "2", "4"])
def test_equivalent_settings_match_sync(n):
  references = {}
  for name, make, clip, exact in EQUIVALENT:
    if clip not in references:
      references[clip] = Run(regimes.Sync(), n, clip)
      references[clip].run()
    run = Run(make(), n, clip)
    metrics = run.run()
    assert all(np.isfinite(m["loss"]) for m in metrics), name
    assert all(k in metrics[0] for k in ("regime/bytes_communicated",)), (name, metrics[0])
    assert_replicas_equal(run)
    assert_same_training(run, references[clip], exact)


def test_local_sgd_replicas_agree_only_after_averaging():
  run = Run(regimes.LocalSGD(sync_every=3), 4)
  bytes_sent = []
  for step in range(1, 6):
    bytes_sent.append(run.train()["regime/bytes_communicated"])
    kernel = run.copies(run.model.layers[-1].kernel)
    if step % 3 == 0:
      assert_replicas_equal(run)
    else:
      assert not np.allclose(kernel[0], kernel[1]), f"replicas equal after step {step}"
  state = sum(v.numpy().size * 4 for v in run.model.trainable_variables) * 2  # + momenta
  assert bytes_sent == [0, 0, state, 0, 0]


def test_local_steps_take_embedding_gradients():
  """IndexedSlices gradients (embeddings) get the local step's scaling too."""
  finals = []
  for regime in (regimes.Sync(), regimes.LocalSGD(sync_every=1)):
    replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"), regime)
    with replicator.scope():
      table = keras.Variable(np.linspace(-1, 1, 18, dtype=np.float32).reshape(6, 3))
      optimizer = keras.optimizers.SGD(0.5, momentum=0.9)
      regime.build_optimizer(optimizer, [table])
    ids = replicator.strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([ctx.replica_id_in_sync_group, 4]))

    def step(rows, table=table, optimizer=optimizer, regime=regime):
      with tf.GradientTape() as tape:
        loss = engine.average_loss(tf.reduce_sum(tf.square(tf.gather(table, rows)), axis=1), 4)
      grads = tape.gradient(loss, [table])
      assert isinstance(grads[0], tf.IndexedSlices)
      regime.apply_gradients(optimizer, grads, [table])

    train = tf.function(lambda rows, r=replicator, s=step: r.run(s, rows))
    train(ids)
    train(ids)
    finals.append([c.numpy() for c in replicator.strategy.experimental_local_results(table.value)])
  np.testing.assert_allclose(finals[1], finals[0], rtol=1e-6, atol=1e-7)


def test_gossip_ring_mixes_keeping_the_mean():
  """One step from equal replicas: ring and complete mixing see the same local steps."""
  ring, complete = Run(regimes.Gossip(graph=regimes.Ring()), 4), Run(regimes.Gossip(graph=regimes.Complete()), 4)
  ring_metrics, complete_metrics = ring.train(), complete.train()
  assert ring_metrics["regime/consensus_distance"] > 0
  np.testing.assert_allclose(ring_metrics["regime/consensus_distance"],
                             complete_metrics["regime/consensus_distance"], rtol=1e-5)
  for v, mean in zip(ring.variables(), complete.variables()):
    copies = ring.copies(v)
    np.testing.assert_allclose(np.mean(copies, axis=0), mean.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=v.path)
  kernel = ring.copies(ring.model.layers[-1].kernel)
  assert not np.allclose(kernel[0], kernel[2])
  # After the ring step the replicas still differ, so the next step reports it.
  assert ring.train()["regime/consensus_distance"] > 0
  # Each replica sends parameters and momenta to its two neighbours.
  state = sum(v.numpy().size * 4 for v in ring.model.trainable_variables) * 2
  assert ring_metrics["regime/bytes_communicated"] == 2 * state


@pytest.mark.parametrize("n", [1, 2, 4])
def test_permute_and_ring_neighbours(n):
  values = [np.full((2, 3), i, np.float32) for i in range(n)]

  def ring_of(x):   # Itself and its ring neighbours.
    me = tf.reshape(collectives.replica_id(), [1])
    sources = me if n == 1 else tf.concat([me, gossip.ring_neighbours(me[0], n)], axis=0)
    return collectives.permute(x, sources)

  for i, got in enumerate(helpers.replicated(n, ring_of, values)):
    want = sorted({(i - 1) % n, i, (i + 1) % n}) if n > 2 else sorted({i, (i + 1) % n})
    assert sorted(got[:, 0, 0].astype(int)) == want
  last = helpers.replicated(n, lambda x: collectives.permute(x, tf.constant(n - 1)), values)
  for got in last:
    np.testing.assert_array_equal(got, values[n - 1])


@pytest.mark.parametrize("n", [2, 4, 5])
def test_random_matching_pairs_every_replica_alike(n):
  for step in range(5):
    seed = tf.constant([7, step], tf.int64)
    partner = [int(gossip.random_partner(tf.constant(i), n, seed)) for i in range(n)]
    assert all(partner[partner[i]] == i for i in range(n)), partner
    assert sum(partner[i] == i for i in range(n)) == n % 2, partner


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_stochastic_rounding_is_unbiased(bits):
  draws = 4000
  x = tf.constant(np.random.default_rng(bits).uniform(-1.5, 1.5, size=64), tf.float32)
  scale = tf.reduce_max(tf.abs(x))
  # One call on x repeated: each entry is rounded independently.
  rounded = quantization.stochastic_quantize(tf.tile(x[None], [draws, 1]), scale, bits,
                                               tf.constant([3, 4], tf.int64)).numpy()
  step = 2 * float(scale) / (2**bits - 1)
  grid = (rounded + float(scale)) / step
  np.testing.assert_allclose(grid, np.round(grid), atol=1e-3)        # On the grid,
  assert np.all(np.abs(rounded - x.numpy()) <= step + 1e-6)         # a neighbour of x,
  # and right on average: the standard error of one entry's mean is <= step / 2 / sqrt(draws).
  error = np.abs(rounded.mean(axis=0) - x.numpy())
  assert np.all(error <= 5 * step / 2 / np.sqrt(draws)), error.max() / step


def test_top_k_keeps_exactly_k_largest():
  x = tf.constant(np.random.default_rng(0).normal(size=(6, 7)), tf.float32)
  for fraction in (0.05, 0.3, 1.0):
    k = compressed.kept_entries(42, fraction)
    kept = compressed.top_k_sparsify(x, k).numpy()
    assert np.count_nonzero(kept) == k
    np.testing.assert_array_equal(kept[kept != 0], x.numpy()[kept != 0])
    assert np.abs(x.numpy()[kept == 0]).max(initial=0) <= np.abs(kept[kept != 0]).min()


def test_error_feedback_carries_what_compression_drops():
  """Plain SGD at rate 1: -(total update) + residuals == total gradient."""
  n, size, steps = 2, 40, 3
  regime = regimes.Compressed(top_k=0.25)
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"), regime)
  with replicator.scope():
    w = keras.Variable(np.zeros(size, np.float32))
    optimizer = keras.optimizers.SGD(1.0)
    regime.build_optimizer(optimizer, [w])
  grads = [np.random.default_rng(i).normal(size=size).astype(np.float32) for i in range(n)]
  inputs = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))
  step = tf.function(lambda g: replicator.run(
      lambda x: regime.apply_gradients(optimizer, [x], [w]), g))
  residual = regime._residual(w)  # pylint: disable=protected-access
  k = compressed.kept_entries(size, 0.25)
  for t in range(1, steps + 1):
    before = w.numpy()
    step(inputs)
    # Each replica sent k entries: the rest of its gradient (+ residual) stays behind.
    for r in replicator.strategy.experimental_local_results(residual):
      assert np.count_nonzero(r.numpy()) == size - k
    assert 0 < np.count_nonzero(w.numpy() - before) <= n * k
    np.testing.assert_allclose(-w.numpy() + residual.numpy(), t * sum(grads), rtol=1e-5,
                               atol=1e-5)


def test_compressed_8_bit_trains_close_to_sync():
  run, sync = Run(regimes.Compressed(bits=8), 2, TIGHT_CLIP), Run(regimes.Sync(), 2, TIGHT_CLIP)
  metrics = run.run()
  sync.run()
  assert_replicas_equal(run)
  kernel = run.model.layers[-1].kernel.numpy()
  want = sync.model.layers[-1].kernel.numpy()
  assert not np.array_equal(kernel, want)
  np.testing.assert_allclose(kernel, want, atol=0.02)
  # 8-bit levels summed over 2 replicas need 9-bit fields, 7 to an int64 word:
  # 8/7 bytes an entry (+ the scales) against 4, a ratio just under 3.5.
  assert metrics[0]["regime/compression_ratio"] == pytest.approx(3.48, rel=0.01)


@pytest.mark.parametrize("make", [
    lambda: regimes.LocalSGD(sync_every=0), lambda: regimes.LocalSGD(sync_every=2.0),
    lambda: regimes.Compressed(), lambda: regimes.Compressed(bits=8, top_k=0.1),
    lambda: regimes.Compressed(bits=17), lambda: regimes.Compressed(top_k=0.0),
    lambda: regimes.Compressed(top_k=1.5), lambda: regimes.Compressed(bits=8, wire="ring"),
    lambda: regimes.Compressed(top_k=0.1, wire="two_pass"),
    lambda: regimes.Gossip(compression=regimes.Compressed(bits=8, wire="two_pass")),
    lambda: regimes.Gossip(graph="star"), lambda: regimes.RandomMatching(seed=1.5)])
def test_bad_settings_are_user_errors(make):
  with pytest.raises(UserError, match="regimes\\."):
    make()


CONFIG = "configs/resnet/fashion_mnist.gin"
HARNESS_CASES = [
    ("LocalSGD", ["regimes.LocalSGD.sync_every = 2"], ["regime/bytes_communicated"]),
    # The two-pass wire (the packed sum is the unit tests' and the configs' default).
    ("Compressed", ["regimes.Compressed.bits = 8", "regimes.Compressed.wire = 'two_pass'"],
     ["regime/bytes_communicated", "regime/compression_ratio"]),
    ("Gossip", ["regimes.Gossip.graph = @regimes.Ring()"],
     ["regime/bytes_communicated", "regime/consensus_distance"]),
    # SwarmSGD: local steps, a random pair every 2 steps, 8-bit copies.
    ("LocalSGD", ["regimes.LocalSGD.sync_every = 2", "regimes.LocalSGD.average = @regimes.Gossip()",
                  "regimes.Gossip.graph = @regimes.RandomMatching()",
                  "regimes.Gossip.compression = @regimes.Compressed()",
                  "regimes.Compressed.bits = 8"],
     ["regime/bytes_communicated", "regime/consensus_distance"]),
    # Decentralised data: each replica its own Dirichlet(0.1) shard.
    ("GradientTracking", ["FashionMNIST.partition = 'dirichlet'",
                          "regimes.GradientTracking.graph = @regimes.Ring()"],
     ["regime/bytes_communicated", "regime/consensus_distance"]),
]
CASE_IDS = ["local_sgd", "compressed", "gossip", "swarm_sgd", "gradient_tracking"]


def _bindings(regime, extra):
  return [*helpers.TINY[CONFIG], f"Experiment.regime = @regimes.{regime}()", *extra]


@pytest.mark.parametrize("regime,bindings,tags", HARNESS_CASES, ids=CASE_IDS)
def test_plan_shows_the_regime(regime, bindings, tags):
  del tags
  files = [os.path.join(helpers.REPO, f) for f in (CONFIG, "configs/topology/local2.gin")]
  plan = make_plan(load_experiment(files, _bindings(regime, bindings)))
  assert plan["regime"].startswith(getattr(regimes, regime).name)
  assert 0 < plan["bytes_communicated_per_step"] <= 2 * plan["allreduce_bytes_per_step"]
  assert "bytes_communicated_per_step" in format_plan(plan)


# The harness runs' model: one residual block, not the tiny config's three. Most of a
# two-step run is tracing the replicated step (each layer's norm and its all-reduce,
# per replica); what these tests read, the regime's metrics in the harness's outputs,
# does not depend on the depth.
ONE_BLOCK = ["small_resnet.widths = (4,)", "small_resnet.blocks_per_stage = (1,)"]


@pytest.fixture(scope="module")
def harness_runs(tmp_path_factory):
  """{regime: workdir} after two training steps of each regime through the harness.

  In this process (run_experiment, as `replibench run` calls it), one after another:
  five `replibench run` processes each paid TensorFlow's import and start-up (~5 s)
  for what these tests check, the harness's outputs (test_cli runs the CLI itself).
  """
  workdirs = {}
  for case in CASE_IDS:
    regime, bindings, _ = HARNESS_CASES[CASE_IDS.index(case)]
    workdir = tmp_path_factory.mktemp(case)
    files = [os.path.join(helpers.REPO, f) for f in (CONFIG, "configs/topology/local2.gin")]
    run_experiment(load_experiment(files, [*_bindings(regime, bindings), *ONE_BLOCK]),
                   str(workdir), max_steps=2)   # load_experiment starts from a cleared gin config.
    gc.collect()   # Each run's tf.data iterators, before the next run (see conftest).
    workdirs[case] = workdir
  return workdirs


@pytest.mark.parametrize("case,tags", [(c, t) for c, (_, _, t) in zip(CASE_IDS, HARNESS_CASES)],
                         ids=CASE_IDS)
def test_regime_runs_through_the_harness(harness_runs, case, tags):
  workdir = harness_runs[case]
  result = helpers.result(workdir)
  assert result.status == "budget_exhausted" and result.final_step == 2
  events = helpers.event_tags(workdir)
  for tag in tags:
    assert f"train/{tag}" in events, sorted(events)
