"""Gradient tracking: decentralised SGD that follows the network-average gradient.

Plain gossip on non-IID shards stalls: each replica's step follows its own
shard's gradient, and mixing only pulls the copies together, so they settle
where the local gradients balance, not at a minimum of the global loss.
Gradient tracking (the NEXT / DIGing family: Di Lorenzo & Scutari 2016,
Nedic et al. 2017; used for decentralised training over networks by
Scardapane & Di Lorenzo) gives every replica i a tracker y_i of the average
gradient, itself mixed by consensus:

  y_i(k)   = sum_j W_ij y_j(k-1) + g_i(k) - g_i(k-1)      y(-1) = g(-1) = 0
  x_i(k+1) = sum_j W_ij x_j(k)   - lr * y_i(k)

with g_i(k) replica i's gradient of its own batch at x_i(k). W is the gossip
graph's doubly stochastic mixing matrix, so the trackers' mean is exactly the
mean of the current gradients at every step, and y_i -> that mean as the
copies agree. On one replica (W = [1]) y(k) = g(k): plain SGD.

Per step each replica exchanges its parameters and its tracker in one flat
vector: two copies of the model per neighbour (gossip sends parameters and
optimizer slots). The optimizer takes y as the gradient of the mixed
parameters; its slots (momentum) stay local and are not mixed: the analysis is
for plain SGD, and with momentum this is a heuristic. The trackers and previous
gradients are per-replica state that checkpoints do not hold (a resumed run
restarts them from zero, as Compressed's residuals).
"""

import gin
import tensorflow as tf

from replibench.engine import aggregation, collectives
from replibench.engine.regimes import replica_state
from replibench.engine.regimes.base import GRADIENTS
from replibench.engine.regimes.gossip import Gossip, Graph, Ring, consensus_distance
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError
from replibench.inputs import shown


@gin.configurable(module="regimes")
class GradientTracking(Gossip):
  """Gossip of parameters and of a tracker of the average gradient (DIGing / NEXT).

  graph: a Graph (gin: `regimes.GradientTracking.graph = @regimes.Ring()`, the default).
  """

  name = "gradient_tracking"
  exchanges = GRADIENTS   # Sizes of the parameters: wire_bytes sends two copies of them.

  def __init__(self, graph: Graph | None = None, report_consensus: bool = True):
    graph = Ring() if graph is None else graph
    if not isinstance(graph, Graph):
      raise UserError(
          f"regimes.GradientTracking.graph must be a gossip graph, e.g. @regimes.Ring() or "
          f"@regimes.RandomMatching(); got {shown(graph)}.")
    super().__init__(graph=graph, report_consensus=report_consensus)
    self._state = {}   # id(variable) -> (variable, tracker, previous gradient)

  def build_optimizer(self, optimizer, variables):
    super().build_optimizer(optimizer, variables)
    for v in variables:
      zeros = lambda v=v: tf.zeros(v.shape, v.dtype)
      # Mirrored variables whose components drift apart, like the parameters.
      self._state[id(v)] = (v, tf.Variable(zeros(), trainable=False, name="gradient_tracker"),
                            tf.Variable(zeros(), trainable=False, name="previous_gradient"))

  def _tracking(self, variable) -> tuple:
    found = self._state.get(id(variable))
    if found is None or found[0] is not variable:
      raise RuntimeError(
          f"No gradient tracker for {getattr(variable, 'path', variable)}: build the "
          "optimizer with regime.build_optimizer under Replicator.scope() first.")
    return found[1:]

  def apply_gradients(self, optimizer, grads, variables):
    n = collectives.num_replicas()
    # average_loss scales a replica's gradient by 1/n: n times that is its own batch mean.
    pairs = [(tf.convert_to_tensor(g) * float(n), v)
             for g, v in zip(grads, variables) if g is not None]
    params = [v for _, v in pairs]
    trackers, previous = zip(*(self._tracking(v) for v in params))
    sizes = replica_state.state_sizes(params)
    flat = replica_state.read_flat(params + list(trackers))
    metrics = StepMetrics({"regime/bytes_communicated": self.wire_bytes(sizes, n)})
    if self.report_consensus:
      metrics += consensus_distance(replica_state.squared_consensus_distance(flat[:sum(sizes)]))
    mixed = self.graph.mix(flat, collectives.replica_id(), n, optimizer.iterations)
    mixed_params, mixed_trackers = tf.split(mixed, 2)
    gradient = tf.concat([tf.reshape(g, [-1]) for g, _ in pairs], axis=0)
    tracker = mixed_trackers + gradient - replica_state.read_flat(list(previous))
    replica_state.assign_flat(params + list(trackers) + list(previous),
                              tf.concat([mixed_params, tracker, gradient], axis=0))
    step = [tf.reshape(t, v.shape) for t, v in zip(tf.split(tracker, sizes), params)]
    aggregation.apply_reduced(optimizer, step, params)   # Each replica its own copy.
    return metrics

  def wire_bytes(self, sizes, num_replicas):
    """Parameters and tracker, float32, one copy of each per neighbour."""
    return self.graph.payloads(num_replicas) * 8.0 * sum(sizes)

  def check_every(self, steps, binding):
    raise UserError(f"{binding}: regimes.GradientTracking is a regime of its own; it does "
                    f"not mix for another regime.")

  def setting(self):
    return f"{self.name}(graph={type(self.graph).__name__})"

  def hparams(self):
    return {"regime": self.name, "graph": type(self.graph).__name__,
            "gossip_seed": getattr(self.graph, "seed", 0)}
