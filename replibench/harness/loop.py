"""The training loop: evaluation cadence, time-to-target, checkpoints, divergence.

Timing follows MLPerf: init (building the replicated program, restoring,
tracing the training and evaluation steps) is measured apart; the timed span
runs from run_start to the first evaluation that meets the target and includes
training, evaluation and checkpointing, except where the workload's evaluation
is not timed (Workload.timed_evaluation False: reinforcement learning, whose
evaluation episodes MLPerf leaves out; harness/timed_span.py), and except XLA's
compilation of a compiled step (measured in the session's first call, left out once its
second has run: timed_span.XlaCompilation, result.json xla_compile_s). The span, the
eval curve and the outcome are saved inside each checkpoint
(harness/state.py), so a resumed run continues them, and a run whose outcome
is already in its checkpoint only writes result.json again.
"""

import contextlib
import math
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from replibench import cluster, engine, inputs, results
from replibench.config.experiment import Experiment
from replibench.engine import devices, ps
from replibench.engine.measure import noise_scale
from replibench.harness import (netns, outcome, profiling, progress, provenance, slowdown,
                                throughput, wire)
from replibench.harness import workdir as workdir_lib
from replibench.harness.checkpoints import Checkpoints
from replibench.harness.reporting import MLC, MLPerfLog, Summaries
from replibench.harness.state import RunState, StateVariable
from replibench.harness.timed_span import TimedSpan, XlaCompilation


class _Run:
  """One session of one experiment in one workdir (a resume is a new session)."""

  def __init__(self, experiment: Experiment, workdir: str, max_steps: int | None,
               role: engine.Role):
    self.experiment, self.workdir = experiment, workdir
    # The run's step, as the replicator and the workload read it.
    self.workload, self.spec = experiment.workload, experiment.train_spec()
    self.init_start = time.monotonic()
    # Before anything starts TensorFlow's runtime, like the replicator's devices.
    devices.set_thread_pools(experiment.intra_op_threads, experiment.inter_op_threads)
    warning = experiment.thread_pool_warning()
    if warning:
      logging.warning(warning)
    self.replicator = engine.make_replicator(experiment.topology, self.spec.regime)
    # The machine's speed, before the workload starts anything that shares the cores
    # (D4PG's actors made it 20% noisier); not part of init.
    calibration_start = time.monotonic()
    self.calibration = provenance.calibrate()
    self.init_start += time.monotonic() - calibration_start
    experiment.check_models()   # The same model check as `plan`, once the devices exist.
    self.chief = role.is_chief
    # Synthetic data: no target, never evaluated; the plan's FLOPs (not part of init).
    self.synthetic = self.workload.synthetic_data
    flops_start = time.monotonic()
    self.flops_per_example = (throughput.train_flops_per_example(self.workload, self.spec)
                              if self.synthetic else None)
    self.init_start += time.monotonic() - flops_start
    self.limit = min(self.spec.total_steps, max_steps or self.spec.total_steps)
    if experiment.profile_steps is not None:   # Set in gin, beyond a --max_steps.
      inputs.step_range("Experiment.profile_steps (with --max_steps)",
                        experiment.profile_steps, self.limit)
    self.profiler = profiling.StepProfiler(experiment.profile_steps, workdir,
                                           self.spec.steps_per_call)
    self.mllog = MLPerfLog(workdir, enabled=self.chief)   # Buffered until init succeeds.
    self.mllog.start(MLC.INIT_START)
    with self.replicator.scope():
      self.workload.build(self.spec)
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.elapsed = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    self.state_variable = StateVariable()
    checkpoint = tf.train.Checkpoint(step=self.step, elapsed=self.elapsed,
                                     run_state=self.state_variable.variable,
                                     **self.workload.checkpoint_items())
    self.checkpoints = Checkpoints(checkpoint, workdir, self.chief)
    restored = self.checkpoints.restore()
    self.state = self.state_variable.load() if restored else RunState()
    if restored:
      logging.info("Resuming %s at step %d (%.1f s of timed run so far).", restored,
                   int(self.step.numpy()), float(self.elapsed.numpy()))
    self.train = self.replicator.compile(self.workload.step_fn, self.workload.input_fn,
                                         self.spec, start_step=int(self.step.numpy()))
    self.train.trace()
    # Every worker takes part; in a launched cluster the link's counter is read too.
    self.communication = self.train.communication(wire_counter=wire.counter())
    self.workload.prepare_evaluation(self.replicator)
    self.operative_config = gin.operative_config_str()
    self.init_s = time.monotonic() - self.init_start
    self._log_run_facts()
    self.mllog.end(MLC.INIT_STOP)
    # Init succeeded: from here on the run writes files.
    self.mllog.open(session=len(self.state.sessions))
    self.summaries = Summaries(workdir, enabled=self.chief)

  def _log_run_facts(self) -> None:
    spec = self.spec
    self.mllog.submission(self.workload.mlperf_benchmark or self.workload.name,
                          provenance.platform_name())
    self.mllog.event(MLC.CACHE_CLEAR, False)   # Nothing drops the OS caches between runs.
    self.mllog.event(MLC.GLOBAL_BATCH_SIZE, spec.global_batch_size)
    self.mllog.event(MLC.SEED, spec.seed)
    self.mllog.event(MLC.TRAIN_SAMPLES, self.workload.examples_per_epoch())
    self.mllog.event(MLC.EVAL_SAMPLES, self.workload.eval_examples())
    for key, value in self.workload.mlperf_hyperparameters(spec).items():
      self.mllog.event(key, value)

  # -- state and checkpoints ------------------------------------------------------

  def save(self) -> None:
    self.state.update_session(int(self.step.numpy()),
                              float(self.elapsed.numpy()) - self._session_base)
    self.state_variable.store(self.state)
    with self._wire_apart("checkpoint"):
      self.checkpoints.save(int(self.step.numpy()))

  def _wire_apart(self, kind: str):
    """The wire meter's block for bytes that are not training's (none before a session)."""
    meter = getattr(self, "wire", None)
    return meter.counted_apart(kind) if meter is not None else contextlib.nullcontext()

  def _meets_target(self, value: float) -> bool:
    target = self.experiment.target
    return value >= target if self.workload.higher_is_better else value <= target

  # -- the run --------------------------------------------------------------------

  def run(self) -> results.RunResult:
    """Trains until the target, the budget or divergence; returns the run's result."""
    if self.state.status:   # Over already: killed after its last checkpoint.
      logging.info("%s: the checkpoint holds a finished run (%s); writing its result.",
                   self.workdir, self.state.status)
      return self._result()
    self._session_base = float(self.elapsed.numpy())
    # The profiler's start and stop (writing the trace) are not the run's time.
    elapsed = TimedSpan(self._session_base,
                        clock=lambda: time.monotonic() - self.profiler.overhead_s)
    self.state.begin_session(int(self.step.numpy()), self.init_s)
    self.mllog.start(MLC.RUN_START, resumed_at_step=int(self.step.numpy()))
    self.wire = wire.WireMeter(int(self.step.numpy()))
    self.noise_window = {}   # Sums of the noise-scale norms since the last log line.
    meter = progress.Meter(int(self.step.numpy()), self.limit, self.spec.global_batch_size,
                           window_steps=self.experiment.log_every_steps)
    self.compilation = XlaCompilation(self.spec.jit_compile)
    try:
      status, reached_at = self._train(meter, elapsed)
    finally:   # An early end (target, divergence, a crash) still writes the trace.
      self.profiler.stop()
    self.elapsed.assign(elapsed())
    self.state.throughput = {"examples_per_s": meter.examples_per_s(),
                             "first_call_s": meter.first_call_s, "windows": meter.windows,
                             "xla_compile_s": self.compilation.seconds,
                             "calibration": self.calibration}
    if self.synthetic:
      why = None
      if meter.examples_per_s() is None:
        why = throughput.why_none(meter.start_step, int(self.step.numpy()),
                                  self.spec.steps_per_call, self.spec.total_steps)
        logging.warning("%s: %s.", self.workdir, why)
      self.state.throughput["record"] = throughput.record(
          meter.examples_per_s(), self.spec.global_batch_size, self.spec.num_replicas,
          self.replicator.num_workers, throughput.replica_devices(self.replicator),
          self.flops_per_example, self.calibration, why)
    if status != results.BUDGET_EXHAUSTED or int(self.step.numpy()) >= self.spec.total_steps:
      self.state.status, self.state.reached_at = status, reached_at   # Final: in the checkpoint.
    self.save()
    self.mllog.end(MLC.RUN_STOP, status="success" if status == results.REACHED else "aborted")
    return self._result(status)

  def _train(self, meter, elapsed) -> tuple[str, int | None]:
    exp, steps_per_call = self.experiment, self.spec.steps_per_call
    self.mllog.block_start(self._samples())
    while (done := int(self.step.numpy())) < self.limit:
      traced = self.profiler.before_call(done)
      t0, cpu0 = time.monotonic(), time.process_time()
      with self.profiler.step(done + steps_per_call):
        outputs = self.train()
        if traced:   # The marker ends when the call's work has (a GPU runs ahead).
          float(outputs["loss"])
      if exp.inject_slowdown:
        slowdown.add_work(time.monotonic() - t0, exp.inject_slowdown)
      step = int(self.step.assign_add(steps_per_call).numpy())
      seconds = time.monotonic() - t0
      meter.trained(steps_per_call, seconds, time.process_time() - cpu0, traced=traced)
      self.compilation.call_ended(seconds, elapsed, traced=traced)   # Out of the span.
      self.profiler.after_call(step)
      self.workload.after_train_call(step)
      self.elapsed.assign(elapsed())
      self.state.add_regime_metrics(outputs)
      self._add_noise_norms(outputs)
      if not math.isfinite(float(outputs["loss"])):
        logging.error("Diverged at step %d: loss is %s.", step, float(outputs["loss"]))
        return results.DIVERGED, None
      if step % exp.log_every_steps < steps_per_call:
        self._log_train(step, outputs, meter, elapsed())
      if not self.synthetic and (step % exp.eval_every_steps == 0 or step >= self.limit):
        self.mllog.block_stop(self._samples())
        with self.wire.counted_apart("eval"), self._eval_timing(elapsed):
          value = self._evaluate(step, elapsed)
        meter.evaluated(step, value)
        if not math.isfinite(value):
          logging.error("Diverged at step %d: %s is %s.", step, self.workload.target_metric, value)
          return results.DIVERGED, None
        if self._meets_target(value):
          self.state.at_target = self.state.last_eval
          return results.REACHED, step
        self.mllog.block_start(self._samples())
      if step % exp.checkpoint_every_steps == 0:
        self.save()
    return results.BUDGET_EXHAUSTED, None

  def _eval_timing(self, elapsed: TimedSpan):
    """The evaluation's place in the timed span: inside it, or (RL) paused."""
    if self.workload.timed_evaluation:
      return contextlib.nullcontext()
    return elapsed.untimed()

  def _samples(self) -> int:
    return int(self.step.numpy()) * self.spec.global_batch_size

  def _log_train(self, step: int, outputs: dict, meter, now: float) -> None:
    values = {f"train/{k}": float(v) for k, v in outputs.items()}
    values["train/learning_rate"] = self.workload.learning_rate(step)
    values["train/examples_per_s"] = meter.recent_examples_per_s()
    values.update(self.workload.host_metrics())
    values.update(self.wire.scalars(step))
    values.update(self._noise_scale_scalar())
    self.summaries.scalars(step, values)
    logging.info("%s", meter.line(step, values, now))

  def _add_noise_norms(self, outputs: dict) -> None:
    for key in (noise_scale.SMALL, noise_scale.BIG):
      if key in outputs:
        total, count = self.noise_window.get(key, (0.0, 0))
        self.noise_window[key] = (total + float(outputs[key]), count + 1)

  def _noise_scale_scalar(self) -> dict:
    """{'train/noise_scale/b_simple': B_simple over the steps since the last log}."""
    means = {k: total / count for k, (total, count) in self.noise_window.items()}
    self.noise_window = {}
    found = outcome.noise_record(means, self.spec.per_replica_batch_size,
                                 self.spec.global_batch_size)
    return ({"train/noise_scale/b_simple": found.b_simple}
            if found is not None and found.b_simple is not None else {})

  def _evaluate(self, step: int, elapsed) -> float:
    epoch = round(step / self.spec.steps_per_epoch, 4)
    self.mllog.start(MLC.EVAL_START, epoch_num=epoch, samples_count=self._samples())
    started = time.monotonic()
    metrics = self.workload.evaluate(self.replicator)
    self.state.eval_time = [self.state.eval_time[0] + time.monotonic() - started,
                            self.state.eval_time[1] + 1]
    images = {k: v for k, v in metrics.items() if isinstance(v, np.ndarray) and v.ndim == 4}
    scalars = {k: float(v) for k, v in metrics.items() if k not in images}
    value = scalars[self.workload.target_metric]
    now = elapsed()
    self.state.curve.append([step, round(now, 3), value])
    self.state.last_eval = scalars
    self.summaries.scalars(step, scalars)
    for tag, image in images.items():
      self.summaries.image(tag, image, step)
    self.mllog.event(MLC.EVAL_ACCURACY, value, epoch_num=epoch, samples_count=self._samples())
    self.mllog.end(MLC.EVAL_STOP, epoch_num=epoch, samples_count=self._samples())
    logging.info("eval at step %d (epoch %.2f, %.1f s): %s = %.4f (target %s)", step, epoch,
                 now, self.workload.target_metric, value, self.experiment.target)
    return value

  def facts(self) -> outcome.RunFacts:
    """This session's facts, for outcome.make_result (read at the session's end)."""
    exp, spec, state, workload = self.experiment, self.spec, self.state, self.workload
    measured = state.throughput or {}   # This session's throughput (RunState).
    meter = getattr(self, "wire", None)   # None: the checkpoint held a finished run.
    return outcome.RunFacts(
        workload=workload.name, target_metric=workload.target_metric,
        higher_is_better=workload.higher_is_better, target=exp.target,
        topology=exp.topology.describe(), scaling_kind=exp.topology.kind,
        num_workers=self.replicator.num_workers, num_replicas=spec.num_replicas,
        global_batch_size=spec.global_batch_size,
        per_replica_batch_size=spec.per_replica_batch_size,
        steps_per_epoch=spec.steps_per_epoch, seed=spec.seed, regime=spec.regime.hparams(),
        hparams=outcome.hparams(spec, exp.topology, workload,
                                netns.rate() if netns.inside() else None),
        budget=results.Budget(spec.total_steps, self.limit), jit_compile=spec.jit_compile,
        operative_config=self.operative_config, **provenance.versions(),
        final_step=int(self.step.numpy()), elapsed_s=float(self.elapsed.numpy()),
        init_s=self.init_s, curve=state.curve, last_eval=state.last_eval,
        at_target=state.at_target, reached_at=state.reached_at,
        regime_means=state.regime_means(),
        eval_s=state.eval_time[0] / state.eval_time[1] if state.eval_time[1] else None,
        sessions=state.sessions, examples_per_s=measured.get("examples_per_s"),
        first_call_s=measured.get("first_call_s"), windows=measured.get("windows", []),
        xla_compile_s=measured.get("xla_compile_s"),
        communication=self.communication,
        network=self._network(meter) if meter is not None else None,
        machine=results.Machine(**provenance.machine(measured.get("calibration"))),
        throughput=results.Throughput.of(measured["record"]) if "record" in measured else None,
        profile=self.profiler.record(), scheduler=cluster.scheduler_record())

  def _network(self, meter: wire.WireMeter) -> results.Network | None:
    """Bytes the cluster put on its wire this session, beside what the account predicts."""
    steps = int(self.step.numpy()) - self.state.sessions[-1]["start_step"]
    record = meter.record(steps, wire.expected_per_step(self.communication,
                                                        self.spec.num_replicas))
    return None if record is None else results.Network.of(record)

  def _result(self, status: str | None = None) -> results.RunResult:
    result = outcome.make_result(self.facts(), status or self.state.status)
    self.summaries.outcome(result)
    return result

  def close(self) -> None:
    self.workload.close()
    if hasattr(self, "summaries"):
      self.summaries.close()
    self.mllog.close()


def run_experiment(experiment: Experiment, workdir: str,
                   max_steps: int | None = None) -> results.RunResult:
  """Runs (or resumes) experiment in workdir; writes and returns its result.json.

  A workdir whose result.json is final is left alone (its result is returned). On a
  parameter-server cluster's worker or ps task it serves the chief and never returns.
  Bad input (UserError) leaves nothing behind; a failure after init writes a
  result with status 'failed', and the next run resumes from the checkpoint.
  """
  role = engine.process_role(experiment.topology, experiment.regime)
  if not role.trains:   # A parameter-server cluster's worker or ps task: it serves the chief.
    ps.serve(experiment.topology)
  chief = role.is_chief
  with workdir_lib.owned(workdir, chief=chief):
    previous = _previous_result(workdir) if chief else None
    if previous is not None and _complete(previous):
      logging.info("%s is complete (status %s); nothing to do.", workdir, previous.status)
      return previous
    run = _Run(experiment, workdir, max_steps, role)   # Bad input fails here, writing nothing.
    try:
      result = run.run()
    except Exception as e:
      if run.chief:
        results.write(workdir, outcome.failed_result(run.facts(), e))
      raise
    finally:
      run.close()
    if run.chief:
      results.write(workdir, result)
    return result


def _previous_result(workdir: str) -> results.RunResult | None:
  """The workdir's result.json; None if absent or unreadable (the checkpoint decides)."""
  try:
    return results.read(workdir)
  except Exception as e:  # pylint: disable=broad-except  (UserError: a garbled file)
    logging.warning("%s: ignoring an unreadable result.json (%s); the checkpoint decides "
                    "what is left to do.", workdir, " ".join(str(e).split())[:300])
    return None


def _complete(result: results.RunResult) -> bool:
  return (result.status in (results.REACHED, results.DIVERGED)
          or (result.status == results.BUDGET_EXHAUSTED and result.budget is not None
              and result.final_step >= result.budget.total_steps))
