"""Scoring a generator against real data, and image grids for TensorBoard.

Every figure is computed at a stated number of generated samples N: the
Frechet distance is biased for finite N, so a generated figure is only
meaningful next to the real-data figure at the same N (real_data_scores: the
first N test images scored exactly like generated ones).
"""

import dataclasses

import numpy as np

from replibench.data import fashion_mnist
from replibench.eval import metrics
from replibench.eval.classifier import Classifier, to_model_range

KID_SUBSET_SIZE = 1000
KID_NUM_SUBSETS = 100


@dataclasses.dataclass(frozen=True)
class RealReference:
  """Classifier features of a real split: float64 features [M, d], mean [d], cov [d, d]."""
  split: str
  features: np.ndarray
  mean: np.ndarray
  cov: np.ndarray


def real_reference(classifier: Classifier, split="train", data_dir=None,
                   num_examples=None) -> RealReference:
  """Features and Gaussian statistics of Fashion-MNIST `split` (all of it, or its
  first num_examples images)."""
  images, _ = fashion_mnist.load(split, data_dir)
  images = images[:num_examples]
  features, _ = classifier.predict(to_model_range(images))
  return RealReference(split, features, *metrics.gaussian_statistics(features))


def score_outputs(features, probabilities, reference: RealReference, kid_seed=0) -> dict:
  """Scores N samples from their classifier outputs (float64 [N, d], [N, K]).

  Returns {'num_samples', 'fid', 'classifier_score', 'classifier_score_std',
  'kid', 'kid_std'}: FD against the reference statistics, the classifier score
  over 10 splits (one if N < 10), KID over KID_NUM_SUBSETS subsets of
  min(KID_SUBSET_SIZE, N).
  """
  mean, cov = metrics.gaussian_statistics(features)
  score, score_std = metrics.classifier_score(probabilities,
                                              num_splits=10 if len(features) >= 10 else 1)
  kid, kid_std = metrics.kernel_inception_distance(
      features, reference.features, subset_size=KID_SUBSET_SIZE,
      num_subsets=KID_NUM_SUBSETS, seed=kid_seed)
  return {
      "num_samples": len(features),
      "fid": metrics.frechet_distance_from_statistics(mean, cov, reference.mean,
                                                      reference.cov),
      "classifier_score": score,
      "classifier_score_std": score_std,
      "kid": kid,
      "kid_std": kid_std,
  }


def draw_samples(sample_fn, num_samples, batch_size=500):
  """Calls sample_fn(n) until num_samples images are drawn; float32 [N, 28, 28, 1]."""
  batches, drawn = [], 0
  while drawn < num_samples:
    n = min(batch_size, num_samples - drawn)
    batch = np.asarray(sample_fn(n), np.float32)[:n]
    if len(batch) == 0:
      raise ValueError(f"sample_fn({n}) returned no images")
    batches.append(batch)
    drawn += len(batch)
  return np.concatenate(batches)


def evaluate_generator(sample_fn, num_samples, classifier: Classifier,
                       real_reference: RealReference, batch_size=500) -> dict:
  """Scores num_samples generated images against the real reference.

  sample_fn(n) returns n images float [n, 28, 28, 1] in [-1, 1] (numpy or
  tensor); for a class-conditional generator it should draw labels uniformly
  over the classes, like the real data. Returns score_outputs()' dict.
  """
  features, probabilities = classifier.predict(draw_samples(sample_fn, num_samples,
                                                            batch_size))
  return score_outputs(features, probabilities, real_reference)


def real_data_scores(classifier: Classifier, real_reference: RealReference, num_samples,
                     split="test", data_dir=None) -> dict:
  """The same scores for the first num_samples real images of `split` (the floor
  a generator can reach at that N; test vs the train reference by default)."""
  images, _ = fashion_mnist.load(split, data_dir)
  if num_samples > len(images):
    raise ValueError(f"num_samples={num_samples} exceeds the {len(images)} {split} images")
  features, probabilities = classifier.predict(to_model_range(images[:num_samples]))
  return score_outputs(features, probabilities, real_reference)


def image_grid(images, num_rows, padding=1, pad_value=1.0):
  """Tiles images float [R*C, h, w, c] in [-1, 1] into float32 [1, H, W, c] in [0, 1].

  Row-major: image i goes to row i // C. For per-class samples ordered class by
  class, each row is one class. The leading 1 is the batch axis that
  tf.summary.image expects.
  """
  x = np.asarray(images, np.float32)
  if x.ndim == 3:
    x = x[..., None]
  n, h, w, c = x.shape
  if n % num_rows:
    raise ValueError(f"{n} images do not fill {num_rows} rows")
  cols = n // num_rows
  x = np.clip((x + 1.0) / 2.0, 0.0, 1.0)
  x = np.pad(x, [(0, 0), (padding, 0), (padding, 0), (0, 0)], constant_values=pad_value)
  grid = x.reshape(num_rows, cols, h + padding, w + padding, c).transpose(0, 2, 1, 3, 4)
  grid = grid.reshape(num_rows * (h + padding), cols * (w + padding), c)
  grid = np.pad(grid, [(0, padding), (0, padding), (0, 0)], constant_values=pad_value)
  return grid[None]
