"""Learner-side feeder: actor transitions -> replay -> sampled batches.

    feeder = ReplayFeeder(pool, replay, step_batch=global_batch // workers, timeout_s=300)
    batch = feeder.sample(per_replica_batch)   # From the learner's input thread.

Rate limiting works both ways, like Reverb's SampleToInsertRatio: the learner
samples only while samples <= samples_per_insert * (inserts - min_size) +
tolerance (the replay's RateLimiter), and transitions are admitted to replay only
while the learner has less than two steps' worth of sampling credit left. Beyond
that the feeder stops reading the actors' pipes, so actors block on their
outboxes and leave the cores to the learner.

One lock serialises everything that touches the pool's pipes or the replay: the
input thread's sampling, priority updates from the training step, the
evaluator's reads of the pool (evaluation.py) and the pool's stop at close.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from replibench.rl import actors as actors_lib

_HEALTH_EVERY_S = 10.0   # Read the actors at least this often, even while replay is full.
_POLL_S = 0.05           # Longest single wait for actor data while holding the lock.


class ReplayFeeder:
  """Actor transitions -> replay -> sampled batches, thread-safe and never unbounded.

  pool: a started ActorPool. step_batch: items sampled per learner step by this
  feeder (global batch / workers), the unit of the insert-side gate.
  timeout_s: longest wait for one batch before a clear error.
  """

  def __init__(self, pool: actors_lib.ActorPool, replay, step_batch: int, timeout_s: float):
    self.pool, self.replay = pool, replay
    self.step_batch, self.timeout_s = step_batch, timeout_s
    self.lock = threading.RLock()
    self.closed = False
    self._readers = 0   # Generators (tf.data input threads) reading batches right now.
    self._inbox: list[dict] = []   # Drained but not yet admitted transitions (batches).
    self._last_drain = 0.0

  def add_batch(self, batch: dict) -> None:
    """ActorPool.drain's sink: keep transitions in the inbox until replay admits them."""
    self._inbox.append(batch)

  def wants_data(self) -> bool:
    """True while replay should take inserts: below min_size, or the learner's sampling
    credit is under two steps' worth."""
    limiter = self.replay.limiter
    if limiter.samples_per_insert is None or limiter.inserts < limiter.min_size:
      return True
    credit = (limiter.samples_per_insert * (limiter.inserts - limiter.min_size)
              + limiter.tolerance - limiter.samples)
    return credit < 2 * self.step_batch

  def pump(self, wait_s: float = 0.0) -> None:
    """Admits inbox data while wanted; reads the actors when the inbox is empty (waiting
    up to wait_s for data) or when they have not been read for _HEALTH_EVERY_S."""
    with self.lock:
      if self.closed:
        return
      self._admit()
      overdue = time.monotonic() - self._last_drain > _HEALTH_EVERY_S
      if (self.wants_data() and not self._inbox) or overdue:
        self._last_drain = time.monotonic()
        self.pool.drain(self, timeout=wait_s if self.wants_data() else 0.0)
        self._admit()

  def _admit(self) -> None:
    while self._inbox and self.wants_data():
      self.replay.add_batch(self._inbox.pop(0))

  def sample(self, batch_size: int) -> dict | None:
    """One batch of batch_size transitions (+ 'key', 'weight'), waiting for actors up to
    timeout_s; None once closed. TimeoutError says what the replay was waiting for."""
    deadline = time.monotonic() + self.timeout_s
    while not self.closed:
      with self.lock:
        self.pump()
        sample = self.replay.try_sample(batch_size)
        if sample is None:
          self.pump(wait_s=_POLL_S)
          sample = self.replay.try_sample(batch_size)
      if sample is not None:
        return {**sample.data, "key": sample.keys, "weight": sample.weights}
      if time.monotonic() > deadline:
        raise TimeoutError(self._starved_message(batch_size))
    return None

  def _starved_message(self, batch_size: int) -> str:
    limiter, stats = self.replay.limiter, self.pool.stats()
    return (f"D4PG: no batch of {batch_size} could be sampled from replay for "
            f"{self.timeout_s:.0f} s (D4PG.sample_timeout_s). Replay holds {len(self.replay)} "
            f"items (min_size {limiter.min_size}) after {limiter.inserts} inserts and "
            f"{limiter.samples} samples (samples_per_insert {limiter.samples_per_insert}, "
            f"tolerance {limiter.tolerance}); actors made {stats['env_steps']} env steps, "
            f"now {stats['env_steps_per_s']:.0f}/s, with {stats['restarts']} restart(s). "
            f"Actors too slow or stuck: check their logs, or lower min_size.")

  def batches(self, batch_size: int, convert):
    """Yields convert(batch) until the feeder is closed: the body of the learner's
    tf.data.Dataset.from_generator."""
    with self.lock:
      self._readers += 1
    try:
      while (batch := self.sample(batch_size)) is not None:
        yield convert(batch)
    finally:
      with self.lock:
        self._readers -= 1

  def close(self, wait_s: float = 0.25) -> None:
    """Stops sampling, then waits (up to wait_s) for the input threads to leave
    batches().

    Deleting a tf.data iterator waits for its input thread; if that thread is
    waiting for the GIL to run the generator while the deleting thread holds it,
    both wait forever. Once closed, the next call ends the generator, after which
    the thread never needs Python again; a thread still inside waits on a full
    prefetch buffer instead, which the iterator's deletion cancels.
    """
    self.closed = True
    deadline = time.monotonic() + wait_s
    while self._readers and time.monotonic() < deadline:
      time.sleep(0.01)   # Releases the GIL to the input threads.

  def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
    with self.lock:
      self.replay.update_priorities(keys, priorities)

  def stats(self) -> dict:
    with self.lock:
      return self.pool.stats()
