"""dm_control environments, the numpy acting policy, the weight stream and the actor pool.

Pool tests use cartpole-swingup with 5-step episodes and 8-unit policies; every
wait is bounded by a deadline, so a regression fails instead of hanging.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from models import d4pg
from replibench.errors import UserError
from replibench.rl import actors
from replibench.rl import envs
from replibench.rl import numpy_policy
from replibench.rl import replay
from replibench.rl import weight_service

DEADLINE_S = 90.0  # Per wait; start-up of spawned actors takes a few seconds.


# -- environments ---------------------------------------------------------------

def rollout(env, actions):
  time_step = env.reset()
  observations, rewards = [time_step.observation], []
  for action in actions:
    time_step = env.step(action)
    observations.append(time_step.observation)
    rewards.append(time_step.reward)
  return np.array(observations), np.array(rewards), time_step


def test_state_env_is_flat_float32_deterministic_and_time_limited():
  config = envs.EnvConfig(time_limit=0.05)  # cartpole: 0.01 s per control step.
  env = envs.make_env(config, seed=3)
  assert env.observation_spec().shape == (5,)
  assert env.action_spec().dtype == np.float32 and env.action_spec().shape == (1,)
  actions = np.linspace(-1, 1, 5)[:, None]
  obs, rewards, last = rollout(env, actions)
  assert obs.dtype == np.float32 and obs.shape == (6, 5)
  assert last.last() and last.discount == 1.0  # Truncation, not termination.
  again, rewards_again, _ = rollout(envs.make_env(config, seed=3), actions)
  np.testing.assert_array_equal(obs, again)
  np.testing.assert_array_equal(rewards, rewards_again)
  other, _, _ = rollout(envs.make_env(config, seed=4), actions)
  assert not np.array_equal(obs[0], other[0])


def test_action_repeat_sums_rewards_over_env_steps():
  single = envs.make_env(envs.EnvConfig(task="walker-walk"), seed=0)
  repeated = envs.make_env(envs.EnvConfig(task="walker-walk", action_repeat=2), seed=0)
  actions = np.random.default_rng(0).uniform(-1, 1, (3, 6))
  obs1, rewards1, _ = rollout(single, np.repeat(actions, 2, axis=0))
  obs2, rewards2, _ = rollout(repeated, actions)
  np.testing.assert_allclose(obs2, obs1[::2], atol=1e-6)
  np.testing.assert_allclose(rewards2, rewards1.reshape(3, 2).sum(1), atol=1e-9)


def test_bad_task_name_lists_valid_ones():
  with pytest.raises(UserError, match="cartpole-swingup.*cheetah-run.*walker-walk"):
    envs.make_env(envs.EnvConfig(task="cartpole-swing"), seed=0)
  with pytest.raises(UserError, match="Unknown dm_control task"):
    actors.ActorPool(actors.ActorConfig(env=envs.EnvConfig(task="nope")))


def test_pixels_refuse_to_render_next_to_tensorflow():
  env = envs.make_env(envs.EnvConfig(pixels=True), seed=0)
  assert env.observation_spec().shape == (84, 84, 9)
  with pytest.raises(RuntimeError, match="EGL and TensorFlow"):
    env.reset()


_PIXEL_CHECK = textwrap.dedent("""
    import numpy as np
    from replibench.rl import envs
    config = envs.EnvConfig(pixels=True, action_repeat=4, time_limit=0.2)
    def run(seed):
      env = envs.make_env(config, seed)
      first = env.reset().observation
      return first, [env.step(np.ones(1)) for _ in range(3)]
    first, steps = run(0)
    assert first.shape == (84, 84, 9) and first.dtype == np.uint8, first.shape
    assert (first[..., :6] == first[..., 3:]).all()  # Reset stacks copies of one frame.
    second, last = steps[0].observation, steps[-1].observation
    assert (second[..., :6] == first[..., 3:]).all()  # The stack shifts by one frame.
    assert (last[..., 6:] != first[..., 6:]).any()  # The cart moved.
    assert not steps[-1].last()  # 3 agent steps x 4 = 12 of the 20 control steps.
    again, _ = run(0)
    assert (again == first).all()
    print("ok")
""")


def test_pixel_env_in_a_tensorflow_free_process():
  env = {**os.environ, "MUJOCO_GL": "egl"}
  result = subprocess.run([sys.executable, "-c", _PIXEL_CHECK], capture_output=True,
                          text=True, timeout=120, env=env)
  assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


# -- numpy policy and shared weights ----------------------------------------------

@pytest.mark.parametrize("pixels,obs_shape", [(False, (5,)), (True, (16, 16, 9))])
def test_numpy_policy_matches_the_keras_actor(pixels, obs_shape):
  low, high = [-1.0, -3.0], [1.0, 2.0]
  model = d4pg.make_actor_network(obs_shape, low, high, (8, 8), pixels=pixels, embed_dim=4)
  rng = np.random.default_rng(0)
  weights = [rng.normal(scale=0.5, size=w.shape).astype(np.float32)
             for w in model.get_weights()]
  model.set_weights(weights)
  policy = numpy_policy.NumpyPolicy(obs_shape, low, high, (8, 8), pixels, embed_dim=4)
  assert policy.shapes == [w.shape for w in weights]
  policy.set_weights(weights)
  for _ in range(3):
    if pixels:
      obs = rng.integers(0, 256, obs_shape).astype(np.uint8)
    else:
      obs = rng.normal(size=obs_shape).astype(np.float32)
    np.testing.assert_allclose(policy(obs), model(obs[None]).numpy()[0], atol=1e-5)
  with pytest.raises(ValueError, match="do not match"):
    policy.set_weights(weights[:-1])


def _wait_for(condition, what):
  deadline = time.monotonic() + DEADLINE_S
  while not (got := condition()):
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.01)
  return got


def test_weights_are_pushed_newest_version_first_and_shapes_are_kept():
  server = weight_service.WeightServer([(2, 3), (3,)])
  subscriber = server.source().subscribe()
  try:
    assert server.version == 0 and subscriber.read(0) is None
    first = [np.ones((2, 3)), np.arange(3.0)]
    assert server.publish(first) == 1
    version, got = _wait_for(lambda: subscriber.read(0), "version 1")
    assert version == 1 and all(np.array_equal(a, b) for a, b in zip(got, first))
    assert all(a.dtype == np.float32 for a in got)
    assert subscriber.read(1) is None   # Nothing newer.
    # A burst of versions: whatever the stream skipped, the newest arrives, whole.
    for k in range(2, 40):
      server.publish([np.full((2, 3), k), np.full(3, -k)])
    _wait_for(lambda: (subscriber.read(38) or (0,))[0] == 39, "version 39")
    _, got = subscriber.read(38)
    assert (got[0] == 39).all() and (got[1] == -39).all()
    with pytest.raises(ValueError, match="shapes"):
      server.publish([np.ones((3, 2)), np.ones(3)])
  finally:
    subscriber.close()
    server.stop()


def test_a_subscriber_started_before_the_first_push_and_one_after_a_stop():
  server = weight_service.WeightServer([(4,)])
  early = server.source().subscribe()
  late = None
  try:
    server.publish([np.arange(4.0)])
    _wait_for(lambda: early.read(0), "the first push")
    late = server.source().subscribe()     # Joins later: gets the newest version at once.
    assert _wait_for(lambda: late.read(0), "the late subscriber's push")[0] == 1
  finally:
    server.stop()                # Open streams end with the server (bounded by its grace).
    _wait_for(lambda: early.errors >= 1, "the broken stream")
    early.close()
    if late is not None:
      late.close()


def test_weight_server_listens_on_loopback_or_on_this_tasks_tf_config_host(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert weight_service.serving_host() == "127.0.0.1"
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.2:2223"]},
      "task": {"type": "worker", "index": 1}}))
  assert weight_service.serving_host() == "127.0.0.2"
  server = weight_service.WeightServer([(1,)], weight_service.serving_host())
  try:
    assert server.address.startswith("127.0.0.2:")
  finally:
    server.stop()
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["[::1]:2222"]}, "task": {"type": "worker", "index": 0}}))
  assert weight_service.serving_host() == "::1"


def test_the_actor_side_of_the_weight_stream_loads_no_tensorflow():
  """An actor imports the subscriber: grpcio alone, never TensorFlow (EGL, numpy_policy)."""
  done = subprocess.run(
      [sys.executable, "-c", "import sys, replibench.rl.actor_loop; "
       "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"],
      capture_output=True, text=True, check=True, timeout=120)
  assert done.stdout.strip() == "[]", done.stdout[:500]


# -- the actor pool -------------------------------------------------------------

def tiny_config(**kwargs):
  fields = dict(env=envs.EnvConfig(time_limit=0.05), policy_sizes=(8, 8), n_step=2,
                send_every=2, stats_every_s=0.05, weight_poll_steps=1)
  fields.update(kwargs)
  return actors.ActorConfig(**fields)


def drain_until(pool, memory, condition, what):
  deadline = time.monotonic() + DEADLINE_S
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}: {pool.stats()}"
    pool.drain(memory, timeout=0.5)


def replay_evaluation(pool, config, episodes, weights_by_version):
  """Undiscounted returns of the evaluator's episodes, recomputed in this process."""
  env = envs.make_env(config.env, pool.actor_seed(pool.num_actors))
  policy = numpy_policy.NumpyPolicy((5,), [-1.0], [1.0], config.policy_sizes, pixels=False)
  returns = []
  for episode in episodes:
    policy.set_weights(weights_by_version[episode["weights_version"]])
    time_step, total = env.reset(), 0.0
    while not time_step.last():
      time_step = env.step(policy(time_step.observation))
      total += time_step.reward
    returns.append(total)
  return returns


def test_pool_feeds_replay_updates_weights_and_restarts_killed_actors():
  config = tiny_config()
  network = d4pg.make_actor_network((5,), [-1.0], [1.0], config.policy_sizes)
  v1 = network.get_weights()
  rng = np.random.default_rng(0)
  v2 = [w + rng.normal(scale=0.5, size=w.shape).astype(np.float32) for w in v1]
  memory = replay.UniformReplay(capacity=10_000)
  pool = actors.ActorPool(config, num_actors=2, evaluator=True, max_restarts=1, seed=7)
  episodes = []
  with pool.start(v1):
    drain_until(pool, memory, lambda: len(memory) >= 40, "transitions")
    sample = memory.sample(40).data
    assert sample["observation"].shape == (40, 5) and sample["action"].shape == (40, 1)
    assert np.all(np.abs(sample["action"]) <= 1.0)
    assert sample["action"].std() > 0.05  # Gaussian noise on a near-constant policy.
    assert set(np.round(sample["discount"], 6)) <= {np.float32(0.99), np.float32(0.9801)}

    assert pool.publish(v2) == 2
    drain_until(pool, memory, lambda: all(
        a["weights_version"] == 2 for a in pool.stats()["actors"]), "weights version 2")
    drain_until(pool, memory, lambda: episodes.extend(pool.eval_results()) or any(
        e["weights_version"] == 2 for e in episodes), "an evaluation with version 2")
    returns = replay_evaluation(pool, config, episodes, {1: v1, 2: v2})
    np.testing.assert_allclose([e["return"] for e in episodes], returns, rtol=1e-6)
    stats = pool.stats()
    assert stats["env_steps"] > 0 and all(a["alive"] for a in stats["actors"])
    assert stats["evaluator"]["episodes"] >= 1

    victim = stats["actors"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    drain_until(pool, memory, lambda: pool.stats()["restarts"] == 1, "the restart")
    drain_until(pool, memory, lambda: pool.stats()["actors"][0]["pid"] not in (None, victim),
                "the restarted actor")
    assert pool.stats()["actors"][0]["incarnation"] == 1

    os.kill(pool.stats()["actors"][1]["pid"], signal.SIGKILL)
    with pytest.raises(actors.ActorCrashError, match="actor-1 .* killed by signal 9"):
      drain_until(pool, memory, lambda: False, "the crash error")
    assert not any(a["alive"] for a in pool.stats()["actors"])


def test_an_exception_in_an_actor_ends_the_run_with_its_traceback():
  pool = actors.ActorPool(tiny_config(), num_actors=1, max_restarts=0)
  memory = replay.UniformReplay(capacity=10)
  with pool.start([np.zeros((3, 3), np.float32)]):  # Not this policy's shapes.
    with pytest.raises(actors.ActorCrashError, match="(?s)raised.*ActorConfig must match"):
      drain_until(pool, memory, lambda: False, "the crash error")
  assert not pool.stats()["actors"][0]["alive"]


def test_pixel_actor_sends_stacked_frames():
  config = tiny_config(env=envs.EnvConfig(pixels=True, time_limit=0.05), embed_dim=4)
  network = d4pg.make_actor_network((84, 84, 9), [-1.0], [1.0], config.policy_sizes,
                                    pixels=True, embed_dim=4)
  memory = replay.UniformReplay(capacity=100)
  pool = actors.ActorPool(config, num_actors=1, max_restarts=0)
  with pool.start(network.get_weights()):
    drain_until(pool, memory, lambda: len(memory) >= 4, "pixel transitions")
  sample = memory.sample(4).data
  assert sample["observation"].shape == (4, 84, 84, 9)
  assert sample["observation"].dtype == np.uint8 and sample["observation"].any()


def test_actor_config_follows_the_networks():
  networks = d4pg.D4PGNetworks((5,), [-1.0], [1.0], policy_sizes=(8,), critic_sizes=(8,),
                               hparams=d4pg.D4PGHyperparams(n_step=3, sigma=0.1))
  config = actors.ActorConfig.from_networks(networks, envs.EnvConfig(), send_every=8)
  assert (config.policy_sizes, config.n_step, config.sigma, config.discount,
          config.send_every) == ((8,), 3, 0.1, 0.99, 8)
