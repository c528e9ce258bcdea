"""GAN metrics (FD, classifier score, KID), the cached classifier, and image grids."""

import dataclasses

import numpy as np
import pytest

from replibench.eval import classifier as classifier_lib
from replibench.eval import evaluate, metrics


def _gaussian(rng, mean, variances, n):
  return mean + rng.standard_normal((n, len(variances))) * np.sqrt(variances)


def _frechet(activations1, activations2):
  """FID's formula on Gaussians fitted to [N, d] activations, as evaluate.py applies it."""
  return metrics.frechet_distance_from_statistics(*metrics.gaussian_statistics(activations1),
                                                  *metrics.gaussian_statistics(activations2))


def test_frechet_distance_matches_the_closed_form_for_diagonal_gaussians():
  mu1, mu2 = np.array([0.0, 1.0, -1.0, 0.5]), np.array([1.0, 1.0, 0.0, -0.5])
  s1, s2 = np.array([1.0, 2.0, 0.5, 1.0]), np.array([2.0, 1.0, 1.0, 0.25])
  closed_form = np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2.0 * np.sqrt(s1 * s2))
  exact = metrics.frechet_distance_from_statistics(mu1, np.diag(s1), mu2, np.diag(s2))
  np.testing.assert_allclose(exact, closed_form, rtol=1e-10)
  rng = np.random.default_rng(0)
  n = 50_000
  sampled = _frechet(_gaussian(rng, mu1, s1, n), _gaussian(rng, mu2, s2, n))
  # Sampling error of the statistics is O(1/sqrt(n)) ~ 0.005 per term here.
  np.testing.assert_allclose(sampled, closed_form, atol=0.05)


def test_frechet_distance_of_a_set_with_itself_is_zero_and_singular_input_is_finite():
  x = np.random.default_rng(1).standard_normal((500, 16))
  assert abs(_frechet(x, x)) < 1e-6
  degenerate = x.copy()
  degenerate[:, :4] = 0.0  # Zero-variance features: a singular covariance.
  value = _frechet(degenerate, x)
  assert np.isfinite(value) and value > 3.0  # The 4 lost unit variances cost ~4.


def test_statistics_are_float64_and_unbiased():
  x = np.array([[0.0], [2.0]], np.float32)
  mean, cov = metrics.gaussian_statistics(x)
  assert mean.dtype == cov.dtype == np.float64
  np.testing.assert_allclose(cov, [[2.0]])  # ddof=1: ((-1)^2 + 1^2) / (2 - 1).


def test_classifier_score_bounds():
  k = 10
  uniform = np.full((100, k), 1.0 / k)
  assert metrics.classifier_score(uniform)[0] == pytest.approx(1.0)
  one_hot = np.eye(k)[np.arange(200) % k]
  mean, std = metrics.classifier_score(one_hot, num_splits=2)
  assert mean == pytest.approx(k) and std == pytest.approx(0.0, abs=1e-9)


def test_kid_is_near_zero_for_equal_and_positive_for_shifted_distributions():
  rng = np.random.default_rng(2)
  x, y = rng.standard_normal((1000, 8)), rng.standard_normal((1000, 8))
  same, same_std = metrics.kernel_inception_distance(x, y, subset_size=200, num_subsets=20)
  shifted, _ = metrics.kernel_inception_distance(x, y + 0.5, subset_size=200, num_subsets=20)
  assert abs(same) < 3 * same_std + 1e-3
  assert shifted > 10 * max(same_std, abs(same))
  # The estimator is unbiased: a subset against itself still counts pairs i != j only.
  np.testing.assert_allclose(metrics.polynomial_mmd2_unbiased(x[:3], x[:3]),
                             _mmd2_by_loops(x[:3], x[:3]), rtol=1e-12)


def _mmd2_by_loops(x, y):
  k = lambda a, b: (a @ b / len(a) + 1.0) ** 3
  m, n = len(x), len(y)
  xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
  yy = sum(k(y[i], y[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
  xy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
  return xx + yy - 2 * xy


def test_image_grid_layout_and_range():
  images = np.stack([np.full((2, 3, 1), v) for v in (-1.0, 1.0, 0.0, -1.0, 1.0, 0.0)])
  grid = evaluate.image_grid(images, num_rows=2, padding=1, pad_value=0.5)
  assert grid.shape == (1, 2 * 3 + 1, 3 * 4 + 1, 1)
  assert grid.min() >= 0.0 and grid.max() <= 1.0
  assert grid[0, 1, 1, 0] == 0.0 and grid[0, 1, 5, 0] == 1.0 and grid[0, 4, 9, 0] == 0.5
  assert grid[0, 0, 0, 0] == 0.5  # Padding.


TINY_CONFIG = classifier_lib.ClassifierConfig(conv_widths=(4,), feature_dim=8, epochs=1,
                                            batch_size=64, num_train_examples=512)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
  """A cache directory holding TINY_CONFIG's classifier, trained once per module."""
  cache = tmp_path_factory.mktemp("cache")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(classifier_lib.CACHE_ENV, str(cache))
    classifier_lib.fashion_mnist_classifier(TINY_CONFIG)
  return cache


def test_tiny_classifier_is_cached_reloaded_and_reproducible(tiny_cache, tmp_path,
                                                              monkeypatch):
  monkeypatch.setenv(classifier_lib.CACHE_ENV, str(tiny_cache))
  key = TINY_CONFIG.cache_key()
  files = sorted(p.name for p in (tiny_cache / "fmnist_classifier").iterdir())
  assert files == [f"{key}.json", f"{key}.weights.h5"]
  loaded = classifier_lib.fashion_mnist_classifier(TINY_CONFIG)  # From the cache.
  assert 0.0 <= loaded.test_accuracy <= 1.0

  images = np.random.default_rng(3).uniform(-1, 1, (5, 28, 28, 1)).astype(np.float32)
  features, probabilities = loaded.predict(images)
  assert features.shape == (5, 8) and probabilities.shape == (5, 10)
  assert features.dtype == probabilities.dtype == np.float64
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)

  monkeypatch.setenv(classifier_lib.CACHE_ENV, str(tmp_path))
  retrained = classifier_lib.fashion_mnist_classifier(TINY_CONFIG)  # Trains again.
  assert (tmp_path / "fmnist_classifier" / f"{key}.weights.h5").exists()
  assert retrained.test_accuracy == loaded.test_accuracy
  np.testing.assert_array_equal(retrained.predict(images)[0], features)

  assert dataclasses.replace(TINY_CONFIG, seed=1).cache_key() != key
  with pytest.raises(ValueError, match=r"\[-1, 1\]"):
    loaded.predict(images * 255.0)


def test_evaluate_generator_scores_real_images_like_real_data(tiny_cache, monkeypatch):
  monkeypatch.setenv(classifier_lib.CACHE_ENV, str(tiny_cache))
  monkeypatch.setattr(evaluate, "KID_NUM_SUBSETS", 10)
  classifier = classifier_lib.fashion_mnist_classifier(TINY_CONFIG)
  reference = evaluate.real_reference(classifier, num_examples=2000)
  real = evaluate.real_data_scores(classifier, reference, num_samples=300)
  test_images = classifier_lib.to_model_range(
      classifier_lib.fashion_mnist.load("test")[0][:300])
  drawn = [0]

  def sample_fn(n):  # "Generates" the same test images, in batches.
    drawn[0] += n
    return test_images[drawn[0] - n:drawn[0]]

  generated = evaluate.evaluate_generator(sample_fn, 300, classifier, reference,
                                          batch_size=128)
  assert generated == real
  assert set(real) >= {"fid", "classifier_score", "kid", "num_samples"}
  assert real["num_samples"] == 300
  noise = evaluate.evaluate_generator(
      lambda n: np.random.default_rng(n).uniform(-1, 1, (n, 28, 28, 1)), 300, classifier,
      reference)
  assert noise["fid"] > real["fid"] and noise["kid"] > real["kid"]
