"""Bytes on the wire of a launched cluster, from its namespace's loopback counters.

`replibench launch` runs every task in one private network namespace whose only
interface is its loopback (harness/netns.py), so the loopback's transmit counter
is every byte the cluster's tasks sent one another: collectives, parameter-server
reads and pushes, gRPC and TCP framing, coordination heartbeats. The chief reads
it around the timed run; evaluations (which may reduce metrics over workers) and
checkpoint saves (whose workers may synchronise: ~95 KB a save for a 2-worker
ResNet, 3 KB a step of a 30-step run, a fifth of top-k compression's step; none
inside the chief's save window in some runs) are counted apart, so
bytes_on_wire_per_step is what training steps send. What the cluster sent before
the timed run (its set-up, the variables' broadcast, the account's replays: 1.8 MB
for a 2-worker smoke-sized ResNet, more than its 20 steps) is init_bytes, counted
from the launcher's start of the cluster (netns.BASE_ENV).

Beside it the record states what the step's communication account predicts (the
collectives traced in the step, backward pass included, with the ring algorithms'
factors, plus the protocol overhead per transfer and per collective op and call,
measured on this link while the step's collectives ran alone at init:
engine/measure/communication.py), so measured and expected sit side by side. Outside
a launched namespace (a single process, or TF_CONFIG set by a cluster launcher) there
is no private wire to count, and the run has no `network` record.
"""

import contextlib

from replibench.harness import netns


class WireMeter:
  """Counts the namespace's loopback bytes over one session's timed run; evaluations
  and checkpoint saves (which synchronise the workers) are counted apart."""

  def __init__(self, step: int):
    self.enabled = netns.inside()
    self._start = self._read()
    # Start-up: the cluster's set-up, variable broadcast, tracing's collective
    # resolution and the account's replayed collectives, before the timed run.
    self.init_bytes = max(0, self._start - netns.cluster_start_bytes()) if self.enabled else 0
    self.apart_bytes = {"eval": 0, "checkpoint": 0}
    self._mark = (step, self._start, 0)   # The last scalars(): step, counter, apart bytes.

  @property
  def eval_bytes(self) -> int:
    return self.apart_bytes["eval"]

  def _apart(self) -> int:
    return sum(self.apart_bytes.values())

  def _read(self) -> int:
    return netns.loopback_bytes() if self.enabled else 0

  @contextlib.contextmanager
  def counted_apart(self, kind: str):
    """Counts the bytes sent inside this block as `kind`'s ('eval', 'checkpoint'), not
    training's."""
    before = self._read()
    try:
      yield
    finally:
      self.apart_bytes[kind] += self._read() - before

  def scalars(self, step: int) -> dict:
    """{'network/bytes_on_wire_per_step': training bytes per step since the last call}
    for TensorBoard, beside train/regime/bytes_communicated ({} outside a namespace)."""
    if not self.enabled:
      return {}
    now = self._read()
    last_step, last_bytes, last_apart = self._mark
    self._mark = (step, now, self._apart())
    if step <= last_step:
      return {}
    sent = now - last_bytes - (self._apart() - last_apart)
    return {"network/bytes_on_wire_per_step": sent / (step - last_step)}

  def record(self, steps: int, expected_per_step: float | None) -> dict | None:
    """result.json's `network` record for steps trained in this session (None outside
    a launched namespace).

    init_bytes: what the cluster sent from its start to the timed run (set-up, variable
    broadcast, the account's replays); bytes_on_wire: every byte the cluster sent in
    the timed run (init_bytes + bytes_on_wire is the link's count when the result is
    written; only the processes' shutdown comes after); eval_bytes and
    checkpoint_bytes: the evaluations' and checkpoint saves' shares;
    bytes_on_wire_per_step: (bytes_on_wire - eval_bytes - checkpoint_bytes) / steps;
    expected_bytes_per_step: the communication account's prediction for the whole
    cluster; measured_over_expected: their ratio (protocol overhead and traffic the
    account does not trace, such as heartbeats, make it exceed 1).
    """
    if not self.enabled:
      return None
    total = self._read() - self._start
    record = {"rate": netns.rate(), "init_bytes": self.init_bytes,
              "bytes_on_wire": total, "eval_bytes": self.eval_bytes,
              "checkpoint_bytes": self.apart_bytes["checkpoint"], "steps": steps}
    if steps > 0:
      per_step = (total - self._apart()) / steps
      record["bytes_on_wire_per_step"] = round(per_step)
      if expected_per_step:
        record["expected_bytes_per_step"] = round(expected_per_step)
        record["measured_over_expected"] = round(per_step / expected_per_step, 4)
    return record


def counter():
  """A callable returning the bytes sent so far on this launched cluster's link (None
  outside a launched namespace)."""
  return netns.loopback_bytes if netns.inside() else None


def expected_per_step(account: dict | None, num_replicas: int) -> float | None:
  """The cluster's bytes per step that the communication account predicts: each
  replica's ring-algorithm payload bytes, plus the protocol overhead measured when
  the step's collectives ran alone at init (per transfer, and per collective op and
  call of the step's function), times the replicas (one per worker task)."""
  if not account or account.get("wire_bytes_per_replica_per_step") is None:
    return None
  default = account.get("rpc_overhead_bytes_per_message", 0.0)
  per_transfer = account.get("rpc_overhead_bytes_by_collective") or {}
  messages = account.get("wire_messages_by_collective") or {
      "all_reduce": account.get("wire_messages_per_replica_per_step", 0)}
  overhead = sum(count * per_transfer.get(collective, default)
                 for collective, count in messages.items())
  per_call = account.get("rpc_overhead_bytes_per_call_by_collective") or {}
  ops = account.get("wire_ops_per_step_by_collective") or {}
  overhead += sum(count * per_call.get(collective, 0.0) for collective, count in ops.items())
  return (account["wire_bytes_per_replica_per_step"] + overhead) * num_replicas
