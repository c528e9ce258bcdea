"""Imports every module that registers gin configurables, so configs can name them."""

# pylint: disable=unused-import
import models.resnet  # noqa: F401
import replibench.data.imagenet_gan  # noqa: F401  (Imagenet2012Gan)
import replibench.data.sources  # noqa: F401
import replibench.engine  # noqa: F401  (topology.*, engine.cross_replica_batch_norm)
import replibench.eval.scorers  # noqa: F401  (FashionMNISTScorer, InceptionScorer)
import replibench.workloads.classification  # noqa: F401
import replibench.workloads.d4pg  # noqa: F401
import replibench.workloads.gan  # noqa: F401  (ConditionalGAN; models.sngan)
import replibench.engine.regimes  # noqa: F401  (regimes.*)
