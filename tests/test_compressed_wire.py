"""regimes.Compressed's wire formats: packed integer level sums (bits), the two-pass
all-to-all and all-gather of b-bit levels (bits, wire='two_pass') and one all-gather of
(index, value) pairs (top_k), against float sums and the ledger."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import collectives, regimes
from replibench.engine.regimes import compressed, quantization, two_pass
from tests import helpers
from tests.regime_runs import TIGHT_CLIP, Run, assert_replicas_equal

SHAPES = [(3, 5), (7,), (1,), (2, 2, 3)]   # Tensors of one replica's gradient.
ENTRIES = sum(int(np.prod(s)) for s in SHAPES)


@pytest.mark.parametrize("bits", [1, 3, 8, 16])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 64])
def test_pack_unpack_round_trip_is_exact_for_sums_of_n(bits, n):
  width = quantization.field_bits(bits, n)
  top = 2**bits - 1
  assert n * top < 2**width <= 2**63
  per_word = quantization.fields_per_word(bits, n)
  count = 3 * per_word + 1                       # The last word is padded.
  rng = np.random.default_rng(bits * 100 + n)
  cases = {"worst": np.full(count, n * top), "zero": np.zeros(count),
           "random": rng.integers(0, n * top + 1, size=count)}
  for name, sums in cases.items():
    words = quantization.pack(tf.constant(sums, tf.int64), width)
    assert words.shape == [quantization.packed_words(count, bits, n)] == [4]
    assert np.all(words.numpy() >= 0), name      # The sign bit stays clear.
    np.testing.assert_array_equal(quantization.unpack(words, width, count), sums, err_msg=name)
  # What the all-reduce does: adding n replicas' packed words adds their fields.
  levels = [rng.integers(0, top + 1, size=count) for _ in range(n - 1)] + [np.full(count, top)]
  total = sum(quantization.pack(tf.constant(l, tf.int64), width) for l in levels)
  np.testing.assert_array_equal(quantization.unpack(total, width, count), sum(levels))


@pytest.mark.parametrize("bits", [1, 3, 8, 16])
def test_exchange_words_use_all_64_bits_and_round_trip(bits):
  per_word = quantization.EXCHANGE_BITS // bits
  count = 3 * per_word + 1
  rng = np.random.default_rng(bits)
  for levels in (np.full(count, 2**bits - 1), rng.integers(0, 2**bits, size=count)):
    words = quantization.pack(tf.constant(levels, tf.int64), bits, quantization.EXCHANGE_BITS)
    assert words.shape == [4]
    np.testing.assert_array_equal(
        quantization.unpack(words, bits, count, quantization.EXCHANGE_BITS), levels)
  if 64 % bits == 0:   # The top field holds the sign bit, which unpack masks off again.
    top = quantization.pack(tf.constant(np.full(per_word, 2**bits - 1), tf.int64), bits,
                            quantization.EXCHANGE_BITS)
    assert top.numpy().tolist() == [-1]


def _replica_gradients(n):
  """Per replica, one flat float32 [ENTRIES] vector of SHAPES' tensors, replica-dependent."""
  rng = np.random.default_rng(n)
  return [(rng.normal(size=ENTRIES) * (i + 1)).astype(np.float32) for i in range(n)]


def _exchanged(regime, n):
  """Every replica's (own C(x), summed) from regime.exchange, flat: two [n, ENTRIES]."""

  def fn(flat):
    values = [tf.reshape(p, s) for p, s in zip(
        tf.split(flat, [int(np.prod(s)) for s in SHAPES]), SHAPES)]
    own, summed = regime.exchange(values, tf.constant(3, tf.int64))
    assert [tuple(t.shape) for t in summed] == SHAPES
    flat_own = tf.concat([tf.reshape(t, [-1]) for t in own], 0)
    return tf.stack([flat_own, tf.concat([tf.reshape(t, [-1]) for t in summed], 0)])

  out = np.stack(helpers.replicated(n, fn, _replica_gradients(n)))   # [n, 2, ENTRIES]
  return out[:, 0], out[:, 1]


@pytest.mark.parametrize("bits", [2, 8])
@pytest.mark.parametrize("n", [2, 4])
def test_packed_all_reduce_equals_float_sum_of_dequantized(bits, n):
  own, summed = _exchanged(regimes.Compressed(bits=bits), n)
  for replica in summed[1:]:
    np.testing.assert_array_equal(replica, summed[0])
  # Each own value is on its tensor's grid, and the exact integer sum dequantizes
  # to the float sum of the replicas' dequantized values.
  np.testing.assert_allclose(summed[0], own.sum(axis=0), rtol=1e-5, atol=1e-5)
  assert not np.allclose(own[0], own[1])


def _two_pass(n, bits=8):
  """Per replica: (own C(x) [ENTRIES], two-pass sum [ENTRIES], server residual
  [block]) after one two_pass_sum of _replica_gradients(n)."""
  sizes = tuple(int(np.prod(s)) for s in SHAPES)
  layout = two_pass.BlockLayout(sizes, n, bits)
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"))
  with replicator.scope():
    residual = tf.Variable(tf.zeros([layout.block]), trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)

  def fn(flat):
    values = tf.split(flat, list(sizes))
    scales = collectives.all_reduce(tf.stack([tf.reduce_max(tf.abs(x)) for x in values]), "max")
    seed = tf.stack([tf.constant(7, tf.int64), tf.cast(collectives.replica_id(), tf.int64)])
    levels = [quantization.stochastic_levels(x, scales[i], bits, seed + i)
              for i, x in enumerate(values)]
    own = tf.concat([quantization.dequantize(l, scales[i], bits)
                     for i, l in enumerate(levels)], 0)
    return tf.stack([own, two_pass.two_pass_sum(levels, scales, layout, residual, seed + 99)])

  grads = _replica_gradients(n)
  inputs = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))
  out = replicator.strategy.experimental_local_results(
      tf.function(lambda x: replicator.run(fn, x))(inputs))
  residuals = [r.numpy() for r in replicator.strategy.experimental_local_results(residual)]
  return np.stack([o.numpy()[0] for o in out]), np.stack([o.numpy()[1] for o in out]), residuals


@pytest.mark.parametrize("n", [2, 3, 4])
def test_two_pass_sum_is_the_sum_up_to_what_the_owners_keep(n):
  own, summed, residuals = _two_pass(n)
  for replica in summed[1:]:
    np.testing.assert_array_equal(replica, summed[0])
  exact = own.sum(axis=0)
  # Each owner kept, as its server residual, exactly what its second rounding
  # dropped from its block: the blocks' residuals and the sum add up to the exact sum.
  kept = np.concatenate(residuals)[:ENTRIES]
  np.testing.assert_allclose(summed[0] + kept, exact, rtol=1e-5, atol=1e-5)
  assert np.any(kept != 0)
  # A second 8-bit rounding moves an entry by less than one step of its grid,
  # 2 max|sum| / 255 of its tensor's part of a block.
  assert np.all(np.abs(kept) <= 2 * np.abs(exact).max() / 255 + 1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_two_pass_8_bit_trains_close_to_sync_with_replicas_equal(n):
  run, sync = (Run(regimes.Compressed(bits=8, wire="two_pass"), n, TIGHT_CLIP),
               Run(regimes.Sync(), n, TIGHT_CLIP))
  metrics = run.run()
  sync.run()
  assert_replicas_equal(run)
  kernel, want = run.model.layers[-1].kernel.numpy(), sync.model.layers[-1].kernel.numpy()
  assert not np.array_equal(kernel, want)
  np.testing.assert_allclose(kernel, want, atol=0.02)
  assert all(np.isfinite(m["loss"]) for m in metrics)


@pytest.mark.parametrize("n", [2, 4])
def test_top_k_gather_sum_equals_dense_sum_of_sparsified(n):
  fraction = 0.2
  own, summed = _exchanged(regimes.Compressed(top_k=fraction), n)
  grads = _replica_gradients(n)
  kept = sum(compressed.kept_entries(int(np.prod(s)), fraction) for s in SHAPES)
  for replica, g in zip(own, grads):
    assert np.count_nonzero(replica) == kept
    np.testing.assert_array_equal(replica[replica != 0], g[replica != 0])
  for replica in summed:
    np.testing.assert_allclose(replica, own.sum(axis=0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make,collective,n", [
    (lambda: regimes.Compressed(bits=8), "all_reduce", 2),
    (lambda: regimes.Compressed(bits=8, wire="two_pass"), "all_to_all", 2),
    (lambda: regimes.Compressed(bits=8, wire="two_pass"), "all_to_all", 4),
    (lambda: regimes.Compressed(top_k=0.1), "all_gather", 2)],
    ids=["bits8", "bits8_two_pass_2", "bits8_two_pass_4", "top_k"])
def test_ledger_records_the_compressed_payload(make, collective, n):
  run = Run(make(), n, TIGHT_CLIP)
  run.train.trace()
  ledger = run.train._ledger  # pylint: disable=protected-access
  entries = [e for e in ledger.entries() if e.kind == "gradients"]
  sizes = [v.shape.num_elements() for v in run.model.trainable_variables]
  sync_payload = 4 * sum(sizes)
  # The gradient sum is one collective of the compressed format (bits: beside the
  # gathered per-tensor scales), and wire_bytes states its payload.
  assert collective in [e.collective for e in entries]
  assert sum(e.payload for e in entries) == run.regime.wire_bytes(sizes, n)
  # On the wire (ring factors; an all-to-all's (n-1)/n): at most 0.3x Sync's all-reduce.
  sync_wire = 2 * (n - 1) / n * sync_payload
  assert sum(e.wire_bytes(n) for e in entries) <= 0.3 * sync_wire
  if collective == "all_reduce":
    packed = [e for e in entries if e.collective == "all_reduce"]
    assert [e.payload for e in packed] == [8 * quantization.packed_words(sum(sizes), 8, n)]
  metrics = run.run(1)[0]
  assert metrics["regime/bytes_communicated"] == run.regime.wire_bytes(sizes, n)
  assert metrics["regime/compression_ratio"] == pytest.approx(
      sync_payload / run.regime.wire_bytes(sizes, n))


def test_wire_bytes_by_format():
  sizes = [700, 7, 1]
  assert regimes.Compressed(bits=32).wire_bytes(sizes, 4) == 4 * 708
  assert regimes.Compressed(top_k=1.0).wire_bytes(sizes, 4) == 4 * 708
  # bits=8: 8 + 0 headroom bits (7 fields a word) on 1 replica, + 1 on 2 (7), + 2 on 4 (6);
  # the scales' all-gather first gathers its shape (int32 [2]: 8 bytes), as top_k's does.
  eight = regimes.Compressed(bits=8)
  assert eight.wire_bytes(sizes, 1) == eight.wire_bytes(sizes, 2) == 8 * 102 + 4 * 3 + 8
  assert eight.wire_bytes(sizes, 4) == 8 * 118 + 4 * 3 + 8
  assert regimes.Compressed(top_k=0.1).wire_bytes(sizes, 4) == 8 * (70 + 1 + 1) + 8
  # two_pass at 4: 708 entries in blocks of 177, 23 words of 8 one-byte fields (184
  # entries); all-to-all of 4 x 23 words, all-gather of 23 words + 2 of 3 scales.
  two = regimes.Compressed(bits=8, wire="two_pass")
  assert two.wire_bytes(sizes, 4) == (4 * 3 + 8) + 8 * 4 * 23 + (8 * (23 + 2) + 8)
  assert two.wire_bytes(sizes, 1) == eight.wire_bytes(sizes, 1)   # One replica: no blocks.


def test_two_pass_error_feedback_conserves_every_optimizers_gradient():
  """Plain SGD at rate 1, two optimizers (as a GAN's): after t steps, -w + the workers'
  residuals + the owners' server residuals == t * the summed gradient, for each."""
  n, sizes, steps = 2, (30, 7), 3
  regime = regimes.Compressed(bits=8, wire="two_pass")
  replicator = engine.Replicator(engine.Local(num_replicas=n, device="cpu"), regime)
  with replicator.scope():
    weights = [keras.Variable(np.zeros(s, np.float32)) for s in sizes]
    optimizers = [keras.optimizers.SGD(1.0) for _ in sizes]
    for w, optimizer in zip(weights, optimizers):
      regime.build_optimizer(optimizer, [w])
  grads = [np.random.default_rng(i).normal(size=sum(sizes)).astype(np.float32) for i in range(n)]
  inputs = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))

  def apply(g):
    for part, w, optimizer in zip(tf.split(g, sizes), weights, optimizers):
      regime.apply_gradients(optimizer, [part], [w])
    return g

  step = tf.function(lambda g: replicator.run(apply, g))
  for _ in range(steps):
    step(inputs)
  local = replicator.strategy.experimental_local_results
  for w, optimizer, want in zip(weights, optimizers, np.split(sum(grads), [sizes[0]])):
    _, layout, server = regime._servers[id(optimizer)]  # pylint: disable=protected-access
    owned = np.concatenate([r.numpy() for r in local(server)])[:layout.entries]
    workers = regime._residual(w).numpy()  # pylint: disable=protected-access
    np.testing.assert_allclose(-w.numpy() + workers + owned, steps * want, rtol=1e-5, atol=1e-5)
