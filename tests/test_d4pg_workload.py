"""The D4PG workload: replicated learner math, the replay feeder, and actor failures.

The learner tests drive step_fn on a fixed in-memory batch (no actors); the
feeder tests use a fake pool; one test runs real actor processes and kills
them. The tiny end-to-end runs of configs/d4pg/*.gin through the harness are in
test_configs_end_to_end.py (their overrides are tests/helpers.py TINY).
"""

import functools
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from models import d4pg
from replibench import engine
from replibench.rl import envs
from replibench.rl import replay as replay_lib
from replibench.rl.feeder import ReplayFeeder
from replibench.workloads import d4pg as workload_lib
from replibench.workloads.base import TrainSpec

GLOBAL_BATCH = 8
STEPS = 3
DEADLINE_S = 90.0


def tiny_workload(pixels=False, replay=None, **kwargs):
  # A clip norm this small is always active: replicas must clip the global gradient.
  hparams = d4pg.D4PGHyperparams(target_update_period=2, clip_norm=0.05)
  networks = functools.partial(d4pg.D4PGNetworks, policy_sizes=(8, 8), critic_sizes=(8, 8),
                               num_atoms=11, v_max=10.0, v_min=-10.0, embed_dim=4,
                               hparams=hparams)
  env = envs.EnvConfig(pixels=pixels, image_size=16, time_limit=0.05)
  return workload_lib.D4PG(env=env, networks=networks, replay=replay, **kwargs)


def fixed_batch(networks, size=GLOBAL_BATCH):
  rng = np.random.default_rng(0)
  obs_shape = (size,) + networks.obs_shape
  if networks.pixels:
    obs = lambda: rng.integers(0, 256, obs_shape).astype(np.uint8)  # noqa: E731
  else:
    obs = lambda: rng.normal(size=obs_shape).astype(np.float32)  # noqa: E731
  return {"observation": obs(), "action": rng.uniform(-1, 1, (size, 1)).astype(np.float32),
          "reward": rng.uniform(0, 3, size).astype(np.float32),
          "discount": np.where(np.arange(size) % 4 == 0, 0.0, 0.95).astype(np.float32),
          "next_observation": obs(), "key": np.arange(size, dtype=np.int64),
          "weight": np.ones(size, np.float32)}


def train_on_fixed_batch(num_replicas, pixels=False):
  """STEPS replicated steps (+ after_train_call) on one fixed global batch.

  Uses prioritized replay, so the priority updates from inside the step run too.
  """
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"))
  work = tiny_workload(pixels, replay=functools.partial(replay_lib.PrioritizedReplay,
                                                        capacity=64))
  with replicator.scope():
    work.build_learner(TrainSpec(GLOBAL_BATCH, num_replicas, 0, 10.0, 100, replicator.regime))
  data = fixed_batch(work.networks)
  work.replay = work.replay_fn(seed=0)
  work.replay.add_batch({k: v for k, v in data.items() if k not in ("key", "weight")})
  work.feeder = ReplayFeeder(None, work.replay, GLOBAL_BATCH, timeout_s=1.0)

  def input_fn(ctx):
    # One pipeline; consecutive per-replica batches go to replicas 0, 1, ...: every
    # step sees the same global batch whatever the number of replicas.
    return tf.data.Dataset.from_tensor_slices(data).batch(ctx.per_replica_batch_size).repeat()

  batches = iter(replicator.distribute(input_fn, GLOBAL_BATCH))
  train = tf.function(lambda: replicator.reduce(replicator.run(work.step_fn, next(batches))))
  before = [v.numpy() for v in work.networks.critic.variables]
  for step in range(1, STEPS + 1):
    outputs = train()
    work.after_train_call(step)
  # The workload's outputs, plus the (Sync) regime's bytes sent per replica and, on
  # several replicas, its gradient norms for the noise scale.
  noise = {"regime/noise_small_sq", "regime/noise_big_sq"} if num_replicas > 1 else set()
  assert set(outputs) == {"loss", "critic_loss", "policy_loss", "regime/bytes_communicated",
                          *noise}
  assert np.isfinite(outputs["loss"]) and outputs["loss"] == outputs["critic_loss"]
  moved = [not np.array_equal(b, v.numpy()) for b, v in zip(before, work.networks.critic.variables)]
  assert any(moved)
  # Every replica sent its half of the keys: priorities left the initial 1.0.
  priorities = work.replay.priorities(data["key"])
  assert np.all(priorities != 1.0) and np.unique(priorities).size > 1
  return replicator, work


def all_variables(work):
  nets = work.networks
  models = [nets.policy, nets.critic, nets.target_policy, nets.target_critic]
  if nets.torso is not None:
    models += [nets.torso, nets.target_torso]
  variables = [v for m in models for v in m.variables]
  return variables + work.critic_optimizer.variables + work.policy_optimizer.variables


@pytest.mark.parametrize("pixels", [False, True], ids=["state", "pixels"])
def test_replicas_stay_identical_and_match_one_replica(pixels):
  _, single = train_on_fixed_batch(1, pixels)
  replicator, double = train_on_fixed_batch(2, pixels)
  nets = double.networks
  online = [v for v in nets.policy.variables + nets.critic.variables]
  assert len(all_variables(double)) > 2 * len(online)   # Targets and Adam slots too.
  for one, two in zip(all_variables(single), all_variables(double)):
    copies = [c.numpy() for c in replicator.strategy.experimental_local_results(two.value)]
    assert len(copies) == 2
    np.testing.assert_array_equal(copies[0], copies[1], err_msg=f"{two.path} differs")
    np.testing.assert_allclose(copies[0], one.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=f"{two.path}: 2 replicas != 1 replica")
  # target_update_period = 2: copied after step 2, then the online nets moved on.
  for online, target in nets.online_and_target_pairs():
    if online.trainable:
      assert not np.array_equal(online.numpy(), target.numpy()), online.path


class FakePool:
  """drain() hands over `per_drain` transitions (or nothing when starved)."""

  def __init__(self, per_drain=64, starved=False):
    self.per_drain, self.starved = per_drain, starved
    self.drained = 0

  def drain(self, sink, timeout=0.0):
    if self.starved:
      time.sleep(timeout)
      return 0
    n = self.per_drain
    sink.add_batch({"observation": np.zeros((n, 5), np.float32),
                    "action": np.zeros((n, 1), np.float32), "reward": np.ones(n, np.float32),
                    "discount": np.ones(n, np.float32),
                    "next_observation": np.zeros((n, 5), np.float32)})
    self.drained += n
    return n

  def stats(self):
    return {"env_steps": self.drained, "env_steps_per_s": 0.0, "restarts": 0}


def test_feeder_keeps_samples_per_insert_in_both_directions():
  replay = replay_lib.UniformReplay(capacity=10_000, min_size=100, samples_per_insert=4.0)
  pool = FakePool()
  feeder = ReplayFeeder(pool, replay, step_batch=32, timeout_s=5.0)
  for _ in range(200):
    batch = feeder.sample(32)
    assert batch["observation"].shape == (32, 5) and batch["key"].shape == (32,)
    # Learner side: never beyond the ratio plus tolerance.
    limiter = replay.limiter
    assert limiter.samples <= 4.0 * (limiter.inserts - 100) + limiter.tolerance
  # Insert side: actors were read only as the learner consumed (not 200 drains' worth).
  inserted = replay.limiter.inserts - 100
  assert replay.limiter.samples / inserted == pytest.approx(4.0, rel=0.15)
  assert pool.drained < 100 + 200 * 32 / 4.0 + 3 * 64


def test_feeder_starved_of_data_raises_a_clear_error_in_time():
  replay = replay_lib.UniformReplay(capacity=100, min_size=10)
  feeder = ReplayFeeder(FakePool(starved=True), replay, 8, timeout_s=0.3)
  start = time.monotonic()
  with pytest.raises(TimeoutError, match="sample_timeout_s.*min_size 10"):
    feeder.sample(8)
  assert time.monotonic() - start < 5.0


def test_killed_actors_are_restarted_then_end_the_run_with_a_clear_error():
  work = tiny_workload(replay=functools.partial(replay_lib.UniformReplay, capacity=500,
                                                min_size=8),
                       num_actors=1, max_restarts=1, sample_timeout_s=30.0)
  replicator = engine.Replicator(engine.Local(num_replicas=1, device="cpu"))
  try:
    with replicator.scope():
      work.build(TrainSpec(GLOBAL_BATCH, 1, 0, 10.0, 100, replicator.regime))
    batches = iter(work.input_fn(engine.InputContext(GLOBAL_BATCH, 0, 1, 1)))

    def pid():
      deadline = time.monotonic() + DEADLINE_S
      while (found := work.feeder.stats()["actors"][0]["pid"]) is None:
        assert time.monotonic() < deadline, "the actor never reported"
        next(batches)
      return found

    for killed in range(2):
      os.kill(pid(), signal.SIGKILL)
      deadline = time.monotonic() + DEADLINE_S
      try:
        while work.feeder.stats()["restarts"] == killed:
          assert time.monotonic() < deadline, "the killed actor went unnoticed"
          next(batches)
      except tf.errors.OpError as e:
        assert killed == 1, f"failed on the first crash: {e}"
        assert "No restarts left" in str(e) and "killed by signal 9" in str(e)
        break
    else:
      pytest.fail("the second crash did not end the run")
    assert work.host_metrics()["actors/restarts"] == 1
  finally:
    work.close()


class CountingFeeder:
  """A feeder whose batches number their items, counting the draws from replay."""

  def __init__(self):
    self.draws = []

  def batches(self, batch_size, convert):
    start = 0
    while True:
      self.draws.append(batch_size)
      n = np.arange(start, start + batch_size)
      yield convert({"observation": np.repeat(n[:, None], 5, 1).astype(np.float32),
                     "action": np.zeros((batch_size, 1)), "reward": n, "discount": n,
                     "next_observation": np.zeros((batch_size, 5)), "key": n,
                     "weight": np.ones(batch_size)})
      start += batch_size


@pytest.mark.parametrize("num_replicas", [1, 4])
def test_input_draws_once_a_step_for_all_local_replicas(num_replicas):
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"))
  work = tiny_workload()
  with replicator.scope():
    work.build_learner(TrainSpec(GLOBAL_BATCH, num_replicas, 0, 10.0, 100, replicator.regime))
  work.feeder = CountingFeeder()
  batches = iter(replicator.distribute(work.input_fn, GLOBAL_BATCH))
  for step in range(STEPS):
    keys = replicator.strategy.experimental_local_results(next(batches)["key"])
    # Replica r takes the r-th slice of one draw of the global batch.
    got = np.concatenate([k.numpy() for k in keys])
    np.testing.assert_array_equal(got, step * GLOBAL_BATCH + np.arange(GLOBAL_BATCH))
  # Each draw is the whole global batch (the prefetch may have taken more steps ahead).
  assert set(work.feeder.draws) == {GLOBAL_BATCH} and len(work.feeder.draws) >= STEPS
