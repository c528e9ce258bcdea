"""Test set-up shared by every test module.

CPU tests see four logical devices, so cross-replica code runs with 1, 2 and 4
replicas; this must happen before TensorFlow initialises its runtime.
"""

import ctypes
import gc
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("REPLIBENCH_CPU_DEVICES", "4")
# Each run's machine calibration timed for 0.02 s a rate, not 0.15 (~0.4 CPU-s less a
# run, in this process and every one it starts: launched tasks, SLURM jobs). The tests
# read that a run's calibration is there and positive, never its value.
os.environ.setdefault("REPLIBENCH_CALIBRATION_S", "0.02")

import gin  # noqa: E402
import pytest  # noqa: E402


def _runs_tests(config) -> bool:
  """False in pytest-xdist's controller, which only hands tests to its workers."""
  return hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


def _set_up_tensorflow() -> None:
  """The logical CPUs, before anything starts TensorFlow's runtime (pytest_configure
  runs before the test modules are imported)."""
  from replibench.engine import devices  # pylint: disable=import-outside-toplevel
  devices.ensure_logical_cpus(int(os.environ["REPLIBENCH_CPU_DEVICES"]))


@pytest.fixture(autouse=True)
def fresh_collective_keys():
  """Tests that build their own MirroredStrategy get keys no earlier test used
  (the engine does the same for the strategies it builds)."""
  from replibench import internals  # pylint: disable=import-outside-toplevel
  internals.fresh_collective_keys()


@pytest.fixture(autouse=True)
def clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(autouse=True)
def collect_garbage_while_it_is_fresh():
  """Frees each test's garbage when the test ends, not in some later test.

  Runs, models and tf.function closures form reference cycles, so their tf.data
  iterators are freed by the cyclic garbage collector. Freed minutes later, in a
  generation-2 collection triggered inside another test, an iterator's
  destructor waited up to ~75 s for its tf.data autotuning thread (gdb: main
  thread in ~IteratorResource -> ~RootDataset::Iterator -> ~LogicalThreadWrapper,
  the tf.data model threads in Model::OptimizeLoop's timed wait): 300 s of a
  773 s `make test`, landing on whichever test was running. Collected right after
  the test that made them, the same iterators take 0.2-0.6 s.

  A full collection walks every object alive, and TensorFlow's import plus what
  the tests keep (tf.function caches, module-scoped runs) is 450-700 thousand of
  them: 0.35 s a collection, measured, in a worker that had nothing to free, or
  ~350 s of CPU over ~1,000 tests. So the survivors of each collection are frozen
  (gc.freeze: moved where the collector no longer walks them) and the next test's
  collection walks only what that test made. An object frozen alive that turns
  to garbage later (a module-scoped run when its module ends) is collected once
  its fixture has ended (pytest_runtest_teardown below).

  Before collecting, the test's tf.custom_gradient registrations are dropped: TensorFlow
  keeps each for good, and with it the whole graph traced through it
  (internals.forget_custom_gradients). Kept, they grew each xdist worker to 2.4
  million objects and 3-5 GB, and the suite past 8 GiB.

  Then glibc is asked to hand freed heap pages back to the system: the xdist
  workers otherwise keep every test's peak (TensorFlow's many threads each hold a
  malloc arena), and with launched clusters on top the suite neared CI's 8 GiB.
  """
  from replibench import internals  # pylint: disable=import-outside-toplevel
  with internals.custom_gradients_forgotten():
    yield
  gc.collect()
  gc.freeze()
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


_WIDER_SCOPES = ("class", "module", "package")
# The custom gradients each fixture wider than a test registered while it was set up
# (a module-scoped run's traced steps): dropped once it has ended.
_REGISTERED_BY_FIXTURE = {}
# Set when a fixture wider than a test has been torn down: what it held may be frozen
# garbage now. The custom gradients its set-up registered, to drop.
_WIDER_FIXTURE_ENDED = [False]
_GRADIENTS_TO_DROP = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
  del request
  if fixturedef.scope not in _WIDER_SCOPES:
    yield
    return
  from replibench import internals  # pylint: disable=import-outside-toplevel
  before = internals.custom_gradient_names()
  yield
  _REGISTERED_BY_FIXTURE[fixturedef] = internals.custom_gradient_names() - before


def pytest_fixture_post_finalizer(fixturedef, request):
  del request
  if fixturedef.scope in _WIDER_SCOPES:
    _WIDER_FIXTURE_ENDED[0] = True
    _GRADIENTS_TO_DROP.update(_REGISTERED_BY_FIXTURE.pop(fixturedef, ()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
  """Once a test's teardown has ended a fixture wider than a test (a module-scoped
  run), its custom gradients dropped and every object unfrozen and collected, so what
  it left as garbage is freed before the next test runs.

  Only then: this full collection walks every object the worker holds (2.4 million
  late in a run while custom gradients kept their graphs, ~0.57 million since). Run at
  every module's end, 87 of them found 60 thousand objects in all, nearly all where
  module-scoped fixtures had ended, for ~7% of the suite's CPU; run only then, 12 cost
  a seventh of that, and 0-40 frozen objects a process were left uncollected at the
  suite's end (docs/reference/tests-and-benchmarks.md: the machine and the figures).
  """
  del item, nextitem
  yield
  if _WIDER_FIXTURE_ENDED[0]:
    _WIDER_FIXTURE_ENDED[0] = False
    _collect_everything()


def _collect_everything():
  from replibench import internals  # pylint: disable=import-outside-toplevel
  internals.forget_custom_gradients(_GRADIENTS_TO_DROP)
  _GRADIENTS_TO_DROP.clear()
  gc.unfreeze()
  gc.collect()
  gc.freeze()
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


def _glibc():
  try:
    return ctypes.CDLL("libc.so.6")
  except OSError:   # Not glibc: nothing to trim.
    return None


_LIBC = _glibc()


def pytest_configure(config):
  """TensorFlow set up where tests run: not in xdist's controller, whose import of it
  held ~0.8 GB resident for the whole suite, its memory peak included.
  REPLIBENCH_TEST_MEMORY_LOG=FILE: each test's time and memory, to FILE
  (tests/memory_log.py)."""
  if _runs_tests(config):
    _set_up_tensorflow()
  path = os.environ.get("REPLIBENCH_TEST_MEMORY_LOG")
  if path:
    from tests import memory_log  # pylint: disable=import-outside-toplevel
    config.pluginmanager.register(memory_log.MemoryLog(path), "replibench_memory_log")


def pytest_collection_modifyitems(config, items):
  """Marks the modules of tests/tiers.py `full` (make test-quick leaves them out); skips
  tests marked gpu, saying why, when TensorFlow sees no GPU (CI has none)."""
  del config
  from tests import tiers  # pylint: disable=import-outside-toplevel
  for item in items:
    if item.module.__name__.rpartition(".")[2] in tiers.FULL:
      item.add_marker(pytest.mark.full)
  gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
  if not gpu_tests:
    return
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if tf.config.list_physical_devices("GPU"):
    return
  skip = pytest.mark.skip(reason="needs a GPU (marker 'gpu'); TensorFlow sees none here")
  for item in gpu_tests:
    item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
  session.config.replibench_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """Ends the process as soon as pytest is done, before its clean-ups and the
  interpreter's teardown.

  Both delete the tf.data iterators the tests left to the garbage collector
  (pytest's unraisable-exception plugin runs gc.collect() among its clean-ups),
  and the destructor of an iterator over a Python generator (D4PG's replay feed)
  waits for its prefetch thread, which may be waiting for the GIL the destructor
  holds: a deadlock. A clean-clone `make test` once passed all its tests and then
  hung at exit. This hook runs last among the unconfigure hooks, after the
  results were reported (and, under xdist, sent to the controller).
  """
  status = getattr(config, "replibench_exitstatus", None)
  if status is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)   # pylint: disable=protected-access
