"""One task of a replibench SLURM job: `python -m replibench.scheduler.slurm_task`.

The batch script that `replibench launch --backend=slurm` writes runs this on every
task of its `srun` step:

  python -m replibench.scheduler.slurm_task --exit_file=F [--log=L] -- run ...

It runs `replibench run ...` as a child (which derives its TF_CONFIG from the step:
replibench/cluster.py) and gives the job the semantics of a local `launch`:
- rank 0 (the chief, or worker 0) writes its exit code to F (`rank 0: N`), so the
  submitter returns the chief's code whatever SLURM makes of the other tasks; with
  --log it also appends the run's output there (a sweep's trial.log);
- the other tasks of a parameter-server cluster (REPLIBENCH_SLURM_PS > 0) serve
  until F appears, then stop their server and exit 0, as `launch` stops the servers
  once the chief has ended (a TFJob's operator does the same for its chief).
SIGTERM and SIGINT (scancel, a preemption) are passed to the run.
"""

import argparse
import os
import subprocess
import sys
import time

from replibench import atomic, cluster, processes

POLL_S = 1.0


def _rank() -> int:
  return int(os.environ.get("SLURM_PROCID", "0"))


def _serves_until_the_chief_ends() -> bool:
  return _rank() != 0 and int(os.environ.get(cluster.SLURM_PS_ENV, "0") or 0) > 0


def _tee(proc: subprocess.Popen, log_path: str | None) -> None:
  """Copies the run's output to this task's stdout (SLURM's output file) and the log."""
  log = open(log_path, "ab") if log_path else None
  try:
    for line in iter(proc.stdout.readline, b""):
      sys.stdout.buffer.write(line)
      sys.stdout.flush()
      if log:
        log.write(line)
        log.flush()
  finally:
    if log:
      log.close()


def _wait_for_chief(proc: subprocess.Popen, exit_file: str) -> int:
  """A server task: its run's own exit code if it ends, else 0 once the chief has."""
  while proc.poll() is None:
    if os.path.exists(exit_file):
      proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      return 0
    time.sleep(POLL_S)
  return processes.exit_status(proc.returncode)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m replibench.scheduler.slurm_task")
  parser.add_argument("--exit_file", required=True)
  parser.add_argument("--log", default=None)
  parser.add_argument("args", nargs=argparse.REMAINDER)
  options = parser.parse_args(argv)
  args = options.args[1:] if options.args[:1] == ["--"] else options.args
  chief = _rank() == 0
  command = [sys.executable, "-m", "replibench.cli", *args]
  proc = processes.popen(command, stdout=subprocess.PIPE if chief else None,
                         stderr=subprocess.STDOUT if chief else None)
  with processes.forwarding_signals(lambda: [proc]):
    if chief:
      _tee(proc, options.log)
      code = processes.exit_status(proc.wait())
      os.makedirs(os.path.dirname(os.path.abspath(options.exit_file)), exist_ok=True)
      atomic.write_text(options.exit_file, f"rank 0: {code}\n")
      return code
    if _serves_until_the_chief_ends():
      return _wait_for_chief(proc, options.exit_file)
    return processes.exit_status(proc.wait())


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
