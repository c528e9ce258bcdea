"""Each collective against NumPy, for several shapes, dtypes and replica counts."""

import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import collectives
from tests import helpers


def _per_replica_inputs(n, shape, dtype):
  rng = np.random.default_rng(n)
  if np.issubdtype(dtype, np.integer):
    return [rng.integers(-50, 50, size=shape).astype(dtype) for _ in range(n)]
  return [rng.normal(size=shape).astype(dtype) for _ in range(n)]


CASES = [(n, shape, dtype) for n in (1, 2, 4) for shape in [(), (3,), (2, 5)]
         for dtype in (np.float32, np.int32)]
NUMPY_REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


# tf.distribute defines no mean of integers.
REDUCE_CASES = [(op, *case) for op in sorted(NUMPY_REDUCE) for case in CASES
                if not (op == "mean" and case[2] == np.int32)]


@pytest.mark.parametrize("op,n,shape,dtype", REDUCE_CASES)
def test_all_reduce(op, n, shape, dtype):
  values = _per_replica_inputs(n, shape, dtype)
  want = NUMPY_REDUCE[op](np.stack(values), axis=0)
  for got in helpers.replicated(n, lambda x: engine.all_reduce(x, op), values):
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == dtype


@pytest.mark.parametrize("n,shape,dtype", [c for c in CASES if c[1] != ()])
def test_all_gather(n, shape, dtype):
  values = _per_replica_inputs(n, shape, dtype)
  for axis in range(len(shape)):
    want = np.concatenate(values, axis=axis)
    for got in helpers.replicated(n, lambda x, a=axis: engine.all_gather(x, axis=a), values):
      np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_all_to_all_sends_each_row_to_its_owner(n, dtype):
  values = _per_replica_inputs(n, (n, 3), dtype)   # Replica i's row j goes to replica j.
  got = helpers.replicated(n, collectives.all_to_all, values)
  for j in range(n):
    np.testing.assert_array_equal(got[j], np.stack([values[i][j] for i in range(n)]))


def test_all_to_all_needs_a_row_per_replica():
  with pytest.raises(ValueError, match="one row per replica"):
    helpers.replicated(2, collectives.all_to_all, [np.zeros((3, 2), np.float32)] * 2)


@pytest.mark.parametrize("n,shape,dtype", CASES)
def test_broadcast(n, shape, dtype):
  values = _per_replica_inputs(n, shape, dtype)
  source = n - 1
  for got in helpers.replicated(n, lambda x: engine.broadcast(x, source_replica=source), values):
    np.testing.assert_array_equal(got, values[source])


@pytest.mark.parametrize("n", [1, 2, 4])
def test_replica_id_and_count(n):
  got = helpers.replicated(n, lambda x: tf.stack([engine.replica_id(), engine.num_replicas() + 0 * x]),
             [np.int32(0)] * n)
  assert [g.tolist() for g in got] == [[i, n] for i in range(n)]


def test_reduce_to_host_values():
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))
  out = tf.function(lambda: replicator.run(
      lambda: tf.fill([2], tf.cast(engine.replica_id(), tf.float32) + 1.0)))()
  assert replicator.reduce(out, "sum").numpy().tolist() == [3.0, 3.0]
  assert replicator.reduce(out, "mean").numpy().tolist() == [1.5, 1.5]
  assert replicator.reduce(out, "concat").numpy().tolist() == [1.0, 1.0, 2.0, 2.0]
