"""N-step transitions from a stream of dm_env time steps, never crossing episodes.

For steps t..t+m-1 of one episode (m = n, or fewer at the episode's end) with
rewards r_k and dm_env discounts d_k (the discount that came with r_k):

  reward   = sum_{k<m} (prod_{j<k} gamma * d_j) * r_k
  discount = prod_{k<m} gamma * d_k

so discount = gamma^m after a time-limit end (d = 1: bootstrap from the final
observation) and 0 after a termination (d = 0). When an episode ends, every
pending shorter transition is flushed with the final observation as its
next_observation.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import dm_env
import numpy as np


class Transition(NamedTuple):
  """One n-step transition; reward and discount are float32 scalars."""
  observation: np.ndarray
  action: np.ndarray
  reward: np.float32
  discount: np.float32
  next_observation: np.ndarray


class NStepAccumulator:
  """Turns (action, time step) pairs into n-step transitions as soon as they are complete.

  Usage: add_first(first time step), then add(action, time step) for each step,
  which returns the transitions that became complete (a list, maybe empty).
  After a LAST time step, call add_first again with the next episode's first.
  """

  def __init__(self, n: int, discount: float):
    if n < 1:
      raise ValueError(f"n-step needs n >= 1; got {n}.")
    self.n = n
    self.gamma = float(discount)
    self._observation = None
    # (observation, action, reward, env discount) for steps not yet n steps old.
    self._pending = collections.deque()

  def add_first(self, time_step: dm_env.TimeStep) -> None:
    if not time_step.first():
      raise ValueError("add_first expects a FIRST time step (from env.reset()).")
    self._pending.clear()
    self._observation = time_step.observation

  def add(self, action, time_step: dm_env.TimeStep) -> list[Transition]:
    if self._observation is None:
      raise ValueError("add() before add_first(): start each episode with its first step.")
    self._pending.append((self._observation, np.asarray(action), float(time_step.reward),
                          float(time_step.discount)))
    self._observation = time_step.observation
    ready = []
    if len(self._pending) == self.n:
      ready.append(self._transition(time_step.observation))
      self._pending.popleft()
    if time_step.last():
      while self._pending:
        ready.append(self._transition(time_step.observation))
        self._pending.popleft()
      self._observation = None
    return ready

  def _transition(self, next_observation) -> Transition:
    """The transition from the oldest pending step to next_observation."""
    reward, discount = 0.0, 1.0
    for _, _, r, d in self._pending:
      reward += discount * r
      discount *= self.gamma * d
    observation, action = self._pending[0][:2]
    return Transition(observation, action, np.float32(reward), np.float32(discount),
                      next_observation)


def stack_transitions(transitions: list[Transition]) -> dict[str, np.ndarray]:
  """Transitions -> dict of arrays with a leading batch axis (the replay's insert format)."""
  return {field: np.stack([getattr(t, field) for t in transitions])
          for field in Transition._fields}
