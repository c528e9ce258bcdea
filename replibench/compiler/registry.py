"""Imports every module that registers gin configurables, so configs can name them."""

# pylint: disable=unused-import
import models.resnet  # noqa: F401
import replibench.data.sources  # noqa: F401
import replibench.engine  # noqa: F401  (topology.*, engine.cross_replica_batch_norm)
import replibench.workloads.classification  # noqa: F401
import replibench.workloads.d4pg  # noqa: F401
import replibench.workloads.gan  # noqa: F401  (ConditionalGAN, scorers, Imagenet2012Gan; models.sngan)
import replibench.engine.regimes  # noqa: F401  (regimes.*)
