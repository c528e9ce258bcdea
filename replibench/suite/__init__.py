"""The scaling suite: sweeps of `replibench run` trials, reports and regression checks.

  run_sweep(gin_files, sweep_path, workdir, seeds=None, runner=...) -> SweepOutcome
  build_report(sweep_dir) -> Report;  write_report(report, out_dir) -> {kind: path}
  format_table(report) -> str
  compare(new, baseline) -> Comparison  (print it; .exit_code is 1 on a regression)
"""

from replibench.suite.comparison import Comparison, compare
from replibench.suite.report import Report, build_report, format_table, load_report, write_report
from replibench.suite.sweep import SweepOutcome, run_sweep, subprocess_runner, trial_command
from replibench.suite.sweep_file import Trial

__all__ = ["Comparison", "Report", "SweepOutcome", "Trial", "build_report", "compare",
           "format_table", "load_report", "run_sweep", "subprocess_runner", "trial_command",
           "write_report"]
