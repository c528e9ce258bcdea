"""Every config in configs/ runs end to end at tiny scale through the real harness."""

import math
import os

import numpy as np
import pytest
from tensorflow import make_ndarray

from replibench import internals
from replibench.config import load_experiment
from replibench.config.plan import make_plan
from replibench.engine import devices
from replibench.harness.loop import run_experiment
from tests import helpers, test_mllog_compliance, tiny_runs

RESULT_KEYS = {"status", "target_metric", "target", "time_to_target_s", "init_s",
               "steps_to_target", "epochs_to_target", "examples_to_target", "final_metric",
               "curve", "topology", "num_replicas", "global_batch_size", "seed",
               "operative_config", "git_sha", "tf_version", "machine", "examples_per_s"}


def test_every_workload_config_has_a_tiny_override():
  missing = set(helpers.workload_configs()) - set(helpers.TINY) - {
      c for c in helpers.workload_configs() if not helpers.runs_on_cpu(c)}
  assert not missing, f"add tiny overrides to tests/helpers.py TINY for {missing}"


@pytest.mark.parametrize("config", [c for c in helpers.workload_configs()
                                    if helpers.runs_on_cpu(c)])
@pytest.mark.parametrize("topology", ["local1.gin", "local2.gin"])
def test_config_runs_end_to_end(config, topology, tmp_path_factory):
  # The run is shared with tests of its workload's own outputs (tests/tiny_runs.py).
  result, tmp_path = tiny_runs.run(tmp_path_factory, config, topology)

  assert RESULT_KEYS <= set(result.to_dict())
  assert result == helpers.result(tmp_path)      # what was returned is what was written
  assert result.status in ("reached", "budget_exhausted")
  assert result.num_replicas == int(topology[len("local"):-len(".gin")])
  assert len(result.curve) >= 2
  assert all(math.isfinite(metric) for _, _, metric in result.curve)
  assert math.isfinite(result.final_metric) and result.examples_per_s > 0
  assert "Experiment.global_batch_size" in result.operative_config
  # The machine's fingerprint that `compare` needs to judge times at all.
  calibration = result.machine["calibration"]
  assert calibration and min(calibration.values()) > 0, result.machine
  assert result.machine["malloc"], result.machine   # What the step times ran under.
  # TensorFlow's pools as this process's runtime has them (started before the run here,
  # so a config's Experiment.*_op_threads could not resize them: the record says so).
  assert result.machine["threads"] == devices.thread_pools(), result.machine

  tags = helpers.event_tags(tmp_path)
  for tag in ("train/loss", "train/learning_rate", "train/examples_per_s",
              result.target_metric, "hparams/final_metric", "operative_config",
              "_hparams_/session_start_info"):
    assert tag in tags, f"missing TensorBoard tag {tag}; have {sorted(tags)}"
  losses = [float(make_ndarray(t)) for _, t in tags["train/loss"]]
  assert losses and np.all(np.isfinite(losses))
  mllog = (tmp_path / "mllog.txt").read_text()
  for key in ("init_start", "run_start", "eval_accuracy", "run_stop"):
    assert f'"key": "{key}"' in mllog
  # MLPerf's checker: the training ruleset's common rules.
  assert test_mllog_compliance.check_common_rules(str(tmp_path / "mllog.txt")) == []


@pytest.mark.parametrize("config", sorted(c for c, base in helpers.derived_configs().items()
                                           if helpers.runs_on_cpu(base)))
def test_derived_config_runs_end_to_end(config, tmp_path):
  # A config that includes a workload config (e.g. a bench suite's short recipe):
  # one tiny run on 2 replicas with its base's overrides. Those derived from a TPU
  # config (ImageNet at pod scale: imagenet_goyal256.gin) are planned only, below.
  files = [os.path.join(helpers.REPO, config),
           os.path.join(helpers.REPO, "configs", "topology", "local2.gin")]
  result = run_experiment(load_experiment(files, helpers.TINY[helpers.derived_configs()[config]]),
                          str(tmp_path))
  assert result.status in ("reached", "budget_exhausted") and result.num_replicas == 2
  assert len(result.curve) >= 2
  assert all(math.isfinite(metric) for _, _, metric in result.curve)
  assert result.target_metric in helpers.event_tags(tmp_path)


@pytest.mark.parametrize("config", helpers.workload_configs() + sorted(helpers.derived_configs()))
def test_every_config_plans(config):
  plan = make_plan(load_experiment([os.path.join(helpers.REPO, config)], []))
  assert plan["num_replicas"] >= 1 and plan["total_steps"] > 0
  assert plan["parameters"] > 0 and plan["train_flops_per_step"] > 0
  # The batch norms the models use, with their one momentum and epsilon, are stated.
  if "fashion_mnist" in plan["workload"] and not plan["workload"].startswith("d4pg"):
    assert "momentum 0.9, epsilon" in plan["batch_norm"], plan["batch_norm"]


def test_a_plan_leaves_no_custom_gradient_holding_its_traced_step(monkeypatch):
  """The plan's traced step registers custom gradients (the collectives' recorded
  backward passes); left in TensorFlow's registry they would keep that graph alive
  for the process's life (internals.forget_custom_gradients)."""
  forgotten, forget = [], internals.forget_custom_gradients
  monkeypatch.setattr(internals, "forget_custom_gradients",
                      lambda names: forgotten.append(forget(names)) or forgotten[-1])
  before = internals.custom_gradient_names()
  make_plan(load_experiment([os.path.join(helpers.REPO, "configs/resnet/fashion_mnist.gin")], []))
  assert forgotten and forgotten[0] > 0
  assert internals.custom_gradient_names() == before


def test_a_plan_builds_each_model_once_per_precision_and_layout():
  """make_plan's three readers of the models (check_config, describe, the traced step)
  share one build inside build_once.shared(); training, outside it, builds anew."""
  from replibench.engine.model_parallel import layout as layout_lib  # pylint: disable=C0415
  from replibench.workloads import build_once  # pylint: disable=C0415
  workload, builds = object(), []
  make = lambda: builds.append(object()) or builds[-1]  # noqa: E731
  with build_once.shared():
    first = build_once.built(workload, "float32", make)
    assert build_once.built(workload, "float32", make) is first
    assert build_once.built(workload, "mixed_float16", make) is not first
    assert build_once.built(object(), "float32", make) is not first
    with layout_lib.active(object()):
      assert build_once.built(workload, "float32", make) is not first
  assert build_once.built(workload, "float32", make) is not first
  assert len(builds) == 5
