"""TensorBoard's HParams table over a sweep: one row (session group) per configuration,
its seeds the sessions, read back through TensorBoard's own hparams backend."""

import os

from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment
from tensorboard.plugins.hparams import list_session_groups

from replibench import results
from replibench.harness.reporting import Summaries
from replibench.suite import hparams_config
from tests import fakes

CONFIGS = {"replicas=1": 1, "replicas=2": 2, "workers=2": 2}   # label -> replicas
SEEDS = (1, 2)   # Fewer seeds than configurations: grouping by seed would show 2 rows.


def _backend(logdir: str) -> backend_context.Context:
  multiplexer = plugin_event_multiplexer.EventMultiplexer()
  multiplexer.AddRunsFromDirectory(logdir)
  multiplexer.Reload()
  return backend_context.Context(base_plugin.TBContext(
      logdir=logdir, multiplexer=multiplexer,
      data_provider=data_provider.MultiplexerDataProvider(multiplexer, logdir)))


def session_groups(logdir: str) -> list:
  """The HParams table's rows as TensorBoard's backend lists them to its frontend."""
  request = api_pb2.ListSessionGroupsRequest(
      start_index=0, slice_size=100, aggregation_type=api_pb2.AGGREGATION_AVG,
      allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS,
                        api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING])
  return list(list_session_groups.Handler(tb_context.RequestContext(), _backend(logdir), "",
                                          request).run().session_groups)


def hparam_columns(logdir: str) -> list[tuple[str, bool]]:
  """The table's hparams in TensorBoard's order, with whether each differs between rows
  (the frontend shows those first and ticks them)."""
  experiment = get_experiment.Handler(tb_context.RequestContext(), _backend(logdir), "",
                                      api_pb2.GetExperimentRequest()).run()
  return [(info.name, info.differs) for info in experiment.hparam_infos]


def test_a_sweep_is_one_session_group_per_configuration_with_its_seeds_as_sessions(tmp_path):
  found = []
  for label, replicas in CONFIGS.items():
    for seed in SEEDS:
      kind = "worker_processes" if label.startswith("workers") else "logical_replicas"
      result = results.RunResult.from_dict(fakes.fake_result(
          seed=seed, num_replicas=replicas, scaling_kind=kind,
          time_to_target_s=100.0 + 10 * seed + replicas))
      trial_dir = os.path.join(tmp_path, label, f"seed={seed}")
      summaries = Summaries(trial_dir)
      summaries.outcome(result)
      summaries.close()
      found.append(result)
  hparams_config.write_experiment_config(str(tmp_path), found)

  groups = session_groups(str(tmp_path))
  assert len(groups) == len(CONFIGS)
  rows = {}
  for group in groups:
    assert "seed" not in group.hparams
    sessions = sorted(s.name for s in group.sessions)
    label = sessions[0].split("/")[0]
    assert sessions == [f"{label}/seed={seed}" for seed in SEEDS]
    rows[label] = group
  assert set(rows) == set(CONFIGS)
  for label, group in rows.items():
    assert group.hparams["num_replicas"].number_value == CONFIGS[label]
    assert group.hparams["topology"].string_value == (
        "worker_processes" if label.startswith("workers") else "logical_replicas")
    # The row's time to target is its seeds' mean, not one seed's.
    (ttt,) = [m for m in group.metric_values if m.name.tag == "hparams/time_to_target_s"]
    assert ttt.value == sum(100.0 + 10 * s + CONFIGS[label] for s in SEEDS) / len(SEEDS)
  # The columns that tell the rows apart come first; the seed is no column.
  columns = hparam_columns(str(tmp_path))
  assert columns[:2] == [("num_replicas", True), ("topology", True)]
  assert all(not differs for _, differs in columns[2:]) and "seed" not in dict(columns)
