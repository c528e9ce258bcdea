"""Sample-quality scorers for GAN evaluation, selected in gin by reference.

    ConditionalGAN.scorer = @FashionMNISTScorer()   # 28x28x1, the suite's classifier
    ConditionalGAN.scorer = @InceptionScorer()      # RGB, Keras InceptionV3

A scorer turns images into (features, class probabilities) and scores them
against a reference set of real images: FID, classifier score and KID. The
workload calls, outside any tf.distribute strategy (a scorer's models must not
be mirrored):

  prepare(data, num_samples) -> dict: loads the model and the reference
    statistics; returns the scores of num_samples real held-out images (the
    floor a generator can reach at that N, since FID is biased in N).
  featurize(images [n, H, W, C] in [-1, 1]) -> (features [n, d], probabilities
    [n, K]), float64.
  score(features, probabilities) -> evaluate.score_outputs' dict (num_samples,
    fid, classifier_score, kid and their stds).
"""

import os

import gin
import keras
import numpy as np
import tensorflow as tf

from replibench.errors import UserError
from replibench.eval import classifier as classifier_lib
from replibench.eval import evaluate as evaluate_lib
from replibench.eval import metrics


@gin.configurable
class FashionMNISTScorer:
  """Scores 28x28x1 images with the suite's Fashion-MNIST classifier.

  The reference is the first num_reference train images; the real-data scores
  are the first N test images against it (the floor a generator can reach at N).
  classifier_config None means ClassifierConfig() as gin binds it.
  """

  def __init__(self, num_reference: int = 10000,
               classifier_config: classifier_lib.ClassifierConfig | None = None):
    self.num_reference = num_reference
    self.classifier_config = classifier_config
    self.classifier = self.reference = None

  def prepare(self, data, num_samples: int) -> dict:
    """Loads the classifier and the reference; returns the real-data scores at N."""
    if tuple(data.image_shape) != classifier_lib.IMAGE_SHAPE:
      raise UserError(f"FashionMNISTScorer scores 28x28x1 images; the data source gives "
                      f"{tuple(data.image_shape)}. Use a scorer for that data set.")
    data_dir = getattr(data, "data_dir", None)
    self.classifier = classifier_lib.fashion_mnist_classifier(self.classifier_config, data_dir)
    self.reference = evaluate_lib.real_reference(self.classifier, "train", data_dir,
                                                 self.num_reference)
    return evaluate_lib.real_data_scores(self.classifier, self.reference, num_samples,
                                         "test", data_dir)

  def featurize(self, images) -> tuple:
    """images float [n, 28, 28, 1] in [-1, 1] -> (features [n, d], probabilities [n, 10])."""
    return self.classifier.predict(np.clip(images, -1.0, 1.0))

  def score(self, features, probabilities) -> dict:
    return evaluate_lib.score_outputs(features, probabilities, self.reference)


@gin.configurable
class InceptionScorer:
  """Scores RGB images with Keras' InceptionV3 (pool features, 1000-way softmax).

  weights: a local Keras InceptionV3 weights file (include_top, e.g.
  inception_v3_weights_tf_dim_ordering_tf_kernels.h5); nothing downloads at run
  time. Images are resized to 299x299. The reference is the first num_reference
  images of the data's train split; the real-data scores are the first N images
  of its held-out split. Keras' InceptionV3 is not the TF-GAN FID graph, so the
  values track published FIDs without being equal to them.
  """

  def __init__(self, weights: str | None = None, num_reference: int = 50000,
               batch_size: int = 100):
    self.weights, self.num_reference, self.batch_size = weights, num_reference, batch_size
    self.model = self.reference = None

  def _features_of(self, batches, limit):
    outputs, count = [], 0
    for images in batches:
      outputs.append(self.featurize(images[:limit - count]))
      count += len(outputs[-1][0])
      if count >= limit:
        break
    if count < limit:
      raise UserError(f"InceptionScorer: the split holds {count} images, fewer than {limit}.")
    return (np.concatenate([f for f, _ in outputs]), np.concatenate([p for _, p in outputs]))

  def prepare(self, data, num_samples: int) -> dict:
    reference = data.reference_batches("train", self.batch_size)   # Fails first without data.
    held_out = data.reference_batches("held_out", self.batch_size)
    if not self.weights or not os.path.isfile(self.weights):
      raise UserError(
          f"InceptionScorer.weights = {self.weights!r}: set it to a local Keras InceptionV3 "
          f"weights file (inception_v3_weights_tf_dim_ordering_tf_kernels.h5, include_top); "
          f"nothing is downloaded at run time.")
    inception = keras.applications.InceptionV3(weights=self.weights)
    self.model = keras.Model(inception.input,
                             [inception.get_layer("avg_pool").output, inception.output])
    self._forward = tf.function(lambda x: self.model(
        tf.image.resize(x, (299, 299), method="bilinear"), training=False))
    features, _ = self._features_of(reference, self.num_reference)
    self.reference = evaluate_lib.RealReference("train", features,
                                                *metrics.gaussian_statistics(features))
    return self.score(*self._features_of(held_out, num_samples))

  def featurize(self, images) -> tuple:
    """images float [n, h, w, 3] in [-1, 1] (Inception's own input range) -> float64
    (features [n, 2048], probabilities [n, 1000])."""
    features, probabilities = self._forward(tf.clip_by_value(images, -1.0, 1.0))
    return features.numpy().astype(np.float64), probabilities.numpy().astype(np.float64)

  def score(self, features, probabilities) -> dict:
    return evaluate_lib.score_outputs(features, probabilities, self.reference)
