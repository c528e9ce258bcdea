"""Gossip: decentralised averaging, each replica mixing with its neighbours.

After every local step (each replica applies its own batch's gradient to its
own copy) every replica replaces its parameters and optimizer slots with the
mean of its own and its neighbours' copies; there is no central reduction of
the model. The graph is a gin reference:

  @regimes.Ring()            w_i <- (w_{i-1} + w_i + w_{i+1}) / 3 (2 replicas: the pair mean)
  @regimes.RandomMatching()  a random perfect matching per step; partners average
                             pairwise (with an odd count one replica sits out),
                             drawn from a stateless RNG of (seed, optimizer step)
                             so every replica draws the same matching
  @regimes.Complete()        w_i <- mean_j w_j: synchronous averaging (a check)

Ring and RandomMatching exchange only with neighbours: one all-reduce in a group
of two replicas per neighbour (`collectives.pair_all_reduce`, TF's V2
collectives), whose sum x_i + x_j gives the mix: the ring's
((x_i + x_l) + (x_i + x_r) - x_i) / 3, a pair's (x_i + x_j) / 2. Complete is one
all-reduce of all replicas.

Every mixing matrix here is doubly stochastic, so mixing keeps the replicas'
mean. Step metrics: 'regime/consensus_distance', sqrt(mean_i ||w_i - w_mean||^2)
over the trainable parameters, measured after the local step and before mixing
(it costs an all-reduce of the parameters of its own; report_consensus=False
drops it); 'regime/bytes_communicated', the bytes of parameters and slots each
replica contributes as payload per step: one copy per neighbour (a pair's ring
all-reduce sends each member exactly that), one copy for Complete's all-reduce.

`compression = @regimes.Compressed()` (bits) quantizes every copy a replica
receives (quantized_exchange.py); `Gossip.average` is also the mixing step of
`regimes.LocalSGD.average`, which with RandomMatching and compression is
SwarmSGD; GradientTracking (gradient_tracking.py) mixes on the same graphs.
"""

import gin
import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.measure import communication
from replibench.engine.regimes import replica_state
from replibench.engine.regimes.base import STATE, Regime
from replibench.engine.regimes.compressed import Compressed
from replibench.engine.regimes.quantized_exchange import StateQuantizer
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.errors import UserError
from replibench.inputs import shown


class Graph:
  """Who mixes with whom in a gossip step (gin: regimes.Ring(), RandomMatching(), Complete())."""

  def partners(self, replica: tf.Tensor, n: int, step: tf.Tensor) -> tf.Tensor:
    """The replicas replica exchanges with at optimizer step `step` (n >= 2): int32 [k],
    distinct, k fixed; replica itself in a slot where it sits this step out."""
    raise NotImplementedError

  def neighbours(self, n: int) -> float:
    """Other replicas each replica exchanges with per step, on average."""
    raise NotImplementedError

  def payloads(self, n: int) -> float:
    """Copies of its state each replica sends per step: one per neighbour."""
    return self.neighbours(n)

  def mix(self, flat: tf.Tensor, replica: tf.Tensor, n: int, step: tf.Tensor,
          quantizer: "PairQuantizer | None" = None) -> tf.Tensor:
    """This replica's mixed state, from its own, flat [entries] (replica context).

    quantizer: None sends the state as it is (the mix keeps the replicas' mean
    exactly); otherwise each neighbour's copy arrives quantized (PairQuantizer)
    and this replica's own stays exact, as in SwarmSGD.
    """
    if n == 1:
      return flat
    partners = self.partners(replica, n, step)
    # A replica sitting out gets x_i back: it counts as no neighbour.
    count = tf.reduce_sum(tf.cast(tf.not_equal(partners, replica), flat.dtype))
    if quantizer is not None:
      received = [quantizer.partner_copy(flat, replica, p, step, slot)
                  for slot, p in enumerate(tf.unstack(partners))]
      return (flat + tf.add_n(received)) / (1.0 + count)
    sums = collectives.pair_all_reduce(flat, partners)   # [k, entries]: x_i + x_partner.
    # The subtraction removes x_i from every sum exactly (a sitting-out slot is x_i alone).
    k = partners.shape[0]
    return (tf.reduce_sum(sums, axis=0) - (k - 1) * flat) / (1.0 + count)


@gin.configurable(module="regimes")
class Ring(Graph):
  """w_i <- (w_{i-1} + w_i + w_{i+1}) / 3 (with 2 replicas: the pair mean)."""

  def partners(self, replica, n, step):
    del step
    return ring_neighbours(replica, n)

  def neighbours(self, n):
    return min(n - 1, 2)


@gin.configurable(module="regimes")
class RandomMatching(Graph):
  """A random perfect matching per step, drawn from a stateless RNG of (seed, step), so
  every replica draws the same matching without communicating; partners average
  pairwise (with an odd count one replica sits out)."""

  def __init__(self, seed: int = 0):
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise UserError(f"regimes.RandomMatching.seed must be an integer, got {shown(seed)}.")
    self.seed = seed

  def partners(self, replica, n, step):
    seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
    return tf.reshape(random_partner(replica, n, seed), [1])

  def neighbours(self, n):
    return (n - n % 2) / n


@gin.configurable(module="regimes")
class Complete(Graph):
  """w_i <- mean_j w_j: the same as synchronous averaging (a check)."""

  def mix(self, flat, replica, n, step, quantizer=None):
    if quantizer is None or n == 1:
      return collectives.all_reduce(flat, "mean", kind="parameters")
    return (flat + quantizer.others_sum(flat, replica, step)) / float(n)

  def neighbours(self, n):
    return n - 1

  def payloads(self, n):
    return 1.0 if n > 1 else 0.0   # One all-reduce, not a copy per neighbour.


def ring_neighbours(replica: tf.Tensor, n: int) -> tf.Tensor:
  """replica's neighbours on a ring of n >= 2 replicas: int32 [1] (n = 2) or [2]."""
  if n == 2:
    return tf.reshape(1 - replica, [1])
  return tf.stack([(replica - 1) % n, (replica + 1) % n])


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
  compression: None (copies exchanged as float32) or @regimes.Compressed() with
  `bits`: every copy a replica receives is quantized (quantized_exchange.py).
  A Gossip is also how `regimes.LocalSGD.average` mixes every H steps (SwarmSGD).
  """

  name = "gossip"
  exchanges = STATE

  def __init__(self, graph: Graph | None = None, compression: Compressed | None = None,
               report_consensus: bool = True):
    graph = Ring() if graph is None else graph
    if not isinstance(graph, Graph):
      raise UserError(
          f"regimes.Gossip.graph must be a gossip graph, e.g. @regimes.Ring(), "
          f"@regimes.RandomMatching() or @regimes.Complete(); got {shown(graph)}.")
    if compression is not None and (not isinstance(compression, Compressed)
                                    or compression.top_k is not None
                                    or compression.wire != "packed_sum"):
      raise UserError(
          f"regimes.Gossip.compression quantizes the exchanged model: it must be "
          f"@regimes.Compressed() with regimes.Compressed.bits set (top_k would zero most of "
          f"a model; the copies travel packed, so regimes.Compressed.wire stays "
          f"'packed_sum'), or None; got {shown(compression)}{_compressed_settings(compression)}.")
    if compression is not None and compression.lossless:
      compression = None   # bits = 32: the copies as they are.
    self.graph, self.compression = graph, compression
    self.report_consensus = bool(report_consensus)

  def apply_gradients(self, optimizer, grads, variables):
    replica_state.apply_local(optimizer, grads, variables)
    params = [v for g, v in zip(grads, variables) if g is not None]
    state = params + replica_state.optimizer_slots(optimizer)
    mixing = self.average(state, len(params), optimizer.iterations)
    sent = self.wire_bytes(replica_state.state_sizes(state), collectives.num_replicas())
    return StepMetrics({"regime/bytes_communicated": sent}) + mixing

  def average(self, state: list, num_params: int, step: tf.Tensor,
              every: int = 1) -> StepMetrics:
    """Mixes this replica's copy of state (parameters first, num_params of them, then
    slots) with its neighbours' copies, at the steps where step % every == 0. Returns
    the consensus distance of the parameters before mixing, every step. Replica context."""
    flat = replica_state.read_flat(state)   # Parameters first, then slots.
    metrics = StepMetrics()
    if self.report_consensus:
      params = sum(replica_state.state_sizes(state[:num_params]))
      metrics = consensus_distance(replica_state.squared_consensus_distance(flat[:params]))
    with communication.every(every):   # The account counts the mixing 1/every a step.
      when = tf.equal(step % every, 0)
      if every > 1 and self._mixes_by_all_reduce():
        # An all-reduce of every replica may not sit in replica-context control flow
        # (MirroredStrategy): average_when conditions it in cross-replica context.
        replica_state.average_when(when, state)
        return metrics
      n, replica = collectives.num_replicas(), collectives.replica_id()
      quantizer = (None if self.compression is None else
                   StateQuantizer(self.compression, replica_state.state_sizes(state)))
      mix = lambda: self.graph.mix(flat, replica, n, step, quantizer)
      # Pair exchanges are plain collective ops, which a tf.cond may hold: every
      # replica takes the same branch.
      mixed = mix() if every == 1 else tf.cond(when, mix, lambda: flat)
    replica_state.assign_flat(state, mixed)
    return metrics

  def _mixes_by_all_reduce(self) -> bool:
    return isinstance(self.graph, Complete)

  def check_every(self, steps: int, binding: str) -> None:
    """Raises UserError if this gossip cannot mix every `steps` steps (under a condition)."""
    if steps > 1 and self._mixes_by_all_reduce() and self.compression is not None:
      raise UserError(
          f"{binding}: a Gossip over @regimes.Complete() with compression mixes through "
          f"all-reduces of every replica, which cannot run every few steps only "
          f"(MirroredStrategy forbids them under a condition). Use a pair graph "
          f"(@regimes.RandomMatching(), @regimes.Ring()), no compression, or H = 1.")

  def wire_bytes(self, sizes, num_replicas):
    """Bytes each replica sends per step: a copy of its parameters and slots per
    neighbour (Complete: one, to its all-reduce), quantized if compression is set."""
    if self.compression is None:
      copy = _payload(sizes)
    else:
      copy = StateQuantizer(self.compression, sizes).bytes_per_copy(
          num_replicas, self._mixes_by_all_reduce())
    return self.graph.payloads(num_replicas) * copy

  def setting(self):
    bits = "" if self.compression is None else f", bits={self.compression.bits}"
    return f"{self.name}(graph={type(self.graph).__name__}{bits})"

  def hparams(self):
    return {"regime": self.name, "graph": type(self.graph).__name__,
            "gossip_seed": getattr(self.graph, "seed", 0),
            "bits": 0 if self.compression is None else self.compression.bits}


def consensus_distance(squared: tf.Tensor) -> StepMetrics:
  """'regime/consensus_distance' from its square (replica_state.squared_consensus_distance):
  the squares of a step's calls add up, the root is taken of their sum."""
  return StepMetrics({"regime/consensus_distance_sq": squared},
                     {"regime/consensus_distance": (
                         lambda sums: tf.sqrt(sums["regime/consensus_distance_sq"]),
                         ("regime/consensus_distance_sq",))})


def _payload(sizes: list[int]) -> float:
  """Bytes of one copy of float32 parameters and slots of these sizes."""
  return 4.0 * sum(sizes)


def _compressed_settings(compression) -> str:
  """' with regimes.Compressed.top_k = 0.01, ...': a Compressed's settings as bindings."""
  if not isinstance(compression, Compressed):
    return ""
  settings = {"bits": compression.bits, "top_k": compression.top_k, "wire": compression.wire}
  return " with " + ", ".join(f"regimes.Compressed.{k} = {shown(v)}" for k, v in
                              settings.items() if v is not None)
