"""Env steps/s: a bare dm_control loop versus our actors, in one run.

1. bare: suite.load(...) stepped with uniform random actions in this process
   (with --pixels also rendering one frame per --action_repeat env steps, as the
   actors do): the ceiling for one core.
2. actors: ActorPool with 1, then 2 actor processes (full-size numpy policy,
   Gaussian noise, n-step accumulation, pipe to this process, which drains into
   a UniformReplay). Measured over --seconds after every actor has reported,
   from the actors' own env-step counters; 'delivered' counts transitions that
   reached the replay in the same window.

Prints one line per configuration and its ratio to the bare loop:

  bare     actors=0 env_steps_per_s=...
  actors   actors=1 env_steps_per_s=... per_actor=... delivered_per_s=... ratio=...

The policy weights are random (speed does not depend on their values), so this
process never loads TensorFlow, which must not share a process with EGL.

  python benchmarks/d4pg/actor_throughput.py --task=cartpole-swingup --seconds=10
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

# This process never loads TensorFlow, so the bare --pixels loop may render with EGL.
os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))  # The checkout.
from replibench.rl import actors  # noqa: E402
from replibench.rl import envs  # noqa: E402
from replibench.rl import numpy_policy  # noqa: E402
from replibench.rl import replay  # noqa: E402


def bare_steps_per_s(config: envs.EnvConfig, seconds: float) -> float:
  """Random-action steps/s of the raw suite environment (renders if config.pixels)."""
  from dm_control import suite
  domain, task = envs.check_task(config.task)
  env = suite.load(domain, task, task_kwargs={"random": 0})
  spec = env.action_spec()
  rng = np.random.default_rng(0)
  env.reset()
  steps, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    time_step = env.step(rng.uniform(spec.minimum, spec.maximum))
    if config.pixels and steps % config.action_repeat == 0:  # One frame per agent step.
      env.physics.render(config.image_size, config.image_size, camera_id=config.camera_id)
    steps += 1
    if time_step.last():
      env.reset()
  return steps / (time.perf_counter() - start)


def random_actor_weights(config: actors.ActorConfig) -> list[np.ndarray]:
  env = envs.make_env(config.env, seed=0)
  shapes = numpy_policy.actor_weight_shapes(
      env.observation_spec().shape, env.action_spec().shape[0], config.policy_sizes,
      config.env.pixels, config.embed_dim)
  rng = np.random.default_rng(0)  # Kernels ~ N(0, 1/fan_in); biases and scales 1.
  return [rng.normal(scale=np.prod(s[:-1]) ** -0.5, size=s).astype(np.float32)
          if len(s) > 1 else np.ones(s, np.float32) for s in shapes]


def pool_steps_per_s(config: actors.ActorConfig, num_actors: int,
                     seconds: float) -> tuple[float, list[float], float]:
  """(total env steps/s, per-actor env steps/s, transitions delivered/s)."""
  memory = replay.UniformReplay(capacity=200_000)
  with actors.ActorPool(config, num_actors=num_actors).start(
      random_actor_weights(config)) as pool:
    deadline = time.monotonic() + 120
    while not all(a["env_steps"] > 0 for a in pool.stats()["actors"]):
      if time.monotonic() > deadline:
        raise RuntimeError(f"Actors did not report within 120 s: {pool.stats()}")
      pool.drain(memory, timeout=0.5)
    before = [a["env_steps"] for a in pool.stats()["actors"]]
    inserts_before, start = memory.inserts, time.monotonic()
    while time.monotonic() - start < seconds:
      pool.drain(memory, timeout=0.2)
    elapsed = time.monotonic() - start
    after = [a["env_steps"] for a in pool.stats()["actors"]]
    delivered = (memory.inserts - inserts_before) / elapsed
  per_actor = [(b - a) / elapsed for a, b in zip(before, after)]
  return sum(per_actor), per_actor, delivered


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", default="cartpole-swingup")
  parser.add_argument("--pixels", action="store_true")
  parser.add_argument("--action_repeat", type=int, default=1)
  parser.add_argument("--seconds", type=float, default=10.0)
  parser.add_argument("--actors", default="1,2", help="comma-separated pool sizes")
  args = parser.parse_args(argv)
  env_config = envs.EnvConfig(task=args.task, pixels=args.pixels,
                              action_repeat=args.action_repeat)
  config = actors.ActorConfig(env=env_config, stats_every_s=0.5)
  print(f"task={args.task} pixels={args.pixels} action_repeat={args.action_repeat} "
        f"policy={config.policy_sizes} n_step={config.n_step} sigma={config.sigma} "
        f"cpus={os.cpu_count()}", flush=True)
  bare = bare_steps_per_s(env_config, args.seconds)
  print(f"bare     actors=0 env_steps_per_s={bare:.0f}", flush=True)
  for num_actors in [int(n) for n in args.actors.split(",")]:
    total, per_actor, delivered = pool_steps_per_s(config, num_actors, args.seconds)
    print(f"actors   actors={num_actors} env_steps_per_s={total:.0f} "
          f"per_actor={','.join(f'{r:.0f}' for r in per_actor)} "
          f"delivered_per_s={delivered:.0f} ratio={total / bare:.2f}", flush=True)


if __name__ == "__main__":
  main()
