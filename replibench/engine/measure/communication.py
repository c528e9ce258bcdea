"""The communication account of a replicated step: what it sends, how often, how long.

While a step is traced, every collective the engine issues is recorded in the
active Ledger with its kind and payload (bytes one replica contributes):

  gradients   the gradient all-reduce (one packed collective per optimizer step)
  batch_norm  cross-replica batch statistics (forward; their gradient adds one more)
  outputs     the step outputs, reduced once per call of steps_per_call steps
  parameters  parameter / optimizer-state exchange (local SGD, gossip)
  activations the model axis of a replica spanning devices (engine/model_parallel):
              tensor-parallel all-reduces, a pipeline's stage-to-stage sends. These
              run among one replica's own devices (inside one worker process), not
              between replicas: they count in by_kind but not in the wire figures a
              replica sends; by_axis prices each axis apart
  other       anything else a step_fn all-reduces or gathers

Each entry also names its collective (all_reduce, all_gather, all_to_all) and the replicas
taking part (None: all of them; 2 for gossip's pairwise exchange), from which
wire_bytes gives the bytes each replica puts on the wire with the ring
algorithms TF's collectives use (CommunicationImplementation.RING): 2(n-1)/n
times the payload for an all-reduce of n, (n-1) times it for an all-gather,
(n-1)/n for an all-to-all (each replica's rows go straight to their owners).
That is what `launch --network` measures on the cluster's loopback.

A forward all-reduce that a gradient flows through sends again in the backward
pass (its gradient is an all-reduce of the same size): collectives.all_reduce
records that one when the gradient is traced, so cross-replica batch norm counts
two per layer.

CompiledStep.communication() turns a ledger into result.json's `communication`
record (summarize), adding the collective ops actually found in the traced
graph (graph_collectives: under MultiWorkerMirroredStrategy each is a
CollectiveReduceV2 / CollectiveGatherV2), and the time the recorded collectives
take run alone, in the same order and sizes, on the same replicas (replay): a
lower bound on the communication in a step (no contention with compute, no
overlap). In a launched cluster the replay also measures what the link carries
beyond the payloads, which the expected bytes on the wire include: per transfer
(rpc_overhead_bytes_by_collective: the receiver's request, gRPC framing, TCP;
all-reduces, all-gathers and all-to-alls apart), and per collective op and call
of the function that holds it (rpc_overhead_bytes_per_call_by_collective: an op
run once per call, as a step of one step per call runs its all-reduces, costs
that much more than one of many runs inside a call).
"""

import collections
import contextlib
import threading
import time

import tensorflow as tf

MODEL_AXIS = "activations"   # The kind of the collectives inside a replica (see above).
KINDS = ("gradients", "batch_norm", "outputs", "parameters", MODEL_AXIS, "other")
COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2",
                  "CollectiveBcastSendV2", "CollectiveBcastRecvV2", "CollectiveReduce",
                  "CollectiveGather")

_LEDGERS: list = []   # A stack; MirroredStrategy traces each replica in a thread of its own.


class Ledger:
  """Collectives recorded while tracing: each replica's (per tracing thread: replicas
  record alike) and those issued once for all replicas (cross-replica context)."""

  def __init__(self):
    self._by_thread = collections.defaultdict(list)   # thread id -> [Entry]
    self._cross_replica = []

  def __enter__(self):
    _LEDGERS.append(self)
    return self

  def __exit__(self, *exc):
    _LEDGERS.remove(self)

  def add(self, entry: "Entry", cross_replica: bool) -> None:
    if cross_replica:
      self._cross_replica.append(entry)
    else:
      self._by_thread[threading.get_ident()].append(entry)

  def entries(self) -> list["Entry"]:
    """One replica's collectives in trace order (the longest thread's list), then the
    cross-replica ones."""
    return max(self._by_thread.values(), key=len, default=[]) + self._cross_replica


class Entry(collections.namedtuple("Entry", "kind payload collective group_size share")):
  """One collective: its kind (KINDS), payload (bytes one replica contributes),
  collective ('all_reduce' or 'all_gather'), group_size (replicas taking part;
  None: all) and share (how often it runs per traced step: 1/H for local SGD's
  average every H steps)."""

  def wire_bytes(self, num_replicas: int) -> float:
    """Bytes one participating replica sends for this collective (ring algorithms;
    an all-to-all sends each other replica its row: (n-1)/n of the payload; a 'send'
    of a pipeline stage goes once to one device)."""
    n = self.group_size or num_replicas
    if n <= 1:
      return 0.0
    factor = {"all_gather": n - 1, "all_to_all": (n - 1) / n, "send": 1.0}.get(
        self.collective, 2.0 * (n - 1) / n)
    return factor * self.payload

  def messages(self, num_replicas: int) -> int:
    """Transfers one participating replica sends: a ring all-gather passes n-1 chunks
    on, an all-to-all sends n-1 rows, a ring all-reduce 2(n-1) (reduce-scatter, then
    all-gather)."""
    n = self.group_size or num_replicas
    if n <= 1:
      return 0
    return 2 * (n - 1) if self.collective == "all_reduce" else n - 1


_SHARE = threading.local()   # Per tracing thread: the share every() sets (1.0 outside).


@contextlib.contextmanager
def every(steps: int):
  """Collectives recorded inside this block run once every `steps` steps (e.g. under a
  tf.cond taken every H steps), and count 1/steps per step in the account."""
  outer = _share()
  _SHARE.value = outer / steps
  try:
    yield
  finally:
    _SHARE.value = outer


def _share() -> float:
  return getattr(_SHARE, "value", 1.0)


def record(kind: str, values, cross_replica: bool = False, collective: str = "all_reduce",
           group_size: int | None = None) -> None:
  """Called by the engine's collectives: one collective of kind over values (a nest),
  issued by each replica, or once for all of them (cross_replica)."""
  if _LEDGERS:
    payload = sum(t.shape.num_elements() * t.dtype.size for t in tf.nest.flatten(values)
                  if t.shape.is_fully_defined())
    _LEDGERS[-1].add(Entry(kind if kind in KINDS else "other", int(payload), collective,
                           group_size, _share()), cross_replica)


def summarize(entries: list[Entry], steps_per_call: int = 1,
              num_replicas: int | None = None) -> dict:
  """{collectives_per_step, bytes_per_step, by_kind: {kind: {count, bytes}}} for a step's
  entries; 'outputs' are per call and count 1/steps_per_call per step. With
  num_replicas, also wire_bytes_per_replica_per_step: what each replica sends over
  the ring algorithms (Entry.wire_bytes), its transfers by collective, and
  wire_ops_per_step_by_collective: the collective ops a call runs, per step (each op
  of a call's graph runs at least once in a call when its share times steps_per_call
  reaches 1; an op pays a fixed cost per call, see replay). The model axis's entries
  (MODEL_AXIS) stay out of the wire figures: they do not leave the replica."""
  by_kind: dict[str, dict] = {}
  wire = 0.0
  messages: dict[str, float] = collections.defaultdict(float)
  ops: dict[str, float] = collections.defaultdict(float)
  for entry in entries:
    per_call = entry.kind == "outputs"
    share = entry.share / steps_per_call if per_call else entry.share
    row = by_kind.setdefault(entry.kind, {"count": 0.0, "bytes": 0.0})
    row["count"] += share
    row["bytes"] += share * entry.payload
    if num_replicas and entry.kind != MODEL_AXIS:
      wire += share * entry.wire_bytes(num_replicas)
      messages[entry.collective] += share * entry.messages(num_replicas)
      if entry.messages(num_replicas):
        ops[entry.collective] += (1.0 if per_call else
                                  min(1.0, entry.share * steps_per_call)) / steps_per_call
  account = {"collectives_per_step": round(sum(r["count"] for r in by_kind.values()), 3),
             "bytes_per_step": round(sum(r["bytes"] for r in by_kind.values())),
             "by_kind": {k: {"count": round(v["count"], 3), "bytes": round(v["bytes"])}
                         for k, v in sorted(by_kind.items())}}
  if num_replicas:
    account["wire_bytes_per_replica_per_step"] = round(wire)
    account["wire_messages_per_replica_per_step"] = round(sum(messages.values()), 3)
    account["wire_messages_by_collective"] = {k: round(v, 3) for k, v in sorted(messages.items())}
    account["wire_ops_per_step_by_collective"] = {k: round(v, 3) for k, v in sorted(ops.items())}
  return account


def by_axis(entries: list[Entry], steps_per_call: int = 1, num_replicas: int = 1) -> dict:
  """{'model_axis': ..., 'data_axis': ...} of a replica spanning devices: each axis's
  collectives per step, payload bytes per step and the bytes one device sends per step
  (Entry.wire_bytes: a model-axis entry names its group, M devices or a stage's 2;
  a data-axis one is among num_replicas replicas). The model axis is the MODEL_AXIS
  kind, the data axis every other (the step outputs' per call)."""
  found = {}
  for axis, inside in (("model_axis", True), ("data_axis", False)):
    count = payload = wire = 0.0
    for entry in entries:
      if (entry.kind == MODEL_AXIS) != inside:
        continue
      share = entry.share / steps_per_call if entry.kind == "outputs" else entry.share
      count += share
      payload += share * entry.payload
      wire += share * entry.wire_bytes(num_replicas)
    found[axis] = {"collectives_per_step": round(count, 3),
                   "payload_bytes_per_step": round(payload), "wire_bytes_per_step": round(wire)}
  return found


def graph_collectives(concrete_function) -> int:
  """Collective ops in a traced function and the functions it calls (in-process,
  MirroredStrategy reduces with copies and adds, not collective ops: only the
  gossip's pairwise collective ops, every replica's, are counted there)."""
  graph_def = concrete_function.graph.as_graph_def()
  count = sum(node.op in COLLECTIVE_OPS for node in graph_def.node)
  count += sum(node.op in COLLECTIVE_OPS for f in graph_def.library.function
               for node in f.node_def)
  return count


def replay(strategy, entries: list[Entry], repeats: int = 20, wire_counter=None,
           all_to_all=None) -> dict:
  """The entries' collectives run alone, in order, on strategy's replicas, with the
  same bytes (every replica of a multi-worker cluster must call this together):
  {'seconds': per replay, a lower bound on the step's communication time}; with
  wire_counter (a callable: bytes sent so far on the cluster's link), also what the
  wire carries beyond the payloads, per collective (each kind of collective replays
  apart, so each one's overhead is measured on its own transfers):
  'rpc_overhead_bytes_by_collective', per transfer (the receiver's request, gRPC
  framing, TCP; the all-reduce's, or else the first measured, also as
  'rpc_overhead_bytes_per_message'), and 'rpc_overhead_bytes_per_call_by_collective',
  per collective op and call of the function holding it, per replica (~160 B a
  replica between two workers, whatever the op's size: a step of 20 small
  all-reduces, one step a call, sent 6.6 KB more than its transfers alone).
  all_to_all: the engine's all_to_all(x) (x [num_replicas, ...]; this module cannot
  import the collectives that record into it), needed when the entries hold
  all-to-alls."""
  found = {"seconds": 0.0}
  ops = dict(_REPLAYED, **({"all_to_all": _rows(all_to_all)} if all_to_all else {}))
  for collective, op in ops.items():
    # Pairwise (group_size 2) exchanges are replayed over all replicas: an upper bound.
    # The model axis's (activations) run inside a replica, not among replicas: left out.
    sizes = [max(1, e.payload // 4) for e in entries
             if e.kind not in ("outputs", "activations") and e.collective == collective]
    if sizes:
      measured = _replay_chain(strategy, collective, op, sizes, repeats, wire_counter)
      found["seconds"] += measured.seconds
      if measured.per_transfer is not None:
        found.setdefault("rpc_overhead_bytes_by_collective", {})[collective] = (
            measured.per_transfer)
        found.setdefault("rpc_overhead_bytes_per_call_by_collective", {})[collective] = (
            measured.per_call)
  by_collective = found.get("rpc_overhead_bytes_by_collective", {})
  if by_collective:
    found["rpc_overhead_bytes_per_message"] = by_collective.get(
        "all_reduce", next(iter(by_collective.values())))
  return found


# How each collective is replayed on a float32 [size] value, in replica context.
_REPLAYED = {"all_reduce": lambda ctx, value: ctx.all_reduce("sum", value),
             "all_gather": lambda ctx, value: ctx.all_gather(value, axis=0)}


def _rows(all_to_all):
  """A replay op sending value as num_replicas rows (size rounded up to a multiple)."""
  def op(ctx, value):
    n = ctx.num_replicas_in_sync
    size = value.shape[0]
    rows = tf.reshape(tf.pad(value, [[0, -size % n]]), [n, -1])
    return all_to_all(rows)
  return op


def _replayed_payloads(collective: str, sizes: list[int], n: int) -> list[Entry]:
  """What a replay of these float32 sizes sends, as entries: an all-to-all pads each
  to n rows; an all-gather first gathers its tensor's shape (an int32 [1] here), as
  collectives.all_gather records for a step's gathers."""
  if collective == "all_to_all":
    sizes = [size + (-size % n) for size in sizes]
  replayed = [Entry("other", 4 * size, collective, None, 1.0) for size in sizes]
  if collective == "all_gather":
    replayed += [Entry("other", 4, collective, None, 1.0) for _ in sizes]
  return replayed


class _Replayed(collections.namedtuple("_Replayed", "seconds per_transfer per_call")):
  """A replayed chain: seconds per replay; overhead bytes per transfer and per op and
  call, per replica (None without a wire counter or with one replica)."""


_CALLS = 10   # Calls of one replay each, for the per-call overhead.


def _replay_chain(strategy, collective: str, op, sizes: list[int], repeats: int,
                  wire_counter) -> _Replayed:
  """A chain of float32 collectives of these sizes, each waiting for the last, as a
  step's do: timed over `repeats` replays in one call; with a wire counter, its
  bytes beyond the payloads per transfer (in that call) and per op and call (from
  _CALLS calls of one replay each)."""
  def chain(x):
    ctx = tf.distribute.get_replica_context()
    for size in sizes:
      x = tf.reduce_sum(op(ctx, tf.fill([size], x * 0.0)))
    return x

  # The replays loop inside one call: one call per replay would time the call's
  # dispatch too (a 597 KB all-reduce of 2 workers read 3.3 ms so, against 0.6 ms in a
  # loop: results/scaling/README.md, 2026-11-25).
  @tf.function
  def run(times):
    x = strategy.run(tf.zeros, args=([],))
    for _ in tf.range(times):
      x = strategy.run(chain, args=(x,))
    return x

  run(tf.constant(1))   # Trace and warm up.
  sent = wire_counter() if wire_counter else 0
  start = time.perf_counter()
  run(tf.constant(repeats))
  seconds = (time.perf_counter() - start) / repeats
  n = strategy.num_replicas_in_sync
  if not wire_counter or n <= 1:
    return _Replayed(seconds, None, None)
  counted = (wire_counter() - sent) / repeats
  sent = wire_counter()
  for _ in range(_CALLS):
    run(tf.constant(1))
  per_call = (wire_counter() - sent) / _CALLS
  replayed = _replayed_payloads(collective, sizes, n)
  payload = n * sum(e.wire_bytes(n) for e in replayed)
  messages = n * sum(e.messages(n) for e in replayed)
  ops = n * len(replayed)
  return _Replayed(seconds, round(max(0.0, counted - payload) / messages, 1),
                   round(max(0.0, per_call - counted) / ops, 1))
