"""Learner-side pool of actor processes (and an optional evaluator) on this machine.

    pool = ActorPool(ActorConfig(...), num_actors=2, evaluator=True)
    with pool.start(networks.actor_weights()):
      while training:
        pool.drain(replay, timeout=1.0)     # transitions -> replay; crash checks
        ... learner step ...
        pool.publish(networks.actor_weights())
        pool.stats(); pool.eval_results()

Processes use the 'spawn' start method. Each actor has its own pipe whose write
end only that actor holds, so a killed actor yields EOF instead of a hang or a
corrupted shared queue; weights are pushed to every actor over gRPC
(weight_service.py: the pool's WeightServer, one stream an actor).
A crashed actor (non-zero or unexpected exit, a reported exception, or no
message for stall_timeout_s) is restarted with a new seed and a logged warning,
up to max_restarts times over the pool's life; after that the pool stops all
processes and raises ActorCrashError. Nothing here blocks without a timeout.

Actor processes never load TensorFlow (see numpy_policy.py); pixel actors get
MUJOCO_GL=egl. While a child starts, __main__ is hidden from spawn so a learner
script's top-level imports (TensorFlow) are not re-run in it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from typing import Any

from absl import logging
import gin
import numpy as np

from replibench.rl import envs
from replibench.rl.actor_loop import ActorConfig, actor_main
from replibench.rl import weight_service

__all__ = ["ActorConfig", "ActorCrashError", "ActorPool"]

_JOIN_TIMEOUT_S = 5.0  # Per process, at stop(), before terminate() and then kill().
# One thread per actor: the machine's cores are shared by all actors and the learner.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class ActorCrashError(RuntimeError):
  """An actor process failed and the pool has no restarts left; the run must end."""


@contextlib.contextmanager
def _spawn_conditions(env: dict[str, str]):
  """While starting a child: extra environment variables, and no __main__ re-import.

  Environment: BLAS/OpenMP thread pools are sized when numpy loads, which in a
  spawned child happens before any of our code runs; MUJOCO_GL likewise.
  __main__: spawn re-runs the parent's main module in the child, and a learner
  script that imports TensorFlow at top level would load it there (fatal next to
  EGL, and seconds of start-up). Actors need nothing from __main__.
  """
  saved_env = {k: os.environ.get(k) for k in env}
  main = sys.modules["__main__"]
  saved_main = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
  os.environ.update(env)
  main.__dict__.pop("__file__", None)
  main.__spec__ = None
  try:
    yield
  finally:
    for k, v in saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    main.__dict__.pop("__spec__", None)
    main.__dict__.update(saved_main)


@dataclasses.dataclass
class _Slot:
  """One actor position; its process is replaced on restart."""
  name: str
  index: int
  evaluator: bool
  incarnation: int = 0
  process: Any = None
  conn: Any = None
  started: float = 0.0
  last_message: float = 0.0
  error: str | None = None
  stats: dict = dataclasses.field(default_factory=dict)
  env_steps_before: int = 0  # Env steps of earlier (crashed) incarnations.
  episodes: int = 0  # Over all incarnations, counted from 'episode' messages.


@gin.configurable
class ActorPool:
  """num_actors exploring actors (+ an evaluator without noise) feeding one learner.

  seed: base seed; actor i, incarnation k gets a distinct seed derived from
  (seed, i, k). max_restarts: total restarts allowed across the pool.
  stall_timeout_s: an actor silent this long (including start-up) counts as
  crashed. max_messages: per actor per drain() call, so one fast actor cannot
  keep the learner draining forever. cores: pin every actor (and evaluator)
  process to these cores (rl/placement.py); None: they share this process's.
  weights_host: where the weight server listens (weight_service.serving_host():
  loopback, or this task's host in a TF_CONFIG cluster).
  """

  def __init__(self, config: ActorConfig | None = None, num_actors: int = 1, seed: int = 0,
               evaluator: bool = False, max_restarts: int = 3,
               stall_timeout_s: float = 300.0, max_messages: int = 256,
               cores: set[int] | None = None, weights_host: str = "127.0.0.1"):
    self.config = config or ActorConfig()
    envs.check_task(self.config.env.task)  # Fail in the learner, not in every child.
    if num_actors < 1:
      raise ValueError(f"ActorPool needs num_actors >= 1; got {num_actors}.")
    self.num_actors = num_actors
    self.seed = seed
    self.max_restarts = max_restarts
    self.stall_timeout_s = stall_timeout_s
    self.max_messages = max_messages
    self.cores = set(cores) if cores else None
    self.weights_host = weights_host
    self.restarts = 0
    self._ctx = multiprocessing.get_context("spawn")
    self._slots = [_Slot(f"actor-{i}", i, False) for i in range(num_actors)]
    if evaluator:
      self._slots.append(_Slot("evaluator", num_actors, True))
    self._weights: weight_service.WeightServer | None = None
    self._stop_flag = self._ctx.RawValue("b", 0)
    self._eval_results = collections.deque(maxlen=10_000)  # Bounded if never read.
    self._running = False

  # -- lifecycle ----------------------------------------------------------------

  def start(self, weights: list[np.ndarray]) -> "ActorPool":
    """Publishes the initial policy weights (fixing their shapes) and starts every process."""
    if self._running or self._weights is not None:
      raise RuntimeError("ActorPool.start() may be called once.")
    self._weights = weight_service.WeightServer(
        [np.shape(w) for w in weights], self.weights_host,
        max_subscribers=len(self._slots) + self.max_restarts + 2)
    self._weights.publish(weights)
    self._running = True
    atexit.register(self.stop)
    for slot in self._slots:
      self._spawn(slot)
    return self

  def stop(self) -> None:
    """Stops every process (asks, then terminates, then kills); idempotent."""
    if not self._running:
      return
    self._running = False
    atexit.unregister(self.stop)
    self._stop_flag.value = 1
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    for slot in self._slots:
      if slot.process is not None:
        slot.process.join(max(0.0, deadline - time.monotonic()))
    for slot in self._slots:
      self._end_process(slot)
    self._weights.stop()

  def __enter__(self) -> "ActorPool":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  def actor_seed(self, index: int, incarnation: int = 0) -> int:
    """Env/noise seed of actor `index` (num_actors = the evaluator) in an incarnation."""
    entropy = np.random.SeedSequence([self.seed, index, incarnation])
    return int(entropy.generate_state(1)[0] % (2**31 - 1))

  def _spawn(self, slot: _Slot) -> None:
    reader, writer = self._ctx.Pipe(duplex=False)
    slot.process = self._ctx.Process(
        target=actor_main, name=f"replibench-{slot.name}", daemon=True,
        args=(self.config, self.actor_seed(slot.index, slot.incarnation), slot.evaluator,
              writer, self._weights.source(), self._stop_flag, os.getpid()))
    child_env = {name: "1" for name in _THREAD_VARS}
    child_env["MUJOCO_GL"] = "egl" if self.config.env.pixels else "disable"
    with _spawn_conditions(child_env):
      slot.process.start()
    if self.cores:   # From here (a restarted actor too); its first instants ran unpinned.
      os.sched_setaffinity(slot.process.pid, self.cores)
    writer.close()  # The child holds the only write end: its death means EOF here.
    slot.conn = reader
    slot.started = slot.last_message = time.monotonic()
    slot.error = None
    slot.stats = {}

  @staticmethod
  def _end_process(slot: _Slot) -> None:
    process = slot.process
    if process is not None and process.is_alive():
      process.terminate()
      process.join(_JOIN_TIMEOUT_S)
      if process.is_alive():
        process.kill()
        process.join(_JOIN_TIMEOUT_S)
    if slot.conn is not None:
      slot.conn.close()
      slot.conn = None

  # -- learner API --------------------------------------------------------------

  def publish(self, weights: list[np.ndarray]) -> int:
    """Makes new policy weights available to every actor; returns their version."""
    if self._weights is None:
      raise RuntimeError("ActorPool.publish() before start().")
    return self._weights.publish(weights)

  @property
  def weights_version(self) -> int:
    return self._weights.version if self._weights is not None else 0

  def drain(self, replay, timeout: float = 0.0) -> int:
    """Moves pending transitions into replay (its add_batch); returns how many.

    With timeout > 0, waits up to that many seconds for at least one transition.
    Also detects crashed or stalled actors and restarts them, or raises
    ActorCrashError once restarts are exhausted.
    """
    if not self._running:
      raise RuntimeError("ActorPool.drain() on a pool that is not running.")
    deadline = time.monotonic() + timeout
    while True:
      moved = sum(self._read(slot, replay) for slot in self._slots)
      self._check_health(replay)
      remaining = deadline - time.monotonic()
      if moved or remaining <= 0:
        return moved
      waitables = [s.conn for s in self._slots if s.conn is not None]
      waitables += [s.process.sentinel for s in self._slots]
      multiprocessing.connection.wait(waitables, timeout=min(remaining, 1.0))

  def stats(self) -> dict:
    """Latest reported figures (as of the last drain()).

    Returns {'env_steps', 'env_steps_per_s', 'restarts', 'weights_version',
    'actors': [per-actor dicts], 'evaluator': dict or None}; per-actor dicts hold
    name, pid, alive, incarnation, env_steps and episodes (over all incarnations),
    env_steps_per_s, weights_version (the one it acts with), weights_errors (weight
    streams that ended or broke and were opened again), last_return.
    """
    per_slot = []
    for slot in self._slots:
      alive = slot.process is not None and slot.process.exitcode is None
      per_slot.append({
          "name": slot.name, "pid": slot.stats.get("pid"), "alive": alive,
          "incarnation": slot.incarnation,
          "env_steps": slot.env_steps_before + slot.stats.get("env_steps", 0),
          "env_steps_per_s": slot.stats.get("env_steps_per_s", 0.0),
          "episodes": slot.episodes,
          "weights_version": slot.stats.get("weights_version", 0),
          "weights_errors": slot.stats.get("weights_errors", 0),
          "last_return": slot.stats.get("last_return")})
    actors = [s for s, slot in zip(per_slot, self._slots) if not slot.evaluator]
    evaluator = [s for s, slot in zip(per_slot, self._slots) if slot.evaluator]
    return {"env_steps": sum(a["env_steps"] for a in actors),
            "env_steps_per_s": sum(a["env_steps_per_s"] for a in actors),
            "restarts": self.restarts, "weights_version": self.weights_version,
            "actors": actors, "evaluator": evaluator[0] if evaluator else None}

  def eval_results(self) -> list[dict]:
    """Evaluator episodes since the last call: {'return' (undiscounted), 'length',
    'weights_version', 'env_steps'}, oldest first."""
    results = list(self._eval_results)
    self._eval_results.clear()
    return results

  # -- messages and health ------------------------------------------------------

  def _read(self, slot: _Slot, replay) -> int:
    """Handles up to max_messages waiting messages of one actor; returns transitions moved."""
    moved = 0
    for _ in range(self.max_messages):
      if slot.conn is None:
        break
      try:
        if not slot.conn.poll():
          break
        kind, payload = slot.conn.recv()
      except (EOFError, OSError):  # Died, perhaps mid-message: the health check follows.
        slot.conn.close()
        slot.conn = None
        break
      slot.last_message = time.monotonic()
      if kind == "transitions":
        replay.add_batch(payload)
        moved += len(payload["reward"])
      elif kind == "stats":
        slot.stats.update(payload)
      elif kind == "episode":
        slot.episodes += 1
        slot.stats["last_return"] = payload["return"]
        if slot.evaluator:
          self._eval_results.append(payload)
      elif kind == "error":
        slot.error = payload
    return moved

  def _failure(self, slot: _Slot) -> str | None:
    """Why this slot's current process counts as crashed, or None if it is fine."""
    exitcode = slot.process.exitcode
    if exitcode is not None:
      how = (f"was killed by signal {-exitcode}" if exitcode < 0
             else f"exited with code {exitcode}")
      return f"{slot.name} (pid {slot.process.pid}) {how}"
    if slot.error is not None:
      return f"{slot.name} (pid {slot.process.pid}) raised an exception"
    silent = time.monotonic() - slot.last_message
    if silent > self.stall_timeout_s:
      return f"{slot.name} (pid {slot.process.pid}) sent nothing for {silent:.0f} s"
    return None

  def _check_health(self, replay) -> None:
    for slot in self._slots:
      reason = self._failure(slot)
      if reason is None:
        continue
      self._read(slot, replay)  # Keep what it sent before dying (and its traceback).
      if slot.error:
        reason += ":\n" + slot.error.rstrip()
      self._end_process(slot)
      if self.restarts >= self.max_restarts:
        self.stop()
        raise ActorCrashError(
            f"{reason}\nNo restarts left ({self.restarts} of max_restarts="
            f"{self.max_restarts} used); stopped all actor processes.")
      self.restarts += 1
      logging.warning("%s\nRestarting it (restart %d of %d).", reason, self.restarts,
                      self.max_restarts)
      slot.env_steps_before += slot.stats.get("env_steps", 0)
      slot.incarnation += 1
      self._spawn(slot)
