"""Every value a user gives is checked where it first enters, with its range in the
message, and is shown as the user wrote it: each bad input exits 2 with one paragraph
naming the culprit, shows no Python object or traceback, and leaves nothing behind.

The commands run in this process (replibench.cli.main after absl parses the flags, as
`python -m replibench.cli` does): a process each would cost a TensorFlow start-up a
case. test_cli.py covers the flag parser and the help in real processes.
"""

import json
import os
import re

import pytest

from replibench import cli, rates
from tests import helpers, inprocess_cli

CONFIG = "configs/resnet/fashion_mnist.gin"
PREDICT = ["predict", f"--gin_file={CONFIG}", "--gin_bindings=Experiment.target = 0.9",
           "--device_profile=configs/devices/v100_node.gin", "--workers=4"]
# What a message must never show: Python objects, tracebacks, gin's call notes, tc's words.
INTERNALS = re.compile(r"object at 0x|<class |<function |<ast\.|Traceback|In call to "
                       r"configurable|\('EOF|rate is mandatory|illegal value")


def run_cli(capsys, *args: str) -> str:
  """`replibench ARGS` in this process, from the repo root: its one-paragraph error
  (asserting exit 2, one line, no internals)."""
  run = inprocess_cli.cli(capsys, *args)
  lines = [line for line in run.stderr.splitlines() if "error:" in line]
  assert run.returncode == 2 and len(lines) == 1, (run.returncode, run.stderr[-3000:])
  assert not INTERNALS.search(lines[0]), lines[0]
  return lines[0]


def _efficiency_with(tmp_path, key: str, value) -> str:
  with open(os.path.join(helpers.REPO, "results/predict/resnet_fashion_mnist.json")) as f:
    data = json.load(f)
  data["fit"][key] = value
  path = tmp_path / "efficiency.json"
  path.write_text(json.dumps(data))
  return str(path)


def _profile_with(tmp_path, binding: str) -> str:
  path = tmp_path / "profile.gin"
  with open(os.path.join(helpers.REPO, "configs/devices/v100_node.gin")) as f:
    path.write_text(f.read() + binding + "\n")
  return str(path)


# (arguments, what the one paragraph must say: the culprit as written and the range).
PREDICT_CASES = {
    "zero rate": (["--network=0bit"], ["--network=0bit", "from 1kbit to 1000gbit"]),
    "absurd rate": (["--network=99999999gbit"], ["--network=99999999gbit", "1000gbit"]),
    "one bit": (["--network=1bit"], ["--network=1bit", "1kbit"]),
}


@pytest.mark.parametrize("extra,said", PREDICT_CASES.values(), ids=PREDICT_CASES)
def test_predict_refuses_a_rate_outside_the_link_range(capsys, extra, said):
  line = run_cli(capsys, *PREDICT, *extra)
  assert all(s in line for s in said), line


@pytest.mark.parametrize("binding,said", [
    ("predict.DeviceProfile.intra_host_bytes_per_s = 0",
     "predict.DeviceProfile.intra_host_bytes_per_s = 0: must be a number in (0, inf)"),
    ("predict.DeviceProfile.achieved_fraction = 1.5",
     "predict.DeviceProfile.achieved_fraction = 1.5: must be a number in (0, 1]"),
    ("predict.DeviceProfile.devices_per_host = 2.5",
     "predict.DeviceProfile.devices_per_host = 2.5: must be an integer in [1, inf)"),
    ("predict.DeviceProfile.inter_host_latency_s = -1e-6",
     "predict.DeviceProfile.inter_host_latency_s = -1e-06: must be a number in [0, inf)"),
])
def test_predict_refuses_a_device_profile_field_outside_its_range(capsys, tmp_path, binding,
                                                                   said):
  profile = _profile_with(tmp_path, binding)
  line = run_cli(capsys, *PREDICT[:-2], f"--device_profile={profile}", "--workers=4")
  assert said in line, line


@pytest.mark.parametrize("key,value,said", [
    ("s_min", "abc", "fit.s_min = 'abc': must be a number"),
    ("dof", 2.5, "fit.dof = 2.5: must be an integer in [0, inf)"),
    ("batches", [], "fit.batches = []: must be a non-empty list"),
    ("cov", [[1.0]], "fit.cov = [[1.0]]: must be the 2 x 2 covariance"),
])
def test_predict_refuses_an_efficiency_file_field_of_the_wrong_type_as_it_loads(
    capsys, tmp_path, key, value, said):
  path = _efficiency_with(tmp_path, key, value)
  line = run_cli(capsys, *PREDICT, f"--efficiency={path}")
  assert path in line and said in line, line


def test_predict_says_when_its_network_does_not_apply(capsys):
  code = cli.main(cli.FLAGS(["replibench", *PREDICT[:-1], "--workers=1", "--network=1gbit"]))
  cli.FLAGS.unparse_flags()
  out = capsys.readouterr().out
  assert code == 0 and "network 1gbit (not applied: the 8 replica(s) share one host" in out


@pytest.mark.parametrize("network", ["0bit", "99999gbit", "fast"])
def test_launch_refuses_a_rate_before_it_makes_a_namespace(capsys, tmp_path, network):
  line = run_cli(capsys, "launch", "--workers=2", f"--network={network}", "--", "run",
                 f"--gin_file={CONFIG}", f"--workdir={tmp_path / 'run'}")
  assert f"--network={network}" in line and "1kbit to 1000gbit" in line, line
  assert not (tmp_path / "run").exists()


def test_a_sweep_point_s_rate_is_checked_as_the_sweep_file_loads(capsys, tmp_path):
  sweep = tmp_path / "s.sweep"
  sweep.write_text(f"""
gin_files = ["{helpers.REPO}/{CONFIG}"]
seeds = [1]
seed_binding = "Experiment.seed"
[[axes]]
name = "link"
points = [{{label = "slow", workers = 2, network = "0bit"}}]
""")
  line = run_cli(capsys, "sweep", f"--sweep={sweep}", f"--workdir={tmp_path / 'w'}")
  assert "axes[0].points[0].network" in line and "'0bit'" in line and "1kbit" in line, line
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("command", ["sweep", "report", "run"])
def test_an_output_directory_that_is_a_file_is_refused(capsys, tmp_path, command):
  taken = tmp_path / "taken"
  taken.write_text("mine")
  args = {"sweep": ["sweep", "--sweep=configs/resnet/scaling.sweep", f"--workdir={taken}"],
          "report": ["report", str(tmp_path), f"--out={taken}"],
          "run": ["run", f"--gin_file={CONFIG}", f"--workdir={taken}"]}[command]
  line = run_cli(capsys, *args)
  assert f"={taken}: is a file, not a directory" in line, line
  assert taken.read_text() == "mine"


@pytest.mark.parametrize("flag", ["--gin_file", "--device_profile", "--topology"])
def test_a_directory_given_for_a_file_is_named_as_such(capsys, flag):
  args = (["plan", "--gin_file=configs"] if flag == "--gin_file" else
          [*PREDICT[:3], f"{flag}=configs", *(["--device_profile=configs/devices/v100_node.gin"]
                                              if flag == "--topology" else [])])
  line = run_cli(capsys, *args)
  assert f"{flag}=configs: is a directory, not a file" in line, line


@pytest.mark.parametrize("binding,said", [
    ("Experiment.global_batch_size = 100000",
     "Experiment.global_batch_size = 100000: more than the 60,000 examples"),
    ("small_resnet.widths = (4, 8", "open parenthesis"),
    ("small_resnet.widths = 'abc'", "small_resnet.widths = 'abc'"),
    ("Experiment.target = nan", "cannot read nan as a value"),
    ("Experiment.target = 'high'", "Experiment.target must be a number, got 'high'"),
])
def test_plan_names_the_binding_as_written(capsys, binding, said):
  line = run_cli(capsys, "plan", f"--gin_file={CONFIG}", f"--gin_bindings={binding}")
  assert said in line, line


@pytest.mark.parametrize("binding,said", [
    ("topology.Mesh.model = 3",
     "has 16 output channels, which topology.Mesh.model = 3 does not divide"),
    ("topology.Mesh.workers = 2", "tensor parallelism across worker processes is not supported"),
])
def test_a_mesh_that_cannot_split_the_model_exits_2(capsys, binding, said):
  line = run_cli(capsys, "plan", f"--gin_file={CONFIG}",
                 "--gin_file=configs/resnet/tensor_parallel.gin", f"--gin_bindings={binding}")
  assert said in line, line


@pytest.mark.parametrize("parallelism", ["pipeline", "tensor"])
def test_model_parallelism_on_a_workload_that_cannot_split_gives_its_own_advice(capsys,
                                                                                parallelism):
  line = run_cli(capsys, "plan", "--gin_file=configs/d4pg/cartpole_swingup.gin",
                 "--gin_bindings=Experiment.topology = @topology.Mesh()",
                 f"--gin_bindings=topology.Mesh.parallelism = '{parallelism}'",
                 "--gin_bindings=topology.Mesh.model = 2")
  assert "with the d4pg" in line.lower() and "D4PG's policy and critic" in line, line
  assert "ImageClassification" not in line and "small_resnet" not in line, line


def test_a_configurable_in_a_message_is_shown_as_its_gin_reference(capsys):
  line = run_cli(capsys, "plan", f"--gin_file={CONFIG}",
                 "--gin_bindings=Experiment.regime = @regimes.Gossip()",
                 "--gin_bindings=regimes.Gossip.compression = @regimes.Compressed()",
                 "--gin_bindings=regimes.Compressed.top_k = 0.1")
  assert "got @regimes.Compressed() with regimes.Compressed.top_k = 0.1" in line, line


def test_the_rate_range_is_what_tc_can_apply():
  """The bounds a rate is checked against are ones tc's token bucket takes: at least a
  byte a second, and a burst (token_bucket_bytes) that fits in 32 bits."""
  assert rates.bits_per_second(rates.LOWEST) >= 8
  assert rates.token_bucket_bytes(rates.HIGHEST) < 2**32


def test_more_actor_cores_than_the_machine_leaves_the_learner_exits_2(capsys, tmp_path):
  cores = len(os.sched_getaffinity(0))
  line = run_cli(capsys, "run", "--gin_file=configs/d4pg/learner_scaling.gin",
                 "--gin_file=configs/d4pg/smoke.gin",
                 f"--gin_bindings=D4PG.actor_cores = {cores}", f"--workdir={tmp_path / 'run'}")
  assert f"D4PG.actor_cores = {cores}" in line and f"at most {cores - 1}" in line, line
  assert not (tmp_path / "run").exists()


# The tracker's commands: each bad input exits 2 with one paragraph naming it, before
# anything is checked out or written (tests/test_tracking_ab.py checks the "nothing
# written" of the revision checks on a fake suite).
@pytest.mark.parametrize("args, said", [
    (["ab", "--suite=", "--base=HEAD~1", "--head=HEAD"], "--suite=: empty"),
    (["ab", "--base=", "--head=HEAD", "--suite=resnet"], "--base=: empty"),
    (["ab", "--configs=replicas=1,,workers=2", "--base=HEAD~1", "--head=HEAD"],
     "--configs=replicas=1,,workers=2: empty"),
    (["ab", "--base=HEAD", "--head=HEAD", "--suite=d4pg"], "same commit"),
    (["ab", "--base=HEAD~1", "--head=HEAD", "--suite=d4pg", "--factors=x=1"],
     "--factors not used by this command"),
    (["bisect", "--good=HEAD~1", "--bad=HEAD", "--suite=d4pg", "--metric=examples_per_s",
      "--rounds=-1"], "--rounds=-1"),
    (["bisect", "--good=HEAD~1", "--bad=HEAD", "--suite=d4pg", "--metric=examples_per_s",
      "--rounds=0"], "--rounds=0"),
    (["history", "--suite=resnet"], "--suite not used"),
    (["history", "record", "runs/nowhere", "--suite=resnet", "--factors=bogus"],
     "--factors not used"),
    (["history", "compare", "runs/no-such-sweep", "--suite=resnet"], "no such directory"),
])
def test_a_tracker_command_refuses_bad_input_with_one_paragraph(capsys, args, said):
  assert said in run_cli(capsys, *args)


def test_the_tracker_names_the_file_at_fault(capsys, tmp_path, monkeypatch):
  a_file = tmp_path / "a-file"
  a_file.write_text("x")
  assert f"--out={a_file}: is a file" in run_cli(capsys, "history", f"--out={a_file}")
  monkeypatch.setenv("REPLIBENCH_HISTORY", str(a_file))
  assert f"REPLIBENCH_HISTORY={a_file}: is a file" in run_cli(capsys, "history",
                                                               f"--out={tmp_path / 'o'}")
  assert not (tmp_path / "o").exists()
  # `report FILE` blames FILE, not the --out derived from it.
  line = run_cli(capsys, "report", str(a_file))
  assert f"report {a_file}: is a file, not a sweep directory" in line and "--out" not in line
  # An unknown configuration is refused after reading both revisions' sweep files (no
  # worktree, no A/B directory).
  workdir = tmp_path / "ab"
  line = run_cli(capsys, "ab", "--base=HEAD~1", "--head=HEAD", "--suite=d4pg",
                 "--configs=nope", f"--workdir={workdir}")
  assert "--configs=nope: ['nope'] not in configs/d4pg/learner_scaling.sweep" in line
  assert not workdir.exists()


def test_a_default_output_directory_in_the_way_is_not_blamed_on_a_flag_never_given(
    capsys, tmp_path):
  sweep = tmp_path / "sweep"
  os.makedirs(sweep)
  (sweep / "report").write_text("a file where the default report directory goes")
  line = run_cli(capsys, "report", str(sweep))
  assert "the default output directory (--out)" in line and f"--out={sweep}" not in line
