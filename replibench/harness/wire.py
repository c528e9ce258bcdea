"""Bytes on the wire of a launched cluster, from its namespace's loopback counters.

`replibench launch` runs every task in one private network namespace whose only
interface is its loopback (harness/netns.py), so the loopback's transmit counter
is every byte the cluster's tasks sent one another: collectives, parameter-server
reads and pushes, gRPC and TCP framing, coordination heartbeats. The chief reads
it around the timed run; evaluations (which may reduce metrics over workers) and
checkpoint saves (whose workers may synchronise: ~95 KB a save for a 2-worker
ResNet, 3 KB a step of a 30-step run, a fifth of top-k compression's step; none
inside the chief's save window in some runs) are counted apart, so
bytes_on_wire_per_step is what training steps send.

Beside it the record states what the step's communication account predicts (the
collectives traced in the step, with the ring algorithms' factors, plus each
transfer's protocol overhead, measured on this link while the step's
collectives ran alone at init: engine/measure/communication.py), so measured and
expected sit side by side. Outside a launched namespace (a single process, or
TF_CONFIG set by a cluster launcher) there is no private wire to count, and the
run has no `network` record.
"""

import contextlib

from replibench.harness import netns


class WireMeter:
  """Counts the namespace's loopback bytes over one session's timed run; evaluations
  and checkpoint saves (which synchronise the workers) are counted apart."""

  def __init__(self, step: int):
    self.enabled = netns.inside()
    self._start = self._read()
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

    bytes_on_wire: every byte the cluster sent in the timed run; eval_bytes and
    checkpoint_bytes: the evaluations' and checkpoint saves' shares;
    bytes_on_wire_per_step: (bytes_on_wire - eval_bytes - checkpoint_bytes) / steps;
    expected_bytes_per_step: the communication account's prediction for the whole
    cluster; measured_over_expected: their ratio (protocol overhead and traffic the
    account does not trace, such as heartbeats, make it exceed 1).
    """
    if not self.enabled:
      return None
    total = self._read() - self._start
    record = {"rate": netns.rate(), "bytes_on_wire": total, "eval_bytes": self.eval_bytes,
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
  replica's ring-algorithm payload bytes plus, per transfer, the protocol overhead
  measured when the step's collectives ran alone at init, times the replicas (one
  per worker task)."""
  if not account or account.get("wire_bytes_per_replica_per_step") is None:
    return None
  default = account.get("rpc_overhead_bytes_per_message", 0.0)
  per_collective = account.get("rpc_overhead_bytes_by_collective") or {}
  messages = account.get("wire_messages_by_collective") or {
      "all_reduce": account.get("wire_messages_per_replica_per_step", 0)}
  overhead = sum(count * per_collective.get(collective, default)
                 for collective, count in messages.items())
  return (account["wire_bytes_per_replica_per_step"] + overhead) * num_replicas
