"""Running a sweep: each trial a `replibench run` subprocess in its own directory.

Layout of a sweep directory:

  <workdir>/sweep.json                     the sweep file's text and the trials
  <workdir>/events.out.tfevents...config   TensorBoard HParams experiment config
  <workdir>/<config>/seed=<s>/             one trial: result.json, trial.json,
                                           trial.log, the harness's own files

Running the same sweep again on the same workdir resumes it: trials whose
result.json is final (reached / budget_exhausted / diverged) are skipped, the
others are started again, and `replibench run` resumes them from their checkpoints.
"""

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable, Iterable, Sequence

from replibench import processes
from replibench.errors import UserError
from replibench import atomic
from replibench.suite import hparams_config
from replibench.suite import results
from replibench.suite import sweep_file
from replibench.results import FAILED, RunResult
from replibench.suite.sweep_file import Trial

MANIFEST_FILE = results.MANIFEST_FILE
TERM_GRACE_S = 30   # How long a trial may take to stop after the sweep is told to.
TRIAL_FILE = "trial.json"
LOG_FILE = "trial.log"

# runner(trial, trial_dir) -> exit code (None if unknown). It must leave
# trial_dir/result.json behind when the run produced a result.
Runner = Callable[[Trial, str], int | None]
# An executor runs many trials at once (a scheduler's jobs): executor([(trial,
# trial_dir), ...]) yields (position in that list, exit code) as each one ends.
Executor = Callable[[list], Iterable[tuple[int, int | None]]]


@dataclasses.dataclass
class TrialOutcome:
  trial: Trial
  status: str            # a result.json status, or "failed" when none was written
  skipped: bool          # already final before this call
  time_to_target_s: float | None
  exit_code: int | None = None


@dataclasses.dataclass
class SweepOutcome:
  workdir: str
  outcomes: list[TrialOutcome]

  @property
  def num_failed(self) -> int:
    return sum(o.status == FAILED for o in self.outcomes)


def run_arguments(trial: Trial, trial_dir: str) -> list[str]:
  """`run ...`: the replibench command of one trial, in each of its processes."""
  return ["run", *(f"--gin_file={f}" for f in trial.gin_files),
          *(f"--gin_bindings={b}" for b in trial.bindings), f"--workdir={trial_dir}"]


def trial_command(trial: Trial, trial_dir: str, cores: int | None = None,
                  python: str | None = None) -> list[str]:
  """The command line that runs one trial (in-process, or through `launch`), with
  `python` (default: this interpreter)."""
  run = run_arguments(trial, trial_dir)
  base = [python or sys.executable, "-m", "replibench.cli"]
  if not trial.launch.workers:
    return base + run
  cpus = trial.launch.cpus_per_worker
  if cpus is None:  # Split the machine evenly between the workers.
    cpus = max(1, (cores or os.cpu_count() or 1) // trial.launch.workers)
  ps = ["--ps", str(trial.launch.ps)] if trial.launch.ps else []
  network = [f"--network={trial.launch.network}"] if trial.launch.network != "none" else []
  return base + ["launch", "--workers", str(trial.launch.workers),
                 "--cpus_per_worker", str(cpus), *ps, *network, "--"] + run


def subprocess_runner(trial: Trial, trial_dir: str, python: str | None = None,
                      cwd: str | None = None, env: dict[str, str] | None = None) -> int:
  """Runs the trial as a child process, appending its output to trial.log.

  python, cwd and env: the interpreter, directory and environment it runs with
  (default: this process's; the A/B tracker runs each side from its own checkout).
  The trial dies with the sweep (also on SIGKILL); SIGTERM / SIGINT to the sweep
  are passed to the trial, which is given TERM_GRACE_S to stop before the sweep
  stops too (processes.Terminated).
  """
  command = trial_command(trial, trial_dir, python=python)
  with open(os.path.join(trial_dir, LOG_FILE), "ab") as log:
    log.write(("$ " + " ".join(command) + "\n").encode())
    log.flush()
    proc = processes.popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    try:
      with processes.forwarding_signals(lambda: [proc], processes.raise_terminated):
        return processes.exit_status(proc.wait())
    except processes.Terminated:
      try:
        proc.wait(timeout=TERM_GRACE_S)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      raise


def _check_same_trial(trial: Trial, trial_dir: str, sweep_path: str) -> None:
  """Refuses to resume a directory that an edited sweep file now means differently."""
  path = os.path.join(trial_dir, TRIAL_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    before = json.load(f)
  now = trial.to_dict()
  changed = [k for k in ("gin_files", "bindings", "launch") if before.get(k) != now[k]]
  if changed:
    raise UserError(
        f"Sweep file {sweep_path}: trial {trial.name} in {trial_dir} was started with "
        f"different {', '.join(changed)} ({before.get(changed[0])!r} then, "
        f"{now[changed[0]]!r} now). Resuming would mix two configurations under one "
        f"name: use a new --workdir, or give the changed axis point a new label.")


def _check_seed_reached_run(trial: Trial, result: RunResult | None, sweep: sweep_file.Sweep) -> None:
  """Stops the sweep at the first trial whose run did not get its seed: the other
  trials would be repeats of one seed, hours spent on a useless spread."""
  if result is not None and result.seed != trial.seed:
    raise UserError(
        f"Sweep file {sweep.path}: trial {trial.name} ran with seed {result.seed}, not "
        f"{trial.seed}: the binding '{sweep.seed_binding} = {trial.seed}' (key "
        f"'seed_binding') does not reach the run's seed. Set seed_binding to the gin "
        f"parameter the config reads its seed from.")


def _progress(i: int, n: int, trial: Trial, status: str, result: RunResult | None, note: str) -> str:
  ttt = result.time_to_target_s if result else None
  ttt_text = f"time to target {ttt:.1f} s" if ttt is not None else "target not reached"
  return f"[{i}/{n}] {trial.name}: {status}, {ttt_text}{note}"


def _run_trial(trial: Trial, trial_dir: str, runner: Runner) -> tuple[int | None, dict | None]:
  os.makedirs(trial_dir, exist_ok=True)
  atomic.write_json(os.path.join(trial_dir, TRIAL_FILE), trial.to_dict())
  exit_code = runner(trial, trial_dir)
  return exit_code, results.read_result(trial_dir)


def _write_manifest(workdir: str, sweep: sweep_file.Sweep, trials: list[Trial],
                    gin_files: Sequence[str] = (), bindings: Sequence[str] = ()) -> None:
  with open(sweep.path) as f:
    text = f.read()
  atomic.write_json(os.path.join(workdir, MANIFEST_FILE), {
      "sweep_file": os.path.abspath(sweep.path), "sweep_text": text,
      "judge": list(sweep.judge) if sweep.judge is not None else None,
      # What the command line added to every trial (the history records a suite's
      # sweep only as its file defines it: tracking/record.py).
      "extra_gin_files": list(gin_files), "extra_bindings": list(bindings),
      "trials": [t.to_dict() for t in trials]})


class _HParamsTable:
  """The sweep root's HParams experiment config, rewritten as each trial ends from the
  results found when the sweep started plus each finished trial's: a trial's
  result.json is read once, not again after every later trial (quadratic in trials)."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.found = dict(results.find_results(workdir))

  def add(self, trial_dir: str, result: RunResult | None) -> None:
    if result is not None:
      self.found[os.path.relpath(trial_dir, self.workdir)] = result
    hparams_config.write_experiment_config(self.workdir, self.found.values())


def _update_hparams_config(workdir: str) -> None:
  found = [r for _, r in results.find_results(workdir)]
  hparams_config.write_experiment_config(workdir, found)


def check_trials(trials: Sequence[Trial], sweep_path: str,
                 validate: Callable[[Trial], None]) -> None:
  """validate(trial) for each distinct configuration (seeds aside), before any runs:
  a bad binding fails the sweep at once, naming the trial, not inside every trial."""
  seen = set()
  for trial in trials:
    key = (trial.gin_files, trial.bindings[:-1], dataclasses.astuple(trial.launch))
    if key in seen:
      continue
    seen.add(key)
    try:
      validate(trial)
    except UserError as e:
      raise UserError(f"Sweep file {sweep_path}: trial {trial.name} does not compile: "
                      f"{e}") from None


def run_sweep(gin_files: Sequence[str], sweep_path: str, workdir: str,
              seeds: Sequence[int] | None = None, runner: Runner = subprocess_runner,
              parallel: int = 1, log: Callable[[str], Any] = print,
              bindings: Sequence[str] = (),
              validate: Callable[[Trial], None] | None = None,
              executor: Executor | None = None) -> SweepOutcome:
  """Runs (or resumes) every trial of a sweep; returns what happened to each.

  Args:
    gin_files: extra gin files added to every trial after the sweep's own.
    bindings: extra gin bindings added to every trial after the sweep's and the
      points' own (so they override both).
    sweep_path: the sweep file (TOML, see sweep_file.py).
    workdir: the sweep directory; created if missing, resumed if not.
    seeds: overrides the sweep file's seeds when given.
    runner: runs one trial; the default starts `replibench run` as a subprocess.
    parallel: trials run at once. Keep 1 for timing: parallel trials share cores.
    log: receives one progress line per trial.
    validate: raises UserError if a trial's config is bad; run on every distinct
      configuration before the first trial starts.
    executor: runs the pending trials together instead of runner (the SLURM
      executor: replibench/scheduler/sweep_jobs.py); resume, failures and the report
      are the same.
  """
  sweep = sweep_file.load(sweep_path)
  trials = sweep_file.expand(sweep, gin_files, seeds, bindings)
  if validate is not None:
    check_trials(trials, sweep.path, validate)
  os.makedirs(workdir, exist_ok=True)
  _write_manifest(workdir, sweep, trials, gin_files, bindings)
  n = len(trials)
  outcomes: dict[int, TrialOutcome] = {}
  pending = []
  for i, trial in enumerate(trials, 1):
    trial_dir = os.path.join(workdir, trial.name)
    _check_same_trial(trial, trial_dir, sweep.path)
    result = results.read_result(trial_dir)
    if results.is_final(result):
      log(_progress(i, n, trial, result.status, result, " (finished earlier, skipped)"))
      outcomes[i] = TrialOutcome(trial, result.status, True, result.time_to_target_s)
    else:
      pending.append((i, trial, trial_dir))

  table = _HParamsTable(workdir)

  def finish(i: int, trial: Trial, exit_code: int | None, result: RunResult | None) -> None:
    _check_seed_reached_run(trial, result, sweep)
    status = result.status if result else FAILED
    if result is None:
      note = f" (no result.json; exit code {exit_code}, see {LOG_FILE})"
    else:
      note = f" (exit code {exit_code}, see {LOG_FILE})" if exit_code else ""
    log(_progress(i, n, trial, status, result, note))
    outcomes[i] = TrialOutcome(trial, status, False,
                               result.time_to_target_s if result else None, exit_code)
    table.add(os.path.join(workdir, trial.name), result)

  if executor is not None:
    for _, trial, trial_dir in pending:
      os.makedirs(trial_dir, exist_ok=True)
      atomic.write_json(os.path.join(trial_dir, TRIAL_FILE), trial.to_dict())
    for k, exit_code in executor([(trial, trial_dir) for _, trial, trial_dir in pending]):
      i, trial, trial_dir = pending[k]
      finish(i, trial, exit_code, results.read_result(trial_dir))
  elif parallel <= 1:
    for i, trial, trial_dir in pending:
      log(f"[{i}/{n}] {trial.name}: running in {trial_dir}")
      finish(i, trial, *_run_trial(trial, trial_dir, runner))
  else:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
      futures = {pool.submit(_run_trial, trial, trial_dir, runner): (i, trial)
                 for i, trial, trial_dir in pending}
      for future in concurrent.futures.as_completed(futures):
        finish(*futures[future], *future.result())
  _update_hparams_config(workdir)
  return SweepOutcome(workdir, [outcomes[i] for i in sorted(outcomes)])
