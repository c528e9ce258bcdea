"""The emulated network of `replibench launch --network=RATE`.

The rate limit holds between two processes inside a private namespace (through
the launcher's own netns functions), the loopback counter sees the bytes sent,
a launched cluster reports its bytes on the wire beside the account's
prediction, and a rate that cannot be applied is an error before anything runs.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from replibench import rates
from replibench.harness import netns
from tests import helpers

# Inside a fresh namespace: set lo up, limit it, send BYTES from this process to a
# child process over TCP, and print the seconds the transfer took and the counter.
_TRANSFER = r"""
import json, socket, subprocess, sys, time
from replibench import rates
from replibench.harness import netns
rate, size = sys.argv[1], int(sys.argv[2])
netns.bring_up_loopback()
netns.limit_rate(rate)
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
receiver = subprocess.Popen([sys.executable, "-c", '''
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
left = int(sys.argv[2])
while left:
  left -= len(s.recv(min(left, 1 << 16)))
''', str(server.getsockname()[1]), str(size)])
connection, _ = server.accept()
before = netns.loopback_bytes()
start = time.monotonic()
connection.sendall(b"x" * size)
assert receiver.wait() == 0
print(json.dumps({"seconds": time.monotonic() - start,
                  "counted": netns.loopback_bytes() - before}))
"""


def _transfer(rate: str, size: int) -> dict:
  done = subprocess.run(netns.unshare_command([sys.executable, "-c", _TRANSFER, rate, str(size)]),
                        cwd=helpers.REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_rate_limit_holds_between_two_processes():
  rate, size = "8mbit", 3 * 2**20
  measured = _transfer(rate, size)
  # The token bucket lets `burst` bytes through at once, then the rate: a lower
  # bound the kernel enforces, not a timing of this machine.
  floor = (size - rates.token_bucket_bytes(rate)) * 8 / rates.bits_per_second(rate)
  assert measured["seconds"] >= floor, (measured, floor)
  assert measured["counted"] >= size


def test_the_loopback_counter_sees_an_unlimited_transfer():
  assert _transfer("none", 2**20)["counted"] >= 2**20


def test_a_rate_without_tc_is_an_error_before_anything_runs(tmp_path):
  bin_dir = tmp_path / "bin"   # A PATH with unshare (and the `true` it checks with), no tc.
  bin_dir.mkdir()
  for program in ("unshare", "true"):
    os.symlink(shutil.which(program), bin_dir / program)
  run = helpers.cli("launch", "--workers=2", "--network=100mbit", "--", "run",
                    "--gin_file=configs/resnet/fashion_mnist.gin",
                    f"--workdir={tmp_path / 'run'}", env={"PATH": str(bin_dir)})
  assert run.returncode == 2, run.stderr[-2000:]
  assert "`tc` program" in run.stderr and "--network=100mbit" in run.stderr
  assert not (tmp_path / "run").exists()


# Every config that can launch has its account checked against the wire: in a run
# here, in test_multiworker's (resnet/fashion_mnist.gin, Sync), or through a config
# here whose step sends the same collectives (WIRE_COVERED). The ResNet run with its
# own cross-replica batch norm also takes the compressed two-pass wire through a real
# cluster: its all-to-all and gathers between processes, and their overheads.
TWO_PASS = ["Experiment.regime = @regimes.Compressed()", "regimes.Compressed.bits = 8",
            "regimes.Compressed.wire = 'two_pass'"]
WIRE_RUNS = {
    "resnet-two_pass": ("configs/resnet/fashion_mnist.gin", "none", TWO_PASS),
    "resnet_scaling-100mbit": ("configs/resnet/scaling.gin", "100mbit", []),
    "sngan": ("configs/sngan/fashion_mnist.gin", "none", []),
    "d4pg": ("configs/d4pg/cartpole_swingup.gin", "none", []),
}
WIRE_TESTED = {config for config, _, regime in WIRE_RUNS.values() if not regime} | {
    "configs/resnet/fashion_mnist.gin"}   # test_multiworker


def tiny_overrides(config: str) -> list[str]:
  return helpers.TINY[helpers.derived_configs().get(config, config)]


@pytest.mark.parametrize("config,network,regime", WIRE_RUNS.values(), ids=WIRE_RUNS)
def test_a_launched_cluster_sends_what_its_account_says(tmp_path, config, network, regime):
  run = helpers.cli("launch", "--workers=2", f"--network={network}", "--timeout=500", "--",
                    "run", f"--gin_file={config}", "--gin_file=configs/topology/workers.gin",
                    "--gin_bindings=topology.MultiWorker.workers = 2",
                    *(f"--gin_bindings={b}" for b in [*tiny_overrides(config), *regime]),
                    f"--workdir={tmp_path}")
  assert run.returncode == 0, helpers.failure_report(run)
  if regime:
    overheads = helpers.result(tmp_path).communication["rpc_overhead_bytes_by_collective"]
    assert {"all_to_all", "all_gather"} <= set(overheads)
  wire = helpers.check_wire_account(run, tmp_path)
  assert wire["rate"] == network and wire["steps"] == helpers.result(tmp_path).final_step
  assert wire["bytes_on_wire"] > wire["eval_bytes"] >= 0 and wire["init_bytes"] > 0
  # Checkpoint saves are counted apart, like evaluations: the meter's identity. Their own
  # bytes are not asserted: whether a save puts bytes on the wire inside the chief's save
  # window depends on the other worker's timing (the clean-clone CI run of 2026-11-25
  # saw 0 for the two-pass run, then 2 of 5 runs here).
  assert wire["bytes_on_wire_per_step"] * wire["steps"] == pytest.approx(
      wire["bytes_on_wire"] - wire["eval_bytes"] - wire["checkpoint_bytes"], abs=wire["steps"])
  events = helpers.event_tags(tmp_path)
  assert "network/bytes_on_wire_per_step" in events
  assert "train/regime/bytes_communicated" in events


def launchable_configs() -> list[str]:
  """Every committed config that `replibench launch` can run here (not a TPU's)."""
  bases = [c for c in helpers.workload_configs() if helpers.runs_on_cpu(c)]
  return bases + sorted(c for c, base in helpers.derived_configs().items() if base in bases)


def _experiment(config: str):
  """config at its test size on 2 replicas (loaded, nothing traced)."""
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  return load_experiment([config, "configs/topology/local2.gin"], tiny_overrides(config))


def _collectives(config: str):
  """(workload type, the step's collectives by kind and by collective) of a config
  at its test size on 2 replicas: what the wire check of another config covers."""
  from replibench.config.plan import communication_account  # pylint: disable=import-outside-toplevel
  experiment = _experiment(config)
  account = communication_account(experiment)   # Traces the step: seconds a config.
  return (type(experiment.workload).__name__,
          {kind: row["count"] for kind, row in account["by_kind"].items()},
          account["wire_messages_by_collective"], account["wire_ops_per_step_by_collective"])


def test_every_launchable_config_has_its_account_checked_against_the_wire():
  """A config not launched by a wire check must send the same collectives per step as
  one that is (its bytes differ with its tensors, which the account reads off the trace;
  what the check tests is that nothing else goes on the wire).

  Collectives of different workload types never match (the type is their first
  element), so a wire-checked config's step is traced only when a config of its type
  needs it, and only until one matches."""
  untested = [c for c in launchable_configs() if c not in WIRE_TESTED]
  workload = lambda c: type(_experiment(c).workload).__name__  # noqa: E731
  candidates = {}   # Wire-checked configs by workload type, not yet traced.
  for config in sorted(WIRE_TESTED):
    candidates.setdefault(workload(config), []).append(config)
  tested = []       # Collectives of the wire-checked configs traced so far.
  for config in untested:
    collectives = _collectives(config)
    while collectives not in tested and candidates.get(collectives[0]):
      tested.append(_collectives(candidates[collectives[0]].pop(0)))
    assert collectives in tested, (
        f"{config} sends collectives no wire-checked config does: add it to WIRE_RUNS")


def test_expected_bytes_price_each_collectives_transfers_at_its_own_overhead():
  from replibench.harness import wire  # pylint: disable=import-outside-toplevel
  account = {"wire_bytes_per_replica_per_step": 10_000,
             "wire_messages_by_collective": {"all_reduce": 4, "all_gather": 2},
             "rpc_overhead_bytes_by_collective": {"all_reduce": 500.0, "all_gather": 1400.0},
             "rpc_overhead_bytes_per_message": 500.0}
  assert wire.expected_per_step(account, 2) == 2 * (10_000 + 4 * 500 + 2 * 1400)
  # Each collective op also costs its replica a fixed amount per call of the step's
  # function: 3 ops in a call of 2 steps, at 150 B each.
  per_call = {**account, "wire_ops_per_step_by_collective": {"all_reduce": 1.5},
              "rpc_overhead_bytes_per_call_by_collective": {"all_reduce": 150.0}}
  assert wire.expected_per_step(per_call, 2) == 2 * (10_000 + 4 * 500 + 2 * 1400 + 1.5 * 150)
  # An account with one overhead for every transfer (result.json before the split).
  old = {"wire_bytes_per_replica_per_step": 10_000, "wire_messages_per_replica_per_step": 6,
         "rpc_overhead_bytes_per_message": 500.0}
  assert wire.expected_per_step(old, 2) == 2 * (10_000 + 6 * 500)
