"""models/resnet.py: architecture facts, the norm-layer factory, zero-init, weight-decay set, gin."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from models import resnet


def _n(variables):
  return sum(int(np.prod(v.shape)) for v in variables)


@pytest.fixture(scope="module")
def r50():
  return resnet.resnet50()


def test_resnet50_has_the_reference_parameter_count(r50):
  # torchvision / TF Model Garden ResNet-50: 25,557,032 (conv kernels, BN scale/offset, fc).
  assert _n(r50.trainable_variables) == 25_557_032
  assert _n(r50.non_trainable_variables) == 53_120  # BN moving mean/variance
  assert r50.output_shape == (None, 1000)


def test_resnet50_is_v1_5_stride_on_the_3x3(r50):
  first = {n: r50.get_layer(f"stage2_block1_{n}") for n in ("conv1", "conv2", "conv3", "proj_conv")}
  assert first["conv1"].strides == (1, 1) and first["conv1"].kernel_size == (1, 1)
  assert first["conv2"].strides == (2, 2) and first["conv2"].kernel_size == (3, 3)
  assert first["conv3"].strides == (1, 1) and first["conv3"].filters == 512
  assert first["proj_conv"].strides == (2, 2)
  blocks = [sum(1 for l in r50.layers if l.name.startswith(f"stage{s}_block") and
                l.name.endswith("_conv1")) for s in (1, 2, 3, 4)]
  assert blocks == [3, 4, 6, 3]
  assert r50.get_layer("stage4_block3_out").output.shape[1:] == (7, 7, 2048)


def test_resnet50_runs_on_small_images():
  model = resnet.resnet50(num_classes=5, input_shape=(64, 64, 3))
  assert model(tf.zeros([2, 64, 64, 3]), training=False).shape == (2, 5)


def test_small_resnet_shapes_and_options():
  m = resnet.small_resnet()
  assert m.input_shape == (None, 28, 28, 1) and m.output_shape == (None, 10)
  assert m.get_layer("stage3_block1_out").output.shape[1:] == (7, 7, 64)
  m2 = resnet.small_resnet(widths=(8, 16), blocks_per_stage=(2, 1), stem_stride=2)
  assert m2.get_layer("stem_relu").output.shape[1:] == (14, 14, 8)
  assert m2.get_layer("stage1_block2_out").output.shape[1:] == (14, 14, 8)
  assert m2.get_layer("stage2_block1_out").output.shape[1:] == (7, 7, 16)
  m3 = resnet.small_resnet(widths=(8, 16), block=resnet.bottleneck_block, strides=(2, 1))
  assert m3.get_layer("stage2_block1_out").output.shape[1:] == (14, 14, 64)
  out = m2(tf.random.normal([3, 28, 28, 1]), training=True)
  assert out.shape == (3, 10) and bool(tf.reduce_all(tf.math.is_finite(out)))


@pytest.mark.parametrize("kwargs", [dict(widths=(8, 16), blocks_per_stage=(1,)),
                                    dict(widths=(8,), strides=(1, 2)),
                                    dict(widths=(8,), blocks_per_stage=(0,)),
                                    dict(block="wide")])
def test_small_resnet_rejects_inconsistent_stages(kwargs):
  with pytest.raises(ValueError):
    resnet.small_resnet(**kwargs)


def test_norm_layer_factory_makes_every_norm_layer():
  made = []

  def norm(name=None):
    layer = keras.layers.LayerNormalization(name=name)
    made.append(layer)
    return layer

  model = resnet.small_resnet(widths=(8, 16), norm_layer=norm)
  assert made and all(l.name for l in made)
  assert not [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert {l.name for l in made} <= {l.name for l in model.layers}
  assert made[0].name == "stem_norm"


def test_default_batch_norm_settings():
  bn = resnet.small_resnet(widths=(8,)).get_layer("stem_norm")
  assert isinstance(bn, keras.layers.BatchNormalization)
  assert bn.momentum == pytest.approx(0.9) and bn.epsilon == pytest.approx(1e-5)


def test_zero_init_residual_zeroes_only_the_last_norm_of_each_block():
  m = resnet.small_resnet(widths=(8, 16), blocks_per_stage=(2, 1))
  for name in ("stage1_block1_norm2", "stage1_block2_norm2", "stage2_block1_norm2"):
    assert np.all(m.get_layer(name).gamma.numpy() == 0)
  for name in ("stage1_block1_norm1", "stage2_block1_proj_norm", "stem_norm"):
    assert np.all(m.get_layer(name).gamma.numpy() == 1)
  m_off = resnet.small_resnet(widths=(8, 16), zero_init_residual=False)
  assert np.all(m_off.get_layer("stage1_block1_norm2").gamma.numpy() == 1)
  r = resnet.small_resnet(widths=(4,), block=resnet.bottleneck_block)
  assert np.all(r.get_layer("stage1_block1_norm3").gamma.numpy() == 0)
  assert np.all(r.get_layer("stage1_block1_norm2").gamma.numpy() == 1)


def test_zero_init_residual_blocks_start_as_identity_plus_relu():
  # With the last gamma 0 (and beta 0), an identity-shortcut block outputs relu(input).
  m = resnet.small_resnet(widths=(8,), blocks_per_stage=(2,))
  probe = keras.Model(m.input, [m.get_layer("stage1_block1_out").output,
                                m.get_layer("stage1_block2_out").output])
  a, b = probe(tf.random.normal([2, 28, 28, 1]), training=False)
  np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_zero_init_with_a_norm_layer_without_gamma_is_an_error():
  with pytest.raises(ValueError, match="zero_init_residual"):
    resnet.small_resnet(widths=(8,),
                        norm_layer=lambda name=None: keras.layers.BatchNormalization(
                            scale=False, name=name))
  resnet.small_resnet(widths=(8,), zero_init_residual=False,
                      norm_layer=lambda name=None: keras.layers.BatchNormalization(
                          scale=False, name=name))


def test_decayed_weights_are_exactly_the_conv_and_dense_kernels(r50):
  for model in (resnet.small_resnet(widths=(8, 16)), r50):
    decayed = resnet.decayed_weights(model)
    kernels = [l.kernel for l in model.layers if isinstance(l, (keras.layers.Conv2D,
                                                               keras.layers.Dense))]
    assert {id(v) for v in decayed} == {id(v) for v in kernels}
    assert len(decayed) == len(kernels)
    assert all(v.trainable for v in decayed)
  r50_kernels = resnet.decayed_weights(r50)
  assert len(r50_kernels) == 54  # 53 convs + fc
  no_bn = _n(r50.trainable_variables) - 2 * _n(
      [l.gamma for l in r50.layers if isinstance(l, keras.layers.BatchNormalization)])
  assert _n(r50_kernels) == no_bn - 1000  # everything but BN scale/offset and the fc bias


def test_builders_are_gin_configurable():
  calls = []

  @gin.configurable("test_norm")
  def test_norm(name=None):
    calls.append(name)
    return keras.layers.BatchNormalization(name=name)

  gin.parse_config("""
      small_resnet.widths = (8, 12)
      small_resnet.num_classes = 3
      small_resnet.norm_layer = @test_norm
      batch_norm.momentum = 0.5
  """)
  m = resnet.small_resnet()
  assert m.output_shape == (None, 3)
  assert m.get_layer("stage2_block1_out").output.shape[-1] == 12
  assert "stem_norm" in calls
  assert resnet.batch_norm(name="x").momentum == pytest.approx(0.5)


def test_small_resnet_learns_a_tiny_batch():
  keras.utils.set_random_seed(0)
  m = resnet.small_resnet(widths=(8, 16), stem_stride=2)
  y = tf.range(32) % 10
  patterns = tf.random.normal([10, 28, 28, 1])
  x = tf.gather(patterns, y) + 0.3 * tf.random.normal([32, 28, 28, 1])
  opt = keras.optimizers.SGD(0.5, momentum=0.9)
  decayed = resnet.decayed_weights(m)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          y, m(x, training=True)))
      total = loss + 1e-4 * tf.add_n([tf.reduce_sum(w ** 2) for w in decayed])
    grads = tape.gradient(total, m.trainable_variables)
    opt.apply_gradients(zip(grads, m.trainable_variables))
    return loss

  first = float(step())
  for _ in range(30):
    last = float(step())
  assert last < 0.3 * first
