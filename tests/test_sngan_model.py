"""SN-GAN generator, projection discriminator, hinge losses, and one replicated step."""

import gin
import keras
import numpy as np
import tensorflow as tf

from models import sngan

TINY_G = dict(z_dim=8, ch=4, widths=(2, 1, 1), bottom_width=7)
TINY_D = dict(ch=4)


def _inputs(batch, z_dim, seed=0):
  z = tf.random.stateless_normal((batch, z_dim), (seed, 1))
  labels = tf.constant(np.arange(batch) % 3, tf.int32)
  return z, labels


def test_fashion_mnist_shapes_and_ranges():
  gen = sngan.sngan_generator(num_classes=3, **TINY_G)
  disc = sngan.sngan_discriminator(num_classes=3, **TINY_D)
  z, labels = _inputs(4, 8)
  images = gen(z, labels, training=True)
  assert images.shape == (4, 28, 28, 1)
  assert float(tf.reduce_max(tf.abs(images))) <= 1.0
  assert disc(images, labels, training=True).shape == (4,)
  # SN on every discriminator weight matrix, none in the generator.
  assert any("sn_u" in v.path for v in disc.non_trainable_variables)
  assert not any("sn_u" in v.path for v in gen.variables)


def test_imagenet128_layout_gives_128x128x3():
  gen = sngan.sngan_generator(num_classes=5, **dict(sngan.IMAGENET128_GENERATOR, ch=1))
  disc = sngan.sngan_discriminator(num_classes=5, in_channels=3,
                                   **dict(sngan.IMAGENET128_DISCRIMINATOR, ch=1))
  z, labels = _inputs(2, 128)
  images = gen(z, labels, training=False)
  assert images.shape == (2, 128, 128, 3)
  assert disc(images, labels, training=False).shape == (2,)
  assert len(gen.blocks) == 5 and len(disc.blocks) == 6


def test_gin_binds_the_builders_and_the_injected_norm_layer_is_used():
  made = []

  def counting_norm(**kwargs):
    made.append(kwargs)
    return keras.layers.BatchNormalization(**kwargs)

  gin.parse_config("sngan_generator.ch = 2\nsngan_generator.z_dim = 4")
  gen = sngan.sngan_generator(num_classes=2, widths=(1, 1), norm_layer=counting_norm)
  gen(*_inputs(2, 4), training=True)
  assert gen.c_out.kernel.shape[2] == 2
  assert len(made) == 3  # Two CBNs in the block, one before the output conv.
  assert all(not kw["center"] and not kw["scale"] for kw in made)


def test_conditional_batch_norm_applies_the_gamma_beta_of_each_label():
  cbn = sngan.ConditionalBatchNorm(3)
  x = tf.random.stateless_normal((4, 2, 2, 5), (0, 0))
  labels = tf.constant([0, 1, 2, 1])
  cbn(x, labels, training=False)
  gamma = np.arange(15, dtype=np.float32).reshape(3, 5)
  beta = -np.arange(15, dtype=np.float32).reshape(3, 5)
  cbn.gamma.assign(gamma)
  cbn.beta.assign(beta)
  normalised = cbn.norm(x, training=True).numpy()
  out = cbn(x, labels, training=True).numpy()
  expected = (normalised * gamma[labels.numpy()][:, None, None, :]
              + beta[labels.numpy()][:, None, None, :])
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_projection_term_is_embedding_dot_pooled_features():
  disc = sngan.sngan_discriminator(num_classes=3, **TINY_D)
  images = tf.random.stateless_uniform((2, 28, 28, 1), (0, 1), -1, 1)
  y0, y1 = tf.constant([0, 0]), tf.constant([1, 1])
  difference = disc(images, y1, training=False) - disc(images, y0, training=False)
  # Recompute h and the normalised embedding by hand.
  h = images
  for block in disc.blocks:
    h = block(h, training=False)
  h = tf.reduce_sum(tf.nn.relu(h), axis=(1, 2)).numpy()
  table = disc.l_y.kernel.numpy() / float(disc.l_y.sigma())
  np.testing.assert_allclose(difference.numpy(), h @ (table[1] - table[0]), rtol=1e-4,
                             atol=1e-4)


def test_hinge_losses():
  real = tf.constant([2.0, 0.5, -1.0])
  fake = tf.constant([-2.0, 0.0, 1.0])
  # relu(1 - real) = [0, 0.5, 2]; relu(1 + fake) = [0, 1, 2]. The losses are per
  # example; their batch means are the hinge losses.
  d_loss = tf.reduce_mean(sngan.d_hinge_loss(real, fake))
  np.testing.assert_allclose(float(d_loss), 2.5 / 3 + 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(tf.reduce_mean(sngan.g_hinge_loss(fake))), 1.0 / 3,
                             rtol=1e-6)


def test_replicated_step_keeps_every_variable_identical_across_replicas():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    # 8x8 images, one block each: enough layers of every kind, quick to trace.
    gen = sngan.sngan_generator(num_classes=3, z_dim=8, ch=4, widths=(2, 1), bottom_width=4)
    disc = sngan.sngan_discriminator(num_classes=3, ch=4, widths=(1,), downsample=(True,))
    sngan.build_models(gen, disc)
    g_opt = keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
    d_opt = keras.optimizers.Adam(2e-4, beta_1=0.0, beta_2=0.9)
    g_opt.build(gen.trainable_variables)
    d_opt.build(disc.trainable_variables)

  def replica_step(real, labels, z):
    with tf.GradientTape() as tape:
      fake = gen(z, labels, training=True)
      d_loss = tf.reduce_mean(sngan.d_hinge_loss(disc(real, labels, training=True),
                                                 disc(fake, labels, training=True)))
    d_vars = disc.trainable_variables
    d_opt.apply_gradients(zip(tape.gradient(d_loss, d_vars), d_vars))
    with tf.GradientTape() as tape:
      g_loss = tf.reduce_mean(
          sngan.g_hinge_loss(disc(gen(z, labels, training=True), labels, training=True)))
    g_vars = gen.trainable_variables
    g_opt.apply_gradients(zip(tape.gradient(g_loss, g_vars), g_vars))

  step = tf.function(lambda *args: strategy.run(replica_step, args))

  def per_replica_inputs(ctx):  # Different data on each replica.
    rng = tf.random.Generator.from_seed(ctx.replica_id_in_sync_group)
    labels = (tf.constant([0, 2]) + ctx.replica_id_in_sync_group) % 3
    return rng.uniform((2, 8, 8, 1), -1, 1), labels, rng.normal((2, 8))

  u = disc.blocks[0].c1.sn_u.numpy()
  step(*strategy.experimental_distribute_values_from_function(per_replica_inputs))
  assert not np.allclose(disc.blocks[0].c1.sn_u.numpy(), u)

  variables = gen.variables + disc.variables + g_opt.variables + d_opt.variables
  assert any("moving_mean" in v.path for v in variables)
  for variable in variables:
    copies = strategy.experimental_local_results(variable.value)
    assert len(copies) == 2, variable.path
    if "moving_" in variable.path:   # Kept per replica, read as their mean (models/layers.py).
      np.testing.assert_allclose(tf.convert_to_tensor(variable.value),
                                 np.mean([c.numpy() for c in copies], axis=0), rtol=1e-6,
                                 err_msg=variable.path)
      continue
    np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy(), err_msg=variable.path)
