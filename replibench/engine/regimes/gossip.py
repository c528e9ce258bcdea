"""Gossip: decentralised averaging, each replica mixing with its neighbours.

After every local step (each replica applies its own batch's gradient to its
own copy) every replica replaces its parameters and optimizer slots with the
mean of its own and its neighbours' copies, exchanged through
`collectives.permute`; there is no central reduction of the model. The graph
is a gin reference:

  @regimes.Ring()            w_i <- (w_{i-1} + w_i + w_{i+1}) / 3 (2 replicas: the pair mean)
  @regimes.RandomMatching()  a random perfect matching per step; partners average
                             pairwise (with an odd count one replica sits out),
                             drawn from a stateless RNG of (seed, optimizer step)
                             so every replica draws the same matching
  @regimes.Complete()        w_i <- mean_j w_j: synchronous averaging (a check)

Every mixing matrix here is doubly stochastic, so mixing keeps the replicas'
mean. Step metrics: 'regime/consensus_distance', sqrt(mean_i ||w_i - w_mean||^2)
over the trainable parameters, measured after the local step and before
mixing; 'regime/bytes_communicated', what each replica would send to its
neighbours over a point-to-point transport (parameters and slots).
"""

import gin
import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.regimes import replica_state
from replibench.engine.regimes.base import STATE, Regime
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError

class Graph:
  """Who mixes with whom in a gossip step (gin: regimes.Ring(), RandomMatching(), Complete())."""

  def sources(self, replica: tf.Tensor, n: int, step: tf.Tensor) -> tuple:
    """(replicas whose copies replica averages, int32 [k], itself included; how many of
    them are other replicas, float32 scalar) at optimizer step `step`."""
    raise NotImplementedError

  def neighbours(self, n: int) -> float:
    """Other replicas each replica exchanges with per step, on average."""
    raise NotImplementedError


@gin.configurable(module="regimes")
class Ring(Graph):
  """w_i <- (w_{i-1} + w_i + w_{i+1}) / 3 (with 2 replicas: the pair mean)."""

  def sources(self, replica, n, step):
    del step
    return ring_sources(replica, n), tf.constant(float(self.neighbours(n)))

  def neighbours(self, n):
    return min(n - 1, 2)


@gin.configurable(module="regimes")
class RandomMatching(Graph):
  """A random perfect matching per step, drawn from a stateless RNG of (seed, step), so
  every replica draws the same matching without communicating; partners average
  pairwise (with an odd count one replica sits out)."""

  def __init__(self, seed: int = 0):
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise UserError(f"regimes.RandomMatching.seed must be an integer, got {seed!r}.")
    self.seed = seed

  def sources(self, replica, n, step):
    partner = random_partner(replica, n, tf.stack([tf.constant(self.seed, tf.int64),
                                                   tf.cast(step, tf.int64)]))
    return tf.stack([replica, partner]), tf.cast(tf.not_equal(partner, replica), tf.float32)

  def neighbours(self, n):
    return (n - n % 2) / n


@gin.configurable(module="regimes")
class Complete(Graph):
  """w_i <- mean_j w_j: the same as synchronous averaging (a check)."""

  def sources(self, replica, n, step):
    del replica, step
    return tf.range(n, dtype=tf.int32), tf.constant(float(n - 1))

  def neighbours(self, n):
    return n - 1


def ring_sources(replica: tf.Tensor, n: int) -> tf.Tensor:
  """The replicas whose copies replica averages on a ring of n: itself and neighbours."""
  if n == 1:
    return tf.reshape(replica, [1])
  if n == 2:
    return tf.stack([replica, 1 - replica])
  return tf.stack([(replica - 1) % n, replica, (replica + 1) % n])


def random_partner(replica: tf.Tensor, n: int, seed: tf.Tensor) -> tf.Tensor:
  """replica's partner in a random perfect matching of n replicas (itself if left over).

  seed: int64 [2]; the same seed gives every replica the same matching.
  """
  order = tf.cast(tf.argsort(tf.random.stateless_uniform([n], seed=seed)), tf.int32)
  paired = n - n % 2
  # Consecutive entries of the random order pair up: swap within each pair.
  swapped = tf.reshape(tf.reverse(tf.reshape(order[:paired], [-1, 2]), axis=[1]), [-1])
  partners = tf.concat([swapped, order[paired:]], axis=0)
  # partner_of[order[k]] = partners[k]
  partner_of = tf.scatter_nd(order[:, None], partners, [n])
  return partner_of[replica]


@gin.configurable(module="regimes")
class Gossip(Regime):
  """Local steps, then neighbour averaging of parameters and slots after every step.

  graph: a Graph (gin: `regimes.Gossip.graph = @regimes.Ring()`, the default).
  """

  name = "gossip"
  exchanges = STATE

  def __init__(self, graph: Graph | None = None, report_consensus: bool = True):
    graph = Ring() if graph is None else graph
    if not isinstance(graph, Graph):
      raise UserError(
          f"regimes.Gossip.graph must be a gossip graph, e.g. @regimes.Ring(), "
          f"@regimes.RandomMatching() or @regimes.Complete(); got {graph!r}.")
    self.graph, self.report_consensus = graph, bool(report_consensus)
    self._metrics = StepMetrics()

  def apply_gradients(self, optimizer, grads, variables):
    replica_state.apply_local(optimizer, grads, variables)
    params = [v for g, v in zip(grads, variables) if g is not None]
    state = params + replica_state.optimizer_slots(optimizer)
    flat = replica_state.read_flat(state)   # Parameters first, then slots.
    if self.report_consensus:
      num_params = sum(replica_state.tf_variable(v).shape.num_elements() for v in params)
      self._metrics.add("regime/consensus_distance_sq",
                        replica_state.squared_consensus_distance(flat[:num_params]))
    sources, neighbours = self.graph.sources(collectives.replica_id(),
                                             collectives.num_replicas(), optimizer.iterations)
    # [k, entries]: the k named copies, averaged. An unpaired replica of a
    # random matching names itself twice: (w + w) / 2 == w exactly.
    mixed = tf.reduce_mean(collectives.permute(flat, sources), axis=0)
    replica_state.assign_flat(state, mixed)
    self._metrics.add("regime/bytes_communicated",
                      neighbours * _payload(replica_state.state_sizes(state)))

  def step_metrics(self):
    metrics = self._metrics.take()
    if "regime/consensus_distance_sq" in metrics:
      metrics["regime/consensus_distance"] = tf.sqrt(metrics.pop("regime/consensus_distance_sq"))
    return metrics

  def wire_bytes(self, sizes, num_replicas):
    """Point-to-point bytes each replica sends: its parameters and slots to each neighbour."""
    return self.graph.neighbours(num_replicas) * _payload(sizes)

  def setting(self):
    return f"{self.name}(graph={type(self.graph).__name__})"

  def hparams(self):
    return {"regime": self.name, "graph": type(self.graph).__name__,
            "gossip_seed": getattr(self.graph, "seed", 0)}


def _payload(sizes: list[int]) -> float:
  """Bytes of one copy of float32 parameters and slots of these sizes."""
  return 4.0 * sum(sizes)
