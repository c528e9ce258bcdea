"""Replay memory for the learner process: uniform and proportional prioritized.

Items are dicts of numpy arrays (one transition: 'observation', 'action', ...);
storage is one preallocated ring buffer per field, shaped [capacity, *field]
and allocated from the first insert. When full, the oldest item is overwritten.
Every item gets a key, its insert count (0, 1, ...), so a priority update for
an item that has since been overwritten is recognised and dropped.

A samples-per-insert rate limiter (as Reverb's SampleToInsertRatio) keeps the
learner from running ahead of the actors: `can_sample(batch_size)` is False
while the table holds fewer than min_size items or while the items sampled so
far plus this batch exceed samples_per_insert * (inserts - min_size) + tolerance.
The learner then waits for more inserts (drains its actors) or skips a step.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import gin
import numpy as np

from replibench import inputs


class Sample(NamedTuple):
  """A sampled batch: data fields [B, ...], keys int64 [B], importance weights float32 [B]."""
  data: dict[str, np.ndarray]
  keys: np.ndarray
  weights: np.ndarray


class RateLimiter:
  """Samples-per-insert gate; counts are in items (a batch of B counts B samples).

  samples_per_insert None disables the ratio (only min_size gates).
  tolerance: how many item-samples the learner may run ahead of the ratio;
  default 10% of samples_per_insert * min_size, as in Acme's D4PG.
  """

  def __init__(self, min_size: int, samples_per_insert: float | None = None,
               tolerance: float | None = None):
    if min_size < 1:
      raise ValueError(f"min_size must be >= 1; got {min_size}.")
    self.min_size = min_size
    self.samples_per_insert = samples_per_insert
    if tolerance is None and samples_per_insert is not None:
      tolerance = 0.1 * samples_per_insert * min_size
    self.tolerance = tolerance
    self.inserts = 0
    self.samples = 0

  def can_sample(self, size: int, batch_size: int) -> bool:
    if size < self.min_size:
      return False
    if self.samples_per_insert is None:
      return True
    allowed = self.samples_per_insert * (self.inserts - self.min_size) + self.tolerance
    return self.samples + batch_size <= allowed


@gin.configurable
class UniformReplay:
  """Bounded FIFO replay with uniform sampling and a rate limiter."""

  def __init__(self, capacity: int, min_size: int = 1,
               samples_per_insert: float | None = None, tolerance: float | None = None,
               seed: int = 0):
    inputs.number("UniformReplay.capacity", capacity, 1, integer=True, meaning="transitions")
    inputs.number("UniformReplay.min_size", min_size, 1, capacity, integer=True,
                  meaning="at most UniformReplay.capacity")
    if samples_per_insert is not None:
      inputs.number("UniformReplay.samples_per_insert", samples_per_insert, 0, low_open=True)
    self.capacity = capacity
    self.limiter = RateLimiter(min_size, samples_per_insert, tolerance)
    self._rng = np.random.default_rng(seed)
    self._storage: dict[str, np.ndarray] | None = None
    self._keys = np.full(capacity, -1, np.int64)
    self._size = 0

  def __len__(self) -> int:
    return self._size

  @property
  def inserts(self) -> int:
    return self.limiter.inserts

  def _allocate(self, batch: Mapping[str, np.ndarray]) -> None:
    self._storage = {k: np.zeros((self.capacity,) + v.shape[1:], v.dtype)
                     for k, v in batch.items()}

  def add(self, item: Mapping[str, np.ndarray]) -> None:
    """Inserts one item: a dict of arrays without a batch axis."""
    self.add_batch({k: np.asarray(v)[None] for k, v in item.items()})

  def add_batch(self, batch: Mapping[str, np.ndarray]) -> None:
    """Inserts N items given as a dict of arrays with leading axis N, oldest first."""
    batch = {k: np.asarray(v) for k, v in batch.items()}
    n = len(next(iter(batch.values())))
    if n == 0:
      return
    if self._storage is None:
      self._allocate(batch)
    if batch.keys() != self._storage.keys():
      raise ValueError(f"Replay fields are {sorted(self._storage)}; got {sorted(batch)}.")
    if n > self.capacity:  # Only the newest `capacity` items would survive anyway.
      self.limiter.inserts += n - self.capacity
      batch = {k: v[-self.capacity:] for k, v in batch.items()}
      n = self.capacity
    keys = self.limiter.inserts + np.arange(n)
    slots = keys % self.capacity
    for k, v in batch.items():
      self._storage[k][slots] = v
    self._keys[slots] = keys
    self.limiter.inserts += n
    self._size = min(self._size + n, self.capacity)
    self._on_insert(slots)

  def _on_insert(self, slots: np.ndarray) -> None:
    """Hook for subclasses (new priorities)."""

  def can_sample(self, batch_size: int) -> bool:
    return self.limiter.can_sample(self._size, batch_size)

  def _choose(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(slots [B], importance weights [B]) for one batch."""
    slots = self._rng.integers(0, self._size, batch_size)
    return slots, np.ones(batch_size, np.float32)

  def sample(self, batch_size: int) -> Sample:
    """A batch of stored items; RuntimeError if the rate limiter does not allow it."""
    if not self.can_sample(batch_size):
      raise RuntimeError(
          f"Replay cannot sample {batch_size} items now (size {self._size}, min_size "
          f"{self.limiter.min_size}, {self.limiter.samples} sampled after "
          f"{self.limiter.inserts} inserts); check can_sample() or use try_sample().")
    slots, weights = self._choose(batch_size)
    self.limiter.samples += batch_size
    data = {k: v[slots] for k, v in self._storage.items()}
    return Sample(data, self._keys[slots], weights)

  def try_sample(self, batch_size: int) -> Sample | None:
    """A batch, or None when the rate limiter says the learner must wait."""
    return self.sample(batch_size) if self.can_sample(batch_size) else None

  def _live_slots(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots, mask) of keys whose items are still stored (not yet overwritten)."""
    keys = np.asarray(keys, np.int64)
    slots = keys % self.capacity
    return slots, self._keys[slots] == keys


class SumTree:
  """Binary tree of non-negative values with O(log N) update and prefix-sum search."""

  def __init__(self, capacity: int):
    self._leaves = 1 << max(1, int(np.ceil(np.log2(capacity))))
    self.capacity = capacity
    self._tree = np.zeros(2 * self._leaves, np.float64)  # Node i has children 2i, 2i+1.

  @property
  def total(self) -> float:
    return float(self._tree[1])

  def get(self, indices: np.ndarray) -> np.ndarray:
    return self._tree[np.asarray(indices) + self._leaves]

  def set(self, indices: np.ndarray, values: np.ndarray) -> None:
    nodes = np.asarray(indices, np.int64) + self._leaves
    self._tree[nodes] = values
    # Recompute (not increment) parents so rounding errors never accumulate.
    nodes = np.unique(nodes // 2)
    while True:
      self._tree[nodes] = self._tree[2 * nodes] + self._tree[2 * nodes + 1]
      if nodes[0] == 1:
        break
      nodes = np.unique(nodes // 2)

  def find(self, targets: np.ndarray) -> np.ndarray:
    """Leaf index i for each target in [0, total): prefix(i) <= target < prefix(i + 1)."""
    targets = np.array(targets, np.float64)
    nodes = np.ones(len(targets), np.int64)
    while nodes[0] < self._leaves:
      left = 2 * nodes
      go_right = targets >= self._tree[left]
      targets -= np.where(go_right, self._tree[left], 0.0)
      nodes = left + go_right
    # Rounding can step past the last non-zero leaf; stay within stored items.
    return np.minimum(nodes - self._leaves, self.capacity - 1)


@gin.configurable
class PrioritizedReplay(UniformReplay):
  """Proportional prioritized replay (Schaul et al. 2016) on a sum-tree.

  P(i) = p_i^alpha / sum_j p_j^alpha; new items get the largest priority seen so
  far. Importance weights (N * P(i))^-beta are divided by the batch maximum.
  Sampling is stratified: one draw per equal slice of the total priority mass.
  """

  def __init__(self, capacity: int, min_size: int = 1,
               samples_per_insert: float | None = None, tolerance: float | None = None,
               seed: int = 0, alpha: float = 0.6, beta: float = 0.4,
               epsilon: float = 1e-6):
    super().__init__(capacity, min_size, samples_per_insert, tolerance, seed)
    self.alpha, self.beta, self.epsilon = alpha, beta, epsilon
    self._tree = SumTree(capacity)
    self._max_priority = 1.0

  def _on_insert(self, slots: np.ndarray) -> None:
    self._tree.set(slots, np.full(len(slots), self._max_priority ** self.alpha))

  def _choose(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    total = self._tree.total
    bounds = np.arange(batch_size + 1) * (total / batch_size)
    targets = self._rng.uniform(bounds[:-1], bounds[1:])
    slots = self._tree.find(targets)
    probs = self._tree.get(slots) / total
    weights = (self._size * probs) ** -self.beta
    return slots, (weights / weights.max()).astype(np.float32)

  def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
    """Sets new priorities (e.g. |TD error| or the critic loss) for sampled keys.

    Keys whose items were overwritten since they were sampled are ignored.
    """
    priorities = np.abs(np.asarray(priorities, np.float64)) + self.epsilon
    slots, live = self._live_slots(keys)
    if not live.any():
      return
    self._max_priority = max(self._max_priority, float(priorities[live].max()))
    self._tree.set(slots[live], priorities[live] ** self.alpha)

  def priorities(self, keys: np.ndarray) -> np.ndarray:
    """Stored p^alpha of live keys (NaN for overwritten ones), for inspection/tests."""
    slots, live = self._live_slots(keys)
    return np.where(live, self._tree.get(slots), np.nan)
