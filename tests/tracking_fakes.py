"""A small git repository with a fake, fast suite, for the tracker's tests.

The repository holds a sweep file (two configurations, seeds 1-3) and a file
`speed.txt` whose number scales the fake trials' throughput: a commit that
lowers it is a slowdown. The fake runner writes each trial's result.json from
that number and a deterministic noise (no TensorFlow, no timing), so the A/B,
history and bisect code runs exactly as on a real suite, in milliseconds.
"""

import hashlib
import json
import math
import os
import subprocess

import numpy as np

from replibench import results
from replibench.errors import UserError
from replibench.tracking.suites import Suite

SUITE = Suite("fake", "configs/fake/fake.sweep", rounds=1)
SWEEP = """# Fake suite for the tracker's tests.
description = "fake"
gin_files = ["fake.gin"]
seeds = [1, 2, 3]
seed_binding = "Experiment.seed"
judge = ["converged", "time_to_target_s", "steps_to_target", "examples_per_s"]

[[axes]]
name = "setup"

[[axes.points]]
label = "replicas=1"

[[axes.points]]
label = "replicas=2"
"""
PYPROJECT = '[project]\nname = "fake"\nversion = "0"\ndependencies = ["numpy"]\n'


def git(repo, *args) -> str:
  env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
         "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
  return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                        text=True, env=env).stdout.strip()


def commit(repo, message: str, speed: float | None = None, files: dict | None = None) -> str:
  """Commits speed.txt (if given) and files ({path: text}); returns the sha."""
  for path, text in {**({"speed.txt": f"{speed}\n"} if speed is not None else {}),
                     **(files or {})}.items():
    full = os.path.join(repo, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
      f.write(text)
  git(repo, "add", "-A")
  git(repo, "commit", "-q", "--allow-empty", "-m", message)
  return git(repo, "rev-parse", "HEAD")


def make_repo(path, speed: float = 1.0) -> str:
  """A fresh repository at path with the fake suite; returns its path."""
  os.makedirs(path, exist_ok=True)
  git(path, "init", "-q", "-b", "main")
  with open(os.path.join(path, ".gitignore"), "w") as f:
    f.write("/runs/\n")
  commit(path, "fake suite", speed, {
      "configs/fake/fake.sweep": SWEEP, "configs/fake/fake.gin": "# fake\n",
      "pyproject.toml": PYPROJECT})
  return str(path)


def _noise(*key, sigma: float) -> float:
  seed = int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16)
  return math.exp(sigma * np.random.default_rng(seed).standard_normal())


def write_result(trial_dir: str, seed: int, speed: float, noise: float = 1.0,
                 git_sha: str = "", status: str = "reached", threads=None) -> None:
  """A fake trial's result.json: examples/s = 1000 x speed x noise; threads: the
  machine.threads it records (None: none, as before the pools were recorded)."""
  eps = 1000.0 * speed * noise
  results.write(trial_dir, results.RunResult(
      status=status, workload="fake", target_metric="eval/top1", target=0.5,
      higher_is_better=True, time_to_target_s=10000.0 / eps, steps_to_target=100,
      examples_per_s=eps, final_metric=0.6, seed=seed, git_sha=git_sha, tf_version="2.21.0",
      machine={"calibration": {"matmul_gflops": 100.0, "convnet_gflops": 50.0},
               **({"threads": threads} if threads else {})}))


BROKEN = "Fake.broken = True"   # A binding the fake validator says does not compile.
GRAPH = "Experiment.jit_compile = False"   # Pins the fake's step uncompiled.


def validate(python, code, trials) -> dict[str, bool]:
  """The fake suite's compile check (validate.Validator): a trial whose bindings hold
  BROKEN, or a revision whose broken.txt exists, does not compile; a revision whose
  xla.txt exists compiles its step with XLA (Experiment.jit_compile resolved) unless a
  trial pins GRAPH."""
  for t in trials:
    if BROKEN in t.bindings or os.path.exists(os.path.join(code, "broken.txt")):
      raise UserError(f"trial {t.name} does not compile: Gin config fake.gin: No "
                      f"configurable matching 'Fake.broken'.")
  xla = os.path.exists(os.path.join(code, "xla.txt"))
  return {t.name: xla and GRAPH not in t.bindings for t in trials}


def write_manifest(sweep_dir: str, sweep_file: str = SUITE.sweep,
                   extra_bindings: tuple = (), trials: tuple = ()) -> None:
  """The sweep.json `replibench sweep` leaves in its directory (names the sweep file and
  what the command line added)."""
  os.makedirs(sweep_dir, exist_ok=True)
  with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
    json.dump({"sweep_file": os.path.join("/somewhere", sweep_file), "sweep_text": SWEEP,
               "judge": None, "extra_gin_files": [], "extra_bindings": list(extra_bindings),
               "trials": [{"name": name} for name in trials]}, f)


class FakeRunner:
  """A runner for ab.run_suite: examples/s = 1000 x speed.txt x noise; time to target
  the other way. `sigma` is the log-normal noise of one trial. A revision whose
  speed.txt says 'fail' (or a trial fail(side, trial) says should) fails: no result."""

  def __init__(self, sigma: float = 0.03, salt: str = "", fail=None):
    self.sigma, self.salt, self.calls, self.fail = sigma, salt, [], fail

  def __call__(self, side, trial, trial_dir):
    with open(os.path.join(side.env.code, "speed.txt")) as f:
      text = f.read().strip()
    self.calls.append((side.label, trial.name, trial_dir))
    if text == "fail" or self.fail is not None and self.fail(side, trial):
      return 1
    speed = float(text)
    # Seeded by what names the trial, not by its directory (under pytest's tmp_path, a
    # new one each run): the same A/B draws the same noise every time.
    noise = _noise(self.salt, side.label, trial.name, os.path.basename(trial_dir),
                   sigma=self.sigma)
    write_result(trial_dir, trial.seed, speed, noise)
    return 0


def write_bench_sweep(path, sha: str, speed: float = 1.0, seeds=(1, 2, 3), failed=(),
                      sweep: str = SUITE.sweep, threads=None) -> str:
  """A finished bench sweep directory of the fake suite (or `sweep`) at commit sha, its
  seeds run on replicas=1 and replicas=2 (the seeds in `failed` failed); returns it."""
  write_manifest(str(path), sweep)
  for config in ("replicas=1", "replicas=2"):
    for seed in seeds:
      write_result(os.path.join(path, config, f"seed={seed}"), seed, speed, 1 + 0.01 * seed,
                   git_sha=sha, status="failed" if seed in failed else "reached",
                   threads=threads)
  return str(path)
