"""D4PG learner math: categorical projection, losses, gradients and target updates."""

import gin
import numpy as np
import pytest
import tensorflow as tf

from models import d4pg

SUPPORT = np.array([-2.0, -1.0, 0.0, 1.0, 2.0], np.float32)
P = np.array([0.1, 0.2, 0.3, 0.25, 0.15], np.float32)


def project(probs, reward, discount, support=SUPPORT):
  probs = np.atleast_2d(np.asarray(probs, np.float32))
  batch = len(probs)
  out = d4pg.categorical_projection(probs, np.full(batch, reward, np.float32),
                                    np.full(batch, discount, np.float32), support)
  return out.numpy()


def test_identity_projection():
  probs = np.random.default_rng(0).dirichlet(np.ones(5), size=4).astype(np.float32)
  np.testing.assert_allclose(project(probs, 0.0, 1.0), probs, atol=1e-6)


def test_shift_by_exactly_one_atom():
  # Every atom moves up one; the top atom's mass (2 + 1 = 3) is clipped back to 2.
  np.testing.assert_allclose(project(P, 1.0, 1.0)[0], [0.0, 0.1, 0.2, 0.3, 0.4], atol=1e-6)
  np.testing.assert_allclose(project(P, -1.0, 1.0)[0], [0.3, 0.3, 0.25, 0.15, 0.0],
                             atol=1e-6)


def test_shift_between_atoms_splits_mass_linearly():
  # z + 0.25: 3/4 of each atom's mass stays, 1/4 moves to the atom above.
  expected = [0.75 * 0.1, 0.25 * 0.1 + 0.75 * 0.2, 0.25 * 0.2 + 0.75 * 0.3,
              0.25 * 0.3 + 0.75 * 0.25, 0.25 * 0.25 + 0.15]
  np.testing.assert_allclose(project(P, 0.25, 1.0)[0], expected, atol=1e-6)


def test_discount_contracts_the_distribution():
  # 0.5 * z = [-1, -0.5, 0, 0.5, 1]: the half-way atoms split evenly.
  expected = [0.0, 0.1 + 0.5 * 0.2, 0.5 * 0.2 + 0.3 + 0.5 * 0.25, 0.5 * 0.25 + 0.15, 0.0]
  np.testing.assert_allclose(project(P, 0.0, 0.5)[0], expected, atol=1e-6)


def test_mass_beyond_both_edges_lands_on_edge_atoms():
  # 2 * z = [-4, -2, 0, 2, 4] is clipped to [-2, -2, 0, 2, 2].
  np.testing.assert_allclose(project(P, 0.0, 2.0)[0], [0.3, 0.0, 0.3, 0.0, 0.4], atol=1e-6)
  np.testing.assert_allclose(project(P, 10.0, 1.0)[0], [0, 0, 0, 0, 1], atol=1e-6)
  np.testing.assert_allclose(project(P, -10.0, 0.9)[0], [1, 0, 0, 0, 0], atol=1e-6)


def test_terminal_transitions_put_all_mass_around_the_reward():
  np.testing.assert_allclose(project(P, 0.5, 0.0)[0], [0, 0, 0.5, 0.5, 0], atol=1e-6)
  np.testing.assert_allclose(project(P, 1.0, 0.0)[0], [0, 0, 0, 1, 0], atol=1e-6)
  np.testing.assert_allclose(project(P, -1.75, 0.0)[0], [0.75, 0.25, 0, 0, 0], atol=1e-6)


def test_rows_sum_to_one_and_mean_is_preserved_inside_the_support():
  rng = np.random.default_rng(1)
  support = np.linspace(-150, 150, 51).astype(np.float32)
  probs = rng.dirichlet(np.ones(51), size=64).astype(np.float32)
  rewards = rng.uniform(-5, 5, 64).astype(np.float32)
  discounts = np.where(rng.random(64) < 0.2, 0.0, 0.99 ** 5).astype(np.float32)
  out = d4pg.categorical_projection(probs, rewards, discounts, support).numpy()
  np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-5)
  assert (out >= 0).all()
  # Linear splitting keeps the mean wherever nothing is clipped.
  unclipped = np.abs(rewards[:, None] + discounts[:, None] * support).max(-1) <= 150
  expected = rewards + discounts * (probs @ support)
  np.testing.assert_allclose((out @ support)[unclipped], expected[unclipped], atol=1e-2)


def test_td_loss_is_cross_entropy_to_the_projected_target():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(3, 5)).astype(np.float32)
  next_logits = rng.normal(size=(3, 5)).astype(np.float32)
  rewards, discounts = np.array([0.3, -1.0, 0.0], np.float32), np.array([0.9, 0.0, 1.0],
                                                                        np.float32)
  loss = d4pg.categorical_td_loss(logits, next_logits, rewards, discounts, SUPPORT).numpy()
  target = d4pg.categorical_projection(tf.nn.softmax(next_logits), rewards, discounts,
                                       SUPPORT).numpy()
  expected = -(target * tf.nn.log_softmax(logits).numpy()).sum(-1)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)


def tiny_networks(pixels=False, **kwargs):
  obs_shape = (16, 16, 9) if pixels else (5,)
  return d4pg.D4PGNetworks(obs_shape, [-1.0, -2.0], [1.0, 2.0], pixels=pixels,
                           policy_sizes=(8, 8), critic_sizes=(8, 8), embed_dim=4,
                           num_atoms=11, v_min=-10.0, v_max=10.0, **kwargs)


def tiny_batch(networks, batch=3, seed=0):
  rng = np.random.default_rng(seed)
  shape = (batch,) + networks.obs_shape
  if networks.pixels:
    obs = rng.integers(0, 256, shape).astype(np.uint8)
    next_obs = rng.integers(0, 256, shape).astype(np.uint8)
  else:
    obs, next_obs = rng.normal(size=shape).astype(np.float32), rng.normal(
        size=shape).astype(np.float32)
  return {"observation": obs, "action": rng.uniform(-1, 1, (batch, 2)).astype(np.float32),
          "reward": rng.normal(size=batch).astype(np.float32),
          "discount": np.full(batch, 0.95, np.float32), "next_observation": next_obs}


def gradients(loss_fn, networks, batch, variables):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(loss_fn(networks, batch))
  return loss, tape.gradient(loss, variables)


def nonzero(grads):
  return [g is not None and float(tf.reduce_sum(tf.abs(g))) > 0 for g in grads]


@pytest.mark.parametrize("pixels", [False, True])
def test_losses_train_the_right_variables(pixels):
  networks = tiny_networks(pixels)
  batch = tiny_batch(networks)
  assert d4pg.critic_loss(networks, batch).shape == (3,)
  assert d4pg.policy_loss(networks, batch).shape == (3,)
  targets = (networks.target_policy.trainable_variables
             + networks.target_critic.trainable_variables)
  _, grads = gradients(d4pg.critic_loss, networks, batch,
                       networks.critic_variables + networks.policy_variables + targets)
  n_critic, n_policy = len(networks.critic_variables), len(networks.policy_variables)
  assert all(nonzero(grads[:n_critic]))  # Torso (pixels) and critic head.
  assert not any(nonzero(grads[n_critic:]))  # Neither policy nor targets.
  torso = networks.torso.trainable_variables if pixels else []
  _, grads = gradients(d4pg.policy_loss, networks, batch, networks.policy_variables + torso)
  assert all(nonzero(grads[:n_policy]))
  assert not any(nonzero(grads[n_policy:]))  # The torso is trained by the critic only.


def test_policy_loss_is_minus_the_critic_mean():
  networks = tiny_networks()
  batch = tiny_batch(networks)
  obs = tf.constant(batch["observation"])
  action = networks.policy(obs)
  logits = networks.critic([obs, action]).numpy()
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  expected = -(probs @ networks.support.numpy())
  np.testing.assert_allclose(d4pg.policy_loss(networks, batch).numpy(), expected, atol=1e-6)
  # Actions respect the bounds of each dimension.
  assert np.all(np.abs(action.numpy()) <= [1.0, 2.0])


def perturb(model):
  for v in model.variables:
    v.assign_add(tf.ones_like(v))


def same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights()))


@pytest.mark.parametrize("pixels", [False, True])
def test_copy_to_targets_copies_every_online_network(pixels):
  networks = tiny_networks(pixels)
  assert same(networks.policy, networks.target_policy)
  assert same(networks.critic, networks.target_critic)
  for model in (networks.policy, networks.critic) + ((networks.torso,) if pixels else ()):
    perturb(model)
  assert not same(networks.critic, networks.target_critic)
  d4pg.copy_to_targets(networks)
  assert same(networks.policy, networks.target_policy)
  assert same(networks.critic, networks.target_critic)
  if pixels:
    assert same(networks.torso, networks.target_torso)


def test_target_copy_under_a_mirrored_strategy():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    networks = tiny_networks()
  perturb(networks.critic)
  d4pg.copy_to_targets(networks)   # Cross-replica context, as the workload calls it.
  for v in networks.target_critic.variables:
    values = strategy.experimental_local_results(v.value)  # The tf.Variable under Keras'.
    assert len(values) == 2 and np.array_equal(values[0], values[1])
  assert same(networks.critic, networks.target_critic)


def test_gin_configures_networks_and_hyperparameters():
  gin.parse_config("""
      D4PGNetworks.num_atoms = 7
      D4PGNetworks.v_max = 30.0
      D4PGHyperparams.n_step = 3
      D4PGHyperparams.sigma = 0.2
  """)
  networks = d4pg.D4PGNetworks((5,), [-1.0], [1.0], policy_sizes=(8,), critic_sizes=(8,))
  assert networks.support.shape == (7,) and float(networks.support[-1]) == 30.0
  assert networks.critic.output.shape[-1] == 7
  assert networks.hparams.n_step == 3 and networks.hparams.sigma == 0.2
  defaults = d4pg.D4PGHyperparams(n_step=5, sigma=0.3)
  assert (defaults.discount, defaults.target_update_period, defaults.clip_norm,
          defaults.learning_rate) == (0.99, 100, 40.0, 1e-4)


@pytest.mark.parametrize("pixels", [False, True])
def test_actor_network_matches_the_learners_policy(pixels):
  networks = tiny_networks(pixels)
  actor = d4pg.make_actor_network(networks.obs_shape, [-1.0, -2.0], [1.0, 2.0], (8, 8),
                                  pixels=pixels, embed_dim=4)
  actor.set_weights(networks.actor_weights())
  obs = tiny_batch(networks)["observation"]
  np.testing.assert_allclose(actor(obs).numpy(), networks.actor(obs).numpy(), atol=1e-6)
