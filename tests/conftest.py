"""Test set-up shared by every test module.

CPU tests see four logical devices, so cross-replica code runs with 1, 2 and 4
replicas; this must happen before TensorFlow initialises its runtime.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("REPLIBENCH_CPU_DEVICES", "4")

import gin  # noqa: E402
import pytest  # noqa: E402

from replibench.engine import devices  # noqa: E402

devices.ensure_logical_cpus(int(os.environ["REPLIBENCH_CPU_DEVICES"]))


@pytest.fixture(autouse=True)
def clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()
