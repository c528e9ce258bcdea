"""The engine's bad-input errors: clear, naming the culprit, non-zero exit at the CLI."""

import json

import pytest

from replibench import engine
from replibench.engine import devices
from replibench.engine.spec import per_replica_batch_size
from replibench.errors import UserError
from tests import inprocess_cli


def test_global_batch_must_divide_over_replicas():
  assert per_replica_batch_size(256, 4) == 64
  with pytest.raises(UserError, match="global batch size 30 does not divide over 4"):
    per_replica_batch_size(30, 4)


def test_absent_device_type():
  with pytest.raises(UserError, match="device='gpu'.*no"):
    engine.Local(num_replicas=1, device="gpu").make_strategy()
  with pytest.raises(UserError, match="device must be"):
    engine.Local(num_replicas=1, device="tpu").make_strategy()


def test_too_many_cpu_replicas_after_initialisation():
  with pytest.raises(UserError, match="REPLIBENCH_CPU_DEVICES"):
    devices.ensure_logical_cpus(64)


@pytest.mark.parametrize("tf_config,culprit", [
    ("{not json", "malformed"),
    (json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}}), "malformed"),
    (json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}),
     "not in its cluster"),
    (json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}),
     "not in its cluster"),
])
def test_bad_tf_config(monkeypatch, tf_config, culprit):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  with pytest.raises(UserError, match=culprit):
    engine.MultiWorker().make_strategy()


def test_missing_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(UserError, match="TF_CONFIG"):
    engine.MultiWorker().make_strategy()


def test_tpu_topology_plans_but_does_not_run_here():
  assert engine.Tpu(num_cores=32).num_replicas == 32
  with pytest.raises(UserError, match="no TPU"):
    engine.Tpu(num_cores=32).make_strategy()


def test_cli_exits_non_zero_on_bad_tf_config(tmp_path, capsys):
  run = inprocess_cli.cli(capsys, "run", "--gin_file=configs/resnet/fashion_mnist.gin",
                          "--gin_file=configs/topology/workers.gin", f"--workdir={tmp_path}",
                          env={"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                                            '"task": {"type": "worker", "index": 5}}'})
  assert run.returncode == 2 and "TF_CONFIG" in run.stderr, run.stderr[-2000:]
  assert not (tmp_path / "result.json").exists()
