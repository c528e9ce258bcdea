"""DeepMind Control Suite tasks as dm_env environments with state or pixel observations.

Tasks are named 'domain-task' ('cartpole-swingup', 'walker-walk', 'cheetah-run',
or any other suite task). State observations are the task's observation dict
flattened in key order to float32 [obs_dim]. Pixel observations are 84x84 RGB
frames from `physics.render`, the last `frame_stack` frames concatenated on
channels: uint8 [84, 84, 3 * frame_stack].

Rendering uses EGL (Mesa on CPU-only machines), which cannot share a process
with TensorFlow: loading both segfaults, in either import order. So MUJOCO_GL
defaults to 'disable' (state tasks work anywhere, and the learner can import
this module and TensorFlow in any order); ActorPool starts pixel actors, which
never load TensorFlow, with MUJOCO_GL=egl. A standalone TF-free script that
renders must set MUJOCO_GL=egl itself before importing this module.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys

# Must precede the first dm_control import: the render backend is chosen then.
os.environ.setdefault("MUJOCO_GL", "disable")

import dm_env  # noqa: E402
from dm_env import specs  # noqa: E402
import gin  # noqa: E402
import numpy as np  # noqa: E402

from replibench import inputs  # noqa: E402
from replibench.errors import UserError  # noqa: E402

_NO_RENDERER = ("off", "disable", "disabled", "false", "0")  # dm_control's spellings.


@gin.configurable
@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """What an environment is; the seed comes separately (one per actor).

  action_repeat: env steps per agent step (rewards summed; pixel papers use 8
  for cartpole, 2 for walker). time_limit: episode length in seconds of
  simulated time (None = the task's own, 1000 control steps for these tasks);
  tests use tiny values for short episodes.
  """
  task: str = "cartpole-swingup"
  pixels: bool = False
  action_repeat: int = 1
  frame_stack: int = 3
  image_size: int = 84
  camera_id: int = 0
  time_limit: float | None = None

  def __post_init__(self):
    check = lambda key, *a, **k: inputs.number(  # noqa: E731
        f"EnvConfig.{key}", getattr(self, key), *a, **k)
    check("action_repeat", 1, integer=True, meaning="env steps per agent step")
    check("frame_stack", 1, integer=True)
    check("image_size", 8, 1024, integer=True, meaning="pixels a side")
    check("camera_id", 0, integer=True)
    if self.time_limit is not None:
      check("time_limit", 0, low_open=True, meaning="seconds of simulated time; None: the "
                                                    "task's own")


def task_names() -> list[str]:
  """Every valid task name, 'domain-task'."""
  from dm_control import suite
  return sorted(f"{domain}-{task}" for domain, task in suite.ALL_TASKS)


def check_task(task: str) -> tuple[str, str]:
  """(domain, task) for a 'domain-task' name; UserError listing valid names otherwise."""
  from dm_control import suite
  domain, _, task_name = task.partition("-")
  if (domain, task_name) not in suite.ALL_TASKS:
    raise UserError(
        f"Unknown dm_control task {task!r} (EnvConfig.task). Tasks are named "
        f"'domain-task'; valid names: {', '.join(task_names())}.")
  return domain, task_name


def flatten_observation(observation: collections.OrderedDict) -> np.ndarray:
  """The observation dict's values, each flattened, concatenated as float32 [obs_dim]."""
  parts = [np.asarray(v, np.float32).reshape(-1) for v in observation.values()]
  return np.concatenate(parts)


class ControlEnv(dm_env.Environment):
  """A dm_control suite task with flattened-state or stacked-pixel observations."""

  def __init__(self, config: EnvConfig, seed: int):
    from dm_control import suite
    if config.action_repeat < 1:
      raise UserError(f"EnvConfig.action_repeat must be >= 1; got {config.action_repeat}.")
    domain, task = check_task(config.task)
    task_kwargs = {"random": seed}
    if config.time_limit is not None:
      task_kwargs["time_limit"] = config.time_limit
    self.config = config
    self._env = suite.load(domain, task, task_kwargs=task_kwargs)
    self._frames = collections.deque(maxlen=config.frame_stack)
    self._needs_reset = True
    spec = self._env.action_spec()
    self._action_spec = specs.BoundedArray(
        spec.shape, np.float32, spec.minimum.astype(np.float32),
        spec.maximum.astype(np.float32), name="action")

  @property
  def physics(self):
    return self._env.physics

  def _render(self) -> np.ndarray:
    if os.environ.get("MUJOCO_GL") in _NO_RENDERER or "tensorflow" in sys.modules:
      raise RuntimeError(
          f"Pixel observations need EGL rendering, unavailable in this process "
          f"(MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}, TensorFlow loaded: "
          f"{'tensorflow' in sys.modules}). EGL and TensorFlow crash when loaded "
          f"together: run pixel environments in actor processes (ActorPool), or in a "
          f"TensorFlow-free process started with MUJOCO_GL=egl.")
    size = self.config.image_size
    return self._env.physics.render(size, size, camera_id=self.config.camera_id)

  def _observe(self, time_step: dm_env.TimeStep, first: bool) -> np.ndarray:
    if not self.config.pixels:
      return flatten_observation(time_step.observation)
    frame = self._render()
    if first:  # Start the stack with copies of the first frame.
      self._frames.extend([frame] * self.config.frame_stack)
    else:
      self._frames.append(frame)
    return np.concatenate(self._frames, axis=-1)

  def reset(self) -> dm_env.TimeStep:
    self._needs_reset = False
    time_step = self._env.reset()
    return time_step._replace(observation=self._observe(time_step, first=True))

  def step(self, action) -> dm_env.TimeStep:
    """One agent step = action_repeat env steps; rewards summed, discounts multiplied.

    As dm_env specifies, a step after the LAST step starts a new episode instead.
    """
    if self._needs_reset:
      return self.reset()
    action = np.asarray(action, np.float64)
    reward, discount = 0.0, 1.0
    for _ in range(self.config.action_repeat):
      time_step = self._env.step(action)
      reward += time_step.reward or 0.0
      discount *= time_step.discount
      if time_step.last():
        self._needs_reset = True
        break
    return dm_env.TimeStep(time_step.step_type, reward, discount,
                           self._observe(time_step, first=False))

  def observation_spec(self) -> specs.Array:
    if self.config.pixels:
      size, channels = self.config.image_size, 3 * self.config.frame_stack
      return specs.Array((size, size, channels), np.uint8, name="observation")
    dim = sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
    return specs.Array((dim,), np.float32, name="observation")

  def action_spec(self) -> specs.BoundedArray:
    return self._action_spec

  def close(self):
    self._env.close()


def make_env(config: EnvConfig, seed: int) -> ControlEnv:
  """The environment described by config; the same seed gives the same episodes."""
  return ControlEnv(config, seed)
