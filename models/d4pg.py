"""D4PG networks and learner math in plain Keras 3 + TensorFlow (Barth-Maron et al. 2018).

Architectures follow Acme's D4PG for the DeepMind Control Suite:
- policy: LayerNormMLP (256, 256, 256) -> near-zero-initialised linear -> tanh
  scaled to the action bounds;
- critic: concat(observation embedding, action) -> LayerNormMLP (512, 512, 256)
  -> logits over a fixed categorical support (51 atoms on [-150, 150]);
- pixels: 84x84 RGB with 3 stacked frames (uint8 [84, 84, 9]) go through a torso
  of two 3x3 convs (32 channels, ELU, the first with stride 2) and dense 50 +
  LayerNorm + tanh. The torso is shared and trained by the critic only: the
  policy sees it through a stop-gradient.

The learner math is pure functions returning per-example losses [B]
(`critic_loss`, `policy_loss`); optimisers, gradient all-reduce and clipping are
the training step's business. Target networks are plain copies refreshed every
`target_update_period` learner steps by `copy_to_targets` (the D4PG workload
calls it on the host, between training calls, where assigning a mirrored
variable sets every replica).

Built under a Keras mixed-precision policy, the networks compute in bfloat16 or
float16; the losses cast the critic's logits to float32 first, so softmax, the
categorical projection and the cross-entropy run in float32.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

# Acme's LayerNormMLP initialiser (Sonnet `uniform_initializer`).
_MLP_INIT = keras.initializers.VarianceScaling(
    scale=1 / 3, mode="fan_out", distribution="uniform")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class D4PGHyperparams:
  """Learner/actor settings from the D4PG paper and Acme (see anchors.md).

  discount is the per-step gamma; an n-step transition carries gamma^n (0 at a
  termination) in its own `discount` field. sigma is the std of the Gaussian
  exploration noise in action units; clip_norm the global gradient norm clip.
  The batch size is not set here: it is Experiment.global_batch_size.
  """
  n_step: int = 5
  discount: float = 0.99
  sigma: float = 0.3
  target_update_period: int = 100
  clip_norm: float = 40.0
  learning_rate: float = 1e-4


class ScaleToBounds(keras.layers.Layer):
  """Maps values in [-1, 1] (a tanh output) affinely onto [low, high] per action dim."""

  def __init__(self, low: Sequence[float], high: Sequence[float], **kwargs):
    super().__init__(**kwargs)
    self.low = np.asarray(low, np.float32)
    self.high = np.asarray(high, np.float32)

  def call(self, x):
    low, high = (keras.ops.cast(b, x.dtype) for b in (self.low, self.high))
    return low + (x + 1.0) * (0.5 * (high - low))

  def get_config(self):
    return {**super().get_config(), "low": self.low.tolist(), "high": self.high.tolist()}


def layer_norm_mlp(x, sizes: Sequence[int], activate_final: bool, name: str):
  """Acme's LayerNormMLP: Dense -> LayerNorm -> tanh, then ELU-activated Dense layers."""
  x = keras.layers.Dense(sizes[0], kernel_initializer=_MLP_INIT, name=f"{name}_in")(x)
  x = keras.layers.LayerNormalization(name=f"{name}_in_norm")(x)
  x = keras.layers.Activation("tanh", name=f"{name}_in_tanh")(x)
  for i, size in enumerate(sizes[1:], start=1):
    last = i == len(sizes) - 1
    activation = None if last and not activate_final else "elu"
    x = keras.layers.Dense(size, activation=activation, kernel_initializer=_MLP_INIT,
                           name=f"{name}_{i}")(x)
  return x


def make_pixel_torso(obs_shape: Sequence[int], embed_dim: int = 50) -> keras.Model:
  """uint8 [B, 84, 84, 3 * frames] -> float32 [B, embed_dim] in (-1, 1)."""
  obs = keras.Input(tuple(obs_shape), dtype="uint8", name="pixels")
  x = keras.layers.Rescaling(1 / 255, name="to_unit")(obs)
  x = keras.layers.Conv2D(32, 3, strides=2, activation="elu", name="conv1")(x)
  x = keras.layers.Conv2D(32, 3, strides=1, activation="elu", name="conv2")(x)
  x = keras.layers.Flatten(name="flatten")(x)
  x = keras.layers.Dense(embed_dim, name="embed")(x)
  x = keras.layers.LayerNormalization(name="embed_norm")(x)
  x = keras.layers.Activation("tanh", name="embed_tanh")(x)
  return keras.Model(obs, x, name="torso")


def make_policy_head(embed_dim: int, action_low, action_high,
                     sizes: Sequence[int] = (256, 256, 256)) -> keras.Model:
  """float32 [B, embed_dim] -> actions [B, action_dim] within [action_low, action_high]."""
  action_dim = len(action_low)
  emb = keras.Input((embed_dim,), name="embedding")
  x = layer_norm_mlp(emb, sizes, activate_final=True, name="policy_mlp")
  # Near-zero init (Acme NearZeroInitializedLinear): initial actions sit mid-range.
  x = keras.layers.Dense(action_dim, activation="tanh", name="policy_out",
                         kernel_initializer=keras.initializers.VarianceScaling(1e-4))(x)
  action = ScaleToBounds(action_low, action_high, name="to_bounds")(x)
  return keras.Model(emb, action, name="policy")


def make_critic_head(embed_dim: int, action_dim: int, sizes: Sequence[int] = (512, 512, 256),
                     num_atoms: int = 51) -> keras.Model:
  """([B, embed_dim], [B, action_dim]) -> logits [B, num_atoms] over the value support."""
  emb = keras.Input((embed_dim,), name="embedding")
  action = keras.Input((action_dim,), name="action")
  x = keras.layers.Concatenate(name="obs_action")([emb, action])
  x = layer_norm_mlp(x, sizes, activate_final=True, name="critic_mlp")
  logits = keras.layers.Dense(num_atoms, name="critic_logits")(x)
  return keras.Model([emb, action], logits, name="critic")


def _make_torso_and_policy(obs_shape, action_low, action_high, policy_sizes, pixels,
                           embed_dim):
  """(torso or None, policy head, actor = policy(torso(obs))) built in a fixed order."""
  if pixels:
    torso = make_pixel_torso(obs_shape, embed_dim)
    policy = make_policy_head(embed_dim, action_low, action_high, policy_sizes)
    obs = keras.Input(tuple(obs_shape), dtype="uint8", name="observation")
    actor = keras.Model(obs, policy(torso(obs)), name="actor")
    return torso, policy, actor
  if len(obs_shape) != 1:
    raise ValueError(f"State observations must be flat [obs_dim]; got shape {obs_shape}.")
  policy = make_policy_head(obs_shape[0], action_low, action_high, policy_sizes)
  return None, policy, policy


def make_actor_network(obs_shape: Sequence[int], action_low, action_high,
                       policy_sizes: Sequence[int] = (256, 256, 256), pixels: bool = False,
                       embed_dim: int = 50) -> keras.Model:
  """The acting policy alone (torso + policy head), as built by actor processes.

  Its weights list matches `D4PGNetworks.actor_weights()` for the same arguments.
  """
  return _make_torso_and_policy(obs_shape, action_low, action_high, policy_sizes, pixels,
                                embed_dim)[2]


@gin.configurable
class D4PGNetworks:
  """Online and target torso/policy/critic, the value support and the hyperparameters.

  obs_shape: (obs_dim,) float32 states, or (84, 84, 9) uint8 stacked frames with
  pixels=True. action_low/high: per-dimension bounds of the action spec.
  Targets start as exact copies of the online networks.
  """

  def __init__(self, obs_shape: Sequence[int], action_low, action_high, *,
               pixels: bool = False,
               policy_sizes: Sequence[int] = (256, 256, 256),
               critic_sizes: Sequence[int] = (512, 512, 256),
               num_atoms: int = 51, v_min: float = -150.0, v_max: float = 150.0,
               embed_dim: int = 50,
               hparams: D4PGHyperparams | None = None):
    if num_atoms < 2 or not v_min < v_max:
      raise ValueError(f"Need num_atoms >= 2 and v_min < v_max; got {num_atoms}, "
                       f"[{v_min}, {v_max}].")
    self.obs_shape = tuple(obs_shape)
    self.action_low = np.asarray(action_low, np.float32)
    self.action_high = np.asarray(action_high, np.float32)
    self.pixels = pixels
    self.policy_sizes = tuple(policy_sizes)
    self.embed_dim = embed_dim
    self.hparams = hparams or D4PGHyperparams()
    self.support = tf.constant(np.linspace(v_min, v_max, num_atoms), tf.float32)
    self.torso, self.policy, self.actor = self._build_actor_side()
    self.critic = self._build_critic(critic_sizes, num_atoms)
    self.target_torso, self.target_policy, _ = self._build_actor_side()
    self.target_critic = self._build_critic(critic_sizes, num_atoms)
    copy_to_targets(self)

  def _build_actor_side(self):
    return _make_torso_and_policy(self.obs_shape, self.action_low, self.action_high,
                                  self.policy_sizes, self.pixels, self.embed_dim)

  def _build_critic(self, sizes, num_atoms):
    in_dim = self.embed_dim if self.pixels else self.obs_shape[0]
    return make_critic_head(in_dim, len(self.action_low), sizes, num_atoms)

  def embed(self, obs, target: bool = False):
    """Observation embedding [B, E] (the observation itself for states)."""
    torso = self.target_torso if target else self.torso
    return obs if torso is None else torso(obs)

  @property
  def critic_variables(self) -> list[tf.Variable]:
    """What the critic loss trains: the shared torso and the critic head."""
    torso = self.torso.trainable_variables if self.torso is not None else []
    return torso + self.critic.trainable_variables

  @property
  def policy_variables(self) -> list[tf.Variable]:
    """What the policy loss trains: the policy head only (never the torso)."""
    return self.policy.trainable_variables

  def online_and_target_pairs(self) -> list[tuple[tf.Variable, tf.Variable]]:
    """(online, target) variable pairs over torso, policy and critic."""
    pairs = list(zip(self.policy.variables, self.target_policy.variables))
    pairs += zip(self.critic.variables, self.target_critic.variables)
    if self.torso is not None:
      pairs += zip(self.torso.variables, self.target_torso.variables)
    return pairs

  def actor_weights(self) -> list[np.ndarray]:
    """Numpy weights of torso + policy, in `make_actor_network`'s order (for actors)."""
    return [np.asarray(w) for w in self.actor.get_weights()]


def copy_to_targets(networks: D4PGNetworks) -> None:
  """Target variables := online variables (torso, policy, critic)."""
  for online, target in networks.online_and_target_pairs():
    target.assign(online)


def categorical_projection(next_probs, rewards, discounts, support):
  """Projects the distribution of r + discount * Z onto the fixed support (C51/D4PG).

  next_probs: float32 [B, A] probabilities on `support` (rows sum to 1).
  rewards, discounts: float32 [B]; discount already includes gamma^n and is 0 for
  terminal transitions. support: float32 [A], strictly increasing.
  Returns float32 [B, A]: each shifted atom's mass split linearly between its two
  neighbouring support atoms, mass beyond the edges landing on the edge atoms.
  """
  support = tf.convert_to_tensor(support, tf.float32)
  next_probs = tf.convert_to_tensor(next_probs, tf.float32)
  rewards = tf.convert_to_tensor(rewards, tf.float32)
  discounts = tf.convert_to_tensor(discounts, tf.float32)
  shifted = rewards[:, None] + discounts[:, None] * support[None, :]
  shifted = tf.clip_by_value(shifted, support[0], support[-1])  # [B, A_source]
  gaps = support[1:] - support[:-1]
  ones = tf.ones([1], tf.float32)  # Edge atoms never receive mass from beyond the edge.
  gap_above = tf.concat([gaps, ones], 0)  # [A_target]
  gap_below = tf.concat([ones, gaps], 0)
  # delta[b, i, j]: source atom j's shifted position minus target atom i.
  delta = shifted[:, None, :] - support[None, :, None]
  weight = tf.where(delta >= 0, 1.0 - delta / gap_above[None, :, None],
                    1.0 + delta / gap_below[None, :, None])
  weight = tf.clip_by_value(weight, 0.0, 1.0)
  return tf.reduce_sum(weight * next_probs[:, None, :], axis=-1)


def categorical_mean(logits, support):
  """Expected value [B] of the categorical distribution with logits [B, A] on support [A]."""
  return tf.reduce_sum(tf.nn.softmax(logits) * support, axis=-1)


def categorical_td_loss(logits, next_logits, rewards, discounts, support):
  """Cross-entropy [B] between the projected target (held constant) and online logits.

  logits: online critic logits [B, A] at (s, a); next_logits: target critic
  logits [B, A] at (s', pi_target(s')).
  """
  target = categorical_projection(tf.nn.softmax(next_logits), rewards, discounts, support)
  target = tf.stop_gradient(target)
  return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)


def _float32(logits):
  """Critic logits in float32 (a mixed-precision critic computes in 16 bits)."""
  return tf.cast(logits, tf.float32)


def _as_tensors(batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """Keras rejects calls mixing numpy arrays and tensors, so convert up front."""
  return {k: tf.convert_to_tensor(v) for k, v in batch.items()}


def critic_loss(networks: D4PGNetworks, batch: Mapping[str, tf.Tensor]):
  """Per-example distributional critic loss [B].

  batch: 'observation' [B, *obs_shape], 'action' [B, action_dim] float32,
  'reward' [B] (n-step discounted sum), 'discount' [B] (gamma^n or 0),
  'next_observation' [B, *obs_shape]. Gradients reach the torso and critic only;
  target networks are evaluated under stop-gradient.
  """
  batch = _as_tensors(batch)
  emb = networks.embed(batch["observation"])
  logits = _float32(networks.critic([emb, tf.cast(batch["action"], tf.float32)]))
  next_emb = tf.stop_gradient(networks.embed(batch["next_observation"], target=True))
  next_action = networks.target_policy(next_emb)
  next_logits = tf.stop_gradient(_float32(networks.target_critic([next_emb, next_action])))
  return categorical_td_loss(logits, next_logits, batch["reward"], batch["discount"],
                             networks.support)


def policy_loss(networks: D4PGNetworks, batch: Mapping[str, tf.Tensor]):
  """Per-example deterministic policy loss [B]: -Q(s, pi(s)), Q the categorical mean.

  The torso output is stop-gradient (trained by the critic only). Differentiate
  with respect to `networks.policy_variables`: the critic is only a function here.
  """
  emb = tf.stop_gradient(networks.embed(tf.convert_to_tensor(batch["observation"])))
  logits = _float32(networks.critic([emb, networks.policy(emb)]))
  return -categorical_mean(logits, networks.support)
