"""Test set-up shared by every test module.

CPU tests see four logical devices, so cross-replica code runs with 1, 2 and 4
replicas; this must happen before TensorFlow initialises its runtime.
"""

import atexit
import os
import sys

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


def pytest_sessionfinish(session, exitstatus):
  session.config.replibench_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """Ends the process as soon as pytest is done, skipping interpreter teardown.

  Tearing down the interpreter deletes the tf.data iterators the tests left to
  the garbage collector after TensorFlow's runtime has begun to shut down, and
  an iterator's destructor can wait forever for its prefetch thread: a
  clean-clone `make test` once passed all its tests and then hung at exit. The
  handler is registered last, so it runs first among the exit handlers, once
  pytest has returned its status and run its own clean-ups.
  """
  status = getattr(config, "replibench_exitstatus", None)
  if status is not None:
    atexit.register(_exit_now, status)


def _exit_now(status: int) -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)   # pylint: disable=protected-access
