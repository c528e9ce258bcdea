"""What runs inside one actor (or evaluator) process started by `ActorPool`.

The process imports numpy and dm_control but never TensorFlow (EGL rendering and
TensorFlow cannot share a process; see numpy_policy.py): the policy is the actor
network evaluated in numpy on one BLAS thread. It steps its own environment with
its own seed, acts with the latest policy the learner pushed (a WeightSubscriber,
weight_service.py) plus Gaussian noise (none for the evaluator), turns steps into
n-step transitions and sends messages to the learner over a pipe:

  ('transitions', dict of arrays [N, ...])   (actors only)
  ('stats', {'env_steps', 'env_steps_per_s', 'weights_version', 'weights_errors', 'pid'})
  ('episode', {'return', 'length', 'weights_version', 'env_steps'})
  ('error', traceback text)                   (then exit code 1)

A sender thread owns the pipe, so stepping continues while the learner is busy;
when its outbox is full the actor waits (backpressure), checking every 0.1 s
whether it should stop or the learner has gone.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
import time
import traceback

import gin
import numpy as np

from replibench.rl import envs
from replibench.rl import nstep
from replibench.rl import numpy_policy
from replibench.rl import weight_service

_POLL_S = 0.1  # Longest wait on anything before re-checking stop/learner liveness.


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ActorConfig:
  """Everything an actor process needs besides its seed (must be picklable).

  policy_sizes/embed_dim must match the learner's D4PGNetworks. sigma: std of
  the Gaussian exploration noise (actions are clipped to bounds afterwards).
  weight_poll_steps: agent steps between swaps to the newest pushed weights.
  send_every: transitions per message. outbox_size: messages an actor holds
  before it waits for the learner.
  """
  env: envs.EnvConfig = dataclasses.field(default_factory=envs.EnvConfig)
  policy_sizes: tuple[int, ...] = (256, 256, 256)
  embed_dim: int = 50
  n_step: int = 5
  discount: float = 0.99
  sigma: float = 0.3
  weight_poll_steps: int = 100
  send_every: int = 64
  stats_every_s: float = 1.0
  outbox_size: int = 16

  @classmethod
  def from_networks(cls, networks, env: envs.EnvConfig, **kwargs) -> "ActorConfig":
    """The config matching a models.d4pg.D4PGNetworks (read by attribute, no TF import)."""
    hparams = networks.hparams
    return cls(env=env, policy_sizes=networks.policy_sizes, embed_dim=networks.embed_dim,
               n_step=hparams.n_step, discount=hparams.discount, sigma=hparams.sigma,
               **kwargs)


class _LearnerGone(Exception):
  """The pool asked us to stop, or the learner process/pipe is gone."""


class _Outbox:
  """Bounded queue drained into the pipe by a daemon thread."""

  def __init__(self, conn, size: int, stop_flag, parent_pid: int):
    self._conn = conn
    self._queue = queue.Queue(maxsize=size)
    self._stop_flag = stop_flag
    self._parent_pid = parent_pid
    self._broken = threading.Event()
    self._thread = threading.Thread(target=self._send_loop, daemon=True)
    self._thread.start()

  def _send_loop(self):
    while True:
      try:
        message = self._queue.get(timeout=_POLL_S)
      except queue.Empty:
        continue
      if message is None:
        return
      try:
        self._conn.send(message)
      except (OSError, ValueError):  # BrokenPipeError: the learner is gone.
        self._broken.set()
        return

  def check(self) -> None:
    if self._stop_flag.value or self._broken.is_set() or os.getppid() != self._parent_pid:
      raise _LearnerGone()

  def put(self, message) -> None:
    while True:
      self.check()
      try:
        self._queue.put(message, timeout=_POLL_S)
        return
      except queue.Full:
        pass

  def flush(self, timeout_s: float) -> None:
    """Lets queued messages go out (best effort, bounded) before the process exits."""
    try:
      self._queue.put(None, timeout=timeout_s)
    except queue.Full:
      return
    self._thread.join(timeout_s)


class _Policy:
  """NumpyPolicy kept current from the learner's pushed weights (a WeightSubscriber)."""

  def __init__(self, config: ActorConfig, env, weights):
    obs_spec, action_spec = env.observation_spec(), env.action_spec()
    self._net = numpy_policy.NumpyPolicy(
        obs_spec.shape, action_spec.minimum, action_spec.maximum, config.policy_sizes,
        config.env.pixels, config.embed_dim)
    if self._net.shapes != weights.shapes:
      raise ValueError(
          f"The actor's policy (policy_sizes={config.policy_sizes}, pixels="
          f"{config.env.pixels}) has weight shapes {self._net.shapes}, but the learner "
          f"published {weights.shapes}: ActorConfig must match the learner's D4PGNetworks.")
    self._weights = weights
    self.version = 0

  def refresh(self) -> bool:
    """Loads the newest published weights, if newer than ours."""
    got = self._weights.read(self.version)
    if got is None:
      return False
    self.version, arrays = got
    self._net.set_weights(arrays)
    return True

  def __call__(self, observation: np.ndarray) -> np.ndarray:
    return self._net(observation)


def _run(config: ActorConfig, seed: int, evaluator: bool, outbox: _Outbox,
         source: weight_service.WeightSource):
  rng = np.random.default_rng(seed)
  env = envs.make_env(config.env, seed)
  weights = source.subscribe()
  policy = _Policy(config, env, weights)
  while not policy.refresh():  # The pool publishes before starting us: the first push.
    outbox.check()
    time.sleep(0.01)
  spec = env.action_spec()
  sigma = 0.0 if evaluator else config.sigma
  accumulator = nstep.NStepAccumulator(config.n_step, config.discount)
  pending: list[nstep.Transition] = []
  steps = 0
  last_stats_time, last_stats_steps = time.monotonic(), 0

  def stats(now: float) -> dict:
    rate = (steps - last_stats_steps) / max(now - last_stats_time, 1e-9)
    return {"env_steps": steps * config.env.action_repeat,
            "env_steps_per_s": rate * config.env.action_repeat,
            "weights_version": policy.version, "weights_errors": weights.errors,
            "pid": os.getpid()}

  outbox.put(("stats", stats(last_stats_time)))
  while True:
    if evaluator:
      policy.refresh()  # Evaluate one fixed policy per episode.
    time_step = env.reset()
    accumulator.add_first(time_step)
    episode_return, length = 0.0, 0
    while not time_step.last():
      action = policy(time_step.observation)
      if sigma:
        action = action + sigma * rng.standard_normal(action.shape).astype(np.float32)
      action = np.clip(action, spec.minimum, spec.maximum)
      time_step = env.step(action)
      steps += 1
      length += 1
      episode_return += time_step.reward
      if not evaluator:
        pending.extend(accumulator.add(action, time_step))
        if len(pending) >= config.send_every:
          outbox.put(("transitions", nstep.stack_transitions(pending)))
          pending = []
        if steps % config.weight_poll_steps == 0:
          policy.refresh()
      now = time.monotonic()
      if now - last_stats_time >= config.stats_every_s:
        outbox.put(("stats", stats(now)))
        last_stats_time, last_stats_steps = now, steps
    outbox.put(("episode", {"return": float(episode_return), "length": length,
                            "weights_version": policy.version,
                            "env_steps": steps * config.env.action_repeat}))


def actor_main(config: ActorConfig, seed: int, evaluator: bool, conn,
               weights: weight_service.WeightSource, stop_flag, parent_pid: int) -> None:
  """Process entry point; exits 0 when told to stop, 1 after reporting an error.

  Ends with os._exit: interpreter teardown of the EGL/MuJoCo contexts can crash
  and would turn a clean stop into a spurious failure.
  """
  outbox = _Outbox(conn, config.outbox_size, stop_flag, parent_pid)
  code = 0
  try:
    if config.env.pixels and "tensorflow" in sys.modules:
      raise RuntimeError(
          "TensorFlow is loaded in this pixel actor process, and EGL rendering crashes "
          "alongside it. Something imported it at spawn time: keep TensorFlow imports "
          "out of the modules an actor process loads.")
    _run(config, seed, evaluator, outbox, weights)
  except _LearnerGone:
    pass
  except BaseException:  # noqa: BLE001 -- Report anything to the learner, then fail.
    code = 1
    try:
      outbox.put(("error", traceback.format_exc()))
    except _LearnerGone:
      pass
  outbox.flush(timeout_s=2.0 if code else 0.0)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)
