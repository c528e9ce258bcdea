"""Tiny runs shared by the tests that each check a different output of the same run.

test_configs_end_to_end runs every workload config at its tiny size (helpers.TINY) on
1 and 2 replicas; test_gan_workload checks the SN-GAN's scores and sample grid, and
test_predict the noise-scale record, of runs that are the same experiments. One
run serves them all in a process (an xdist worker; the tests only read its workdir).
"""

import os

import pytest

from tests import helpers

_RUNS = {}


def run(tmp_path_factory, config: str, topology: str) -> tuple:
  """(RunResult, workdir) of config with its tiny overrides on configs/topology/topology,
  run in this process on first use; later calls return the same run. The classifier
  that scores GAN samples is trained into this session's own cache (as on a fresh
  clone), not taken from ~/.cache."""
  key = (config, topology)
  if key not in _RUNS:
    from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
    from replibench.eval import classifier  # pylint: disable=import-outside-toplevel
    from replibench.harness.loop import run_experiment  # pylint: disable=import-outside-toplevel
    files = [os.path.join(helpers.REPO, config),
             os.path.join(helpers.REPO, "configs", "topology", topology)]
    workdir = tmp_path_factory.mktemp(f"{os.path.basename(config)[:-4]}-{topology[:-4]}")
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv(classifier.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "cache"))
      _RUNS[key] = (run_experiment(load_experiment(files, helpers.TINY[config]), str(workdir)),
                    workdir)
  return _RUNS[key]
