"""Sweep files, trial expansion and naming, resumption, the HParams config."""

import glob
import os
import sys
import textwrap

import pytest

from replibench.errors import UserError
from tests import fakes as fake
from replibench.suite import hparams_config
from replibench.suite import sweep
from replibench.suite import sweep_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEP = """
gin_files = ["base.gin"]
bindings = ["EVAL_EVERY = 2"]
seeds = [1, 2]
seed_binding = "SEED"

[[axes]]
name = "setup"
points = [
  {label = "replicas=1", gin_files = ["local1.gin"]},
  {label = "workers=2", gin_files = ["workers.gin"], workers = 2, cpus_per_worker = 1},
]

[[axes]]
name = "batch"
binding = "GLOBAL_BATCH_SIZE"
values = [128, 256]
"""


def write_sweep(tmp_path, text=SWEEP, name="s.sweep"):
  for gin in ("base.gin", "local1.gin", "workers.gin"):
    (tmp_path / gin).write_text("# stub\n")
  path = tmp_path / name
  path.write_text(textwrap.dedent(text))
  return str(path)


def test_expansion_is_the_product_of_axes_times_seeds_with_stable_names(tmp_path):
  trials = sweep_file.expand(sweep_file.load(write_sweep(tmp_path)))
  assert [t.name for t in trials] == [
      "replicas=1,batch=128/seed=1", "replicas=1,batch=256/seed=1",
      "workers=2,batch=128/seed=1", "workers=2,batch=256/seed=1",
      "replicas=1,batch=128/seed=2", "replicas=1,batch=256/seed=2",
      "workers=2,batch=128/seed=2", "workers=2,batch=256/seed=2"]
  t = trials[3]
  assert [os.path.basename(f) for f in t.gin_files] == ["base.gin", "workers.gin"]
  assert all(os.path.isabs(f) for f in t.gin_files)
  # The point's `workers` is the one statement of its worker count; each run checks it.
  assert t.bindings == ("EVAL_EVERY = 2", "topology.MultiWorker.workers = 2",
                        "GLOBAL_BATCH_SIZE = 256", "SEED = 1")
  assert t.launch == sweep_file.Launch(workers=2, cpus_per_worker=1)
  assert trials[0].launch == sweep_file.Launch()


def test_seeds_and_extra_gin_files_from_the_caller(tmp_path):
  extra = tmp_path / "extra.gin"
  extra.write_text("")
  trials = sweep_file.expand(sweep_file.load(write_sweep(tmp_path)), [str(extra)], seeds=[7])
  assert len(trials) == 4 and {t.seed for t in trials} == {7}
  assert [os.path.basename(f) for f in trials[0].gin_files] == [
      "base.gin", "extra.gin", "local1.gin"]


def test_trial_command_in_process_and_through_launch(tmp_path):
  trials = sweep_file.expand(sweep_file.load(write_sweep(tmp_path)))
  run = sweep.trial_command(trials[0], "/w/t0")
  assert run[:4] == [sys.executable, "-m", "replibench.cli", "run"]
  assert "--gin_bindings=SEED = 1" in run and run[-1] == "--workdir=/w/t0"
  assert any(a.startswith("--gin_file=") and a.endswith("local1.gin") for a in run)
  launch = sweep.trial_command(trials[2], "/w/t2")
  assert launch[3:9] == ["launch", "--workers", "2", "--cpus_per_worker", "1", "--"]
  assert launch[9] == "run" and launch[-1] == "--workdir=/w/t2"


NETWORK_AXIS = """
[[axes]]
name = "network"
points = [{label = "net=none"}, {label = "net=100mbit", network = "100mbit"}]
"""


def test_a_network_axis_crosses_rates_with_launched_topologies(tmp_path):
  trials = sweep_file.expand(sweep_file.load(write_sweep(tmp_path, SWEEP.replace(
      '{label = "replicas=1", gin_files = ["local1.gin"]},', "") + NETWORK_AXIS)))
  by_name = {t.config: t for t in trials if t.seed == 1}
  limited = by_name["workers=2,batch=128,net=100mbit"]
  assert limited.launch == sweep_file.Launch(workers=2, cpus_per_worker=1, network="100mbit")
  assert "--network=100mbit" in sweep.trial_command(limited, "/w/t")
  unlimited = by_name["workers=2,batch=128,net=none"]
  assert not any(a.startswith("--network") for a in sweep.trial_command(unlimited, "/w/t"))
  # An unlimited trial's record is as before the key existed: old sweeps resume.
  assert "network" not in unlimited.to_dict()["launch"]


def test_a_network_that_is_not_a_rate_names_its_key(tmp_path):
  text = SWEEP + NETWORK_AXIS.replace('network = "100mbit"', 'network = "fast"')
  with pytest.raises(UserError, match=r"axes\[2\]\.points\[1\]\.network"):
    sweep_file.load(write_sweep(tmp_path, text))


def test_a_network_without_launched_workers_is_refused(tmp_path):
  with pytest.raises(UserError, match="network = '100mbit' without `workers`"):
    sweep_file.expand(sweep_file.load(write_sweep(tmp_path, SWEEP + NETWORK_AXIS)))


def test_the_scaling_sweep_has_five_setups_times_three_seeds():
  trials = sweep_file.expand(sweep_file.load(os.path.join(REPO, "configs/resnet/scaling.sweep")))
  assert len(trials) == 15
  assert sorted({t.config for t in trials}) == [
      "replicas=1", "replicas=2", "replicas=4", "workers=1", "workers=2"]
  assert {t.launch.workers for t in trials if t.config.startswith("workers")} == {1, 2}


def test_a_point_with_ps_launches_a_chief_and_parameter_servers():
  trials = sweep_file.expand(sweep_file.load(os.path.join(REPO, "configs/resnet/regimes.sweep")))
  (trial,) = [t for t in trials if t.config == "async_ps" and t.seed == 1]
  command = sweep.trial_command(trial, "/tmp/x")
  assert command[3:11] == ["launch", "--workers", "4", "--cpus_per_worker", "0", "--ps", "1", "--"]


@pytest.mark.parametrize("text, key", [
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\nsedes = [2]\n", "sedes"),
    ("gin_files = ['base.gin']\nseeds = ['one']\nseed_binding = 'S'\n", "seeds"),
    ("gin_files = ['missing.gin']\nseeds = [1]\nseed_binding = 'S'\n", "gin_files"),
    ("gin_files = ['base.gin']\nseeds = [1]\n", "seed_binding"),
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\n"
     "[[axes]]\nname = 'a'\npoints = [{gin_files = ['base.gin']}]\n", "axes[0].points[0].label"),
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\n"
     "[[axes]]\nname = 'a'\npoints = [{label = 'x', workers = 0}]\n", "axes[0].points[0].workers"),
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\n"
     "[[axes]]\nname = 'a'\npoints = [{label = 'x', workers = 2, "
     "bindings = ['topology.MultiWorker.workers = 3']}]\n", "axes[0].points[0].bindings"),
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\n"
     "[[axes]]\nname = 'b'\nbinding = 'B'\nvalues = []\n", "axes[0].values"),
    ("gin_files = ['base.gin']\nseeds = [1]\nseed_binding = 'S'\n"
     "[[axes]]\nname = 'a/b'\nbinding = 'B'\nvalues = [1]\n", "axes[0].name"),
])
def test_malformed_sweep_file_names_file_and_key(tmp_path, text, key):
  path = write_sweep(tmp_path, text, "bad.sweep")
  with pytest.raises(UserError) as e:
    sweep_file.load(path)
  assert path in str(e.value) and f"'{key}'" in str(e.value)


def test_invalid_toml_names_the_file(tmp_path):
  path = write_sweep(tmp_path, "seeds = [1,\n", "broken.sweep")
  with pytest.raises(UserError, match="broken.sweep"):
    sweep_file.load(path)


def test_resume_skips_final_trials_and_reruns_the_rest(tmp_path):
  path = write_sweep(tmp_path)
  workdir = str(tmp_path / "run")
  # First pass: one trial crashes (no result.json), one writes status "failed".
  first = fake.FakeRunner(lambda t: None if t.name == "workers=2,batch=128/seed=1"
                          else {"status": "failed"} if t.name == "replicas=1,batch=256/seed=2"
                          else {})
  lines = []
  out = sweep.run_sweep([], path, workdir, runner=first, log=lines.append)
  assert len(first.calls) == 8 and out.num_failed == 2
  assert any(l.startswith("[3/8] workers=2,batch=128/seed=1: failed") for l in lines)
  assert any("time to target" in l for l in lines)
  second = fake.FakeRunner()
  out = sweep.run_sweep([], path, workdir, runner=second, log=lines.append)
  assert second.calls == ["workers=2,batch=128/seed=1", "replicas=1,batch=256/seed=2"]
  assert out.num_failed == 0 and sum(o.skipped for o in out.outcomes) == 6
  third = fake.FakeRunner()
  sweep.run_sweep([], path, workdir, runner=third, log=lines.append)
  assert third.calls == []


def test_interrupted_sweep_resumes_where_it_stopped(tmp_path):
  path = write_sweep(tmp_path)
  workdir = str(tmp_path / "run")
  calls = []

  def interrupted(trial, trial_dir):
    calls.append(trial.name)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return fake.FakeRunner()(trial, trial_dir)

  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep([], path, workdir, runner=interrupted, log=lambda s: None)
  rest = fake.FakeRunner()
  sweep.run_sweep([], path, workdir, runner=rest, log=lambda s: None)
  assert rest.calls[0] == calls[2] and len(rest.calls) == 6


def test_parallel_trials_all_finish(tmp_path):
  runner = fake.FakeRunner()
  out = sweep.run_sweep([], write_sweep(tmp_path), str(tmp_path / "run"), runner=runner,
                        parallel=2, log=lambda s: None)
  assert sorted(runner.calls) == sorted(o.trial.name for o in out.outcomes)
  assert [o.status for o in out.outcomes] == ["reached"] * 8


def test_edited_sweep_refuses_to_resume_into_old_trials(tmp_path):
  path = write_sweep(tmp_path)
  workdir = str(tmp_path / "run")
  sweep.run_sweep([], path, workdir, runner=fake.FakeRunner(lambda t: None), log=lambda s: None)
  write_sweep(tmp_path, SWEEP.replace('"EVAL_EVERY = 2"', '"EVAL_EVERY = 3"'))
  with pytest.raises(UserError, match="bindings"):
    sweep.run_sweep([], path, workdir, runner=fake.FakeRunner(), log=lambda s: None)


def test_hparams_experiment_config_names_trial_hparams_and_metrics(tmp_path):
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.plugins.hparams import plugin_data_pb2

  workdir = str(tmp_path / "run")
  sweep.run_sweep([], write_sweep(tmp_path), workdir, runner=fake.FakeRunner(),
                  log=lambda s: None)
  path = os.path.join(workdir, hparams_config.CONFIG_FILE)
  events = list(event_file_loader.EventFileLoader(path).Load())
  (value,) = [v for e in events for v in e.summary.value]
  assert value.tag == "_hparams_/experiment"
  data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
  names = {h.name for h in data.experiment.hparam_infos}
  assert {"num_replicas", "global_batch_size", "topology"} <= names
  assert "seed" not in names   # A configuration's seeds are the sessions of its group.
  assert {m.name.tag for m in data.experiment.metric_infos} == {
      "hparams/time_to_target_s", "hparams/final_metric"}


def test_the_hparams_config_grows_as_trials_end_reading_each_result_once(tmp_path, monkeypatch):
  """Each finished trial's result joins the table at once; a result.json is read when
  the sweep starts, after its trial and for the final table, not after every trial."""
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.plugins.hparams import plugin_data_pb2
  from replibench.suite import results as suite_results

  workdir = str(tmp_path / "run")
  path = os.path.join(workdir, hparams_config.CONFIG_FILE)
  reads, read = {}, suite_results.read_result
  monkeypatch.setattr(suite_results, "read_result", lambda d: reads.update(
      {d: reads.get(d, 0) + 1}) or read(d))

  def batches_in_the_table():
    (value,) = [v for e in event_file_loader.EventFileLoader(path).Load() for v in e.summary.value]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    (batch,) = [h for h in data.experiment.hparam_infos if h.name == "global_batch_size"]
    return len(batch.domain_discrete.values)

  seen = []
  runner = fake.FakeRunner(lambda t: seen.append(
      batches_in_the_table() if os.path.exists(path) else 0) or {"global_batch_size": len(seen)})
  outcome = sweep.run_sweep([], write_sweep(tmp_path), workdir, runner=runner, log=lambda s: None)
  assert len(outcome.outcomes) == 8 and outcome.num_failed == 0
  assert seen == list(range(8))   # Trial k's table had the k trials before it.
  assert batches_in_the_table() == 8
  assert len(reads) == 8 and max(reads.values()) <= 3, reads


FAKE_CLI = '''
import json, os, sys
args = sys.argv[1:]
if args[0] == "launch":
  args = args[args.index("--") + 1:]
workdir = [a.split("=", 1)[1] for a in args if a.startswith("--workdir=")][0]
seed = int([a for a in args if a.startswith("--gin_bindings=SEED")][0].rsplit(" ", 1)[1])
print("fake run", args)
with open(os.path.join(workdir, "result.json"), "w") as f:
  json.dump({"status": "reached", "workload": "w", "target_metric": "m", "target": 1.0,
             "higher_is_better": True, "time_to_target_s": 1.5, "seed": seed}, f)
'''


def test_subprocess_runner_runs_the_cli_and_logs_its_output(tmp_path, monkeypatch):
  # A stand-in `replibench.cli` first on the child's path (python -m puts the cwd first).
  fake_pkg = tmp_path / "cwd" / "replibench"
  fake_pkg.mkdir(parents=True)
  (fake_pkg / "__init__.py").write_text("")
  (fake_pkg / "cli.py").write_text(FAKE_CLI)
  monkeypatch.chdir(tmp_path / "cwd")
  out = sweep.run_sweep([], write_sweep(tmp_path), str(tmp_path / "run"), seeds=[5],
                        log=lambda s: None)
  assert [o.status for o in out.outcomes] == ["reached"] * 4
  assert [o.exit_code for o in out.outcomes] == [0] * 4
  log = (tmp_path / "run" / "workers=2,batch=256" / "seed=5" / sweep.LOG_FILE).read_text()
  assert "launch --workers 2 --cpus_per_worker 1 -- run" in log and "fake run" in log


def test_a_seed_binding_that_does_not_reach_the_run_stops_the_sweep(tmp_path):
  runner = fake.FakeRunner(lambda t: {"seed": 0})
  with pytest.raises(UserError, match="seed_binding"):
    sweep.run_sweep([], write_sweep(tmp_path), str(tmp_path / "run"), runner=runner,
                    log=lambda s: None)
  assert len(runner.calls) == 1


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.sweep"))))
def test_every_committed_sweep_expands(path):
  trials = sweep_file.expand(sweep_file.load(path))
  assert trials and len({t.name for t in trials}) == len(trials)
  if os.path.basename(path) == "network.sweep":   # Every trial launched, rates crossed.
    assert all(t.launch.workers == 4 for t in trials)
    assert {t.launch.network for t in trials} >= {"none", "100mbit"}
