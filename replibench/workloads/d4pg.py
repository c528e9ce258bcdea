"""D4PG (Barth-Maron et al. 2018) on the DeepMind Control Suite as a replicated workload.

The paper's third TF-Replicator experiment: a distributed distributional
actor-critic. Here, per learner process (one per worker):

  actors (ActorPool, 'spawn' processes, numpy policy, no TensorFlow)
    <--gRPC-- policy weights pushed every publish_every_steps (rl/weight_service.py)
    --pipes--> ReplayFeeder: inbox -> replay (admitted only while the learner
    can use the data) -> per-replica batches (tf.data.Dataset.from_generator)
    --> step_fn on every replica: distributional critic + policy updates
    --> after_train_call: target networks and actor weights refreshed on the host.

The RL plumbing lives in replibench/rl: the two-way rate limiting between actors
and learner in feeder.py, the noise-free evaluation episodes (in this process for
state tasks, in the pool's evaluator process for pixels) in evaluation.py.

With a MultiWorker topology each worker runs its own actors and replay (like
the distributed D4PG learners); gradients are all-reduced by the engine and
evaluation results are averaged over workers, so every worker decides the same.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable

from absl import logging
import gin
import keras
import numpy as np
import tensorflow as tf

from models import d4pg
from replibench import cluster, engine, errors, inputs
from replibench.engine.measure import cost
from replibench.errors import UserError
from replibench.rl import actors as actors_lib
from replibench.rl import envs
from replibench.rl import evaluation
from replibench.rl import placement
from replibench.rl import replay as replay_lib
from replibench.rl import weight_service
from replibench.rl.feeder import ReplayFeeder
from replibench.workloads import build_once, precision
from replibench.workloads.base import TrainSpec, Workload


def _worker_position() -> tuple[int, int]:
  """(this process's index, number of training processes); (0, 1) on one process."""
  if not isinstance(tf.distribute.get_strategy(),
                    tf.distribute.MultiWorkerMirroredStrategy) or not cluster.present():
    return 0, 1
  spec = cluster.current()
  return spec.worker_index, spec.training_processes


@gin.configurable
class D4PG(Workload):
  """Distributional actor-critic with K local actors; target metric eval/return.

  eval/return is the average undiscounted return of eval_episodes noise-free
  episodes (higher is better; 1000 is the maximum on these tasks).

  env: the task. networks: D4PGNetworks factory (sizes, support and
  D4PGHyperparams come from gin; the batch is Experiment.global_batch_size).
  replay: factory taking seed=, e.g. @UniformReplay or @PrioritizedReplay
  (priorities are the per-example critic losses). epoch_size: sampled
  transitions per epoch, i.e. learner steps per epoch times the global batch.
  publish_every_steps: learner steps between policy-weight publications to the
  actors. separate_evaluator: evaluate in the pool's evaluator process (None:
  only where pixels require it). synthetic: a SyntheticTransitions source
  (replibench/data/synthetic.py) feeds the learner instead of actors and replay:
  no environment is built or stepped, nothing is evaluated, and the run reports
  learner throughput only. actor_cores: cores of their own for the actor
  processes (the last actor_cores of this process's cores; the learner process is
  pinned to the others); 0 (default): actors and learner share every core. More
  than this process's cores less one is bad input (rl/placement.py).
  """

  target_metric = "eval/return"
  higher_is_better = True
  target_range = (0.0, 1000.0)   # dm_control: rewards in [0, 1] over 1,000-step episodes.
  host_local_input = True   # The learner samples the replay its actors fill in this process.
  # Evaluation episodes are not timed (as MLPerf's RL benchmark leaves its evaluation
  # games out of time to train): time to target is the learner's training time.
  timed_evaluation = False

  def __init__(self, env: envs.EnvConfig | None = None, name: str = "d4pg",
               networks: Callable[..., d4pg.D4PGNetworks] = d4pg.D4PGNetworks,
               replay: Callable | None = None, num_actors: int = 2,
               epoch_size: int = 256_000, publish_every_steps: int = 10,
               eval_episodes: int = 5, separate_evaluator: bool | None = None,
               max_restarts: int = 3, sample_timeout_s: float = 300.0,
               max_messages: int = 4, synthetic=None, actor_cores: int = 0):
    self.name = name
    self.env_config = env or envs.EnvConfig()
    self.synthetic = synthetic
    if synthetic is None:   # Synthetic transitions build no environment (nor need dm_control).
      envs.check_task(self.env_config.task)
    self.networks_fn = networks
    self.replay_fn = replay or functools.partial(
        replay_lib.UniformReplay, capacity=1_000_000, min_size=1000, samples_per_insert=32.0)
    for key, value in (("num_actors", num_actors), ("epoch_size", epoch_size),
                       ("publish_every_steps", publish_every_steps),
                       ("eval_episodes", eval_episodes), ("max_messages", max_messages)):
      inputs.number(f"D4PG.{key}", value, 1, integer=True)
    inputs.number("D4PG.max_restarts", max_restarts, 0, integer=True)
    inputs.number("D4PG.sample_timeout_s", sample_timeout_s, 0, low_open=True, meaning="seconds")
    self.separate_evaluator = (self.env_config.pixels if separate_evaluator is None
                               else separate_evaluator)
    if self.env_config.pixels and not self.separate_evaluator:
      raise UserError("D4PG.separate_evaluator = False with EnvConfig.pixels = True: pixel "
                      "episodes render with EGL, which cannot run in the TensorFlow learner "
                      "process. Leave separate_evaluator unset (None) or True.")
    self.num_actors, self.epoch_size = num_actors, epoch_size
    self.publish_every_steps, self.eval_episodes = publish_every_steps, eval_episodes
    self.max_restarts, self.sample_timeout_s = max_restarts, sample_timeout_s
    self.max_messages = max_messages
    placement.check_actor_cores(actor_cores, placement.allowed_cores())
    self.actor_cores = actor_cores
    self._learner_pin = None   # (each thread's cores before pinning, the process's)
    self.networks = self.spec = self.pool = self.replay = self.feeder = None
    self.evaluator = None
    self._last_step = None
    self._mark = (None, 0, 0)   # (time, learner step, env steps) at the last host_metrics.

  # -- construction ------------------------------------------------------------

  def examples_per_epoch(self) -> int:
    return self.epoch_size

  @property
  def synthetic_data(self) -> bool:
    return self.synthetic is not None

  def _make_networks(self) -> d4pg.D4PGNetworks:
    if self.synthetic is not None:
      low, high = self.synthetic.action_bounds()
      return self.networks_fn(self.synthetic.observation_shape(self.env_config), low, high,
                              pixels=self.env_config.pixels)
    env = envs.make_env(self.env_config, seed=0)   # Specs only: nothing renders.
    obs, action = env.observation_spec(), env.action_spec()
    env.close()
    return self.networks_fn(obs.shape, action.minimum, action.maximum,
                            pixels=self.env_config.pixels)

  def model_parallel_refusal(self) -> str | None:
    return ("D4PG's policy and critic have no tensor-parallel or pipelined form (model "
            "parallelism splits ResNet and SN-GAN, configs/{resnet,sngan}/{tensor_parallel,"
            "pipeline}.gin); scale D4PG's learner by data parallelism instead: "
            "Experiment.topology = @topology.Local() with more replicas, or worker "
            "processes (configs/d4pg/learner_scaling.sweep)")

  def _networks(self, policy: str) -> d4pg.D4PGNetworks:
    """The networks under the dtype policy named policy (one build per plan: build_once)."""
    def make():
      with precision.policy_scope(policy):
        return self._make_networks()
    return build_once.built(self, policy, make)

  def check_config(self, spec: TrainSpec) -> None:
    try:
      networks = self._networks(spec.precision)
    except (ValueError, TypeError) as e:
      raise errors.build_failure("D4PG.networks", e) from None
    hp = networks.hparams
    check = lambda key, *a, **k: inputs.number(  # noqa: E731
        f"D4PGHyperparams.{key}", getattr(hp, key), *a, **k)
    check("n_step", 1, integer=True)
    check("discount", 0, 1)
    check("sigma", 0, meaning="exploration noise, in action units")
    check("target_update_period", 1, integer=True, meaning="learner steps")
    check("clip_norm", 0, low_open=True)
    check("learning_rate", 0, low_open=True)

  def build_learner(self, spec: TrainSpec) -> None:
    """Networks and optimizers only (call under the replicator's scope); build() adds
    the actors. Tests drive step_fn on fixed data after this."""
    self.spec = spec
    keras.utils.set_random_seed(spec.seed)
    self.networks = self._networks(spec.precision)
    hp = self.networks.hparams
    # global_clipnorm acts on the full gradient: the engine reduces before applying
    # (and, under float16, the loss-scale optimizer unscales before the inner Adam clips).

    def adam():
      return precision.wrap_optimizer(
          keras.optimizers.Adam(hp.learning_rate, global_clipnorm=hp.clip_norm), spec.precision)

    self.critic_optimizer, self.policy_optimizer = adam(), adam()
    spec.build_optimizer(self.critic_optimizer, self.networks.critic_variables)
    spec.build_optimizer(self.policy_optimizer, self.networks.policy_variables)

  def build(self, spec: TrainSpec) -> None:
    self.build_learner(spec)
    if self.synthetic is not None:
      logging.info("D4PG on synthetic transitions: no actors, replay or evaluator.")
      return
    worker, workers = _worker_position()
    seed = int(np.random.SeedSequence([spec.seed, worker]).generate_state(1)[0] % (2**31 - 1))
    self.replay = self.replay_fn(seed=seed)
    config = actors_lib.ActorConfig.from_networks(self.networks, self.env_config)
    learner_cores, actor_cores = self._place()
    self.pool = actors_lib.ActorPool(
        config, num_actors=self.num_actors, seed=seed, evaluator=self.separate_evaluator,
        max_restarts=self.max_restarts, max_messages=self.max_messages, cores=actor_cores,
        weights_host=weight_service.serving_host())
    self.pool.start(self.networks.actor_weights())
    if learner_cores:
      allowed = placement.allowed_cores()
      self._learner_pin = (placement.pin_threads(learner_cores), allowed)
      logging.info("D4PG: learner on cores %s, actors on %s (D4PG.actor_cores).",
                   sorted(learner_cores), sorted(actor_cores))
    # A step's batch on this process: its replicas' batches.
    self.feeder = ReplayFeeder(self.pool, self.replay,
                               spec.per_replica_batch_size * (spec.num_replicas // workers),
                               self.sample_timeout_s)
    self.evaluator = evaluation.Evaluator(
        self.env_config, self.eval_episodes, seed=seed,
        feeder=self.feeder if self.separate_evaluator else None, timeout_s=self.sample_timeout_s)
    logging.info("D4PG worker %d: %d actor(s)%s on %s, replay %s.", worker, self.num_actors,
                 " + evaluator" if self.separate_evaluator else "", self.env_config.task,
                 type(self.replay).__name__)

  def _place(self) -> tuple[set[int] | None, set[int] | None]:
    """(learner cores, actor cores), or (None, None) when they share every core."""
    if not self.actor_cores:
      return None, None
    return placement.split_cores(self.actor_cores, placement.allowed_cores())

  # -- data --------------------------------------------------------------------

  def element_spec(self, per_replica_batch_size: int) -> dict:
    batch_size = per_replica_batch_size
    obs = tuple(self.networks.obs_shape)
    obs_dtype = tf.uint8 if self.env_config.pixels else tf.float32
    action_dim = len(self.networks.action_low)
    return {"observation": tf.TensorSpec((batch_size,) + obs, obs_dtype),
            "action": tf.TensorSpec((batch_size, action_dim), tf.float32),
            "reward": tf.TensorSpec((batch_size,), tf.float32),
            "discount": tf.TensorSpec((batch_size,), tf.float32),
            "next_observation": tf.TensorSpec((batch_size,) + obs, obs_dtype),
            "key": tf.TensorSpec((batch_size,), tf.int64),
            "weight": tf.TensorSpec((batch_size,), tf.float32)}

  @engine.per_worker_input   # Each worker's replay is its own actors'.
  def input_fn(self, ctx: engine.InputContext) -> tf.data.Dataset:
    """Batches sampled from this worker's replay as the actors fill it (endless).

    One sample a step for all of this pipeline's replicas, split into their batches:
    each draw from replay is a Python call (~0.5 ms on one core of the 2-core EPYC of
    results/scaling), which 4 logical replicas would otherwise pay 4 times a step.
    """
    if self.synthetic is not None:
      return self.synthetic.train(ctx, self.spec.seed, self.env_config)
    replicas_here = ctx.replicas_per_pipeline
    signature = self.element_spec(ctx.per_replica_batch_size)
    stacked = {k: tf.TensorSpec((replicas_here, *spec.shape), spec.dtype)
               for k, spec in signature.items()}
    feeder, size = self.feeder, ctx.per_replica_batch_size * replicas_here

    def convert(batch):
      return {k: np.asarray(batch[k], spec.dtype.as_numpy_dtype).reshape(spec.shape)
              for k, spec in stacked.items()}

    ds = tf.data.Dataset.from_generator(lambda: feeder.batches(size, convert),
                                        output_signature=stacked).unbatch()
    # Endless, and said so: with an unknown cardinality MultiWorkerMirroredStrategy
    # all-reduces a "has data" flag on every step to stop all workers together.
    ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    return ds.prefetch(2)

  # -- learner -----------------------------------------------------------------

  def step_fn(self, batch) -> dict:
    """Both losses from the same (pre-update) networks, as Acme does; then both updates."""
    # Forward and backward: one XLA cluster under TrainSpec.jit_compile; the exchange
    # (in apply_gradients_jointly) stays outside it.
    critic, policy, critic_per_example, critic_grads, policy_grads = self.spec.compiled(
        self._losses_and_gradients)(batch)
    critic_vars, policy_vars = self.networks.critic_variables, self.networks.policy_variables
    metrics = self.spec.regime.apply_gradients_jointly([
        (self.critic_optimizer, critic_grads, critic_vars),
        (self.policy_optimizer, policy_grads, policy_vars)])
    if isinstance(self.replay, replay_lib.PrioritizedReplay):
      tf.py_function(self.feeder.update_priorities, [batch["key"], critic_per_example], [])
    # Shares (1/N of the local means) times N: local means, averaged over replicas by
    # the engine with the other outputs (no collective of their own).
    critic, policy = critic * engine.num_replicas(), policy * engine.num_replicas()
    return {"loss": critic, "critic_loss": critic, "policy_loss": policy, **metrics}

  def _losses_and_gradients(self, batch):
    """Critic and policy loss shares, the critic's per-example loss [b] and both
    gradients, from the same (pre-update) networks."""
    nets, global_batch = self.networks, self.spec.global_batch_size
    with tf.GradientTape(persistent=True) as tape:
      critic_per_example = d4pg.critic_loss(nets, batch)
      critic = engine.average_loss(batch["weight"] * critic_per_example, global_batch)
      policy = engine.average_loss(d4pg.policy_loss(nets, batch), global_batch)
      # Each loss times its optimizer's loss scale under float16 (else itself).
      scaled_critic = precision.scaled(self.critic_optimizer, critic)
      scaled_policy = precision.scaled(self.policy_optimizer, policy)
    critic_grads = tape.gradient(scaled_critic, nets.critic_variables)
    policy_grads = tape.gradient(scaled_policy, nets.policy_variables)
    del tape
    return critic, policy, critic_per_example, critic_grads, policy_grads

  def after_train_call(self, step: int) -> None:
    """Target networks every target_update_period steps (on the host, where assigning a
    mirrored variable sets every replica), actor weights every publish_every_steps."""
    previous = self._last_step if self._last_step is not None else step - 1
    self._last_step = step
    crossed = lambda period: step // period > previous // period  # noqa: E731
    if crossed(self.networks.hparams.target_update_period):
      d4pg.copy_to_targets(self.networks)
    if self.pool is not None and crossed(self.publish_every_steps):
      self.pool.publish(self.networks.actor_weights())

  def host_metrics(self) -> dict:
    """Actor and learner rates over the interval since the previous call."""
    if self.feeder is None:
      return {}
    stats, now = self.feeder.stats(), time.monotonic()
    step, env_steps = self._last_step or 0, stats["env_steps"]
    last_time, last_step, last_env_steps = self._mark
    self._mark = (now, step, env_steps)
    limiter = self.replay.limiter
    metrics = {"actors/env_steps": env_steps, "actors/restarts": stats["restarts"],
               "replay/size": len(self.replay),
               "replay/samples_per_insert": limiter.samples / max(1, limiter.inserts)}
    if last_time is not None and now > last_time:
      metrics["actors/env_steps_per_s"] = (env_steps - last_env_steps) / (now - last_time)
      metrics["learner/steps_per_s"] = (step - last_step) / (now - last_time)
    return metrics

  # -- evaluation --------------------------------------------------------------

  def _across_workers(self, replicator: engine.BaseReplicator, values: list[float]) -> np.ndarray:
    """Mean over workers (identical on every worker, so all decide alike)."""
    values = np.asarray(values, np.float64)
    if replicator.num_workers == 1:
      return values
    if not hasattr(self, "_mean_fn"):
      self._mean_fn = tf.function(lambda x: replicator.reduce(
          replicator.run(lambda: tf.identity(x)), "mean"))
    return self._mean_fn(tf.constant(values)).numpy()

  def eval_examples(self) -> int:
    return self.eval_episodes

  def mlperf_hyperparameters(self, spec: TrainSpec) -> dict:
    del spec
    hp = self.networks.hparams
    return {"opt_name": "adam", "opt_base_learning_rate": hp.learning_rate,
            "opt_gradient_clip_norm": hp.clip_norm, "n_step": hp.n_step,
            "discount": hp.discount}

  def evaluate(self, replicator: engine.BaseReplicator) -> dict:
    """eval/return (mean over episodes and workers), eval/return_min (this worker's),
    eval/env_steps (env steps the exploring actors of all workers have made so far:
    the experience the policy learnt from) and eval/episodes (played for this value)."""
    returns = self.evaluator.returns(self.networks)
    env_steps = self.feeder.stats()["env_steps"] if self.feeder else 0
    mean, steps, episodes = self._across_workers(
        replicator, [np.mean(returns), env_steps, len(returns)])
    workers = replicator.num_workers
    return {"eval/return": float(mean), "eval/return_min": float(np.min(returns)),
            "eval/env_steps": int(round(steps * workers)),
            "eval/episodes": int(round(episodes * workers))}

  # -- bookkeeping -------------------------------------------------------------

  def checkpoint_items(self) -> dict:
    nets = self.networks
    items = {"policy": nets.policy, "critic": nets.critic, "target_policy": nets.target_policy,
             "target_critic": nets.target_critic, "critic_optimizer": self.critic_optimizer,
             "policy_optimizer": self.policy_optimizer}
    if nets.torso is not None:
      items.update(torso=nets.torso, target_torso=nets.target_torso)
    return items

  def close(self) -> None:
    if self.feeder is not None:
      self.feeder.close()   # Before the harness lets go of the input iterator.
    if self.pool is not None:
      with self.feeder.lock if self.feeder is not None else contextlib.nullcontext():
        self.pool.stop()
    if self.evaluator is not None:
      self.evaluator.close()
    if self._learner_pin is not None:   # This process may go on (tests, a sweep's next run).
      placement.restore_threads(*self._learner_pin)
      self._learner_pin = None

  def learning_rate(self, step: int) -> float:
    del step
    return self.networks.hparams.learning_rate if self.networks else float("nan")

  def hparams(self) -> dict:
    nets = self.networks
    hp = nets.hparams if nets else d4pg.D4PGHyperparams()
    limiter = self.replay.limiter if self.replay is not None else None
    return {"task": self.env_config.task, "pixels": self.env_config.pixels,
            "num_actors": self.num_actors, "n_step": hp.n_step, "discount": hp.discount,
            "sigma": hp.sigma, "target_update_period": hp.target_update_period,
            "replay": "synthetic" if self.synthetic is not None else type(self.replay).__name__,
            "samples_per_insert": float(limiter.samples_per_insert or 0) if limiter else 0.0,
            "policy_sizes": str(nets.policy_sizes) if nets else ""}

  def describe(self, spec: TrainSpec) -> dict:
    del spec
    nets = self._networks(keras.config.dtype_policy().name)   # The global policy's.
    trained = nets.critic_variables + nets.policy_variables
    obs = tf.TensorSpec((1,) + nets.obs_shape, tf.uint8 if nets.pixels else tf.float32)
    action = tf.TensorSpec((1, len(nets.action_low)), tf.float32)
    scalar = tf.TensorSpec((1,), tf.float32)

    def losses(o, a, r, d, o2):
      batch = {"observation": o, "action": a, "reward": r, "discount": d,
               "next_observation": o2}
      return d4pg.critic_loss(nets, batch), d4pg.policy_loss(nets, batch)

    def train(o, a, r, d, o2):
      with tf.GradientTape(persistent=True) as tape:
        critic, policy = losses(o, a, r, d, o2)
      return (tape.gradient(critic, nets.critic_variables),
              tape.gradient(policy, nets.policy_variables))

    specs = (obs, action, scalar, scalar, obs)
    return {
        "parameters": int(sum(np.prod(v.shape) for v in trained)),
        "forward_flops_per_example": cost.graph_flops(losses, *specs),
        "train_flops_per_example": cost.graph_flops(train, *specs),   # Losses + gradients.
        "allreduce_bytes_per_step": int(sum(4 * np.prod(v.shape) for v in trained)),
        "gradient_tensors": cost.sizes(trained),
        "state_tensors": (
            cost.state_sizes(keras.optimizers.Adam(), nets.critic_variables)
            + cost.state_sizes(keras.optimizers.Adam(), nets.policy_variables)),
        "learning_rate": {"peak": nets.hparams.learning_rate, "schedule": "constant (Adam)"},
    }
