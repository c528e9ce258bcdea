"""Run reporting: TensorBoard summaries and MLPerf-format log lines.

TensorBoard: scalars against the global step (its relative-time axis gives the
time-to-accuracy view), the operative gin config as text, and an HParams
session whose metrics are `hparams/time_to_target_s` and `hparams/final_metric`.
MLPerf: `:::MLLOG` lines in DIR/mllog.txt through the mlperf-logging package.
"""

import logging
import os

import tensorflow as tf
from mlperf_logging.mllog import constants as mlc
from mlperf_logging.mllog import mllog
from tensorboard.plugins.hparams import api as hp

HPARAM_METRICS = ("hparams/time_to_target_s", "hparams/final_metric")


class Summaries:
  """tf.summary writer for one run (a no-op writer on non-chief workers)."""

  def __init__(self, logdir: str, enabled: bool = True):
    self.writer = (tf.summary.create_file_writer(logdir) if enabled
                   else tf.summary.create_noop_writer())

  def scalars(self, step: int, values: dict) -> None:
    with self.writer.as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)
    self.writer.flush()

  def text(self, tag: str, markdown: str, step: int = 0) -> None:
    with self.writer.as_default(step=step):
      tf.summary.text(tag, markdown)

  def hparams(self, values: dict, trial_id: str) -> None:
    with self.writer.as_default(step=0):
      hp.hparams(values, trial_id=trial_id)

  def image(self, tag: str, images, step: int) -> None:
    with self.writer.as_default(step=step):
      tf.summary.image(tag, images, step=step, max_outputs=1)

  def close(self) -> None:
    self.writer.flush()
    self.writer.close()


def operative_config_markdown(config: str) -> str:
  # Indented lines render as a code block in TensorBoard's text plugin.
  return "\n".join("    " + line for line in config.splitlines())


class MLPerfLog:
  """`:::MLLOG` lines for one run, appended to a file (resumed runs continue it)."""

  def __init__(self, path: str, enabled: bool = True):
    self._logger = logging.getLogger(f"replibench.mllog.{os.path.abspath(path)}")
    self._logger.propagate = False
    self._logger.setLevel(logging.INFO)
    self._logger.handlers.clear()
    self._handler = logging.FileHandler(path) if enabled else logging.NullHandler()
    self._logger.addHandler(self._handler)
    self._log = mllog.MLLogger(logger=self._logger, default_stack_offset=2)

  def event(self, key: str, value=None, **metadata) -> None:
    self._log.event(key=key, value=value, metadata=metadata or None)

  def start(self, key: str, value=None, **metadata) -> None:
    self._log.start(key=key, value=value, metadata=metadata or None)

  def end(self, key: str, value=None, **metadata) -> None:
    self._log.end(key=key, value=value, metadata=metadata or None)

  def close(self) -> None:
    self._logger.removeHandler(self._handler)
    self._handler.close()


MLC = mlc
