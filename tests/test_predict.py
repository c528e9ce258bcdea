"""Prediction: the noise-scale estimator, the steps(B) fit, the step-time model, and
`replibench predict` on topologies this machine lacks and on bad input."""

import dataclasses
import functools
import json
import math
import os

import gin
import numpy as np
import pytest

from replibench.engine.measure import noise_scale
from replibench.errors import UserError
from replibench.config import plan as plan_lib
from replibench.predict import command, efficiency, hardware
from tests import helpers, inprocess_cli, tiny_runs

CONFIG = "configs/resnet/fashion_mnist.gin"
V100 = os.path.join(helpers.REPO, "configs/devices/v100_node.gin")


def _replica_gradients(rng, true_grad, sigma, replicas, per_replica):
  """Per-replica batch-mean gradients of examples g = G + N(0, sigma^2 I): [replicas, d]."""
  noise = rng.normal(0.0, sigma, size=(replicas, per_replica, true_grad.size))
  return (true_grad + noise).mean(axis=1)


def test_noise_scale_estimate_recovers_trace_sigma_over_squared_gradient():
  rng = np.random.default_rng(0)
  d, sigma, replicas, b = 50, 2.0, 4, 8
  true_grad = rng.normal(size=d) * 0.3
  want = d * sigma**2 / float(true_grad @ true_grad)   # tr(Sigma) / |G|^2
  small, big = [], []
  for _ in range(2000):
    means = _replica_gradients(rng, true_grad, sigma, replicas, b)
    small.append(np.mean(np.sum(means**2, axis=1)))
    big.append(float(np.sum(means.mean(axis=0) ** 2)))
  found = noise_scale.estimate(np.mean(small), np.mean(big), b, b * replicas)
  assert found.b_simple == pytest.approx(want, rel=0.05)
  assert found.trace_sigma == pytest.approx(d * sigma**2, rel=0.05)


def test_noise_scale_is_none_when_the_gradient_estimate_is_not_positive():
  assert noise_scale.estimate(1.0, 0.4, 8, 16).b_simple is None   # |G|^2 = (6.4 - 8) / 8 < 0
  with pytest.raises(ValueError):
    noise_scale.estimate(1.0, 1.0, 16, 16)


def test_step_norms_scale_per_replica_gradients_to_their_batch_means():
  """Replica i's gradient of an average_loss-scaled loss is 1/N of its batch mean."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from replibench import engine  # pylint: disable=import-outside-toplevel
  values = [np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)]

  def norms(g):
    reduced = engine.all_reduce(g, "sum")
    out = noise_scale.step_norms([g], [reduced], 2)
    return tf.stack([out[noise_scale.SMALL], out[noise_scale.BIG]])

  got = helpers.replicated(2, norms, values)
  for value, (small, big) in zip(values, got):
    assert small == pytest.approx(4 * float(value @ value))
    assert big == pytest.approx(float(np.sum((values[0] + values[1]) ** 2)))


def _synthetic_points(s_min, b_crit, batches, seeds, rel_noise, rng):
  rows = [(b, s_min * (1 + b_crit / b) * (1 + rel_noise * rng.normal()))
          for b in batches for _ in range(seeds)]
  return [r[0] for r in rows], [r[1] for r in rows]


def test_fit_recovers_s_min_and_b_crit_and_predicts_held_out_batches():
  rng = np.random.default_rng(1)
  batches, steps = _synthetic_points(800.0, 512.0, [64, 128, 256, 1024, 2048], 3, 0.03, rng)
  fit = efficiency.fit_steps(batches, steps)
  assert fit.s_min == pytest.approx(800.0, rel=0.1)
  assert fit.b_crit == pytest.approx(512.0, rel=0.15)
  low, high = fit.b_crit_interval()
  assert low < 512.0 < high
  predicted, lo, hi = fit.steps(512)   # held out
  assert predicted == pytest.approx(1600.0, rel=0.05) and lo < 1600.0 < hi
  assert not fit.extrapolates(512) and fit.extrapolates(4096)


def test_one_runs_interval_covers_the_seed_scatter_the_mean_interval_does_not():
  rng = np.random.default_rng(2)
  batches, steps = _synthetic_points(800.0, 512.0, [64, 128, 256, 1024, 2048], 4, 0.15, rng)
  fit = efficiency.fit_steps(batches, steps)
  assert fit.relative_sd == pytest.approx(0.15, rel=0.3)
  _, mean_low, mean_high = fit.steps(512)
  run_low, run_high = fit.run_steps(512)
  assert run_low < mean_low < mean_high < run_high
  runs = 1600.0 * (1 + 0.15 * rng.standard_normal(2000))   # fresh runs at batch 512
  covered = np.mean((run_low <= runs) & (runs <= run_high))
  assert 0.8 < covered < 0.99   # a 90% prediction interval


def test_fit_needs_two_batch_sizes():
  with pytest.raises(ValueError, match="batch sizes"):
    efficiency.fit_steps([256, 256, 256], [100, 110, 105])


def test_ring_allreduce_time_within_and_across_hosts():
  profile = hardware.DeviceProfile(name="x", peak_flops=1e12, achieved_fraction=0.5,
                                   devices_per_host=4, intra_host_bytes_per_s=1e9,
                                   inter_host_bytes_per_s=1e8)
  assert hardware.allreduce_seconds(profile, 1e6, 1, 1) == 0.0
  assert hardware.allreduce_seconds(profile, 1e6, 1, 4) == pytest.approx(2 * 3 / 4 * 1e-3)
  across = hardware.allreduce_seconds(profile, 1e6, 1, 8)   # 2 hosts of 4
  assert across == pytest.approx(2 * 3 / 4 * 1e-3 + 2 * 1 / 2 * 1e-2)
  shared = dataclasses.replace(profile, shared_link=True, devices_per_host=1)
  assert hardware.allreduce_seconds(shared, 1e6, 1, 4) == pytest.approx(2 * 3 * 1e6 / 1e8)
  assert hardware.compute_seconds(profile, 1e9, 10, 1) == pytest.approx(1e10 / 5e11)


def test_the_emulated_link_passes_its_refilled_bucket_at_once_and_shared_cores_slow_hops():
  link = hardware.DeviceProfile(name="x", peak_flops=1e12, achieved_fraction=1.0,
                                shared_link=True, inter_host_bytes_per_s=1e7,
                                inter_host_latency_s=1e-3, link_burst_bytes=2e5,
                                shared_cores=2)
  moved = 2 * 1 * 1e6   # 2 replicas' ring: 2(n-1) M bytes through the one link.
  assert hardware.allreduce_seconds(link, 1e6, 1, 2) == pytest.approx(2e-3 + moved / 1e7)
  # 10 ms of compute refills 1e5 bytes of the bucket; 1 s refills all of it (2e5).
  assert hardware.allreduce_seconds(link, 1e6, 1, 2, idle_s=0.01) == pytest.approx(
      2e-3 + (moved - 1e5) / 1e7)
  assert hardware.allreduce_seconds(link, 1e6, 1, 2, idle_s=1.0) == pytest.approx(
      2e-3 + (moved - 2e5) / 1e7)
  # 4 replicas on 2 cores: each of the 6 hops waits twice as long for its peer.
  assert hardware.allreduce_seconds(link, 0.0, 1, 4) == pytest.approx(6 * 1e-3 * 2)
  step = hardware.step_time(link, 1e9, 20, 2, 1e6, 1)
  assert step.comm_s == pytest.approx(hardware.allreduce_seconds(link, 1e6, 1, 2, step.compute_s))


def _efficiency_file(tmp_path, target=0.92, workload="resnet_fashion_mnist") -> str:
  fit = efficiency.fit_steps([64, 64, 256, 256, 1024, 1024], [4000, 4200, 1500, 1400, 700, 760])
  path = tmp_path / "eff.json"
  path.write_text(json.dumps({"workload": workload, "target": target, "eval_s": 1.0,
                              "eval_achieved_flops": 1e11, "fit": dataclasses.asdict(fit)}))
  return str(path)


def test_predict_a_gpu_cluster_this_machine_lacks(tmp_path, capsys):
  run = inprocess_cli.cli(capsys, "predict", f"--gin_file={CONFIG}", f"--device_profile={V100}",
                          "--workers=4", f"--efficiency={_efficiency_file(tmp_path)}", "--json")
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout)
  assert got["num_replicas"] == 32 and got["hosts"] == 4
  assert got["comm_s"] > 0 and got["compute_s"] > 0
  assert got["step_s"] == pytest.approx(got["compute_s"] + got["comm_s"])
  low, high = got["steps_interval"]
  assert low < got["steps_to_target"] < high
  assert got["time_interval_s"][0] < got["time_to_target_s"] < got["time_interval_s"][1]
  assert math.isfinite(got["critical_batch"]) and got["critical_batch"] > 0
  slower = inprocess_cli.cli(capsys, "predict", f"--gin_file={CONFIG}",
                             f"--device_profile={V100}", "--workers=4", "--network=1gbit",
                             f"--efficiency={_efficiency_file(tmp_path)}", "--json")
  assert json.loads(slower.stdout)["comm_s"] > got["comm_s"]


@pytest.mark.parametrize("case,culprit", [
    ("no_profile", "--device_profile is required"),
    ("missing_profile", "--device_profile=/nonexistent.gin"),
    ("unknown_field", "warp_factor"),
    ("other_target", "target 0.92"),
    ("missing_efficiency", "no such statistical-efficiency file"),
])
def test_bad_predict_input_exits_2_naming_the_culprit(tmp_path, capsys, case, culprit):
  profile, efficiency_path = V100, _efficiency_file(tmp_path)
  if case == "unknown_field":
    profile = str(tmp_path / "bad.gin")
    with open(profile, "w") as f:
      f.write(open(V100).read() + "predict.DeviceProfile.warp_factor = 9\n")
  elif case == "other_target":
    efficiency_path = _efficiency_file(tmp_path, target=0.85)
  elif case == "missing_efficiency":
    efficiency_path = str(tmp_path / "none.json")
  args = ["predict", f"--gin_file={CONFIG}", f"--efficiency={efficiency_path}"]
  if case != "no_profile":
    args.append("--device_profile=/nonexistent.gin" if case == "missing_profile"
                else f"--device_profile={profile}")
  run = inprocess_cli.cli(capsys, *args)
  assert run.returncode == 2, (run.stdout[-1000:], run.stderr[-2000:])
  assert "Traceback" not in run.stderr and culprit in run.stderr, run.stderr[-2000:]


SHORT = ["small_resnet.widths = (4, 8)", "small_resnet.blocks_per_stage = (1, 1)",
         "FashionMNIST.num_eval_examples = 200", "ImageClassification.eval_batch_size = 200"]


@pytest.mark.parametrize("norm", ["cross_replica", "per_replica"])
def test_a_two_replica_run_records_the_noise_scale_and_says_when_it_is_biased(
    tmp_path, tmp_path_factory, norm):
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  from replibench.harness.loop import run_experiment  # pylint: disable=import-outside-toplevel
  binding = f"small_resnet.norm_layer = @engine.{norm}_batch_norm"
  if norm == "cross_replica":   # The config's own, in the run test_configs_end_to_end checks.
    result, _ = tiny_runs.run(tmp_path_factory, CONFIG, "local2.gin")
    assert binding in result.operative_config
  else:
    files = [os.path.join(helpers.REPO, CONFIG),
             os.path.join(helpers.REPO, "configs/topology/local2.gin")]
    # Two blocks and 200 evaluation images: the record read here needs no depth.
    result = run_experiment(load_experiment(files, [*helpers.TINY[CONFIG], binding, *SHORT]),
                            str(tmp_path))
  record = result.noise_scale
  assert record["per_replica_batch"] * 2 == record["global_batch"] == result.global_batch_size
  assert math.isfinite(record["trace_sigma"]) and math.isfinite(record["grad_sq"])
  assert ("caveat" in record) == (norm == "cross_replica")
  assert result.eval_s > 0
  assert result.regime_metrics[noise_scale.SMALL] > 0 < result.regime_metrics[noise_scale.BIG]


def test_predict_takes_a_topology_file_and_refuses_it_with_workers(tmp_path, capsys):
  local4 = os.path.join(helpers.REPO, "configs/topology/local4.gin")
  run = inprocess_cli.cli(capsys, "predict", f"--gin_file={CONFIG}", f"--device_profile={V100}",
                          f"--topology={local4}", f"--efficiency={_efficiency_file(tmp_path)}")
  assert run.returncode == 0, run.stderr[-3000:]
  assert "4 on 1 host(s)" in run.stdout and "time to target" in run.stdout
  both = inprocess_cli.cli(capsys, "predict", f"--gin_file={CONFIG}",
                           f"--device_profile={V100}", f"--topology={local4}", "--workers=2")
  assert both.returncode == 2 and "not both" in both.stderr


def test_the_documented_predict_example_runs_on_the_committed_efficiency_file(capsys):
  """`replibench predict --help`'s example, as printed, against results/predict/."""
  import shlex  # pylint: disable=import-outside-toplevel
  from replibench.cli_help import COMMANDS  # pylint: disable=import-outside-toplevel
  args = shlex.split(COMMANDS["predict"].example)
  assert args[:2] == ["replibench", "predict"]
  run = inprocess_cli.cli(capsys, *args[1:], "--json")
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout)
  assert got["workload"] == "resnet_fashion_mnist" and got["target"] == 0.90
  assert math.isfinite(got["time_to_target_s"]) and got["time_to_target_s"] > 0


def _header_command(path: str) -> list[str]:
  """The `replibench predict ...` command in a gin file's header, as a user copies it."""
  import shlex  # pylint: disable=import-outside-toplevel
  lines = [line[1:].strip() for line in open(os.path.join(helpers.REPO, path))
           if line.startswith("#")]
  start = next(i for i, line in enumerate(lines) if line.startswith("replibench predict"))
  joined = ""
  for line in lines[start:]:
    joined += line.rstrip("\\").strip() + " "
    if not line.endswith("\\"):
      break
  return shlex.split(joined)[1:]


_PLANS = {}   # gin's bindings but Experiment.target -> make_plan's plan, in this process.


@pytest.fixture
def plans_once(monkeypatch):
  """`predict` plans an experiment planned before in this process once, whatever its
  target: a plan of the ImageNet recipes traces a 224x224 ResNet-50 step (seconds, and
  hundreds of MiB the process keeps), and three tests ask one recipe about different
  targets. The target is the only field of the plan a target binding changes."""
  def make_plan(experiment):
    key = "\n".join(line for line in gin.config_str().splitlines()
                    if not line.startswith("Experiment.target"))
    if key not in _PLANS:
      _PLANS[key] = plan_lib.make_plan(experiment)
    return {**_PLANS[key], "target": experiment.target}

  monkeypatch.setattr(command, "make_plan", make_plan)


@pytest.mark.usefixtures("plans_once")
@pytest.mark.parametrize("profile,workload_file,replicas,batch,steps,bound", [
    # Goyal et al.: 90 epochs at batch 8,192 on 256 P100s; the recipe's own target.
    ("configs/devices/p100_bigbasin.gin", "imagenet_goyal256.gin", 256, 8192,
     90 * 1281167 / 8192, "at_most"),
    # TF-Replicator: 75.3% on 32 TPU v3 cores, easier than the recipe's 76.3%.
    ("configs/devices/tpu_v3_32.gin", "imagenet_tpu32.gin", 32, 4096,
     90 * 1281167 / 4096, "at_most"),
])
def test_the_published_results_predict_from_their_profiles_headers(
    capsys, profile, workload_file, replicas, batch, steps, bound):
  """The ImageNet comparisons of results/predict/README.md, by the commands in the
  device profiles' headers: topologies and a dataset this machine lacks."""
  args = _header_command(profile)
  assert f"--device_profile={profile}" in args
  run = inprocess_cli.cli(capsys, *args, "--json")
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout)
  assert (got["num_replicas"], got["global_batch_size"]) == (replicas, batch)
  assert got["steps_to_target"] == pytest.approx(steps) and got["steps_bound"] == bound
  assert got["critical_batch"] is None and got["critical_batch_interval"][0] == 8192
  assert got["time_to_target_s"] == pytest.approx(steps * got["step_s"])
  text = command.format_prediction(got)
  assert "at most" in text and "Goyal et al. 2017" in text and "not timed" in text


@pytest.mark.usefixtures("plans_once")
@pytest.mark.parametrize("target,error", [(0.78, True), (0.70, False)])
def test_a_published_recipe_covers_no_target_harder_than_its_own(target, error):
  ask = functools.partial(
      command.predict_command, [os.path.join(helpers.REPO, "configs/resnet/imagenet_goyal256.gin")],
      [f"Experiment.target = {target}"], os.path.join(helpers.REPO, "configs/devices/p100_bigbasin.gin"),
      os.path.join(helpers.REPO, "results/predict/resnet50_imagenet_published.json"),
      workers=None, topology=None, network="none", as_json=True)
  if error:
    with pytest.raises(UserError, match="no harder than its final metric"):
      ask()
  else:
    assert json.loads(ask())["steps_bound"] == "at_most"
