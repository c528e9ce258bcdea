"""The training loop: evaluation cadence, time-to-target, checkpoints, divergence.

Timing follows MLPerf: init (building the replicated program, restoring,
tracing) is measured apart; the timed span runs from run_start to the first
evaluation that meets the target and includes training, evaluation and
checkpointing. The span is saved with each checkpoint, so a resumed run
continues it rather than starting again.
"""

import math
import os
import shutil
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from replibench.compiler.experiment import Experiment
from replibench.engine import Replicator
from replibench.errors import UserError
from replibench.harness import progress, provenance
from replibench.atomic import read_json, write_json
from replibench.harness.reporting import MLC, MLPerfLog, Summaries, operative_config_markdown

FINAL_STATUSES = ("reached", "diverged")


class _Run:
  """One session of one experiment in one workdir (a resume is a new session)."""

  def __init__(self, experiment: Experiment, workdir: str, max_steps: int | None):
    self.experiment, self.workdir = experiment, workdir
    self.workload = experiment.workload
    self.init_start = time.monotonic()
    self.replicator = Replicator(experiment.topology, experiment.regime)
    self.chief = self.replicator.is_chief
    self.spec = experiment.train_spec(self.replicator.num_replicas)
    self.limit = min(experiment.total_steps, max_steps or experiment.total_steps)
    self.mllog = MLPerfLog(os.path.join(workdir, "mllog.txt"), enabled=self.chief)
    self.mllog.start(MLC.INIT_START)
    self.summaries = Summaries(workdir, enabled=self.chief)
    with self.replicator.scope():
      self.workload.build(self.spec)
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.elapsed = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    self.checkpoint = tf.train.Checkpoint(step=self.step, elapsed=self.elapsed,
                                          **self.workload.checkpoint_items())
    self.state = self._restore()
    self.train = self.replicator.compile(
        self.workload.step_fn, self.workload.input_fn, experiment.global_batch_size,
        experiment.steps_per_call, start_step=int(self.step.numpy()))
    self.train.trace()
    self.operative_config = gin.operative_config_str()
    self.init_s = time.monotonic() - self.init_start
    self.mllog.end(MLC.INIT_STOP)

  # Checkpoints: the chief writes DIR/checkpoints; other workers must take part
  # in saving (MultiWorkerMirroredStrategy) but write to a scratch directory.
  def _checkpoint_dir(self) -> str:
    if self.chief:
      return os.path.join(self.workdir, "checkpoints")
    return os.path.join(self.workdir, f".scratch-{os.getpid()}")

  def _restore(self) -> dict:
    self.manager = tf.train.CheckpointManager(self.checkpoint, self._checkpoint_dir(),
                                              max_to_keep=2)
    latest = tf.train.latest_checkpoint(os.path.join(self.workdir, "checkpoints"))
    state = read_json(os.path.join(self.workdir, "progress.json"), {"curve": []})
    if latest:
      try:
        self.checkpoint.restore(latest).assert_existing_objects_matched()
      except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise UserError(
            f"{self.workdir} holds a checkpoint ({latest}) that does not match this config "
            f"(was the model or optimizer changed?); use a new --workdir. ({e})") from None
      step = int(self.step.numpy())
      state["curve"] = [p for p in state["curve"] if p[0] <= step]
      logging.info("Resuming %s at step %d (%.1f s of timed run so far).",
                   self.workdir, step, float(self.elapsed.numpy()))
    return state

  def _begin_session(self, base: float) -> None:
    # One entry per session (the first run and each resume): where it started, its
    # init, and the timed seconds it added, updated at every save. A session killed
    # between saves keeps the entry of its last save, as the checkpoint does.
    self._session_base = base
    self.state.setdefault("sessions", []).append(
        {"start_step": int(self.step.numpy()), "end_step": int(self.step.numpy()),
         "init_s": round(self.init_s, 3), "timed_s": 0.0})

  def _update_session(self) -> None:
    self.state["sessions"][-1].update(
        end_step=int(self.step.numpy()),
        timed_s=round(float(self.elapsed.numpy()) - self._session_base, 3))

  def save(self) -> None:
    self._update_session()
    self.manager.save(checkpoint_number=int(self.step.numpy()))
    if self.chief:
      write_json(os.path.join(self.workdir, "progress.json"), self.state)
    else:
      shutil.rmtree(self._checkpoint_dir(), ignore_errors=True)

  def _meets_target(self, value: float) -> bool:
    target = self.experiment.target
    return value >= target if self.workload.higher_is_better else value <= target

  def run(self) -> dict:
    """Trains until the target, the budget or divergence; returns result.json's dict."""
    exp = self.experiment
    self.calibration = provenance.calibrate()   # Outside init and the timed span.
    session_start, base = time.monotonic(), float(self.elapsed.numpy())
    self._begin_session(base)
    elapsed = lambda: base + time.monotonic() - session_start  # noqa: E731
    self.mllog.start(MLC.RUN_START, resumed_at_step=int(self.step.numpy()))
    meter = progress.Meter(int(self.step.numpy()), self.limit, exp.global_batch_size)
    status, reached_at = "budget_exhausted", None
    while int(self.step.numpy()) < self.limit:
      t0 = time.monotonic()
      outputs = self.train()
      step = int(self.step.assign_add(exp.steps_per_call).numpy())
      meter.trained(exp.steps_per_call, time.monotonic() - t0)
      self.workload.after_train_call(step)
      self.elapsed.assign(elapsed())
      self._accumulate_regime_metrics(outputs)
      loss = float(outputs["loss"])
      if not math.isfinite(loss):
        status = "diverged"
        logging.error("Diverged at step %d: loss is %s.", step, loss)
        break
      if step % exp.log_every_steps < exp.steps_per_call:
        self._log_train(step, outputs, meter, elapsed())
      if step % exp.eval_every_steps == 0 or step >= self.limit:
        value = self._evaluate(step, elapsed)
        meter.evaluated(step, value)
        if not math.isfinite(value):
          status = "diverged"
          logging.error("Diverged at step %d: %s is %s.", step, self.workload.target_metric, value)
          break
        if self._meets_target(value):
          status, reached_at = "reached", step
          self.state["at_target"] = self.state["last_eval"]
          break
      if step % exp.checkpoint_every_steps == 0:
        self.save()
    self.elapsed.assign(elapsed())
    if status != "diverged":
      self.save()
    return self._finish(status, reached_at, meter)

  def _accumulate_regime_metrics(self, outputs: dict) -> None:
    # The regime's per-step scalars (bytes sent, consensus distance, staleness),
    # averaged over the whole run for result.json; kept in progress.json so a
    # resumed run continues the average.
    sums = self.state.setdefault("regime_sums", {})
    for key, value in outputs.items():
      if key.startswith("regime/"):
        total, count = sums.get(key, (0.0, 0))
        sums[key] = (total + float(value), count + 1)

  def _log_train(self, step: int, outputs: dict, meter, now: float) -> None:
    values = {f"train/{k}": float(v) for k, v in outputs.items()}
    values["train/learning_rate"] = self.workload.learning_rate(step)
    values["train/examples_per_s"] = meter.recent_examples_per_s()
    values.update(self.workload.host_metrics())
    self.summaries.scalars(step, values)
    logging.info("%s", meter.line(step, values, now))

  def _evaluate(self, step: int, elapsed) -> float:
    metrics = self.workload.evaluate(self.replicator)
    images = {k: v for k, v in metrics.items() if isinstance(v, np.ndarray) and v.ndim == 4}
    scalars = {k: float(v) for k, v in metrics.items() if k not in images}
    value = scalars[self.workload.target_metric]
    now = elapsed()
    self.state["curve"].append([step, round(now, 3), value])
    self.state["last_eval"] = scalars
    self.summaries.scalars(step, scalars)
    for tag, image in images.items():
      self.summaries.image(tag, image, step)
    epoch = step / self.spec.steps_per_epoch
    self.mllog.event(MLC.EVAL_ACCURACY, value, epoch_num=round(epoch, 3))
    logging.info("eval at step %d (epoch %.2f, %.1f s): %s = %.4f (target %s)", step, epoch,
                 now, self.workload.target_metric, value, self.experiment.target)
    return value

  def _finish(self, status: str, reached_at: int | None, meter) -> dict:
    exp, step = self.experiment, int(self.step.numpy())
    self._update_session()
    self.mllog.end(MLC.RUN_STOP, status="success" if status == "reached" else "aborted")
    time_to_target = float(self.elapsed.numpy()) if status == "reached" else None
    curve = self.state["curve"]
    result = {
        "status": status, "workload": self.workload.name,
        "target_metric": self.workload.target_metric, "target": exp.target,
        "higher_is_better": self.workload.higher_is_better,
        "time_to_target_s": time_to_target, "init_s": round(self.init_s, 3),
        "total_s": round(float(self.elapsed.numpy()), 3),
        "steps_to_target": reached_at,
        "epochs_to_target": reached_at / self.spec.steps_per_epoch if reached_at else None,
        "examples_to_target": reached_at * exp.global_batch_size if reached_at else None,
        "final_metric": curve[-1][2] if curve else None, "final_step": step,
        "final_metrics": self.state.get("last_eval"),
        "metrics_at_target": self.state.get("at_target") if status == "reached" else None,
        "examples_per_s": meter.examples_per_s(),
        "first_call_s": None if meter.first_call_s is None else round(meter.first_call_s, 3),
        "regime": exp.regime.hparams(),
        "regime_metrics": {k: total / count
                           for k, (total, count) in self.state.get("regime_sums", {}).items()},
        "budget": {"total_steps": exp.total_steps, "limit": self.limit},
        "curve": curve, **self.describe(),
        "sessions": self.state.get("sessions", []),
        "resumed": max(0, len(self.state.get("sessions", [])) - 1),
        "operative_config": self.operative_config, **provenance.versions(),
        "machine": provenance.machine(self.calibration),
    }
    self._report_hparams(result)
    return result

  def describe(self) -> dict:
    exp = self.experiment
    return {"topology": exp.topology.describe(), "scaling_kind": exp.topology.kind,
            "num_workers": self.replicator.num_workers,
            "num_replicas": self.replicator.num_replicas,
            "global_batch_size": exp.global_batch_size, "seed": exp.seed,
            "hparams": self.hparams()}

  def hparams(self) -> dict:
    exp = self.experiment
    return {"topology": exp.topology.describe(), "scaling_kind": exp.topology.kind,
            "num_replicas": self.replicator.num_replicas,
            "global_batch_size": exp.global_batch_size, "seed": exp.seed,
            **exp.regime.hparams(), **self.workload.hparams()}

  def _report_hparams(self, result: dict) -> None:
    step = result["final_step"]
    self.summaries.hparams(result["hparams"], trial_id=os.path.basename(
        os.path.abspath(self.workdir)))
    metrics = {"hparams/final_metric": result["final_metric"] or float("nan")}
    if result["time_to_target_s"] is not None:
      metrics["hparams/time_to_target_s"] = result["time_to_target_s"]
      metrics["time_to_target_s"] = result["time_to_target_s"]
    self.summaries.scalars(step, metrics)
    self.summaries.text("operative_config", operative_config_markdown(self.operative_config))

  def close(self) -> None:
    self.workload.close()
    self.summaries.close()
    self.mllog.close()


def run_experiment(experiment: Experiment, workdir: str, max_steps: int | None = None) -> dict:
  """Runs (or resumes) experiment in workdir; writes and returns result.json's dict."""
  experiment.regime.check_workload(experiment.workload)
  experiment.regime.serve(experiment.topology)   # AsyncPS worker and ps tasks stay here.
  os.makedirs(workdir, exist_ok=True)
  result_path = os.path.join(workdir, "result.json")
  previous = read_json(result_path)
  if previous and (previous["status"] in FINAL_STATUSES
                   or previous["final_step"] >= previous["budget"]["total_steps"]):
    logging.info("%s is complete (status %s); nothing to do.", workdir, previous["status"])
    return previous
  run = _Run(experiment, workdir, max_steps)   # Bad input fails here, writing nothing.
  try:
    result = run.run()
  except Exception as e:
    if run.chief:
      write_json(result_path, {"status": "failed", "error": f"{type(e).__name__}: {e}",
                                      "workload": experiment.workload.name,
                                      "final_step": int(run.step.numpy()),
                                      "budget": {"total_steps": experiment.total_steps},
                                      **run.describe()})
    raise
  finally:
    run.close()
  if run.chief:
    write_json(result_path, result)
  return result
