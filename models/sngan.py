"""SN-GAN: ResNet generator with conditional BN, SN ResNet projection discriminator.

Follows the authors' Chainer code (pfnet-research/sngan_projection; Miyato et al.
2018, Miyato & Koyama 2018): the generator is unnormalised apart from its batch
norms; every discriminator layer is spectrally normalised; the class enters the
discriminator by projection, D(x, y) = linear(h) + <embed(y), h> with h the
sum-pooled features. Images are NHWC floats in [-1, 1] (tanh output).

Keras 3 cannot wrap a Layer class in gin.configurable (its argspec check fails on
gin's __init__ wrapper), so gin configures the builder functions below. Two sizes:

  Fashion-MNIST 28x28x1 (the defaults): G 128 -> 7x7x64 -> 14 -> 28, width 64;
  D 28 -> 14 -> 7 -> 7 with widths 64, 128, 128.
  ImageNet 128x128x3 (projection paper, "ch=64"): IMAGENET128_GENERATOR and
  IMAGENET128_DISCRIMINATOR, e.g. in gin
    sngan_generator.ch = 64
    sngan_generator.widths = (16, 16, 8, 4, 2, 1)
    sngan_generator.bottom_width = 4
    sngan_generator.out_channels = 3
    sngan_discriminator.widths = (1, 2, 4, 8, 16, 16)
    sngan_discriminator.downsample = (True, True, True, True, True, False)
    sngan_discriminator.in_channels = 3

Where the models may be split across devices (they say where, never how): each
generator block builds its two 3x3 convolutions with `conv_layer` (default
models.layers.conv2d, whole layers; in gin sngan_generator.conv_layer = ...) as a
Megatron pair, the first split by output channels and the second by input channels,
with only a conditional batch norm and a ReLU between them (the spectrally normalised
discriminator stays whole: sigma of a split kernel would need collectives in every
power iteration). For a pipeline, `pieces()` cuts each model between its blocks.
"""

from typing import Callable, Sequence

import gin
import keras
from keras import ops

from models import pieces as pieces_lib
from models.layers import SPLIT_INPUT, SPLIT_OUTPUT, MeanAggregatedBatchNorm, conv2d
from models.spectral_norm import SNConv2D, SNDense, SNEmbedding

IMAGENET128_GENERATOR = dict(z_dim=128, ch=64, widths=(16, 16, 8, 4, 2, 1),
                             bottom_width=4, out_channels=3)
IMAGENET128_DISCRIMINATOR = dict(ch=64, widths=(1, 2, 4, 8, 16, 16),
                                 downsample=(True, True, True, True, True, False))

NormFactory = Callable[..., keras.layers.Layer]


def _glorot_sqrt2():
  # Chainer GlorotUniform(sqrt(2)) scales the uniform limit by sqrt(2), i.e. the
  # variance by 2; the authors use it for the 3x3 convs of every residual block.
  return keras.initializers.VarianceScaling(2.0, mode="fan_avg", distribution="uniform")


@gin.configurable
def sngan_batch_norm(name=None, center=False, scale=False, momentum=0.9, epsilon=2e-5):
  """The default norm_layer factory (Chainer's BN decay and eps)."""
  return MeanAggregatedBatchNorm(center=center, scale=scale, momentum=momentum,
                                 epsilon=epsilon, name=name)


class ConditionalBatchNorm(keras.layers.Layer):
  """norm(x) * gamma[y] + beta[y]: per-class scale and shift on an affine-free norm.

  num_classes=0 gives one unconditional gamma/beta (labels ignored). gamma starts
  at 1, beta at 0. Input NHWC float, labels int [B]. The normaliser is
  norm_layer(name=..., center=False, scale=False): any factory taking keras
  BatchNormalization's arguments works (e.g. a cross-replica BN).
  """

  def __init__(self, num_classes: int, norm_layer: NormFactory = sngan_batch_norm,
               **kwargs):
    super().__init__(**kwargs)
    self.num_classes = num_classes
    self.norm = norm_layer(name="norm", center=False, scale=False)

  def build(self, input_shape):
    self.norm.build(input_shape)
    channels = input_shape[-1]
    rows = max(self.num_classes, 1)
    self.gamma = self.add_weight(name="gamma", shape=(rows, channels), initializer="ones")
    self.beta = self.add_weight(name="beta", shape=(rows, channels), initializer="zeros")

  def call(self, x, labels=None, training=None):
    h = self.norm(x, training=training)
    if self.num_classes:
      gamma = ops.take(self.gamma, ops.cast(labels, "int32"), axis=0)[:, None, None, :]
      beta = ops.take(self.beta, ops.cast(labels, "int32"), axis=0)[:, None, None, :]
    else:
      gamma, beta = self.gamma[0], self.beta[0]
    return h * gamma + beta


class GeneratorBlock(keras.layers.Layer):
  """Pre-activation up-block: CBN-ReLU-up-conv3x3-CBN-ReLU-conv3x3 + (up, conv1x1)."""

  def __init__(self, in_channels, out_channels, num_classes, norm_layer,
               upsample=True, conv_layer=conv2d, **kwargs):
    super().__init__(**kwargs)
    self.out_channels = out_channels
    self.upsample = keras.layers.UpSampling2D(2) if upsample else None
    self.b1 = ConditionalBatchNorm(num_classes, norm_layer, name="b1")
    self.c1 = conv_layer(out_channels, 3, padding="same", kernel_initializer=_glorot_sqrt2(),
                         name="c1", split=SPLIT_OUTPUT)
    self.b2 = ConditionalBatchNorm(num_classes, norm_layer, name="b2")
    self.c2 = conv_layer(out_channels, 3, padding="same", kernel_initializer=_glorot_sqrt2(),
                         name="c2", split=SPLIT_INPUT)
    self.c_sc = None
    if in_channels != out_channels or upsample:
      self.c_sc = keras.layers.Conv2D(out_channels, 1, name="c_sc")

  def output_shape_for(self, input_shape):
    batch, height, width, _ = input_shape
    scale = 2 if self.upsample is not None else 1
    return (batch, height * scale, width * scale, self.out_channels)

  def build(self, input_shape):
    # Explicit builds spare Keras a symbolic trace of call() per nesting level.
    out_shape = self.output_shape_for(input_shape)
    self.b1.build(input_shape)
    self.c1.build(out_shape[:3] + (input_shape[-1],))
    # c1's own output shape: a split c1 gives this device its share of the channels.
    hidden = self.c1.compute_output_shape(out_shape[:3] + (input_shape[-1],))
    self.b2.build(hidden)
    self.c2.build(hidden)
    if self.c_sc is not None:
      self.c_sc.build(input_shape)

  def call(self, x, labels=None, training=None):
    h = ops.relu(self.b1(x, labels, training=training))
    if self.upsample is not None:
      h = self.upsample(h)
    h = self.c1(h)
    h = self.c2(ops.relu(self.b2(h, labels, training=training)))
    shortcut = x
    if self.c_sc is not None:
      # A 1x1 conv commutes with nearest upsampling; convolving first is cheaper.
      shortcut = self.c_sc(shortcut)
      if self.upsample is not None:
        shortcut = self.upsample(shortcut)
    return h + shortcut


class DiscriminatorBlock(keras.layers.Layer):
  """SN residual down-block.

  Regular: ReLU-conv3x3-ReLU-conv3x3-avgpool + (conv1x1, avgpool); the hidden
  width is the input width. optimized=True (the first block, on raw images):
  conv3x3-ReLU-conv3x3-avgpool + (avgpool, conv1x1), no leading ReLU.
  """

  def __init__(self, in_channels, out_channels, downsample=True, optimized=False,
               **kwargs):
    super().__init__(**kwargs)
    self.optimized = optimized
    self.out_channels = out_channels
    hidden = out_channels if optimized else in_channels
    self.pool = keras.layers.AveragePooling2D(2) if downsample else None
    self.c1 = SNConv2D(hidden, 3, kernel_initializer=_glorot_sqrt2(), name="c1")
    self.c2 = SNConv2D(out_channels, 3, kernel_initializer=_glorot_sqrt2(), name="c2")
    self.c_sc = None
    if optimized or in_channels != out_channels or downsample:
      self.c_sc = SNConv2D(out_channels, 1, name="c_sc")

  def output_shape_for(self, input_shape):
    batch, height, width, _ = input_shape
    if self.pool is not None:
      height, width = height // 2, width // 2
    return (batch, height, width, self.out_channels)

  def build(self, input_shape):
    self.c1.build(input_shape)
    self.c2.build(tuple(input_shape[:3]) + (self.c1.filters,))
    if self.c_sc is not None:
      pooled = self.output_shape_for(input_shape)[:3] + (input_shape[-1],)
      self.c_sc.build(pooled if self.optimized else input_shape)

  def _pool(self, x):
    return self.pool(x) if self.pool is not None else x

  def call(self, x, training=None):
    h = x if self.optimized else ops.relu(x)
    h = self.c1(h, training=training)
    h = self._pool(self.c2(ops.relu(h), training=training))
    if self.c_sc is None:
      return h + x
    if self.optimized:
      return h + self.c_sc(self._pool(x), training=training)
    return h + self._pool(self.c_sc(x, training=training))


class ResNetGenerator(keras.Model):
  """z [B, z_dim] float, labels int [B] -> images [B, H, W, out_channels] in [-1, 1].

  Dense to bottom_width^2 * ch*widths[0], then one up-block per later entry of
  widths (ch*w channels each), then BN-ReLU-conv3x3-tanh. H = W =
  bottom_width * 2**(len(widths) - 1).
  """

  def __init__(self, num_classes, z_dim, ch, widths, bottom_width, out_channels,
               norm_layer, conv_layer=conv2d, **kwargs):
    super().__init__(**kwargs)
    self.num_classes = num_classes
    self.z_dim = z_dim
    self.bottom = (bottom_width, bottom_width, ch * widths[0])
    self.l1 = keras.layers.Dense(bottom_width * bottom_width * ch * widths[0], name="l1")
    self.blocks = [
        GeneratorBlock(ch * w_in, ch * w_out, num_classes, norm_layer, conv_layer=conv_layer,
                       name=f"block{i}")
        for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:]), start=2)]
    self.b_out = ConditionalBatchNorm(0, norm_layer, name="b_out")
    self.c_out = keras.layers.Conv2D(out_channels, 3, padding="same", name="c_out")
    side = bottom_width * 2 ** len(self.blocks)
    self.image_shape = (side, side, out_channels)

  def build(self, z_shape):
    self.l1.build(z_shape)
    shape = (z_shape[0],) + self.bottom
    for block in self.blocks:
      block.build(shape)
      shape = block.output_shape_for(shape)
    self.b_out.build(shape)
    self.c_out.build(shape)

  def call(self, z, labels=None, training=None):
    return pieces_lib.run(self.pieces(), (z, labels), training)

  def pieces(self) -> list[pieces_lib.Piece]:
    """The forward pass cut between blocks; the carry is (features, labels)."""
    def dense(carry, training):
      z, labels = carry
      return ops.reshape(self.l1(z), (-1,) + self.bottom), labels

    def output(carry, training):
      h = ops.relu(self.b_out(carry[0], training=training))
      return ops.tanh(self.c_out(h))

    return ([pieces_lib.Piece("l1", dense, (self.l1,))]
            + [pieces_lib.Piece(b.name, _block_piece(b), (b,)) for b in self.blocks]
            + [pieces_lib.Piece("output", output, (self.b_out, self.c_out))])


class ResNetProjectionDiscriminator(keras.Model):
  """images [B, H, W, C] in [-1, 1], labels int [B] -> logits float [B].

  Block i has ch*widths[i] channels and halves the resolution if downsample[i];
  block 0 is the optimized block. num_classes=0 drops the projection term.
  """

  def __init__(self, num_classes, ch, widths, downsample, in_channels, **kwargs):
    super().__init__(**kwargs)
    if len(widths) != len(downsample):
      raise ValueError(f"widths {widths} and downsample {downsample} differ in length")
    self.num_classes = num_classes
    channels = [in_channels] + [ch * w for w in widths]
    self.blocks = [
        DiscriminatorBlock(channels[i], channels[i + 1], downsample[i], optimized=i == 0,
                           name=f"block{i + 1}")
        for i in range(len(widths))]
    self.l_out = SNDense(1, name="l_out")
    self.l_y = (SNEmbedding(num_classes, channels[-1], name="l_y")
                if num_classes else None)

  def build(self, images_shape):
    shape = tuple(images_shape)
    for block in self.blocks:
      block.build(shape)
      shape = block.output_shape_for(shape)
    self.l_out.build((shape[0], shape[-1]))
    if self.l_y is not None:
      self.l_y.build()

  def call(self, images, labels=None, training=None):
    return pieces_lib.run(self.pieces(), (images, labels), training)

  def pieces(self) -> list[pieces_lib.Piece]:
    """The forward pass cut between blocks; the carry is (features, labels)."""
    def head(carry, training):
      h, labels = carry
      h = ops.sum(ops.relu(h), axis=(1, 2))  # Sum (not mean) pooling, as the paper.
      logits = self.l_out(h, training=training)[:, 0]
      if self.l_y is not None:
        logits = logits + ops.sum(self.l_y(labels, training=training) * h, axis=1)
      return logits

    head_layers = (self.l_out,) + ((self.l_y,) if self.l_y is not None else ())
    return ([pieces_lib.Piece(b.name, _block_piece(b, labelled=False), (b,))
             for b in self.blocks] + [pieces_lib.Piece("head", head, head_layers)])


def _block_piece(block, labelled: bool = True):
  """A block as a piece: (h, labels) -> (block(h[, labels]), labels)."""
  def fn(carry, training):
    h, labels = carry
    h = block(h, labels, training=training) if labelled else block(h, training=training)
    return h, labels
  return fn


@gin.configurable
def sngan_generator(num_classes: int = 10, z_dim: int = 128, ch: int = 64,
                    widths: Sequence[int] = (1, 1, 1), bottom_width: int = 7,
                    out_channels: int = 1, norm_layer: NormFactory = sngan_batch_norm,
                    conv_layer: Callable[..., keras.layers.Layer] = conv2d) -> ResNetGenerator:
  """The conditional ResNet generator; defaults are the Fashion-MNIST size. conv_layer
  builds each block's two 3x3 convolutions (a pair a model-parallel factory may split)."""
  return ResNetGenerator(num_classes, z_dim, ch, tuple(widths), bottom_width,
                         out_channels, norm_layer, conv_layer, name="generator")


@gin.configurable
def sngan_discriminator(num_classes: int = 10, ch: int = 64,
                        widths: Sequence[int] = (1, 2, 2),
                        downsample: Sequence[bool] = (True, True, False),
                        in_channels: int = 1) -> ResNetProjectionDiscriminator:
  """The SN ResNet projection discriminator; defaults are the Fashion-MNIST size."""
  return ResNetProjectionDiscriminator(num_classes, ch, tuple(widths), tuple(downsample),
                                       in_channels, name="discriminator")


def build_models(generator, discriminator):
  """Creates every variable of both models without running them.

  Call under strategy.scope(): variables must exist before a replicated step is
  traced.
  """
  generator.build((None, generator.z_dim))
  discriminator.build((None,) + generator.image_shape)


# The losses are per example, not batch means: a replicated step averages them
# over the global batch (tf.nn.compute_average_loss), not over one replica's
# slice; on one device, take their mean.


@gin.configurable
def d_hinge_loss(real_logits, fake_logits):
  """Discriminator hinge loss per example: relu(1 - D(x)) + relu(1 + D(G(z))).

  Args:
    real_logits: float [B], D on real images.
    fake_logits: float [B], D on generated images (paired with real_logits).

  Returns:
    float [B]; its mean over a batch is mean(relu(1 - D(x))) + mean(relu(1 + D(G(z)))).
  """
  return ops.relu(1.0 - real_logits) + ops.relu(1.0 + fake_logits)


@gin.configurable
def g_hinge_loss(fake_logits):
  """Generator hinge loss per example: -D(G(z)); float [B] -> float [B]."""
  return -fake_logits
