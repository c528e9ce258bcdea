"""Policy weights pushed from the learner to its actors over gRPC.

    server = WeightServer(shapes, host)      # learner process: listens on host, a free port
    server.publish(weights)                  # -> version 1, 2, ...
    source = server.source()                 # picklable: what a spawned actor needs
    # in the actor process (numpy only, never TensorFlow):
    weights = source.subscribe()             # a background thread receives every push
    weights.read(newer_than=version)         # -> (version, [arrays]) or None, never blocks

The transport is grpcio, the gRPC runtime TensorFlow's own cluster (TF_CONFIG)
speaks, used without TensorFlow: an actor must never load TensorFlow (EGL
rendering and TensorFlow crash one process, numpy_policy.py), and grpcio is its
own C library. One server-streaming method, `/replibench.Weights/Subscribe`: the
request is the version the actor holds, the stream carries each newer version as
it is published. A stream writes the newest version whenever the transport can
take one, so a slow actor skips versions instead of queueing them, and the learner
never waits for an actor (gRPC's flow control holds the stream, not publish()).
Messages are raw bytes, an 8-byte little-endian version and the float32 arrays
flattened in order, so no protobuf schema is compiled.

The server listens on 127.0.0.1, or in a TF_CONFIG cluster on this task's own
host (so inside the launcher's network namespace where it made one), on a port
the kernel picks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import struct
import threading
import time

import grpc
import numpy as np

from replibench import cluster

_SERVICE = "replibench.Weights"
_METHOD = f"/{_SERVICE}/Subscribe"
_VERSION = struct.Struct("<q")
_WAKE_S = 0.5   # A stream re-checks its RPC and the server's state at least this often.
_RETRY_S = 0.1  # A subscriber whose stream broke tries again after this long.
# Weights can exceed gRPC's default 4 MiB message limit (pixel torsos).
_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def _sizes(shapes) -> list[int]:
  return [int(np.prod(s)) for s in shapes]


def _unpack(message: bytes, shapes) -> list[np.ndarray]:
  """The arrays of a message (read-only views of it, past its version)."""
  flat = np.frombuffer(message, np.float32, offset=_VERSION.size)
  offsets = np.cumsum([0] + _sizes(shapes))
  return [flat[a:b].reshape(s) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]


def serving_host() -> str:
  """Where a learner's weight server listens: this task's TF_CONFIG host, else loopback."""
  if not cluster.present():
    return "127.0.0.1"
  host = cluster.current().address.rsplit(":", 1)[0]
  return host[1:-1] if host.startswith("[") else host


@dataclasses.dataclass(frozen=True)
class WeightSource:
  """Where a process subscribes to the learner's weights (picklable: spawn arguments)."""
  address: str
  shapes: tuple[tuple[int, ...], ...]

  def subscribe(self) -> "WeightSubscriber":
    return WeightSubscriber(self.address, self.shapes)


class WeightServer:
  """One writer (the learner), any number of streaming subscribers (actors, evaluator)."""

  def __init__(self, shapes, host: str = "127.0.0.1", max_subscribers: int = 16):
    self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    self._bytes = 4 * sum(_sizes(self.shapes))
    self._latest: tuple[int, bytes] = (0, b"")
    self._changed = threading.Condition()
    self._stopping = False
    # A sync server gives each open stream one thread for its life: one per subscriber.
    self._server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_subscribers, "replibench-weights"),
        handlers=[grpc.method_handlers_generic_handler(_SERVICE, {
            "Subscribe": grpc.unary_stream_rpc_method_handler(self._subscribe)})],
        options=_OPTIONS, maximum_concurrent_rpcs=max_subscribers)
    bracketed = f"[{host}]" if ":" in host else host
    port = self._server.add_insecure_port(f"{bracketed}:0")
    if not port:
      raise OSError(f"The actors' weight server could not listen on {host} (a free port).")
    self.address = f"{bracketed}:{port}"
    self._server.start()

  @property
  def version(self) -> int:
    return self._latest[0]

  def source(self) -> WeightSource:
    return WeightSource(self.address, self.shapes)

  def publish(self, weights: list[np.ndarray]) -> int:
    """Makes weights (same shapes as at construction) the newest version; returns it."""
    shapes = tuple(tuple(np.shape(w)) for w in weights)
    if shapes != self.shapes:
      raise ValueError(f"Published weight shapes {shapes} differ from the server's "
                       f"{self.shapes} (given to ActorPool.start).")
    with self._changed:
      version = self._latest[0] + 1
      message = bytearray(_VERSION.size + self._bytes)   # The arrays copied in once,
      _VERSION.pack_into(message, 0, version)
      flat = np.frombuffer(message, np.float32, offset=_VERSION.size)
      offset = 0
      for w in weights:
        size = int(np.size(w))
        flat[offset:offset + size] = np.ravel(w)
        offset += size
      self._latest = (version, bytes(message))             # then frozen (gRPC sends bytes).
      self._changed.notify_all()
    return version

  def _subscribe(self, request: bytes, context):
    """The stream of one subscriber: the newest version, each time there is one newer than
    the last it was sent (versions published meanwhile are skipped)."""
    have = _VERSION.unpack(request)[0]
    context.add_callback(self._wake)   # The subscriber went away: end this stream now.
    while True:
      with self._changed:
        self._changed.wait_for(lambda: self._stopping or not context.is_active()
                               or self._latest[0] > have, timeout=_WAKE_S)
        version, message = self._latest
      if self._stopping or not context.is_active():
        return
      if version > have:
        have = version
        yield message

  def _wake(self) -> None:
    with self._changed:
      self._changed.notify_all()

  def stop(self, grace_s: float = 1.0) -> None:
    """Ends every stream and stops listening; idempotent."""
    with self._changed:
      self._stopping = True
      self._changed.notify_all()
    self._server.stop(grace_s).wait(grace_s + 1.0)


class WeightSubscriber:
  """The actor's side: a daemon thread keeps the newest pushed version at hand."""

  def __init__(self, address: str, shapes):
    self.shapes = [tuple(s) for s in shapes]
    self._bytes = 4 * sum(_sizes(self.shapes))
    self._channel = grpc.insecure_channel(address, options=_OPTIONS)
    self._stream = self._channel.unary_stream(_METHOD)   # Raw bytes both ways.
    self._latest: tuple[int, bytes] | None = None
    self.errors = 0      # Streams that ended or broke (the learner's server stopped, a reset).
    self._failure: str | None = None
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._listen, name="weights", daemon=True)
    self._thread.start()

  def _listen(self) -> None:
    while not self._closed.is_set():
      have = self._latest[0] if self._latest else 0
      try:
        for message in self._stream(_VERSION.pack(have), wait_for_ready=True):
          if len(message) != _VERSION.size + self._bytes:
            self._failure = (f"The learner pushed a weights message of {len(message)} bytes; "
                             f"policy shapes {self.shapes} need {_VERSION.size + self._bytes}.")
            return
          self._latest = (_VERSION.unpack_from(message)[0], message)
      except grpc.RpcError:
        pass
      if self._closed.is_set():
        return
      self.errors += 1   # The stream ended or broke: subscribe again, from our version.
      time.sleep(_RETRY_S)

  def read(self, newer_than: int) -> tuple[int, list[np.ndarray]] | None:
    """(version, arrays) of the newest pushed version if newer than newer_than; else None.
    RuntimeError if the learner pushed weights of other shapes."""
    if self._failure:
      raise RuntimeError(self._failure)
    latest = self._latest
    if latest is None or latest[0] <= newer_than:
      return None
    version, message = latest
    return version, _unpack(message, self.shapes)

  def close(self) -> None:
    self._closed.set()
    self._channel.close()
