"""Each collective against NumPy, for several shapes, dtypes and replica counts."""

import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.engine import collectives, fusion
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


def _nest(replica: int, dtype):
  rng = np.random.default_rng(replica)
  draw = lambda shape: (rng.normal(size=shape) * 9).astype(dtype)  # noqa: E731
  return {"w": draw((3, 4)), "b": draw(()), "steps": draw((5,)),
          "layers": [draw((2, 2, 3)) for _ in range(3)]}


def _add_n_sums(addends: list) -> list:
  """Every float32 result TensorFlow's CPU AddN can give for these addends.

  The kernel (core/kernels/aggregate_ops.h) adds its inputs left to right, but first
  swaps input 0 with the first input whose buffer it can reuse for the output, and
  which one it can depends on when the other holders of each buffer let go: with
  three or more replicas a sum's association, and so its last bit, varies from run
  to run (the flake this test once had under a loaded suite). One result per
  possible swap; addends: the replicas' values, in replica order.
  """
  sums = []
  for k in range(len(addends)):
    order = list(range(len(addends)))
    order[0], order[k] = k, 0
    total = addends[order[0]]
    for i in order[1:]:
      total = total + addends[i]       # float32 + float32, one rounding, like Eigen's.
    sums.append(total)
  return sums


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fused_all_reduce_sums_each_element_as_the_strategy_does(n):
  """Tensor fusion (one buffer per dtype) reduces every element as the strategy's own
  per-tensor all-reduce does: one AddN over the same replicas, so each element is
  one of the sums that kernel can give (bit for bit), one order for the whole fused
  buffer, and every replica receives the same bits."""
  nests = [_nest(r, np.float32) for r in range(n)]
  stacked = [tf.constant(np.stack(leaves)) for leaves in zip(*map(tf.nest.flatten, nests))]
  replicator = engine.Replicator(engine.Local(num_replicas=n))

  def fused_and_per_tensor():
    i = engine.replica_id()
    nest = tf.nest.pack_sequence_as(nests[0], [tf.gather(t, i) for t in stacked])
    per_tensor = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.nest.map_structure(tf.identity, nest))
    return engine.all_reduce(nest, "sum"), per_tensor

  def step():
    return replicator.run(fused_and_per_tensor)

  fused, per_tensor = tf.function(step)()
  local = replicator.strategy.experimental_local_results

  def on_replica(nest, r):
    return [local(t)[r].numpy() for t in tf.nest.flatten(nest)]

  candidates = [_add_n_sums(list(addends)) for addends in zip(*map(tf.nest.flatten, nests))]
  for got in (fused, per_tensor):
    for r in range(1, n):
      for a, b in zip(on_replica(got, 0), on_replica(got, r)):
        np.testing.assert_array_equal(a, b, err_msg=f"replica {r} received other bits")
  fused_orders = [k for k in range(n) if all(
      np.array_equal(leaf, sums[k]) for leaf, sums in zip(on_replica(fused, 0), candidates))]
  assert fused_orders, "the fused sum is none of the sums AddN can give"
  for leaf, sums in zip(on_replica(per_tensor, 0), candidates):
    assert any(np.array_equal(leaf, s) for s in sums), "the strategy's sum, unexplained"
  want = tf.nest.map_structure(lambda *xs: np.sum(np.stack(xs), axis=0), *nests)
  for g, w in zip(on_replica(fused, 0), tf.nest.flatten(want)):
    np.testing.assert_allclose(g, w, rtol=1e-6)


def test_fusion_reduces_a_nest_in_one_transfer():
  """Under a single-process MirroredStrategy, ten gradients are one reduction, not ten."""
  replicator = engine.Replicator(engine.Local(num_replicas=4))
  assert fusion.fuses_in_engine(replicator.strategy)
  assert not fusion.fuses_in_engine(tf.distribute.get_strategy())

  def reduce_ten():
    return engine.all_reduce([tf.ones([i + 1]) for i in range(10)])

  def step():
    return replicator.run(reduce_ten)

  graph = tf.function(step).get_concrete_function().graph
  ops = [op.type for op in graph.get_operations()]
  ops += [node.op for f in graph.as_graph_def().library.function for node in f.node_def]
  # ReductionToOneDevice adds each reduced tensor's replica copies with one AddN.
  assert ops.count("AddN") == 1


def test_a_gradient_through_an_all_reduce_is_a_second_collective_in_the_account():
  """The gradient of an all-reduce is an all-reduce of the same size (cross-replica
  batch norm's moments send twice a step): the account records it when the gradient
  is traced, and nothing when no gradient flows through."""
  from replibench.engine.measure import communication  # pylint: disable=import-outside-toplevel
  replicator = engine.Replicator(engine.Local(num_replicas=2))

  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      moments = engine.all_reduce(tf.stack([x, x * x]), "sum", kind="batch_norm")
      loss = tf.reduce_sum(moments * moments)
    engine.all_reduce(tf.ones([5]), "sum", kind="outputs")   # No gradient flows here.
    return tape.gradient(loss, x)

  x = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.fill([3], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)))
  with communication.Ledger() as ledger:
    grads = tf.function(lambda v: replicator.run(step, v))(x)
  entries = [(e.kind, e.payload) for e in ledger.entries()]
  assert entries == [("batch_norm", 24), ("outputs", 20), ("batch_norm", 24)]
  for replica, value in enumerate(replicator.strategy.experimental_local_results(grads), 1):
    # The gradient is unchanged: loss = sum(S^2 + Q^2), S = x1 + x2, Q = x1^2 + x2^2, and
    # the all-reduce's gradient sums the replicas' upstream: 2 (2S + 4 Q x_r).
    np.testing.assert_allclose(value.numpy(), [2 * (2 * 3 + 4 * 5 * replica)] * 3)


def test_the_account_counts_each_collective_op_once_per_call():
  """summarize's ops per step: an op in the step's body runs in every call (once per
  steps_per_call steps), one under a condition taken every 4 steps in a call of 2
  steps in every other call, the outputs' reduction once a call."""
  from replibench.engine.measure import communication  # pylint: disable=import-outside-toplevel
  entries = [communication.Entry("gradients", 400, "all_reduce", None, 1.0),
             communication.Entry("parameters", 400, "all_reduce", None, 0.25),
             communication.Entry("outputs", 8, "all_reduce", None, 1.0)]
  account = communication.summarize(entries, steps_per_call=2, num_replicas=2)
  assert account["wire_ops_per_step_by_collective"] == {"all_reduce": (1 + 0.5 + 1) / 2}
  assert account["wire_messages_by_collective"] == {"all_reduce": 2 + 0.5 + 1}
