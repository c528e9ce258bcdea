"""Policy weights in shared memory: one writer (the learner), many readers (actors).

A seqlock instead of a lock: the writer makes the sequence number odd, copies,
then makes it even; a reader copies and keeps the copy only if the sequence
number was even and unchanged across the copy. Readers never block the writer,
and an actor killed mid-read (SIGKILL) leaves nothing locked behind.
Published version = sequence // 2 (1 after the first publish).
"""

from __future__ import annotations

import numpy as np


class SharedWeights:
  """A list of float32 arrays with fixed shapes, flattened into one shared buffer.

  Create in the parent with a spawn context and pass to child processes as a
  Process argument (shared ctypes can only be pickled while spawning).
  """

  def __init__(self, ctx, shapes: list[tuple[int, ...]]):
    self.shapes = [tuple(int(d) for d in s) for s in shapes]
    self._sizes = [int(np.prod(s)) for s in self.shapes]
    self._buffer = ctx.RawArray("f", max(1, sum(self._sizes)))
    self._sequence = ctx.RawValue("q", 0)

  @property
  def version(self) -> int:
    return self._sequence.value // 2

  def _flat(self) -> np.ndarray:
    return np.frombuffer(self._buffer, dtype=np.float32)

  def write(self, weights: list[np.ndarray]) -> int:
    """Publishes weights (same shapes as at construction); returns the new version."""
    shapes = [tuple(np.shape(w)) for w in weights]
    if shapes != self.shapes:
      raise ValueError(f"Published weight shapes {shapes} differ from the pool's "
                       f"{self.shapes} (given to ActorPool.start).")
    flat = self._flat()
    self._sequence.value += 1  # Odd: write in progress.
    offset = 0
    for w, size in zip(weights, self._sizes):
      flat[offset:offset + size] = np.asarray(w, np.float32).reshape(-1)
      offset += size
    self._sequence.value += 1
    return self.version

  def read(self, newer_than: int, attempts: int = 3) -> tuple[int, list[np.ndarray]] | None:
    """(version, weights) if a complete version newer than newer_than is available."""
    for _ in range(attempts):
      before = self._sequence.value
      if before // 2 <= newer_than:
        return None
      if before % 2:
        continue  # A write is in progress; try again.
      flat = self._flat().copy()
      if self._sequence.value == before:
        offsets = np.cumsum([0] + self._sizes)
        arrays = [flat[a:b].reshape(s) for a, b, s in zip(offsets[:-1], offsets[1:],
                                                           self.shapes)]
        return before // 2, arrays
    return None
