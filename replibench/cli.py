"""The replibench command line.

  replibench run    --gin_file=F [--gin_file=G] [--gin_bindings='X.y = 1'] --workdir=DIR [--max_steps=N]
  replibench plan   --gin_file=F [--json]
  replibench launch --workers N [--ps P] [--cpus_per_worker K] -- run --gin_file=... --workdir=DIR
  replibench sweep  --sweep=S [--gin_file=F] [--gin_bindings=B] --workdir=DIR [--seeds=K]
  replibench report DIR [--out=OUT]
  replibench compare NEW --baseline=B [--factors=final_metric=0.5,...] [--normalize]
"""

import json
import os
import sys

from absl import app, flags, logging

from replibench.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin config files, parsed in order.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, applied after the files.")
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, events, result.json.")
flags.DEFINE_integer("max_steps", None, "Stop training after this many steps (quick tries).")
flags.DEFINE_boolean("json", False, "plan: print JSON instead of a table.")
flags.DEFINE_integer("workers", 2, "launch: number of worker processes.")
flags.DEFINE_integer("ps", 0, "launch: parameter servers; > 0 adds a chief and these ps tasks "
                     "(for Experiment.regime = @regimes.AsyncPS(), configs/topology/ps.gin).")
flags.DEFINE_integer("cpus_per_worker", 0, "launch: pin each worker to this many cores (0: no pinning).")
flags.DEFINE_float("timeout", None, "launch: stop all workers after this many seconds.")
flags.DEFINE_string("sweep", None, "sweep: the sweep declaration (TOML, beside the gin files).")
flags.DEFINE_integer("seeds", None, "sweep: run seeds 1..K instead of the sweep file's seeds.")
flags.DEFINE_string("out", None, "report: output directory (default DIR/report).")
flags.DEFINE_string("baseline", None, "compare: the baseline report.json (or sweep directory).")
flags.DEFINE_boolean("normalize", False, "compare: where the two sides' machine calibrations "
                     "differ by more than 10%, rescale the new times and throughputs to the "
                     "baseline's machine instead of leaving them unjudged.")
flags.DEFINE_list("factors", [], "compare: minimum effect sizes as metric=fraction, e.g. "
                  "final_metric=0.5 for a noisy one-seed RL return (defaults: 0.1; final_metric 0.01).")

EXIT_USER_ERROR, EXIT_DIVERGED = 2, 3
COMMANDS = ("run", "plan", "launch", "sweep", "report", "compare")


def _compile():
  from replibench.compiler import compile_experiment  # pylint: disable=import-outside-toplevel
  if not FLAGS.gin_file:
    raise UserError("--gin_file is required (e.g. --gin_file=configs/resnet/fashion_mnist.gin).")
  return compile_experiment(FLAGS.gin_file, FLAGS.gin_bindings)


def cmd_run(args) -> int:
  from replibench.harness.loop import run_experiment  # pylint: disable=import-outside-toplevel
  if args:
    raise UserError(f"run: unexpected arguments {args}.")
  if not FLAGS.workdir:
    raise UserError("run: --workdir is required.")
  if FLAGS.max_steps is not None and FLAGS.max_steps < 1:
    raise UserError(f"--max_steps={FLAGS.max_steps}: must be a positive number of steps.")
  result = run_experiment(_compile(), FLAGS.workdir, FLAGS.max_steps)
  summary = {k: result.get(k) for k in ("status", "target_metric", "target", "time_to_target_s",
                                        "steps_to_target", "final_metric", "final_step",
                                        "examples_per_s", "init_s")}
  print(json.dumps(summary))
  return EXIT_DIVERGED if result["status"] == "diverged" else 0


def cmd_plan(args) -> int:
  from replibench.compiler.plan import format_plan, make_plan  # pylint: disable=import-outside-toplevel
  if args:
    raise UserError(f"plan: unexpected arguments {args}.")
  plan = make_plan(_compile())
  print(json.dumps(plan, indent=1) if FLAGS.json else format_plan(plan))
  return 0


def cmd_launch(args) -> int:
  from replibench.harness.launcher import launch  # pylint: disable=import-outside-toplevel
  if not args:
    raise UserError("launch: give the replibench command after '--', e.g. "
                    "`replibench launch --workers 2 -- run --gin_file=F --workdir=D`.")
  if FLAGS.workers < 1:
    raise UserError(f"--workers={FLAGS.workers}: need at least one worker.")
  if FLAGS.ps < 0:
    raise UserError(f"--ps={FLAGS.ps}: the number of parameter servers cannot be negative.")
  return launch(FLAGS.workers, args, FLAGS.cpus_per_worker, FLAGS.timeout, ps=FLAGS.ps)


def cmd_sweep(args) -> int:
  from replibench.suite import run_sweep  # pylint: disable=import-outside-toplevel
  if args or not FLAGS.sweep or not FLAGS.workdir:
    raise UserError("sweep: usage is `replibench sweep --sweep=S --workdir=DIR [--seeds=K]`.")
  if FLAGS.seeds is not None and FLAGS.seeds < 1:
    raise UserError(f"--seeds={FLAGS.seeds}: need at least one seed.")
  seeds = list(range(1, FLAGS.seeds + 1)) if FLAGS.seeds else None
  outcome = run_sweep(FLAGS.gin_file, FLAGS.sweep, FLAGS.workdir, seeds=seeds,
                      bindings=FLAGS.gin_bindings)
  return 1 if outcome.num_failed else 0


def cmd_report(args) -> int:
  from replibench.suite import build_report, format_table, write_report  # pylint: disable=import-outside-toplevel
  if len(args) != 1:
    raise UserError("report: usage is `replibench report DIR [--out=OUT]`.")
  report = build_report(args[0])
  print(format_table(report))
  for kind, path in write_report(report, FLAGS.out or os.path.join(args[0], "report")).items():
    print(f"wrote {kind}: {path}")
  return 0


def _parse_factors(items: list[str]) -> dict[str, float]:
  from replibench.suite.comparison import DEFAULT_FACTORS  # pylint: disable=import-outside-toplevel
  factors = {}
  for item in items:
    metric, _, value = item.partition("=")
    try:
      factors[metric] = float(value)
    except ValueError:
      factors[metric] = -1.0
    if metric not in DEFAULT_FACTORS or not factors[metric] > 0:
      raise UserError(f"--factors={item}: expected metric=fraction with metric one of "
                      f"{sorted(DEFAULT_FACTORS)} and a positive fraction (e.g. final_metric=0.5).")
  return factors


def cmd_compare(args) -> int:
  from replibench.suite import compare  # pylint: disable=import-outside-toplevel
  if len(args) != 1 or not FLAGS.baseline:
    raise UserError("compare: usage is `replibench compare NEW --baseline=B`.")
  comparison = compare(args[0], FLAGS.baseline, factors=_parse_factors(FLAGS.factors),
                       normalize=FLAGS.normalize)
  print(comparison)
  return comparison.exit_code


def main(argv) -> int:
  if len(argv) < 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"Usage: replibench {{{'|'.join(COMMANDS)}}} [flags]; see --helpfull.")
  command, args = argv[1], argv[2:]
  try:
    return {"run": cmd_run, "plan": cmd_plan, "launch": cmd_launch, "sweep": cmd_sweep,
            "report": cmd_report, "compare": cmd_compare}[command](args)
  except UserError as e:
    logging.flush()
    print(f"replibench {command}: error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR


def run_main():
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
  run_main()
