"""Model parallelism through the whole stack: ResNet and SN-GAN trained end to end with
each kind, a pipeline whose data axis spans two launched worker processes (the model
axis inside each), plan and predict per device and axis, and bad topologies as
one-paragraph errors (exit 2: tests/test_bad_inputs.py runs them through the CLI)."""

import dataclasses
import math
import os

import keras
import pytest

from replibench.config import load_experiment
from replibench.config.plan import format_plan, make_plan
from replibench.engine import model_parallel
from replibench.engine.model_parallel.pipeline import partition
from replibench.engine.regimes import ShardedSync, Sync
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from replibench.predict import hardware, model_parallel as predict_mp
from tests import helpers

RESNET, SNGAN = "configs/resnet/fashion_mnist.gin", "configs/sngan/fashion_mnist.gin"
# Two training steps of batch 64 of a two-block ResNet, two evaluations of 200 images;
# pipelines over 2 micro-batches (tracing grows with micro-batches x pieces). No
# augmentation and a small learning rate: the pipelined ResNet is also the reference of
# the launched workers' run (tests/tiny_runs.py says why).
SHORT = {RESNET: ["Experiment.global_batch_size = 64", "Experiment.train_epochs = 0.05",
                  "Experiment.eval_every_epochs = 0.025", "FashionMNIST.num_eval_examples = 200",
                  "ImageClassification.eval_batch_size = 200", "small_resnet.widths = (4, 8)",
                  "small_resnet.blocks_per_stage = (1, 1)", "FashionMNIST.augment = False",
                  "ImageClassification.base_lr_per_256 = 0.01"],
         SNGAN: [], "pipeline.gin": ["topology.Mesh.micro_batches = 2"], "tensor_parallel.gin": []}


def _files(workload: str, fragment: str) -> list[str]:
  return [workload, os.path.join(os.path.dirname(workload), fragment)]


def _bindings(workload: str, fragment: str) -> list[str]:
  return helpers.TINY[workload] + SHORT[workload] + SHORT[fragment]


def _config(workload: str, fragment: str) -> list[str]:
  return [os.path.join(helpers.REPO, f) for f in _files(workload, fragment)]


def _train(workload: str, fragment: str, workdir):
  experiment = load_experiment(_config(workload, fragment), _bindings(workload, fragment))
  return run_experiment(experiment, str(workdir))


@pytest.fixture(scope="module")
def resnet_pipeline(tmp_path_factory):
  """The pipelined ResNet trained in this process: (its result, its workdir)."""
  workdir = tmp_path_factory.mktemp("resnet_pipeline")
  return _train(RESNET, "pipeline.gin", workdir), workdir


@pytest.mark.parametrize("workload", [RESNET, SNGAN], ids=["resnet", "sngan"])
@pytest.mark.parametrize("fragment", ["tensor_parallel.gin", "pipeline.gin"])
def test_trains_end_to_end(workload, fragment, tmp_path, request):
  if (workload, fragment) == (RESNET, "pipeline.gin"):
    result, tmp_path = request.getfixturevalue("resnet_pipeline")
  else:
    result = _train(workload, fragment, tmp_path)
  assert result.status == "budget_exhausted" and result.num_replicas == 2
  assert len(result.curve) >= 2 and all(math.isfinite(m) for _, _, m in result.curve)
  assert result.examples_per_s > 0 and result.target_metric in helpers.event_tags(tmp_path)
  account = result.communication
  record = account.model_parallel
  assert (record.data, record.model, record.workers) == (2, 2, 0)
  assert record.model_axis["collectives_per_step"] > 0
  assert record.model_axis["payload_bytes_per_step"] > 0
  assert record.data_axis["payload_bytes_per_step"] > 0
  assert account.by_kind["activations"]["count"] == record.model_axis["collectives_per_step"]
  # The model axis stays inside a replica: what a replica sends is the data axis's alone.
  assert account.wire_bytes_per_replica_per_step == record.data_axis["wire_bytes_per_step"]
  held = record.device_memory_bytes
  assert len(held) == 4 and all(row["parameters"] > 0 and row["activations"] > 0
                                for row in held.values())
  if fragment == "tensor_parallel.gin":   # A device holds part of its replica's gradient.
    assert result.noise_scale is None


def test_two_worker_processes_each_hold_a_pipelined_replica(resnet_pipeline, tmp_path):
  """topology.Mesh.workers = 2: the data axis across 2 launched processes
  (MultiWorkerMirroredStrategy), each a replica of 2 logical CPU devices (its two
  stages), trains as the 2 x 2 mesh of one process; the wire carries the data axis's
  bytes alone, so the stage-to-stage sends stayed inside each worker."""
  (reference, reference_dir), workdir = resnet_pipeline, tmp_path / "workers"
  launched = helpers.cli("launch", "--workers=2", "--timeout=500", "--", "run",
                         *(f"--gin_file={f}" for f in _files(RESNET, "pipeline.gin")),
                         *(f"--gin_bindings={b}" for b in _bindings(RESNET, "pipeline.gin")),
                         "--gin_bindings=topology.Mesh.workers = 2", f"--workdir={workdir}")
  assert launched.returncode == 0, helpers.failure_report(launched)
  assert "[worker 0]" in launched.stdout and "[worker 1]" in launched.stdout
  helpers.check_wire_account(launched, workdir)
  result = helpers.result(workdir)
  assert (result.num_replicas, result.num_workers) == (2, 2)
  record = result.communication.model_parallel
  assert record.workers == 2 and record.model_axis == reference.communication.model_parallel[
      "model_axis"]
  held = record.device_memory_bytes   # The chief's own two devices, a stage each.
  assert sorted(held) == [f"/job:worker/replica:0/task:0/device:CPU:{k}" for k in (0, 1)]
  assert all(row["parameters"] > 0 for row in held.values())
  helpers.assert_same_training(reference_dir, workdir)


FIT = ["configs/resnet/fashion_mnist.gin", "configs/resnet/model_parallel_fit.gin"]


@pytest.fixture(scope="module")
def fit_plans():
  return {m: make_plan(load_experiment([os.path.join(helpers.REPO, f) for f in FIT],
                                       [f"topology.Mesh.model = {m}"])) for m in (1, 2)}


def test_plan_reports_each_device_and_axis_and_whether_it_fits(fit_plans):
  one, two = fit_plans[1]["model_parallel"], fit_plans[2]["model_parallel"]
  assert one["fits"] is False and two["fits"] is True   # 32 MB devices (the config).
  row1, row2 = one["per_device"][0], two["per_device"][0]
  for key in ("parameter_bytes", "optimizer_bytes", "activation_bytes", "train_flops_per_step"):
    assert 0 < row2[key] < row1[key], key
  assert row2["parameter_bytes"] > row1["parameter_bytes"] / 2   # The stem and head are whole.
  assert one["model_axis"]["collectives_per_step"] == 0
  assert two["model_axis"]["collectives_per_step"] == 12      # 6 blocks: forward + backward.
  assert two["model_axis"]["wire_bytes_per_step"] > 0
  assert "DOES NOT FIT" in format_plan(fit_plans[1]) and "fits" in format_plan(fit_plans[2])


def test_predict_prices_both_axes_and_a_profile_decides_the_fit(fit_plans):
  profile = hardware.DeviceProfile(name="x", peak_flops=1e12, achieved_fraction=0.5,
                                   memory_bytes=32e6, devices_per_host=8,
                                   intra_host_bytes_per_s=1e10, intra_host_latency_s=1e-5)
  step, details = predict_mp.step_time(profile, fit_plans[2], 1)
  assert details["model_axis_s"] > 0 and step.comm_s >= details["model_axis_s"]
  assert predict_mp.fits(fit_plans[2], profile, 1) is True
  assert predict_mp.fits(fit_plans[1], profile, 1) is False
  small = dataclasses.replace(profile, memory_bytes=1e6)
  assert predict_mp.fits(fit_plans[2], small, 1) is False


def test_plan_reports_a_pipelines_stages_and_bubble():
  plan = make_plan(load_experiment(_config(RESNET, "pipeline.gin"),
                                   helpers.TINY[RESNET] + SHORT[RESNET]))
  facts = plan["model_parallel"]
  assert facts["bubble_fraction"] == pytest.approx(1 / 5)   # K = 2, n = 4.
  assert len(facts["per_device"]) == 2
  assert all(row["parameter_bytes"] > 0 and row["train_flops_per_step"] > 0
             for row in facts["per_device"])
  assert facts["model_axis"]["collectives_per_step"] == 2 * (4 + 1)   # 4 boundary sends + back.
  # The plan's account is the run's: the sends in by_kind, not on a replica's wire.
  account = plan["communication"]
  assert account["by_kind"]["activations"]["count"] == facts["model_axis"]["collectives_per_step"]
  assert account["wire_bytes_per_replica_per_step"] == facts["data_axis"]["wire_bytes_per_step"]


@pytest.mark.parametrize("kwargs,culprit", [
    (dict(model=0), "topology.Mesh.model = 0"),
    (dict(parallelism="sequence"), "topology.Mesh.parallelism"),
    (dict(micro_batches=4), "micro-batches are a pipeline's"),
    (dict(workers=2, data=2), "tensor parallelism across worker processes is not supported"),
    (dict(workers=2, data=1, parallelism="pipeline"), "so data must be 2 too"),
])
def test_bad_mesh_values(kwargs, culprit):
  with pytest.raises(UserError, match=culprit):
    model_parallel.Mesh(**kwargs)


def test_more_devices_than_there_are():
  with pytest.raises(UserError, match=r"data x model = 8 devices"):
    model_parallel.Mesh(data=4, model=2, device="cpu").make_strategy()


@pytest.mark.parametrize("bindings,culprit", [
    (["Experiment.regime = @regimes.LocalSGD()"], "regimes.Sync"),
    (["topology.Mesh.parallelism = 'pipeline'", "topology.Mesh.micro_batches = 3"],
     "does not divide the per-replica batch"),
])
def test_configs_a_mesh_cannot_run(bindings, culprit):
  with pytest.raises(UserError, match=culprit):
    load_experiment(_config(RESNET, "tensor_parallel.gin"), bindings)


def test_a_tensor_parallel_mesh_runs_sync_without_what_needs_a_whole_gradient():
  mesh = model_parallel.Mesh(data=2, model=2)
  sharded = mesh.regime_for(Sync())
  assert type(sharded) is ShardedSync and not sharded.noise_scale   # noqa: E721
  assert mesh.regime_for(sharded) is sharded and sharded.setting() == "sync"
  pipeline = model_parallel.Mesh(data=2, model=2, parallelism="pipeline")
  regime = Sync()
  assert pipeline.regime_for(regime) is regime
  experiment = load_experiment(_config(RESNET, "tensor_parallel.gin"), [])
  assert type(experiment.train_spec().regime) is ShardedSync   # noqa: E721
  with pytest.raises(UserError, match="clips gradients by norm"):
    sharded.build_optimizer(keras.optimizers.SGD(0.1, clipnorm=1.0), [])


def test_stages_are_consecutive_pieces_of_least_largest_cost():
  assert partition([1, 1, 1, 10, 1], 2) == [0, 3]     # 3 | 11, not 13 | 1.
  assert partition([5, 5, 5, 5], 4) == [0, 1, 2, 3]
  assert partition([4, 1, 1, 1, 1], 2) == [0, 1]


def test_stage_starts_from_the_config_are_checked():
  experiment = load_experiment(_config(RESNET, "pipeline.gin"), helpers.TINY[RESNET] + [
      "model_parallel.pipelined.stage_starts = (9,)"])
  with pytest.raises(UserError, match=r"stage_starts = \(9,\): need 1 increasing piece indices"):
    make_plan(experiment)

