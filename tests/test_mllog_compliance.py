"""MLPerf's own compliance checker (mlperf-logging) on the logs runs write.

Every workload's mllog.txt passes the common rules of the training ruleset
4.1.0 (tests/test_configs_end_to_end.py checks each config's run with
`check_common_rules`). A ResNet log names the 'resnet' benchmark; its rules
exist up to ruleset 4.0.0 (MLPerf 4.1 retired ResNet, though 4.1.0's open
division list still names it), so the ResNet-50 ImageNet config's log, from a
tiny run on TFDS mock data (a one-stage ResNet in ResNet-50's place: the log
names no layer), passes the whole 4.0.0 chain: common, open division and resnet
rules.
"""

import os

import pytest
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

from replibench.config import load_experiment
from replibench.harness.loop import run_experiment
from tests import helpers

RULES = os.path.dirname(mlp_compliance.__file__)


def check_common_rules(path: str, ruleset: str = "4.1.0") -> list[str]:
  """The checker's messages for path against the ruleset's common.yaml only ([] = pass)."""
  checker = mlp_compliance.make_checker("training", ruleset, quiet=True, werror=False)
  loglines, errors = mlp_parser.parse_file(path, ruleset=ruleset)
  assert not errors, errors
  checker.configured_checks(loglines, os.path.join(RULES, f"training_{ruleset}", "common.yaml"))
  mlp_compliance.enqueued_configs.clear()   # Division and benchmark rules: not run here.
  return list(checker.overwritable.values()) + checker.not_overwritable


def check_everything(path: str, ruleset: str) -> bool:
  """The checker as `python -m mlperf_logging.compliance_checker` runs it."""
  checker = mlp_compliance.make_checker("training", ruleset, quiet=True, werror=False)
  return mlp_compliance.main(path, os.path.join(RULES, f"training_{ruleset}", "common.yaml"),
                             checker)[0]


def test_the_resnet50_imagenet_log_passes_the_resnet_benchmark_rules(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  config = os.path.join(helpers.REPO, "configs/resnet/imagenet_tpu32.gin")
  # The log names no layer of the model (workloads' mlperf_hyperparameters, the
  # harness's events): a one-stage ResNet stands in for ResNet-50, whose build and
  # traces cost this test most of its time and memory.
  bindings = ["Experiment.topology = @topology.Local()", "topology.Local.num_replicas = 1",
              "Experiment.global_batch_size = 4", "Experiment.steps_per_call = 1",
              "Experiment.log_every_steps = 1", "TfdsImages.image_size = 32",
              "ImageClassification.model = @small_resnet", "small_resnet.widths = (4,)",
              "small_resnet.input_shape = (32, 32, 3)",
              "TfdsImages.num_train_examples = 8", "TfdsImages.num_eval_examples = 4",
              "ImageClassification.eval_batch_size = 4",
              "Experiment.train_epochs = 1", "Experiment.eval_every_epochs = 0.5"]
  with tfds.testing.mock_data(num_examples=8):
    result = run_experiment(load_experiment([config], bindings), str(tmp_path))
  assert result.status == "budget_exhausted" and len(result.curve) == 2
  log = str(tmp_path / "mllog.txt")
  assert check_common_rules(log) == []
  assert check_everything(log, "4.0.0")


def test_the_checker_rejects_a_log_without_the_required_keys(tmp_path):
  path = tmp_path / "mllog.txt"
  path.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "INTERVAL_START", '
                  '"key": "init_start", "value": null, "metadata": {"file": "x", "lineno": 1}}\n')
  messages = check_common_rules(str(path))
  assert any("submission_org" in m for m in messages), messages
