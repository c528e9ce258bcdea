"""What one asynchronous worker update sends between its worker and the parameter servers.

A worker update is one tf.function run on a worker whose variables live on the
ps. TensorFlow places every op that takes a ps variable's resource (reads,
assigns, the optimizer's training kernels) on that ps, with the ops colocated
with them (ParameterServerStrategy's colocate_with around each variable's
optimizer update); the rest runs on the worker. Each tensor that one device
produces and another consumes crosses the wire once per update (a _Send/_Recv
pair, which the receiver pulls with one RecvTensor call), however many ops
consume it there:

  pulls   ps -> worker: every ReadVariableOp (or other ps op) whose value the worker
          uses. TF does not merge reads: a variable read twice in a step crosses
          twice (ImageClassification's L2 term reads each decayed kernel a second
          time, whatever its weight_decay, 0.0 included; an SN-GAN update reads G and
          D once per call of each, and a spectral-normalised kernel twice a call).
  pushes  worker -> ps: what the worker computed for ps ops: each gradient into its
          variable's training kernel, batch-norm moving statistics, the learning
          rate, counters.

find_transfers reads them off the traced update (bytes: each tensor's static
elements times its dtype's size; constants are placed with their consumer and
never cross). account() states them in the communication account's wire format
(engine/measure/communication.py, read by harness/wire.expected_per_step) per worker
update, which under AsyncPS is per worker and harness step. measure_overheads
prices each transfer's protocol bytes (request, gRPC framing, TCP) and each
closure's (scheduling it, returning its outputs) on a launched cluster's wire at
init, by running closures that only read. Not looked into: the bodies of
control flow and function calls (a ps read inside a tf.cond, a tf.while_loop or a
nested tf.function is not counted; the op itself is placed on the worker).
"""

import collections

import tensorflow as tf

_CONSTANTS = ("Const", "HostConst")
_CALLS = ("If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
          "PartitionedCall", "StatefulPartitionedCall")   # Take handles, run elsewhere.
_WORKER = ""   # The placement of an op that runs on the worker.


class Transfers(collections.namedtuple("Transfers", "pulls pushes repeated_reads")):
  """Tensors crossing per update. pulls, pushes: [(tensor name, bytes)];
  repeated_reads: [(variable, bytes)] for each pulled read of a ps variable after
  its first in the update."""

  @property
  def pull_bytes(self) -> int:
    return sum(size for _, size in self.pulls)

  @property
  def push_bytes(self) -> int:
    return sum(size for _, size in self.pushes)


def _bytes(t: tf.Tensor) -> int:
  """Bytes of a statically shaped tensor (0 when its shape is not fully known)."""
  return t.shape.num_elements() * t.dtype.size if t.shape.is_fully_defined() else 0


def _ps_resources(graph, job: str) -> dict:
  """{placeholder name: device} of the graph's captured resources that live on a task
  of the parameter servers' job."""
  found = {}
  for external, internal in graph.captures:
    device = getattr(external, "device", "") or ""
    if internal.dtype == tf.resource and f"/job:{job}/" in device:
      found[internal.op.name] = device
  return found


def _resource_source(t: tf.Tensor) -> str:
  """The name of the op a resource handle comes from, through Identity ops."""
  op = t.op
  while op.type == "Identity" and op.inputs:
    op = op.inputs[0].op
  return op.name


def placement(graph, job: str = "ps") -> dict:
  """{op name: its ps device, or '' on the worker}, by TF's placement rules: an
  explicit device on the ps job, a ps resource input, or colocation with a ps op."""
  resources, placed = _ps_resources(graph, job), {}
  for op in graph.get_operations():   # In creation order: colocation targets come first.
    devices = [resources[_resource_source(t)] for t in op.inputs
               if t.dtype == tf.resource and _resource_source(t) in resources
               and op.type not in _CALLS]
    groups = [g.decode()[len("loc:@"):] for g in op.colocation_groups()]
    devices += [placed.get(name) or resources.get(name) for name in groups if name != op.name]
    if f"/job:{job}/" in op.device:
      devices.insert(0, op.device)
    placed[op.name] = resources.get(op.name) or next((d for d in devices if d), _WORKER)
  return placed


def find_transfers(graph, job: str = "ps") -> Transfers:
  """The tensors an update's traced graph (a FuncGraph) moves between the worker and
  the tasks of the parameter servers' job."""
  placed, resources = placement(graph, job), _ps_resources(graph, job)
  pulls, pushes = {}, {}
  for op in graph.get_operations():
    for t in op.inputs:
      if (t.dtype == tf.resource or t.op.type in _CONSTANTS
          or placed[t.op.name] == placed[op.name]):
        continue
      (pulls if placed[op.name] == _WORKER else pushes)[t.name] = _bytes(t)
  reads, repeated = collections.Counter(), []
  for name, size in sorted(pulls.items()):
    producer = graph.get_tensor_by_name(name).op
    variable = _resource_source(producer.inputs[0]) if producer.type == "ReadVariableOp" else None
    if variable in resources:
      reads[variable] += 1
      if reads[variable] > 1:
        repeated.append((variable, size))
  return Transfers(sorted(pulls.items()), sorted(pushes.items()), repeated)


def account(transfers: Transfers, overheads: dict | None = None) -> dict:
  """The communication account of one worker update (per worker and harness step):
  no collectives; the payload bytes and transfers in the wire format that
  harness/wire.expected_per_step reads; with overheads (measure_overheads), the
  protocol bytes of each transfer and of the closure."""
  messages = {"ps_pull": len(transfers.pulls), "ps_push": len(transfers.pushes), "closure": 1}
  found = {
      "collectives_per_step": 0.0, "bytes_per_step": 0, "by_kind": {},
      "parameter_server": {
          "pulls": {"count": messages["ps_pull"], "bytes": transfers.pull_bytes},
          "pushes": {"count": messages["ps_push"], "bytes": transfers.push_bytes},
          "repeated_reads": {"count": len(transfers.repeated_reads),
                             "bytes": sum(size for _, size in transfers.repeated_reads)}},
      "wire_bytes_per_replica_per_step": transfers.pull_bytes + transfers.push_bytes,
      "wire_messages_by_collective": messages,
      "wire_messages_per_replica_per_step": sum(messages.values()),
  }
  if overheads:
    per_transfer = overheads["per_transfer"]
    found["rpc_overhead_bytes_by_collective"] = {
        "ps_pull": per_transfer, "ps_push": per_transfer, "closure": overheads["per_closure"]}
    found["rpc_overhead_bytes_per_message"] = per_transfer
  return found


def _pulled_variables(graph, job: str) -> dict:
  """{placeholder name: (resource handle, dtype, bytes)} of each ps variable the update
  pulls a read of."""
  handles = {internal.op.name: external for external, internal in graph.captures}
  resources, found = _ps_resources(graph, job), {}
  for name, size in find_transfers(graph, job).pulls:
    producer = graph.get_tensor_by_name(name).op
    if producer.type == "ReadVariableOp":
      variable = _resource_source(producer.inputs[0])
      if variable in resources:
        found[variable] = (handles[variable], producer.get_attr("dtype"), size)
  return found


def _bytes_per_closure(coordinator, fn, wire_counter, repeats: int) -> float:
  """Bytes on the wire per scheduled closure of fn (after one that traces and warms up)."""
  coordinator.schedule(fn)
  coordinator.join()
  sent = wire_counter()
  for _ in range(repeats):
    coordinator.schedule(fn)
  coordinator.join()
  return (wire_counter() - sent) / repeats


def measure_overheads(coordinator, graph, outputs, wire_counter, repeats: int = 10,
                      job: str = "ps") -> dict:
  """Protocol bytes on the wire beyond payload, measured at init by closures that
  write nothing: {'per_closure': bytes of a closure that returns zeros shaped like
  the update's outputs, 'per_transfer': bytes beyond payload per variable of one
  that reads each ps variable the update pulls, once}. A push is the same
  RecvTensor call the other way and is priced alike.

  coordinator: the ClusterCoordinator; graph, outputs: the update's traced FuncGraph
  and structured outputs; wire_counter: a callable, bytes sent so far on the link;
  job: the parameter servers' job name in the cluster.
  """
  variables = _pulled_variables(graph, job)

  def zeros():
    return tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), outputs)

  def read_all():
    values = [tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
              for handle, dtype, _ in variables.values()]
    total = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in values]) * 0.0
    return tf.nest.map_structure(lambda t: t + tf.cast(total, t.dtype), zeros())

  per_closure = _bytes_per_closure(coordinator, tf.function(zeros), wire_counter, repeats)
  per_transfer = 0.0
  if variables:
    reading = _bytes_per_closure(coordinator, tf.function(read_all), wire_counter, repeats)
    payload = sum(size for _, _, size in variables.values())
    per_transfer = max(0.0, reading - per_closure - payload) / len(variables)
  return {"per_closure": round(per_closure, 1), "per_transfer": round(per_transfer, 1)}
