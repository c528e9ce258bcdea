"""The communication account of a replicated step: what it sends, how often, how long.

While a step is traced, every collective the engine issues is recorded in the
active Ledger with its kind and payload (bytes one replica contributes):

  gradients   the gradient all-reduce (one packed collective per optimizer step)
  batch_norm  cross-replica batch statistics (forward; their gradient adds one more)
  outputs     the step outputs, reduced once per call of steps_per_call steps
  parameters  parameter / optimizer-state exchange (local SGD, gossip)
  other       anything else a step_fn all-reduces or gathers

CompiledStep.communication() turns a ledger into result.json's `communication`
record (summarize), adding the collective ops actually found in the traced
graph (graph_collectives: under MultiWorkerMirroredStrategy each is a
CollectiveReduceV2 / CollectiveGatherV2; the backward pass of a forward
collective adds one more, which the ledger cannot see: cross-replica batch norm
costs two per layer), and the time the recorded collectives take run alone, in
the same order and sizes, on the same replicas (time_alone): a lower bound on
the communication in a step (no contention with compute, no overlap).
"""

import collections
import threading
import time

import tensorflow as tf

KINDS = ("gradients", "batch_norm", "outputs", "parameters", "other")
COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastSendV2",
                  "CollectiveBcastRecvV2", "CollectiveReduce", "CollectiveGather")

_LEDGERS: list = []   # A stack; MirroredStrategy traces each replica in a thread of its own.


class Ledger:
  """Collectives recorded while tracing: each replica's (per tracing thread: replicas
  record alike) and those issued once for all replicas (cross-replica context)."""

  def __init__(self):
    self._by_thread = collections.defaultdict(list)   # thread id -> [(kind, bytes)]
    self._cross_replica = []

  def __enter__(self):
    _LEDGERS.append(self)
    return self

  def __exit__(self, *exc):
    _LEDGERS.remove(self)

  def add(self, kind: str, payload: int, cross_replica: bool) -> None:
    if cross_replica:
      self._cross_replica.append((kind, payload))
    else:
      self._by_thread[threading.get_ident()].append((kind, payload))

  def entries(self) -> list[tuple[str, int]]:
    """One replica's collectives in trace order (the longest thread's list), then the
    cross-replica ones."""
    return max(self._by_thread.values(), key=len, default=[]) + self._cross_replica


def record(kind: str, values, cross_replica: bool = False) -> None:
  """Called by the engine's collectives: one collective of kind over values (a nest),
  issued by each replica, or once for all of them (cross_replica)."""
  if _LEDGERS:
    payload = sum(t.shape.num_elements() * t.dtype.size for t in tf.nest.flatten(values)
                  if t.shape.is_fully_defined())
    _LEDGERS[-1].add(kind if kind in KINDS else "other", int(payload), cross_replica)


def summarize(entries: list[tuple[str, int]], steps_per_call: int = 1) -> dict:
  """{collectives_per_step, bytes_per_step, by_kind: {kind: {count, bytes}}} for a step's
  entries; 'outputs' are per call and count 1/steps_per_call per step."""
  by_kind: dict[str, dict] = {}
  for kind, payload in entries:
    share = 1.0 / steps_per_call if kind == "outputs" else 1.0
    row = by_kind.setdefault(kind, {"count": 0.0, "bytes": 0.0})
    row["count"] += share
    row["bytes"] += share * payload
  return {"collectives_per_step": round(sum(r["count"] for r in by_kind.values()), 3),
          "bytes_per_step": round(sum(r["bytes"] for r in by_kind.values())),
          "by_kind": {k: {"count": round(v["count"], 3), "bytes": round(v["bytes"])}
                      for k, v in sorted(by_kind.items())}}


def graph_collectives(concrete_function) -> int:
  """Collective ops in a traced function and the functions it calls (0 in-process:
  MirroredStrategy reduces with copies and adds, not collective ops)."""
  graph_def = concrete_function.graph.as_graph_def()
  count = sum(node.op in COLLECTIVE_OPS for node in graph_def.node)
  count += sum(node.op in COLLECTIVE_OPS for f in graph_def.library.function
               for node in f.node_def)
  return count


def time_alone(strategy, entries: list[tuple[str, int]], repeats: int = 10) -> float:
  """Seconds the entries' all-reduces take run alone, in order, on strategy's replicas
  (every replica of a multi-worker cluster must call this together)."""
  sizes = [max(1, payload // 4) for kind, payload in entries if kind != "outputs"]
  if not sizes:
    return 0.0

  def chain():
    ctx, x = tf.distribute.get_replica_context(), tf.constant(0.0)
    for size in sizes:   # Each waits for the last, as a step's collectives do.
      x = tf.reduce_sum(ctx.all_reduce("sum", tf.fill([size], x * 0.0)))
    return x

  run = tf.function(lambda: strategy.run(chain))
  run()   # Trace and warm up.
  start = time.perf_counter()
  for _ in range(repeats):
    run()
  return (time.perf_counter() - start) / repeats
