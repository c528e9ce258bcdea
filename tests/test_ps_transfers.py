"""engine/measure/transfers.py: the tensors an asynchronous worker update pulls from and pushes
to the parameter servers, and the account of their bytes on the wire.

No cluster: this process's variables stand in for the ps's (job 'localhost'), so
every op that uses one is placed 'on the ps' and the rest 'on the worker'."""

import pytest
import tensorflow as tf

from replibench.engine.measure import transfers
from replibench.harness import wire

LOCAL = "localhost"   # The job this process's variables live on.


def _update_graph():
  """A worker update with every kind of transfer: w [3, 4] read twice (the model and an
  L2 term), b [4] once, a moving statistic s [4] read and written back, gradients
  pushed into training kernels (w's through an op colocated with it), one
  worker-computed learning rate feeding two kernels, a constant that never crosses."""
  w = tf.Variable(tf.ones([3, 4]))
  b = tf.Variable(tf.zeros([4]))
  s = tf.Variable(tf.zeros([4]), trainable=False)

  @tf.function
  def update(x):
    with tf.GradientTape() as tape:
      y = tf.matmul(x, w) + b
      loss = tf.reduce_sum(y) + 0.0 * tf.nn.l2_loss(w)   # A second read of w.
    grad_w, grad_b = tape.gradient(loss, [w, b])
    moved = s.assign(0.9 * s + 0.1 * tf.reduce_mean(y, axis=0), read_value=False)
    lr = tf.multiply(0.1, tf.reduce_mean(x), name="lr")   # Pushed once, used twice.
    with tf.compat.v1.colocate_with(w):
      halved = tf.multiply(grad_w, 0.5, name="halved")   # On w's ps: grad_w crosses.
    applied = [tf.raw_ops.ResourceApplyGradientDescent(var=w.handle, alpha=lr, delta=halved),
               tf.raw_ops.ResourceApplyGradientDescent(var=b.handle, alpha=lr, delta=grad_b),
               moved]
    with tf.control_dependencies(applied):
      return tf.identity(loss)

  return update.get_concrete_function(tf.TensorSpec([2, 3], tf.float32)).graph


def test_ops_run_where_their_resources_are_or_what_they_are_colocated_with():
  placed = transfers.placement(_update_graph(), job=LOCAL)
  kernels = [name for name in placed if name.startswith("ResourceApplyGradientDescent")]
  assert len(kernels) == 2 and all(placed[name] for name in kernels)
  assert placed["halved"] == placed[kernels[0]]
  assert placed["lr"] == ""   # The worker.


def test_an_update_pulls_each_read_and_pushes_each_worker_value_once():
  graph = _update_graph()
  found = transfers.find_transfers(graph, job=LOCAL)
  # Pulls: w twice (48 B each), b and s (16 B each).
  assert sorted(size for _, size in found.pulls) == [16, 16, 48, 48]
  assert [size for _, size in found.repeated_reads] == [48]
  # Pushes: grad_w (48 B), grad_b and s's new value (16 B each), the learning rate (4 B).
  assert sorted(size for _, size in found.pushes) == [4, 16, 16, 48]
  assert (found.pull_bytes, found.push_bytes) == (128, 84)
  pushed = {graph.get_tensor_by_name(name).op.name for name, _ in found.pushes}
  assert "lr" in pushed and "halved" not in pushed


def test_variables_of_another_job_are_not_the_parameter_servers():
  found = transfers.find_transfers(_update_graph(), job="ps")
  assert found.pulls == [] and found.pushes == [] and found.repeated_reads == []


def test_the_account_prices_payload_transfers_and_the_closure_per_worker():
  found = transfers.find_transfers(_update_graph(), job=LOCAL)
  account = transfers.account(found, {"per_transfer": 500.0, "per_closure": 1000.0})
  assert account["collectives_per_step"] == 0.0 and account["by_kind"] == {}
  assert account["parameter_server"] == {"pulls": {"count": 4, "bytes": 128},
                                         "pushes": {"count": 4, "bytes": 84},
                                         "repeated_reads": {"count": 1, "bytes": 48}}
  assert account["wire_bytes_per_replica_per_step"] == 212
  assert account["wire_messages_by_collective"] == {"ps_pull": 4, "ps_push": 4, "closure": 1}
  # One update per worker and harness step: W workers' updates.
  assert wire.expected_per_step(account, 3) == 3 * (212 + 8 * 500 + 1000)
  # Without a measured wire (not a launched cluster): payload only.
  assert wire.expected_per_step(transfers.account(found), 2) == 2 * 212


class _FakeCoordinator:
  """Runs each scheduled closure here and 'sends' what the test's link would: 1000 B
  a closure and 500 B per variable read beyond its payload."""

  def __init__(self):
    self.sent = 0

  def schedule(self, fn):
    graph = fn.get_concrete_function().graph
    reads = [op.outputs[0] for op in graph.get_operations() if op.type == "ReadVariableOp"]
    self.sent += 1000 + sum(500 + t.shape.num_elements() * t.dtype.size for t in reads)
    fn()

  def join(self):
    pass


def test_overheads_are_what_a_read_costs_beyond_its_payload():
  graph = _update_graph()
  coordinator = _FakeCoordinator()
  outputs = tf.TensorSpec([], tf.float32)
  found = transfers.measure_overheads(coordinator, graph, outputs, lambda: coordinator.sent,
                                     repeats=3, job=LOCAL)
  # The replay reads w, b and s once each (w's second read is not replayed).
  assert found == {"per_closure": pytest.approx(1000.0), "per_transfer": pytest.approx(500.0)}
