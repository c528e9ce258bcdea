"""Sample-quality metrics on classifier outputs, all in float64 numpy.

- Frechet distance (Heusel et al. 2017, "FID" with Inception features): the
  distance between Gaussians fitted to two activation sets. Biased for finite N,
  so only compare values computed at the same N.
- Classifier score (Salimans et al. 2016, "Inception score"): exp E_x KL(p(y|x) || p(y)).
- KID (Binkowski et al. 2018): unbiased MMD^2 with the polynomial kernel
  k(x, y) = (x.y / d + 1)^3, averaged over random subsets.
"""

import warnings

import numpy as np
import scipy.linalg
import scipy.special


def _as_float64_matrix(activations, name):
  x = np.asarray(activations, dtype=np.float64)
  if x.ndim != 2 or x.shape[0] < 2:
    raise ValueError(f"{name}: expected activations [N >= 2, d], got shape {x.shape}")
  return x


def gaussian_statistics(activations):
  """(mean [d], covariance [d, d]) in float64; unbiased covariance (ddof=1)."""
  x = _as_float64_matrix(activations, "activations")
  return x.mean(axis=0), np.cov(x, rowvar=False)


def frechet_distance_from_statistics(mu1, sigma1, mu2, sigma2, eps=1e-6):
  """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 sqrtm(S1 S2)).

  As in the TTUR reference implementation: if sqrtm(S1 S2) is not finite (a
  singular product), eps * I is added to both covariances; the negligible
  imaginary part that sqrtm can return for a real product is dropped, and a
  large one (|imag| > 1e-3 on the diagonal) is an error.
  """
  mu1, mu2 = np.atleast_1d(np.float64(mu1)), np.atleast_1d(np.float64(mu2))
  sigma1, sigma2 = np.atleast_2d(np.float64(sigma1)), np.atleast_2d(np.float64(sigma2))
  if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
    raise ValueError(f"Statistics differ in shape: means {mu1.shape} vs {mu2.shape}, "
                     f"covariances {sigma1.shape} vs {sigma2.shape}")
  diff = mu1 - mu2
  with warnings.catch_warnings():
    # A singular product is handled below (as TTUR's disp=False did): no warning.
    warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
    covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)
  if not np.isfinite(covmean).all():
    offset = np.eye(sigma1.shape[0]) * eps
    covmean = scipy.linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
  if np.iscomplexobj(covmean):
    if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
      raise ValueError(f"sqrtm(S1 S2) has an imaginary component of "
                       f"{np.max(np.abs(covmean.imag)):.3g}")
    covmean = covmean.real
  return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean))


def classifier_score(probabilities, num_splits=1):
  """Inception-score style exp(E_x KL(p(y|x) || p(y))) on [N, K] class probabilities.

  The N rows are cut into num_splits contiguous parts (as the Inception score
  code does) and the score is computed per part. Returns (mean, std) over parts
  (std 0.0 for one part). Uniform predictions give 1; confident predictions
  spread evenly over K classes give K.
  """
  p = np.asarray(probabilities, dtype=np.float64)
  if p.ndim != 2:
    raise ValueError(f"probabilities: expected [N, K], got shape {p.shape}")
  scores = []
  for part in np.array_split(p, num_splits):
    marginal = part.mean(axis=0, keepdims=True)
    kl = scipy.special.rel_entr(part, marginal).sum(axis=1)  # 0 log 0 = 0.
    scores.append(np.exp(kl.mean()))
  return float(np.mean(scores)), float(np.std(scores))


def polynomial_mmd2_unbiased(x, y):
  """Unbiased MMD^2 between [m, d] and [n, d] float64 samples, k = (x.y/d + 1)^3."""
  d = x.shape[1]
  m, n = x.shape[0], y.shape[0]
  cube = lambda k: k * k * k  # Far faster than k ** 3 (a generic pow) in numpy.
  k_xx = cube(x @ x.T / d + 1.0)
  k_yy = cube(y @ y.T / d + 1.0)
  k_xy = cube(x @ y.T / d + 1.0)
  within_x = (k_xx.sum() - np.trace(k_xx)) / (m * (m - 1))
  within_y = (k_yy.sum() - np.trace(k_yy)) / (n * (n - 1))
  return within_x + within_y - 2.0 * k_xy.mean()


def kernel_inception_distance(activations1, activations2, subset_size=1000,
                              num_subsets=100, seed=0):
  """KID between [N1, d] and [N2, d] activations; returns (mean, std) over subsets.

  Block estimator of Binkowski et al.'s reference code: each of num_subsets
  rounds draws min(subset_size, N1, N2) rows without replacement from each set
  (fresh draws per round, numpy Generator seeded by seed) and computes the
  unbiased MMD^2. The mean can be slightly negative for equal distributions.
  """
  x = _as_float64_matrix(activations1, "activations1")
  y = _as_float64_matrix(activations2, "activations2")
  if x.shape[1] != y.shape[1]:
    raise ValueError(f"Activation widths differ: {x.shape[1]} vs {y.shape[1]}")
  m = min(subset_size, len(x), len(y))
  rng = np.random.default_rng(seed)
  values = np.array([
      polynomial_mmd2_unbiased(x[rng.choice(len(x), m, replace=False)],
                               y[rng.choice(len(y), m, replace=False)])
      for _ in range(num_subsets)])
  return float(values.mean()), float(values.std())
