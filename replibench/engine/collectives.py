"""MPI-style primitives callable inside a replicated `step_fn`.

These are the TF-Replicator primitives, each a thin call into the current
tf.distribute ReplicaContext. Outside a replicated step (no strategy, or the
default strategy) they behave as on a single replica, so model code can be run
and tested on one device unchanged.

A replicator whose replicas do not step together (engine.ps: each worker
updates the parameter servers on its own) declares what its step_fn sees with
`replica_group(...)` while it builds the step; these functions then ask that
group instead of the ReplicaContext. Nothing here knows of training regimes.
Each call is recorded, with the kind its caller names, in the communication
account of the step being traced (engine/measure/communication.py).

`pair_all_reduce` is the neighbour exchange: TensorFlow's V2 collective ops
(CollectiveReduceV2) take their group as run-time tensors, so two replicas
chosen at run time all-reduce between themselves alone, in a group of two,
under MirroredStrategy and MultiWorkerMirroredStrategy alike. `all_to_all`
(CollectiveAllToAllV2, which tf.distribute does not wrap) sends each replica its
own slice. Their collective keys live above tf.distribute's (see _PairKeys).
"""

import contextlib
import threading
import weakref

import tensorflow as tf

from replibench.engine import fusion
from replibench.engine.measure import communication
from replibench.errors import UserError

_REDUCE_OPS = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
_GATHER_OPS = {"max": tf.reduce_max, "min": tf.reduce_min}
OPS = tuple(_REDUCE_OPS) + tuple(_GATHER_OPS)


class ReplicaGroup:
  """The replicas a step_fn runs among, seen from inside one of them.

  The default is the current tf.distribute ReplicaContext. Methods take and
  return (nests of) tensors; num_replicas is a Python int.
  """

  def num_replicas(self) -> int:
    return _context().num_replicas_in_sync

  def replica_id(self) -> tf.Tensor:
    return tf.cast(_context().replica_id_in_sync_group, tf.int32)

  def all_reduce(self, x, op: str):
    # tf.identity gives each value a device: with one replica, reducing a
    # step's input tensor directly fails with "destinations can not be empty".
    x = tf.nest.map_structure(tf.identity, x)
    ctx = _context()
    if not fusion.fuses_in_engine(ctx.strategy):
      return ctx.all_reduce(_REDUCE_OPS[op], x)
    return fusion.fused(lambda tensors: ctx.all_reduce(_REDUCE_OPS[op], tensors), x)

  def all_gather(self, x, axis: int):
    return _context().all_gather(x, axis=axis)

  def broadcast(self, x, source_replica: int):
    # An all-reduce sum in which only the source contributes; the others add
    # exact zeros, so the result is bit-identical to the source's value.
    is_source = tf.equal(self.replica_id(), source_replica)
    masked = tf.nest.map_structure(
        lambda t: tf.where(is_source, t, tf.zeros_like(t)), tf.nest.map_structure(
            tf.convert_to_tensor, x))
    return self.all_reduce(masked, "sum")


_GROUPS: list = []   # A stack; MirroredStrategy traces replicas in threads, so not thread-local.
_DEFAULT = ReplicaGroup()


@contextlib.contextmanager
def replica_group(group: ReplicaGroup):
  """Makes the collectives in step_fns built inside this block act through group."""
  _GROUPS.append(group)
  try:
    yield group
  finally:
    _GROUPS.remove(group)


def _group() -> ReplicaGroup:
  return _GROUPS[-1] if _GROUPS else _DEFAULT


def _context() -> tf.distribute.ReplicaContext:
  ctx = tf.distribute.get_replica_context()
  if ctx is None:
    raise RuntimeError(
        "Collectives run inside a replicated step (Replicator.run / compile), "
        "not in cross-replica context.")
  return ctx


_COMPILED = threading.local()   # Per thread: MirroredStrategy traces each replica in its own.


@contextlib.contextmanager
def compiled_piece(what: str):
  """Marks the tracing of an XLA-compiled piece of a step (engine/compilation.py): a
  collective met inside it is the identity on one replica and a UserError on several
  (an XLA cluster cannot hold tf.distribute's merge_call or a CPU collective)."""
  previous = getattr(_COMPILED, "what", None)
  _COMPILED.what = what
  try:
    yield
  finally:
    _COMPILED.what = previous


def _identity_in_compiled_piece(kind: str) -> bool:
  """True when the caller should return its input: a one-replica collective inside a
  compiled piece (sum, mean, gather or broadcast over one replica is the identity).
  UserError for several replicas; False outside compiled pieces."""
  what = getattr(_COMPILED, "what", None)
  if what is None or isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy):
    return False   # A TPU step is one XLA program, collectives included.
  if num_replicas() == 1:
    return True
  raise UserError(
      f"Experiment.jit_compile: {what} holds a collective (kind {kind!r}, e.g. "
      f"@engine.cross_replica_batch_norm's all-reduce of its batch moments) and XLA "
      f"compiles that pass as one cluster, which cannot hold a collective among "
      f"{num_replicas()} replicas (tf.distribute's merge_call, and CPU collectives, live "
      f"outside XLA). Use @engine.per_replica_batch_norm (or a model without collectives "
      f"in its forward pass), one replica, or Experiment.jit_compile = False.")


# The collectives below are engine code, run unconverted by AutoGraph, as TensorFlow's
# own are (regimes/base.py, Regime.__init_subclass__, says what conversion costs).
@tf.autograph.experimental.do_not_convert
def num_replicas() -> int:
  """Replicas taking part in the current step (Python int)."""
  return _group().num_replicas()


@tf.autograph.experimental.do_not_convert
def replica_id() -> tf.Tensor:
  """This replica's index in [0, num_replicas()), an int32 scalar tensor."""
  return _group().replica_id()


@tf.autograph.experimental.do_not_convert
def all_reduce(x, op: str = "sum", kind: str = "other"):
  """Reduces a (nest of) tensor(s) over replicas; every replica gets the result.

  op is 'sum', 'mean', 'max' or 'min'. Sum and mean go through the strategy's
  all-reduce (a nest is packed into one collective); max and min (which
  tf.distribute.ReduceOp lacks) gather one value per replica and reduce
  locally, which is exact for every dtype. kind names the collective in the
  step's communication account (engine/measure/communication.py).
  """
  if _identity_in_compiled_piece(kind):
    return x
  if op in _REDUCE_OPS:
    communication.record(kind, x)
    return _recording_backward(_group().all_reduce(x, op), kind)
  if op in _GATHER_OPS:
    reduce = _GATHER_OPS[op]
    return tf.nest.map_structure(
        lambda t: reduce(all_gather(tf.expand_dims(t, 0), axis=0, kind=kind), axis=0), x)
  raise ValueError(f"all_reduce op must be one of {OPS}, got {op!r}.")


def _recording_backward(reduced, kind: str):
  """reduced (an all-reduce's result, a nest), unchanged; a gradient taken through it
  records, in the step's account, the collective its backward pass issues.

  The gradient of an all-reduce is an all-reduce of the same size (tf.distribute's
  ReplicaContext.all_reduce, and the default strategy's identity on one replica): a
  forward collective under a gradient tape, such as cross-replica batch norm's
  moments, sends twice a step. The backward is recorded when the gradient is traced,
  so exactly the collectives a gradient flows through count twice.
  """
  leaves = tf.nest.flatten(reduced)

  @tf.custom_gradient
  def identity(*tensors):
    def gradient(*upstream):
      communication.record(kind, [g for g in upstream if g is not None])
      return upstream
    return [tf.identity(t) for t in tensors], gradient

  return tf.nest.pack_sequence_as(reduced, identity(*leaves))


@tf.autograph.experimental.do_not_convert
def all_gather(x, axis: int = 0, kind: str = "other"):
  """Concatenates every replica's x along axis, in replica order.

  tf.distribute's collective all-gather first gathers each tensor's shape (an
  int32 vector of its rank), then the tensor padded to the largest: both are
  in the account, so a small gather's transfers are all counted.
  """
  if _identity_in_compiled_piece(kind):
    return x
  for t in tf.nest.flatten(x):
    shape = tf.TensorSpec([len(tf.convert_to_tensor(t).shape)], tf.int32)
    communication.record(kind, shape, collective="all_gather")
  communication.record(kind, x, collective="all_gather")
  return _group().all_gather(x, axis)


@tf.autograph.experimental.do_not_convert
def broadcast(x, source_replica: int = 0, kind: str = "other"):
  """Every replica receives source_replica's value of x (a nest of tensors, not bool)."""
  if any(tf.as_dtype(t.dtype).is_bool for t in tf.nest.flatten(x)):
    raise TypeError("broadcast does not take bool tensors; cast to int32 first.")
  if _identity_in_compiled_piece(kind):
    return x
  communication.record(kind, x)
  return _group().broadcast(x, source_replica)


@tf.autograph.experimental.do_not_convert
def permute(x, source, kind: str = "parameters"):
  """Each replica receives x from the replica(s) it names, through an all-gather.

  x: a nest of tensors (same shapes on every replica). source: this replica's
  choice, an int32 tensor in [0, num_replicas()), of shape [] (result: x's
  structure and shapes) or [k] (result: each leaf gets a leading axis k, one
  slice per named replica, in order). Replicas may name different sources,
  chosen at run time (e.g. a random matching drawn per step).

  Every replica all-gathers x and keeps the slices it named, so each one puts
  (num_replicas() - 1) copies of x on the wire whatever it keeps: for
  exchanges with a few neighbours, `pair_all_reduce` sends one copy per
  neighbour instead.
  """
  _identity_in_compiled_piece(kind)   # UserError inside a compiled piece.
  expanded = tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), x)
  gathered = all_gather(expanded, axis=0, kind=kind)   # Each leaf: [num_replicas, ...].
  return tf.nest.map_structure(lambda t: tf.gather(t, source, axis=0), gathered)


@tf.autograph.experimental.do_not_convert
def pair_all_reduce(x, partner, kind: str = "parameters"):
  """Sums x with the partner's x: an all-reduce in a group of two replicas.

  x: a tensor, of the same shape and dtype on every replica. partner: this
  replica's partner, an int32 tensor in [0, num_replicas()) that may differ per
  replica and per step (a random matching), of shape [] (result: x's shape) or
  [k] (k distinct partners, e.g. a ring's two neighbours; result [k, *x.shape],
  one sum per partner, in order). The partner must name this replica back in
  the same call. A replica that names itself gets x back and sends nothing.

  Each pair is a collective of its own (CollectiveReduceV2, ring algorithm), so
  a replica puts exactly one copy of x on the wire per partner, whatever the
  number of replicas. Up to 362 replicas; not available inside
  `replica_group` (engine.ps).
  """
  _identity_in_compiled_piece(kind)   # UserError inside a compiled piece.
  if _GROUPS:
    raise NotImplementedError("pair_all_reduce needs a tf.distribute replica context; "
                              "it is not available inside replica_group().")
  partner = tf.convert_to_tensor(partner, tf.int32)
  partners = tf.unstack(partner) if partner.shape.rank == 1 else [partner]
  # Placed by the device scope strategy.run traces this replica under (a step
  # input itself has no device); the collectives follow it (_unordered_token).
  x = tf.identity(x)
  n = num_replicas()
  if n == 1:   # Every partner is this replica: nothing to send or record.
    sums = [x for _ in partners]
  else:
    if n > _MAX_PAIR_REPLICAS:
      raise NotImplementedError(f"pair_all_reduce supports up to {_MAX_PAIR_REPLICAS} "
                                f"replicas, not {n}.")
    me = replica_id()
    keys = _pair_keys()
    # One instance key for all of this call's pairs: each pair is a group of its
    # own, and TF tells collectives apart by (group key, instance key), so the
    # two ends of a pair meet however each one orders its partners.
    instance = keys.next_instance(me)
    sums = []
    for other in partners:
      communication.record(kind, x, collective="all_reduce", group_size=2)
      sums.append(_pair_sum(x, me, other, keys, instance))
  return tf.stack(sums) if partner.shape.rank == 1 else sums[0]


@tf.autograph.experimental.do_not_convert
def all_to_all(x, kind: str = "gradients"):
  """Row j of x goes to replica j: the result's row i is what replica i sent this one.

  x: a tensor [num_replicas(), ...], of the same shape and dtype on every
  replica. One CollectiveAllToAllV2 over all replicas: each sends each other
  replica its row directly, (n-1)/n of x on the wire (a reduce-scatter's
  traffic, without summing in transit: the receiver sums, so integer levels
  need no headroom bits on the way). tf.distribute's replica context has no
  all-to-all, so the op runs with keys of its own, as pair_all_reduce does.
  Not available inside `replica_group` (engine.ps).
  """
  _identity_in_compiled_piece(kind)   # UserError inside a compiled piece.
  if _GROUPS:
    raise NotImplementedError("all_to_all needs a tf.distribute replica context; "
                              "it is not available inside replica_group().")
  x = tf.identity(x)   # Placed on this replica's device (see pair_all_reduce).
  n = num_replicas()
  if x.shape.rank is None or x.shape[0] != n:
    raise ValueError(f"all_to_all takes one row per replica: shape [{n}, ...], got {x.shape}.")
  if n == 1:
    return x
  communication.record(kind, x, collective="all_to_all")
  keys = _pair_keys()
  return tf.raw_ops.CollectiveAllToAllV2(
      input=x, group_size=n, group_key=keys.everyone(),
      instance_key=keys.next_instance(replica_id()),
      ordering_token=[_unordered_token(x.device)], communication_hint="auto",
      timeout_seconds=0)


def _pair_sum(x: tf.Tensor, me: tf.Tensor, partner: tf.Tensor, keys: "_PairKeys",
              instance_key: int) -> tf.Tensor:
  """x + partner's x through a group-of-2 CollectiveReduceV2; x where partner == me."""
  paired = tf.not_equal(partner, me)
  known = tf.get_static_value(paired)
  if known is not None and not known:   # Unpaired, known when tracing.
    return x
  # An unpaired replica (a random matching of an odd count) all-reduces in a group
  # of one, which returns x without communicating: no control flow around a
  # collective, and its partner-to-be needs no case of its own.
  group_size = tf.where(paired, 2, 1)
  group_key = tf.where(paired, keys.pair(me, partner), keys.single(me))
  return tf.raw_ops.CollectiveReduceV2(
      input=x, group_size=group_size, group_key=group_key, instance_key=instance_key,
      ordering_token=[_unordered_token(x.device)], merge_op="Add", final_op="Id",
      communication_hint="ring", timeout_seconds=0)


def _unordered_token(device: str) -> tf.Tensor:
  """A resource handle of its own for one collective's ordering_token, on device.

  tf.function's automatic control dependencies chain every stateful op without
  a resource input in program order, across devices: under MirroredStrategy one
  replica's pair collective would wait for another's, which waits for it (a
  deadlock); and a ring replica's second pair would wait for its first, each
  neighbour's first being its neighbour's second (a cycle). A resource input
  takes an op out of that chain and orders it only with the ops using the same
  resource, here none. (tf.distribute's own collectives share one variable per
  device and issue them in the same order everywhere.) Made eagerly, so the
  function captures it instead of running a stateful op; the collective is
  placed with it, on this replica's device. The kernel never reads it.
  """
  with tf.init_scope(), tf.device(device):
    return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="")


# Group keys of pair collectives lie above every key tf.distribute hands out (a
# MirroredStrategy's start at 1 + its key base, which internals.fresh_collective_keys
# moves by 100_000 per strategy; MultiWorkerMirroredStrategy's at 1). A group key
# names a fixed set of devices for the life of the process (TF's
# CollectiveParamResolverLocal fails a device not in it), so each strategy gets
# a range of its own: another strategy's replica i may be another device.
_PAIR_GROUP_BASE = 1 << 30
_PAIRS = 1 << 16                  # Pair keys hi * (hi - 1) / 2 + lo: up to 362 replicas,
_MAX_PAIR_REPLICAS = 362
_KEYS_PER_STRATEGY = 2 * _PAIRS   # then one key per replica for its group of one, and
                                  # the last for all replicas together (all_to_all).
_PAIR_INSTANCE_BASE = 1 << 20     # Instance keys are scoped by group key; any start works.


class _PairKeys:
  """Collective keys of one strategy's pair exchanges (made on its first one)."""

  def __init__(self, slot: int):
    self.base = _PAIR_GROUP_BASE + slot * _KEYS_PER_STRATEGY
    if self.base + _KEYS_PER_STRATEGY > 2**31 - 1:
      raise RuntimeError("Too many strategies used pair_all_reduce in one process.")
    self._next: dict[int, int] = {}   # Replica id -> its next instance key.
    self._lock = threading.Lock()

  def pair(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """The group key of replicas {a, b}, a != b (int32 scalars), the same from either end."""
    lo, hi = tf.minimum(a, b), tf.maximum(a, b)
    return self.base + hi * (hi - 1) // 2 + lo

  def single(self, a: tf.Tensor) -> tf.Tensor:
    """The group key of replica a alone."""
    return self.base + _PAIRS + a

  def everyone(self) -> int:
    """The group key of all the strategy's replicas (all_to_all), above the singles'."""
    return self.base + _KEYS_PER_STRATEGY - 1

  def next_instance(self, replica: tf.Tensor) -> int:
    """replica's next instance key, taken when tracing.

    The replicas trace the same calls in the same order (threads of one
    process under MirroredStrategy, a process each under
    MultiWorkerMirroredStrategy), so the k-th call gets the same key on every
    replica. A traced function reuses its keys on every call, which V2
    collectives allow: TF resolves an instance once per (group key, instance
    key), checking the shape, and runs each call under the execution key
    group:instance:frame:iteration (kernels/collective_ops.cc, CollectiveKey).
    """
    index = tf.get_static_value(replica)
    if index is None:
      raise NotImplementedError("pair_all_reduce needs the replica id known when tracing.")
    with self._lock:
      key = self._next.get(int(index), _PAIR_INSTANCE_BASE)
      self._next[int(index)] = key + 1
    return key


class PerStrategy:
  """One object a tf.distribute strategy (key ranges), made by make(slot) when the
  strategy first asks; slots are numbered in that order, which is the same on every
  worker of a cluster, so the workers' keys agree."""

  def __init__(self, make):
    self._make, self._made = make, weakref.WeakKeyDictionary()
    self._lock, self._slots = threading.Lock(), 0

  def current(self):
    strategy = tf.distribute.get_strategy()
    with self._lock:
      if strategy not in self._made:
        self._made[strategy] = self._make(self._slots)
        self._slots += 1
      return self._made[strategy]


_pair_keys = PerStrategy(_PairKeys).current   # The current strategy's pair keys.
