"""regimes.Compressed's wire formats: packed integer level sums (bits) and one
all-gather of (index, value) pairs (top_k), against float sums and the ledger."""

import numpy as np
import pytest
import tensorflow as tf

from replibench.engine import regimes
from replibench.engine.regimes import compressed
from tests import helpers
from tests.regime_runs import TIGHT_CLIP, Run

SHAPES = [(3, 5), (7,), (1,), (2, 2, 3)]   # Tensors of one replica's gradient.
ENTRIES = sum(int(np.prod(s)) for s in SHAPES)


@pytest.mark.parametrize("bits", [1, 3, 8, 16])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 64])
def test_pack_unpack_round_trip_is_exact_for_sums_of_n(bits, n):
  width = compressed.field_bits(bits, n)
  top = 2**bits - 1
  assert n * top < 2**width <= 2**63
  per_word = compressed.fields_per_word(bits, n)
  count = 3 * per_word + 1                       # The last word is padded.
  rng = np.random.default_rng(bits * 100 + n)
  cases = {"worst": np.full(count, n * top), "zero": np.zeros(count),
           "random": rng.integers(0, n * top + 1, size=count)}
  for name, sums in cases.items():
    words = compressed.pack(tf.constant(sums, tf.int64), width)
    assert words.shape == [compressed.packed_words(count, bits, n)] == [4]
    assert np.all(words.numpy() >= 0), name      # The sign bit stays clear.
    np.testing.assert_array_equal(compressed.unpack(words, width, count), sums, err_msg=name)
  # What the all-reduce does: adding n replicas' packed words adds their fields.
  levels = [rng.integers(0, top + 1, size=count) for _ in range(n - 1)] + [np.full(count, top)]
  total = sum(compressed.pack(tf.constant(l, tf.int64), width) for l in levels)
  np.testing.assert_array_equal(compressed.unpack(total, width, count), sum(levels))


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


@pytest.mark.parametrize("make,collective", [
    (lambda: regimes.Compressed(bits=8), "all_reduce"),
    (lambda: regimes.Compressed(top_k=0.1), "all_gather")], ids=["bits8", "top_k"])
def test_ledger_records_the_compressed_payload(make, collective):
  n = 2
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
  assert sum(e.payload for e in entries) <= 0.3 * sync_payload
  if collective == "all_reduce":
    packed = [e for e in entries if e.collective == "all_reduce"]
    assert [e.payload for e in packed] == [8 * compressed.packed_words(sum(sizes), 8, n)]
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
