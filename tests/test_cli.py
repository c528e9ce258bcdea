"""The command line's contract: help that helps, and bad input as one paragraph with exit 2
and nothing written. Each case is a real `python -m replibench.cli` process, but the
second and later cases of one kind of bad input file: those run in this process
(tests/inprocess_cli.py, the same main without a fresh interpreter's start-up), the first
case of the kind having shown what a real process prints (so does the sweep's check
of its trials, whose kind a bad sweep file's real-process case shows)."""

import os
import subprocess
import sys

import pytest

from tests import helpers, inprocess_cli

CONFIG = "configs/resnet/fashion_mnist.gin"
TINY = [f"--gin_bindings={b}" for b in helpers.TINY[CONFIG]]


def _cli(capsys, case: int, *args: str, env: dict | None = None):
  """`replibench ARGS` for the case-th case (from 0) of a parametrized test: the first
  in a real process, the others in this one."""
  if case == 0:
    return helpers.cli(*args, env=env)
  return inprocess_cli.cli(capsys, *args, env=env)


def _one_paragraph_error(run) -> str:
  assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
  assert "Traceback" not in run.stderr, run.stderr[-3000:]
  lines = [l for l in run.stderr.splitlines() if l.startswith("replibench") and "error:" in l]
  assert len(lines) == 1, run.stderr[-3000:]
  # TensorFlow's C++ start-up notices stay out of the way (replibench/native_logs.py).
  assert "InitializeLog" not in run.stderr and "oneDNN" not in run.stderr, run.stderr[-3000:]
  return lines[0]


def test_help_lists_every_command():
  run = helpers.cli("--help")
  assert run.returncode == 0, run.stderr
  for command in ("run", "plan", "predict", "launch", "sweep", "report", "compare"):
    assert f"  {command} " in run.stdout
  assert "Exit codes" in run.stdout


@pytest.mark.parametrize("command,flag", [("launch", "--cpus_per_worker"), ("run", "--workdir"),
                                          ("compare", "--normalize"), ("sweep", "--seeds")])
def test_command_help_shows_its_flags_defaults_and_an_example(command, flag):
  run = helpers.cli(command, "--help")
  assert run.returncode == 0, run.stderr
  assert f"usage: replibench {command}" in run.stdout and flag in run.stdout
  assert "example:" in run.stdout and "(default:" in run.stdout


@pytest.mark.parametrize("args,culprit", [
    ((), "no command given"),
    (("train",), "unknown command 'train'"),
    (("run", "--no_such_flag=1"), "no_such_flag"),
    (("launch", "--workers", "abc", "--", "run"), "workers"),
    (("launch", "--cpus_per_worker=-1", "--", "run"), "cpus_per_worker"),
    (("launch", "--network=fast", "--", "run"), "network"),
    (("compare", "a", "--baseline=b", "--factors=speed=2"), "factors"),
    (("compare", "a", "--baseline=b", "--judge=speed"), "--judge=speed"),
])
def test_flag_and_command_mistakes_exit_2(args, culprit):
  run = helpers.cli(*args)
  assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
  assert culprit in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("case,gin_text,culprit", [
    (0, "", "Required bindings for `Experiment`"),
    (1, "Experiment.workload = @ImageClassification(\n", "empty.gin"),
    (2, "include 'TMP/empty.gin'\n", "cycle"),
])
def test_broken_gin_files_exit_2_with_one_paragraph(tmp_path, capsys, case, gin_text, culprit):
  path = tmp_path / "empty.gin"
  path.write_text(gin_text.replace("TMP", str(tmp_path)))
  run = _cli(capsys, case, "run", f"--gin_file={path}", f"--workdir={tmp_path / 'run'}")
  line = _one_paragraph_error(run)
  assert culprit in line, line
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case,variable,value", [
    (0, "REPLIBENCH_CPU_DEVICES", "abc"), (1, "REPLIBENCH_CALIBRATION_S", "0"),
    (2, "REPLIBENCH_CALIBRATION_S", "fast")])
def test_a_bad_environment_variable_is_named(tmp_path, capsys, case, variable, value):
  run = _cli(capsys, case, "run", f"--gin_file={CONFIG}", *TINY, "--max_steps=1",
             "--gin_file=configs/topology/local2.gin", f"--workdir={tmp_path / 'run'}",
             env={variable: value})
  line = _one_paragraph_error(run)
  assert variable in line and value in line, line
  assert not (tmp_path / "run").exists()


def test_sweep_checks_every_trial_before_running_any(tmp_path, capsys):
  """In this process: what is checked is the sweep's logic (the real-process exit and
  the absence of TensorFlow's start-up notices are the case-0 tests')."""
  (tmp_path / "s.sweep").write_text(f"""
gin_files = ["{helpers.REPO}/{CONFIG}"]
seeds = [1]
seed_binding = "Experiment.seed"
bindings = {[*helpers.TINY[CONFIG]]!r}
[[axes]]
name = "width"
points = [{{label = "ok", bindings = ["small_resnet.widths = (4, 8, 8)"]}},
          {{label = "bad", bindings = ["small_resnet.widths = 'abc'"]}}]
""".replace("['", '["').replace("']", '"]').replace("', '", '", "'))
  run = inprocess_cli.cli(capsys, "sweep", f"--sweep={tmp_path / 's.sweep'}",
                          f"--workdir={tmp_path / 'w'}")
  line = _one_paragraph_error(run)
  assert "trial bad/seed=1 does not compile" in line and "does not build" in line
  assert not list((tmp_path / "w").rglob("result.json"))   # No trial ran.


@pytest.mark.parametrize("case,content", list(enumerate([b"\x89PNG\r\n\x1a\n\x00\x00",
                                                        b"\xff\xfe not utf8", None])))
def test_a_sweep_file_that_is_binary_or_a_directory_exits_2(tmp_path, capsys, case, content):
  path = tmp_path / "s.sweep"
  if content is None:
    path.mkdir()
  else:
    path.write_bytes(content)
  run = _cli(capsys, case, "sweep", f"--sweep={path}", f"--workdir={tmp_path / 'w'}")
  assert "s.sweep" in _one_paragraph_error(run)


@pytest.mark.parametrize("case,content",
                         list(enumerate([b"[1, 2, 3]", b"\x00\x01binary", b'{"workload": 3}'])))
def test_a_baseline_that_is_not_a_report_exits_2(tmp_path, capsys, case, content):
  (tmp_path / "base.json").write_bytes(content)
  run = _cli(capsys, case, "compare", str(tmp_path / "base.json"),
             f"--baseline={tmp_path / 'base.json'}")
  assert "base.json" in _one_paragraph_error(run)


def test_launch_says_why_when_no_private_network_namespace_can_be_made(tmp_path):
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not "
                                "permitted' >&2\nexit 1\n")
  os.chmod(fake / "unshare", 0o755)
  run = helpers.cli("launch", "--workers=2", "--", "run", f"--gin_file={CONFIG}",
                    f"--workdir={tmp_path / 'run'}",
                    env={"PATH": f"{fake}:{os.environ['PATH']}"})
  line = _one_paragraph_error(run)
  assert "private network namespace" in line and "Operation not permitted" in line
  assert not (tmp_path / "run").exists()


def test_tensorflow_start_up_notices_are_shown_when_asked():
  """absl's verbosity flag shows TensorFlow's C++ banner and INFO notices, which every
  other command leaves out (_one_paragraph_error checks)."""
  asked = helpers.cli("-v", "0", "plan", f"--gin_file={CONFIG}",
                      "--gin_bindings=Experiment.target = nan")
  assert asked.returncode == 2 and "cannot read nan" in asked.stderr, asked.stderr[-3000:]
  assert "InitializeLog" in asked.stderr and "I0000" in asked.stderr, asked.stderr[-3000:]


@pytest.mark.parametrize("line,driver,kept", [
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
     False, False),
    ("I0000 00:00:1795.635 4881 port.cc:153] oneDNN custom operations are on.", False, False),
    ("To enable the following instructions: AVX2 FMA, in other operations, rebuild", False,
     False),
    ("E0000 00:00:1795.63 4881 cuda_platform.cc:52] failed call to cuInit: INTERNAL", False,
     False),
    ("E0000 00:00:1795.63 4881 cuda_platform.cc:52] failed call to cuInit: INTERNAL", True,
     True),
    ("E0000 00:00:1795.63 8748 base_collective_executor.cc:252] StartAbort UNAVAILABLE", False,
     True),
    ("W1125 19:32:45.090621 140063 gpu_device.cc:2] Cannot dlopen some GPU libraries.", False,
     True),
    ("F1125 19:32:45.090621 140063 tensor.cc:9] Check failed: dims() == 2", False, True),
    ("I1125 19:32:45.090621 140063805873024 loop.py:214] eval at step 20", False, True),
    ("Traceback (most recent call last):", False, True),
])
def test_the_filter_drops_start_up_notices_and_keeps_every_warning_and_error(line, driver, kept):
  from replibench import native_logs  # pylint: disable=import-outside-toplevel
  assert native_logs.keep(line, nvidia_driver=driver) == kept


@pytest.mark.parametrize("args", [["nosuch", "--help"], ["help", "ab"]])
def test_a_closed_pipe_ends_the_cli_quietly(args):
  """`replibench nosuch --help | head -2`: the reader goes away; no traceback, the exit
  a Unix tool killed by SIGPIPE gives (141)."""
  proc = subprocess.Popen([sys.executable, "-m", "replibench.cli", *args], cwd=helpers.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()                 # Closed before the CLI writes: its write fails.
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=120) == 141, err
  assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
