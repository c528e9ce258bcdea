"""N-step accumulation, uniform and prioritized replay, and the rate limiter."""

import dm_env
import numpy as np
import pytest

from replibench.rl import nstep
from replibench.rl import replay

GAMMA = 0.5


def scripted_episodes(episodes):
  """Time steps of consecutive episodes; episode = (rewards, final dm_env discount).

  Observations count the steps of the whole stream (0, 1, 2, ...), so every
  transition shows which steps it joins; the action of step t is 10 * t.
  """
  obs = 0
  for rewards, final_discount in episodes:
    yield None, dm_env.restart(np.array([obs], np.float32))
    for i, reward in enumerate(rewards):
      obs += 1
      observation = np.array([obs], np.float32)
      action = np.array([10.0 * (obs - 1)], np.float32)
      if i < len(rewards) - 1:
        yield action, dm_env.transition(reward, observation)
      else:
        yield action, dm_env.TimeStep(dm_env.StepType.LAST, reward, final_discount,
                                      observation)
    obs += 1  # The next episode starts from a fresh observation.


def run(episodes, n):
  accumulator = nstep.NStepAccumulator(n, GAMMA)
  out = []
  for action, time_step in scripted_episodes(episodes):
    if time_step.first():
      accumulator.add_first(time_step)
    else:
      out += accumulator.add(action, time_step)
  return [(float(t.observation[0]), float(t.action[0]), float(t.reward), float(t.discount),
           float(t.next_observation[0])) for t in out]


def test_nstep_across_a_truncated_then_a_terminated_episode():
  # Episode A: steps 0->5, rewards 1..5, ends by time limit (discount 1).
  # Episode B: observations 6->8, rewards 10, 20, terminates (discount 0), shorter than n.
  got = run([([1, 2, 3, 4, 5], 1.0), ([10, 20], 0.0)], n=3)
  expected = [
      # (obs, action, reward, discount, next_obs)
      (0, 0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 3),
      (1, 10, 2 + 0.5 * 3 + 0.25 * 4, 0.125, 4),
      (2, 20, 3 + 0.5 * 4 + 0.25 * 5, 0.125, 5),
      (3, 30, 4 + 0.5 * 5, 0.25, 5),  # Flushed at the time limit: bootstrap, gamma^2.
      (4, 40, 5, 0.5, 5),
      (6, 60, 10 + 0.5 * 20, 0.0, 8),  # Terminal: no bootstrap.
      (7, 70, 20, 0.0, 8),
  ]
  np.testing.assert_allclose(got, expected, atol=1e-6)


def test_nstep_episodes_shorter_than_n_and_of_one_step():
  got = run([([1], 1.0), ([2, 3], 1.0), ([4], 0.0)], n=5)
  expected = [(0, 0, 1, 0.5, 1),
              (2, 20, 2 + 0.5 * 3, 0.25, 4), (3, 30, 3, 0.5, 4),
              (5, 50, 4, 0.0, 6)]
  np.testing.assert_allclose(got, expected, atol=1e-6)


def test_one_step_transitions_and_mid_episode_env_discounts():
  # A dm_env discount below 1 mid-episode scales later rewards and the bootstrap.
  accumulator = nstep.NStepAccumulator(2, GAMMA)
  accumulator.add_first(dm_env.restart(np.zeros(1)))
  assert accumulator.add(np.zeros(1), dm_env.transition(1.0, np.ones(1), 0.5)) == []
  (t,) = accumulator.add(np.zeros(1), dm_env.transition(2.0, np.ones(1) * 2))
  assert (t.reward, t.discount) == pytest.approx((1 + 0.5 * 0.5 * 2, 0.5 * 0.5 * 0.5))
  single = nstep.NStepAccumulator(1, 0.99)
  single.add_first(dm_env.restart(np.zeros(1)))
  (t,) = single.add(np.ones(1), dm_env.transition(3.0, np.ones(1)))
  assert (t.reward, t.discount) == pytest.approx((3.0, 0.99))


def items(values):
  values = np.asarray(values, np.float32)
  return {"observation": values[:, None] * np.ones((1, 2), np.float32), "reward": values}


def test_capacity_evicts_oldest_first_and_samples_only_stored_items():
  memory = replay.UniformReplay(capacity=4, seed=0)
  memory.add_batch(items([0, 1, 2]))
  memory.add({"observation": np.full(2, 3.0, np.float32), "reward": np.float32(3)})
  memory.add_batch(items([4, 5]))  # Overwrites 0 and 1.
  assert len(memory) == 4 and memory.inserts == 6
  sample = memory.sample(400)
  assert set(sample.data["reward"].tolist()) == {2.0, 3.0, 4.0, 5.0}
  np.testing.assert_array_equal(sample.keys, sample.data["reward"].astype(np.int64))
  np.testing.assert_array_equal(sample.data["observation"][:, 0], sample.data["reward"])
  assert sample.data["observation"].shape == (400, 2) and (sample.weights == 1).all()
  memory.add_batch(items(np.arange(10, 20)))  # More than capacity at once: newest survive.
  assert set(memory.sample(200).data["reward"].tolist()) == {16.0, 17.0, 18.0, 19.0}


def test_min_size_gates_sampling():
  memory = replay.UniformReplay(capacity=10, min_size=3)
  memory.add_batch(items([0, 1]))
  assert not memory.can_sample(1) and memory.try_sample(1) is None
  with pytest.raises(RuntimeError, match="cannot sample"):
    memory.sample(1)
  memory.add_batch(items([2]))
  assert memory.can_sample(8) and memory.sample(8).data["reward"].shape == (8,)


def test_rate_limiter_keeps_samples_per_insert_within_tolerance():
  memory = replay.UniformReplay(capacity=100, min_size=2, samples_per_insert=4,
                                tolerance=8)
  memory.add_batch(items(range(2)))
  # At min_size the learner may use the tolerance: 8 item-samples, in batches of 4.
  assert memory.try_sample(4) is not None and memory.try_sample(4) is not None
  assert memory.try_sample(4) is None  # 12 > 4 * 0 + 8: wait for inserts.
  memory.add_batch(items([2]))  # Allows 4 more.
  assert memory.try_sample(4) is not None and memory.try_sample(4) is None
  memory.add_batch(items(range(3, 13)))  # 10 inserts: 40 more.
  assert sum(memory.try_sample(4) is not None for _ in range(20)) == 10
  assert memory.limiter.samples == 52
  default = replay.RateLimiter(min_size=1000, samples_per_insert=32)
  assert default.tolerance == pytest.approx(3200)  # Acme: 10% of spi * min_size.


def test_rate_limiter_disabled_only_gates_on_min_size():
  memory = replay.UniformReplay(capacity=10, min_size=1)
  memory.add_batch(items([0]))
  assert all(memory.try_sample(32) is not None for _ in range(100))


def test_sum_tree_prefix_search():
  tree = replay.SumTree(5)
  tree.set(np.arange(5), np.array([1.0, 0.0, 2.0, 3.0, 4.0]))
  assert tree.total == 10.0
  np.testing.assert_array_equal(tree.find([0.0, 0.99, 1.0, 2.99, 3.0, 5.99, 6.0, 9.99]),
                                [0, 0, 2, 2, 3, 3, 4, 4])
  tree.set(np.array([4]), np.array([0.5]))
  assert tree.total == 6.5 and tree.find([6.4])[0] == 4


def test_prioritized_sampling_follows_priority_to_the_alpha():
  memory = replay.PrioritizedReplay(capacity=4, alpha=0.6, beta=0.4, seed=1)
  memory.add_batch(items([0, 1, 2, 3]))
  priorities = np.array([1.0, 2.0, 4.0, 8.0])
  memory.update_priorities(np.arange(4), priorities)
  counts = np.zeros(4)
  for _ in range(50):
    counts += np.bincount(memory.sample(200).keys, minlength=4)
  expected = priorities ** 0.6 / (priorities ** 0.6).sum()
  np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)
  # Importance weights (N P(i))^-beta, normalised by the batch maximum.
  sample = memory.sample(64)
  probs = expected[sample.keys]
  want = (4 * probs) ** -0.4
  np.testing.assert_allclose(sample.weights, want / want.max(), rtol=1e-5)


def test_prioritized_new_items_get_max_priority_and_stale_updates_are_dropped():
  memory = replay.PrioritizedReplay(capacity=2, alpha=1.0, epsilon=0.0, seed=0)
  memory.add_batch(items([0, 1]))
  memory.update_priorities(np.array([0, 1]), np.array([3.0, 1.0]))
  memory.add_batch(items([2]))  # Overwrites key 0 in its slot, with the max priority 3.
  np.testing.assert_allclose(memory.priorities(np.array([0, 1, 2])), [np.nan, 1.0, 3.0])
  memory.update_priorities(np.array([0]), np.array([100.0]))  # Key 0 is gone: ignored.
  np.testing.assert_allclose(memory.priorities(np.array([1, 2])), [1.0, 3.0])
  assert set(memory.sample(100).keys.tolist()) <= {1, 2}
