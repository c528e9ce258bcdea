"""The benchmarks around profiles: benchmarks/throughput/keras_peer.py (Keras' `model.fit` peer of
the ResNet-50 row, tiny on a CPU) and benchmarks/throughput/throughput.py --profile's runs."""

import json
import subprocess
import sys

from tests import helpers


def _script(name: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, f"benchmarks/throughput/{name}", *args], cwd=helpers.REPO,
                        capture_output=True, text=True, timeout=timeout)


def test_the_keras_peer_trains_resnet50_with_model_fit_at_tiny_size(tmp_path):
  out = tmp_path / "peer"
  run = _script("keras_peer.py", "--scale=tiny", "--precisions=float32", "--jit=false",
                "--batch=2", "--steps=1", "--warmup_steps=1", f"--out={out}")
  assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
  (row,) = json.load(open(f"{out}.json"))["rows"]
  assert (row["precision"], row["jit_compile"], row["batch"]) == ("float32", False, 2)
  assert row["images_per_s"] > 0 and row["device"] == "CPU"
  assert "| keras.applications.ResNet50 | float32 | False | 2 |" in open(f"{out}.md").read()


def test_the_keras_peer_lists_its_trials_and_refuses_unknown_ones():
  run = _script("keras_peer.py", "--dry_run", "--precisions=mixed_bfloat16,mixed_float16")
  assert run.returncode == 0 and len(run.stdout.splitlines()) == 4, run.stdout
  assert "--one=mixed_float16,1" in run.stdout and "--batch=256" in run.stdout
  bad = _script("keras_peer.py", "--precisions=float8")
  assert bad.returncode == 2 and "float8" in bad.stderr


def test_throughput_profile_adds_one_traced_call_to_each_run():
  run = _script("throughput.py", "--dry_run", "--profile", "--scale=tiny",
                "--models=resnet50", "--setups=replicas=1", "--precisions=float32")
  assert run.returncode == 0, run.stderr
  # Tiny: 4 timed steps in calls of 2, then the call of steps 5-6, profiled.
  assert "Experiment.profile_steps = (5, 6)" in run.stdout and "--max_steps=6" in run.stdout


def test_the_accelerator_run_rehearses_its_phases_in_the_budgets_order():
  """tools/accelerator/run.sh all --dry-run: every phase's commands, in issue 41's order;
  plan --dry-run: each session within a lent machine's 15 minutes."""
  run = subprocess.run(["tools/accelerator/run.sh", "all", "--dry-run"], cwd=helpers.REPO,
                       capture_output=True, text=True, timeout=60)
  assert run.returncode == 0, run.stderr
  text = run.stdout + run.stderr
  marks = ["keras_peer.py --precisions=mixed_bfloat16 --jit=false\\,true",
           "--models=resnet50", "jit_compile\\ =\\ True --profile", "--models=sngan128",
           "--models=d4pg_pixels",
           *(f"scaling.py --workloads={w} --worker_counts=1\\,2\\,4\\,8 --cpus_per_worker=2"
             for w in ("resnet", "sngan", "d4pg"))]
  positions = [text.find(m) for m in marks]
  assert -1 not in positions and positions == sorted(positions), (positions, text)
  plan = subprocess.run(["tools/accelerator/run.sh", "plan", "--dry-run"], cwd=helpers.REPO,
                        capture_output=True, text=True, timeout=60)
  assert plan.returncode == 0 and all(f"Session {s}" in plan.stdout for s in "ABC")
  assert "OVER" not in plan.stdout, plan.stdout
