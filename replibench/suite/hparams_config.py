"""The TensorBoard HParams experiment config at the root of a sweep.

Each trial's harness writes its own hp.hparams session, in the session group of
its configuration (its hparams but the seed: harness/reporting.py); TensorBoard
shows one row per configuration, its seeds as the sessions, in one HParams table
when the root holds an experiment config naming the hparams and the metrics. The
hparams are taken from the trials' result.json (the configuration of the dict the
harness logs), so the names always match the sessions.

The config is written with TensorBoard's own proto and record writer, so the
sweep driver does not import (and initialise) TensorFlow.
"""

import os
import time
from typing import Any, Iterable

from tensorboard.compat.proto import event_pb2
# summary_v2 is what tensorboard.plugins.hparams.api re-exports, minus the Keras
# callback whose import pulls in TensorFlow.
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.summary.writer import record_writer

from replibench import atomic
from replibench.results import RunResult, configuration

# A stable name, so rewriting the config replaces it instead of adding a second
# experiment summary. TensorBoard reads any file with 'tfevents' in its name.
CONFIG_FILE = "events.out.tfevents.0.sweep-hparams-config"
METRICS = (
    ("hparams/time_to_target_s", "Time to target (s)",
     "MLPerf timed span, run_start to the first eval meeting the target."),
    ("hparams/final_metric", "Final metric", "The target metric at the last evaluation."),
)


def _domain(values: list[Any]) -> hp.Discrete | None:
  """A Discrete domain over the values seen, when they share one type."""
  if all(isinstance(v, bool) for v in values):
    return hp.Discrete(sorted(set(values)))
  if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
    if all(isinstance(v, int) for v in values):
      return hp.Discrete(sorted(set(values)))
    return hp.Discrete(sorted({float(v) for v in values}))
  if all(isinstance(v, str) for v in values):
    return hp.Discrete(sorted(set(values)))
  return None  # Mixed types: TensorBoard infers the domain from the sessions.


def _values(results: list[RunResult]) -> dict[str, list[Any]]:
  """{hparam: the values the results' configurations give it} (their `hparams` but the
  seed: the seeds of a configuration are the sessions of its group)."""
  seen: dict[str, list[Any]] = {}
  for result in results:
    for key, value in configuration(result.hparams).items():
      if isinstance(value, (bool, int, float, str)):
        seen.setdefault(key, []).append(value)
  return seen


def experiment_hparams(results: Iterable[RunResult]) -> list[hp.HParam]:
  """One HParam per key of the results' configurations, with the values seen."""
  return [hp.HParam(key, _domain(values)) for key, values in sorted(_values(list(results)).items())]


def _differing(results: list[RunResult]) -> set[str]:
  """The hparams that tell the configurations apart (set by some, or not one value)."""
  return {key for key, values in _values(results).items()
          if len(values) < len(results) or len(set(map(repr, values))) > 1}


def write_experiment_config(sweep_dir: str, results: Iterable[RunResult]) -> str | None:
  """Writes (or replaces) the experiment config; returns its path, None if no hparams."""
  results = list(results)
  hparams = experiment_hparams(results)
  if not hparams:
    return None
  metrics = [hp.Metric(tag, display_name=name, description=desc) for tag, name, desc in METRICS]
  now = time.time()
  summary = hp.hparams_config_pb(hparams, metrics, time_created_secs=now)
  # Marked as differing, the hparams that tell the rows apart are the table's first
  # columns (TensorBoard shows the first few and leaves the rest to be ticked).
  plugin_data = summary.value[0].metadata.plugin_data
  data = plugin_data_pb2.HParamsPluginData.FromString(plugin_data.content)
  differing = _differing(results)
  for info in data.experiment.hparam_infos:
    info.differs = info.name in differing
  plugin_data.content = data.SerializeToString()
  events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2"),
            event_pb2.Event(wall_time=now, step=0, summary=summary)]

  def write(f):
    writer = record_writer.RecordWriter(f)
    for event in events:
      writer.write(event.SerializeToString())

  path = os.path.join(sweep_dir, CONFIG_FILE)
  atomic.write_atomic(path, write)
  return path
