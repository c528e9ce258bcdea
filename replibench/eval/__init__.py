"""GAN evaluation shared by image GANs: metrics, the Fashion-MNIST classifier, grids.

metrics: Frechet distance, classifier score, KID on any activations (float64).
classifier: a small Fashion-MNIST CNN trained here reproducibly and cached on disk.
evaluate: evaluate_generator / real_data_scores at a stated N, image_grid.
scorers: the gin-selected FashionMNISTScorer and InceptionScorer a GAN workload uses.
"""
