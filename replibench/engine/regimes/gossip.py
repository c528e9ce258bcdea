"""Gossip: decentralised averaging, each replica mixing with its neighbours.

After every local step (each replica applies its own batch's gradient to its
own copy) every replica replaces its parameters and optimizer slots with the
mean of its own and its neighbours' copies, exchanged through
`collectives.permute`; there is no central reduction of the model. The graph:

  ring      w_i <- (w_{i-1} + w_i + w_{i+1}) / 3  (with 2 replicas: the pair mean)
  random    a random perfect matching per step; partners average pairwise
            (with an odd count one replica sits out). Drawn from a stateless
            RNG seeded by (seed, optimizer step), so every replica draws the
            same matching without communicating.
  complete  w_i <- mean_j w_j: the same as synchronous averaging (a check).

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
from replibench.engine.regimes.base import Regime
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError

GRAPHS = ("ring", "random", "complete")


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
  """Local steps, then neighbour averaging of parameters and slots after every step."""

  name = "gossip"

  def __init__(self, graph: str = "ring", seed: int = 0, report_consensus: bool = True):
    if graph not in GRAPHS:
      raise UserError(
          f"regimes.Gossip.graph must be one of {', '.join(repr(g) for g in GRAPHS)}, "
          f"got {graph!r}.")
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise UserError(f"regimes.Gossip.seed must be an integer, got {seed!r}.")
    self.graph, self.seed, self.report_consensus = graph, seed, bool(report_consensus)
    self._metrics = StepMetrics()

  def _sources(self, optimizer) -> tuple:
    """(replicas this one averages, in [k]; how many of them are other replicas)."""
    n, me = collectives.num_replicas(), collectives.replica_id()
    if self.graph == "ring":
      return ring_sources(me, n), tf.constant(min(n - 1, 2), tf.float32)
    if self.graph == "complete":
      return tf.range(n, dtype=tf.int32), tf.constant(n - 1, tf.float32)
    seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(optimizer.iterations, tf.int64)])
    partner = random_partner(me, n, seed)
    return tf.stack([me, partner]), tf.cast(tf.not_equal(partner, me), tf.float32)

  def apply_gradients(self, optimizer, grads, variables):
    replica_state.apply_local(optimizer, grads, variables)
    params = [v for g, v in zip(grads, variables) if g is not None]
    state = params + replica_state.optimizer_slots(optimizer)
    flat = replica_state.read_flat(state)   # Parameters first, then slots.
    if self.report_consensus:
      num_params = sum(replica_state.tf_variable(v).shape.num_elements() for v in params)
      self._metrics.add("regime/consensus_distance_sq",
                        replica_state.squared_consensus_distance(flat[:num_params]))
    sources, neighbours = self._sources(optimizer)
    # [k, entries]: the k named copies, averaged. An unpaired replica of a
    # random matching names itself twice: (w + w) / 2 == w exactly.
    mixed = tf.reduce_mean(collectives.permute(flat, sources), axis=0)
    replica_state.assign_flat(state, mixed)
    self._metrics.add("regime/bytes_communicated",
                      neighbours * float(replica_state.state_bytes(state)))

  def step_metrics(self):
    metrics = self._metrics.take()
    if "regime/consensus_distance_sq" in metrics:
      metrics["regime/consensus_distance"] = tf.sqrt(metrics.pop("regime/consensus_distance_sq"))
    return metrics

  def describe(self, gradient_bytes, num_replicas):
    facts = {"regime": f"{self.name}(graph={self.graph!r})"}
    if gradient_bytes is not None:
      n = num_replicas
      # random: with an odd count one replica per step has no partner.
      neighbours = {"ring": min(n - 1, 2), "random": (n - n % 2) / n,
                    "complete": n - 1}[self.graph]
      # Point-to-point bytes each replica sends: parameters only; each optimizer
      # slot (e.g. momentum) adds as much again.
      facts["bytes_communicated_per_step"] = round(neighbours * gradient_bytes)
    return facts

  def hparams(self):
    return {"regime": self.name, "graph": self.graph, "gossip_seed": self.seed}
