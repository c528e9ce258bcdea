"""Evaluation of the D4PG policy: undiscounted returns of noise-free episodes.

    evaluator = Evaluator(env_config, episodes=5, seed=seed)           # State tasks.
    evaluator = Evaluator(env_config, episodes=5, seed=seed, feeder=feeder)   # Pixels.
    returns = evaluator.returns(networks)   # [episodes] floats, at the current weights.
    evaluator.close()

State tasks are evaluated in the learner process: synchronous, the exact policy
at that step, and no core spent between evaluations. Pixel tasks need EGL, which
cannot share a process with TensorFlow (see envs.py), so the pool's evaluator
process plays them after the learner publishes its current weights.
"""

from __future__ import annotations

import time

from replibench.rl import envs
from replibench.rl import numpy_policy
from replibench.rl.feeder import ReplayFeeder

# Longest single wait for evaluator results while holding the feeder's lock (which
# the learner's input thread needs to sample).
_POLL_S = 0.05
_SEED_STRIDE = 7919   # Between the env seeds of consecutive in-process episodes.


class Evaluator:
  """Plays `episodes` noise-free episodes per call of returns(), here or in the pool.

  env_config: the task. seed: this worker's seed; in-process episode i always
  runs on its own environment, seeded seed + 7919 * i when first used and reset
  for every later evaluation. feeder: None plays the episodes in this process
  (state observations only); otherwise the evaluator process of feeder.pool (an
  ActorPool started with evaluator=True) plays them, read under feeder.lock with
  the actors' transitions going to the feeder as usual. timeout_s: longest wait
  for the evaluator process's episodes before a clear error.
  """

  def __init__(self, env_config: envs.EnvConfig, episodes: int, seed: int = 0,
               feeder: ReplayFeeder | None = None, timeout_s: float = 300.0):
    self.env_config, self.episodes, self.seed = env_config, episodes, seed
    self.feeder, self.timeout_s = feeder, timeout_s
    self._envs = []   # In-process episode i's environment, created on first use.

  def returns(self, networks) -> list[float]:
    """Undiscounted returns [episodes] of the policy with networks' current weights.

    networks: the learner's D4PGNetworks (its actor weights and policy settings).
    """
    if self.feeder is not None:
      return self._returns_from_evaluator(networks)
    return self._returns_here(networks)

  def close(self) -> None:
    """Closes the in-process environments (the pool belongs to its owner)."""
    for env in self._envs:
      env.close()
    self._envs = []

  def _episode_here(self, policy: numpy_policy.NumpyPolicy, index: int) -> float:
    if len(self._envs) <= index:
      self._envs.append(envs.make_env(self.env_config, seed=self.seed + _SEED_STRIDE * index))
    env = self._envs[index]
    time_step, total = env.reset(), 0.0
    while not time_step.last():
      time_step = env.step(policy(time_step.observation))
      total += time_step.reward
    return total

  def _returns_here(self, nets) -> list[float]:
    """episodes noise-free episodes in this process (state observations only)."""
    policy = numpy_policy.NumpyPolicy(nets.obs_shape, nets.action_low, nets.action_high,
                                      nets.policy_sizes, False, nets.embed_dim)
    policy.set_weights(nets.actor_weights())
    return [self._episode_here(policy, i) for i in range(self.episodes)]

  def _returns_from_evaluator(self, networks) -> list[float]:
    """episodes episodes the evaluator process starts after the current weights."""
    feeder, pool = self.feeder, self.feeder.pool
    version = pool.publish(networks.actor_weights())
    deadline = time.monotonic() + self.timeout_s
    returns = []
    while len(returns) < self.episodes:
      if time.monotonic() > deadline:
        raise TimeoutError(
            f"D4PG: the evaluator finished {len(returns)} of {self.episodes} episodes "
            f"with weights version {version} in {self.timeout_s:.0f} s "
            f"(D4PG.sample_timeout_s); evaluator stats: {pool.stats()['evaluator']}.")
      with feeder.lock:
        pool.drain(feeder, timeout=_POLL_S)
        returns += [e["return"] for e in pool.eval_results()
                    if e["weights_version"] >= version]
    return returns[:self.episodes]
