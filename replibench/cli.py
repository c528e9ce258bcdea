"""The replibench command line: `replibench --help` lists the subcommands.

Exit codes: 0 success, 1 failure (a regression for compare, a failed trial for
sweep, a crash), 2 bad input (one paragraph naming the file, binding or flag at
fault; nothing written), 3 the run diverged, 128+N stopped by signal N.
"""

import json
import math
import os
import signal
import sys

from absl import app, flags, logging

from replibench import allocator, cli_cluster, cluster, errors, inputs, native_logs, processes, rates
from replibench.cli_help import COMMANDS, command_help, overview
from replibench.errors import UserError

FLAGS = flags.FLAGS
MAX_TASKS = 256   # Processes one `launch` may start on this machine (each a TensorFlow).
flags.DEFINE_multi_string("gin_file", [], "Gin config files, parsed in order.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, applied after the files.")
flags.DEFINE_string("workdir", None, "Run (or sweep) directory: checkpoints, events, result.json.")
flags.DEFINE_integer("max_steps", None, "Stop training after this many steps (quick tries).")
flags.DEFINE_list("profile_steps", None, "run: write a TensorFlow profile of steps A,B (from 1; "
                  "the whole calls that train them) into the run's TensorBoard directory "
                  "(plan: say which calls); the same as --gin_bindings="
                  "'Experiment.profile_steps = (A, B)'.")
flags.DEFINE_boolean("json", False, "Print JSON instead of a table.")
flags.DEFINE_integer("workers", 2, "Worker processes to start.")
flags.DEFINE_integer("ps", 0, "Parameter servers; > 0 adds a chief and these ps tasks "
                     "(for Experiment.regime = @regimes.AsyncPS(), configs/topology/ps.gin).")
flags.DEFINE_integer("cpus_per_worker", 0, "Pin each worker to this many cores (0: no pinning).")
flags.DEFINE_float("timeout", None, "Stop all tasks after this many seconds.")
flags.DEFINE_string("network", "none", "The cluster's link: 'none' (unlimited loopback) or a "
                    "rate in tc's units (10gbit, 1gbit, 100mbit...), applied to the loopback "
                    "of the launch's private network namespace.")
flags.DEFINE_string("device_profile", None, "predict: a gin file binding predict.DeviceProfile "
                    "(configs/devices/).")
flags.DEFINE_string("efficiency", None, "predict: the statistical-efficiency file (default "
                    "results/predict/WORKLOAD.json).")
flags.DEFINE_string("topology", None, "predict: a topology gin file, applied after the config "
                    "(instead of --workers).")
flags.DEFINE_string("sweep", None, "The sweep declaration (TOML, beside the gin files).")
flags.DEFINE_integer("seeds", None, "Run seeds 1..K instead of the sweep file's seeds (ab, "
                     "bisect: instead of the suite's design).")
flags.DEFINE_string("out", None, "Output directory (default DIR/report); export: the "
                    "manifest file (default: stdout).")
flags.DEFINE_string("baseline", None, "The baseline report.json (or sweep directory).")
flags.DEFINE_boolean("normalize", False, "Where the two sides' machine calibrations differ by "
                     "more than 10%, rescale the new times and throughputs to the baseline's "
                     "machine (without it they are judged and flagged up to 1.5x apart, "
                     "and not judged beyond).")
flags.DEFINE_list("judge", [], "The metrics compare decides on (default: the sweep file's "
                  "judge list, else all): converged, time_to_target_s, steps_to_target, "
                  "examples_per_s, final_metric.")
flags.DEFINE_list("factors", [], "Minimum effect sizes as metric=fraction, e.g. "
                  "final_metric=0.5 for a noisy RL return (defaults: 0.1; final_metric 0.01).")
flags.DEFINE_string("base", None, "ab: the base revision (default: the merge base with main, "
                    "or HEAD~1 on main).")
flags.DEFINE_string("head", None, "ab: the head revision (default HEAD, from a checkout "
                    "without uncommitted changes to what a run measures).")
flags.DEFINE_string("suite", None, "ab, bisect, history: resnet | sngan | d4pg | all.")
flags.DEFINE_integer("rounds", None, "ab, bisect: runs of every trial per side (default: the "
                     "suite's, replibench/tracking/suites.py).")
flags.DEFINE_integer("first_seed", 1, "ab, bisect: with --seeds=K, run seeds first_seed .. "
                     "first_seed + K - 1 (another sample of seeds).")
flags.DEFINE_list("configs", None, "ab, bisect: only these configurations of the sweep "
                  "(labels, e.g. replicas=1,workers=2), or all (default: the suite's "
                  "design, replibench/tracking/suites.py).")
flags.DEFINE_list("min_effect", [], "ab, bisect: minimum effects as metric=fraction (defaults "
                  "0.05; final_metric 0.01): a smaller change is never a regression.")
flags.DEFINE_list("metric", [], "ab: the metrics to judge (default: the sweep file's judge "
                  "list); bisect: the one metric whose move it looks for.")
flags.DEFINE_boolean("record", False, "ab: also append the trials that ran to a result to "
                     "the results history (results/history/, or $REPLIBENCH_HISTORY); an "
                     "A/B's sides stay out of it unless asked.")
flags.DEFINE_integer("probe_processes", None, "ab: throughput-probe processes per side and "
                     "configuration (default: the suite's design, replibench/tracking/"
                     "suites.py; 0: no probe).")
flags.DEFINE_boolean("aa", False, "ab: an A/A run, the same commit on both sides (measures "
                     "the machine's noise); without it base and head must differ.")
flags.DEFINE_string("good", None, "bisect: a revision where the metric is as it was.")
flags.DEFINE_string("bad", None, "bisect: a later revision where it has moved.")


def _compile(extra_bindings: tuple = ()):
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  if not FLAGS.gin_file:
    raise UserError("--gin_file is required (e.g. --gin_file=configs/resnet/fashion_mnist.gin).")
  return load_experiment(FLAGS.gin_file, [*FLAGS.gin_bindings, *extra_bindings])


def _profile_bindings() -> tuple:
  """--profile_steps=A,B as the binding it stands for (after --gin_bindings: it wins)."""
  if FLAGS.profile_steps is None:
    return ()
  try:
    steps = tuple(int(v) for v in FLAGS.profile_steps)
  except ValueError:
    steps = tuple(FLAGS.profile_steps)
  first, last = inputs.step_range("--profile_steps", steps)
  if FLAGS.max_steps is not None and first > FLAGS.max_steps:
    raise UserError(f"--profile_steps={first},{last} with --max_steps={FLAGS.max_steps}: the "
                    f"run stops before step {first}, so no profile would be written; give "
                    f"A <= {FLAGS.max_steps}.")
  return (f"Experiment.profile_steps = ({first}, {last})",)


def _no_arguments(command: str, args: list) -> None:
  if args:
    raise UserError(f"{command}: unexpected arguments {args}; see `replibench {command} --help`.")


def cmd_run(args) -> int:
  from replibench.harness.loop import run_experiment  # pylint: disable=import-outside-toplevel
  _no_arguments("run", args)
  if not FLAGS.workdir:
    raise UserError("run: --workdir is required.")
  if FLAGS.max_steps is not None:
    inputs.number("--max_steps", FLAGS.max_steps, 1, integer=True, meaning="steps")
  profile = _profile_bindings()
  cluster.adopt()   # Inside an srun step or an Indexed Job: TF_CONFIG from its variables.
  # On a worker or ps task of a parameter-server cluster it serves and never returns.
  result = run_experiment(_compile(profile), FLAGS.workdir, FLAGS.max_steps)
  summary = {k: getattr(result, k) for k in (
      "status", "target_metric", "target", "time_to_target_s", "steps_to_target",
      "final_metric", "final_step", "examples_per_s", "init_s")}
  why = result.throughput.no_throughput_because if result.throughput else None
  if why:   # A synthetic run too short to time: say why its throughput is null.
    summary["no_throughput_because"] = why
  print(json.dumps(summary))
  return errors.EXIT_DIVERGED if result.status == "diverged" else errors.EXIT_OK


def cmd_plan(args) -> int:
  from replibench.config.plan import format_plan, make_plan  # pylint: disable=import-outside-toplevel
  _no_arguments("plan", args)
  cluster.adopt()
  plan = make_plan(_compile(_profile_bindings()))
  print(json.dumps(plan, indent=1) if FLAGS.json else format_plan(plan))
  return errors.EXIT_OK


def cmd_predict(args) -> int:
  from replibench.predict.command import predict_command  # pylint: disable=import-outside-toplevel
  _no_arguments("predict", args)
  if not FLAGS.gin_file:
    raise UserError("--gin_file is required (e.g. --gin_file=configs/resnet/fashion_mnist.gin).")
  if FLAGS["workers"].present and FLAGS.topology:
    raise UserError("predict: give --workers or --topology, not both.")
  rates.check("--network", FLAGS.network)
  print(predict_command(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.device_profile,
                        FLAGS.efficiency, FLAGS.workers if FLAGS["workers"].present else None,
                        FLAGS.topology, FLAGS.network, FLAGS.json))
  return errors.EXIT_OK


def cmd_launch(args) -> int:
  from replibench.harness.launcher import launch  # pylint: disable=import-outside-toplevel
  if not args:
    raise UserError("launch: give the replibench command after '--', e.g. "
                    "`replibench launch --workers 2 -- run --gin_file=F --workdir=D`.")
  inputs.number("--workers", FLAGS.workers, 1, MAX_TASKS, integer=True,
                 meaning="worker processes on this machine")
  inputs.number("--ps", FLAGS.ps, 0, MAX_TASKS, integer=True, meaning="parameter servers")
  if FLAGS.backend == "slurm":
    return cli_cluster.launch_on_slurm(args)
  cli_cluster.refuse_slurm_flags()
  inputs.number("--cpus_per_worker", FLAGS.cpus_per_worker, 0, os.cpu_count() or 1,
                integer=True, meaning="this machine's cores; 0 leaves the workers unpinned")
  if FLAGS.timeout is not None:
    inputs.number("--timeout", FLAGS.timeout, 0, low_open=True, meaning="seconds")
  rates.check("--network", FLAGS.network)
  return launch(FLAGS.workers, args, FLAGS.cpus_per_worker, FLAGS.timeout, ps=FLAGS.ps,
                network=FLAGS.network)


def cmd_sweep(args) -> int:
  from replibench.suite import run_sweep  # pylint: disable=import-outside-toplevel
  _no_arguments("sweep", args)
  if not FLAGS.sweep or not FLAGS.workdir:
    raise UserError("sweep: --sweep and --workdir are required; see `replibench sweep --help`.")
  if FLAGS.seeds is not None:
    inputs.number("--seeds", FLAGS.seeds, 1, integer=True, meaning="seeds 1..K")
  inputs.input_file("--sweep", FLAGS.sweep)
  inputs.output_directory("--workdir", FLAGS.workdir)
  seeds = list(range(1, FLAGS.seeds + 1)) if FLAGS.seeds else None
  executor = cli_cluster.sweep_executor(seeds)
  outcome = run_sweep(FLAGS.gin_file, FLAGS.sweep, FLAGS.workdir, seeds=seeds,
                      bindings=FLAGS.gin_bindings, validate=_validate_trial,
                      executor=executor)
  failed = [o.trial.name for o in outcome.outcomes if o.status == "failed"]
  if failed:   # Named at the end too: a gate on the exit code says which to look at.
    print(f"sweep: {len(failed)} failed trial(s): {', '.join(failed)} (see each one's "
          f"trial.log under {FLAGS.workdir})")
  return errors.EXIT_FAILURE if outcome.num_failed else errors.EXIT_OK


def _validate_trial(trial) -> None:
  """A sweep trial's config, loaded and its models built as `run` will (no training),
  and that this machine can apply its launch's network rate (tc)."""
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  from replibench.harness import netns  # pylint: disable=import-outside-toplevel
  netns.tc_program(trial.launch.network)
  load_experiment(list(trial.gin_files), list(trial.bindings)).check_models()


def cmd_report(args) -> int:
  from replibench.suite import build_report, format_table, write_report  # pylint: disable=import-outside-toplevel
  if len(args) != 1:
    raise UserError("report: give one sweep directory, `replibench report DIR [--out=OUT]`.")
  # The input first: a file given for DIR is DIR's fault, not that of the --out derived
  # from it.
  if not os.path.isdir(args[0]):
    raise UserError(f"report {args[0]}: "
                    + ("is a file, not a sweep directory" if os.path.exists(args[0])
                       else "no such directory")
                    + " (give the --workdir of a `replibench sweep`).")
  out = inputs.output_directory("--out" if FLAGS.out else "the default output directory "
                                "(--out)", FLAGS.out or os.path.join(args[0], "report"))
  report = build_report(args[0])
  print(format_table(report))
  for kind, path in write_report(report, out).items():
    print(f"wrote {kind}: {path}")
  return errors.EXIT_OK


def _parse_factors(items: list[str]) -> dict[str, float]:
  from replibench.suite.comparison import DEFAULT_FACTORS  # pylint: disable=import-outside-toplevel
  return inputs.metric_fractions("--factors", items, DEFAULT_FACTORS, 0, math.inf,
                                 low_open=True, example="final_metric=0.5")


def _parse_judge(items: list[str]) -> list[str] | None:
  from replibench.suite.aggregate import JUDGEABLE  # pylint: disable=import-outside-toplevel
  unknown = [m for m in items if m not in JUDGEABLE]
  if unknown:
    raise UserError(f"--judge={','.join(items)}: unknown metric(s) {unknown}; choose from "
                    f"{', '.join(JUDGEABLE)}.")
  return items or None


def cmd_compare(args) -> int:
  from replibench.suite import compare  # pylint: disable=import-outside-toplevel
  if len(args) != 1 or not FLAGS.baseline:
    raise UserError("compare: `replibench compare NEW --baseline=B`; see "
                    "`replibench compare --help`.")
  comparison = compare(args[0], FLAGS.baseline, factors=_parse_factors(FLAGS.factors),
                       normalize=FLAGS.normalize, judge=_parse_judge(FLAGS.judge))
  print(comparison)
  return comparison.exit_code


def _tracking_options(metrics=None):
  """ab's and bisect's options, every flag checked (before anything is checked out)."""
  from replibench.tracking import ab, commands  # pylint: disable=import-outside-toplevel
  if FLAGS.seeds is not None:
    inputs.number("--seeds", FLAGS.seeds, 1, 10_000, integer=True, meaning="seeds")
  if FLAGS.first_seed < 0 or FLAGS["first_seed"].present and FLAGS.seeds is None:
    raise UserError(f"--first_seed={FLAGS.first_seed}: give it with --seeds=K, and >= 0.")
  if FLAGS.rounds is not None:
    inputs.number("--rounds", FLAGS.rounds, 1, 1_000, integer=True,
                  meaning="runs of every trial per side")
  seeds = tuple(range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds)) if FLAGS.seeds else None
  options = ab.Options(
      rounds=FLAGS.rounds, seeds=seeds,
      configs=tuple(FLAGS.configs) if FLAGS.configs else None,
      bindings=tuple(FLAGS.gin_bindings), metrics=metrics,
      min_effects=commands.parse_min_effects(FLAGS.min_effect),
      probe_processes=FLAGS.probe_processes)
  commands.check_options(options)
  return options


def _string_flags_given_empty(command: str) -> None:
  """A flag given with no value (`--base=`, `--suite=`, `--configs=a,,b`) is refused: a
  default silently taken for it would run something else than was asked."""
  for name in COMMANDS[command].flags:
    flag = FLAGS[name]
    if not flag.present or isinstance(flag.value, bool):
      continue
    value = flag.value
    empty = (value == "" if isinstance(value, str)
             else isinstance(value, list) and (not value or any(
                 isinstance(v, str) and not v.strip() for v in value)))
    if empty:
      raise UserError(f"--{name}={','.join(value) if isinstance(value, list) else value}: "
                      f"empty; give a value, or leave the flag out for its default "
                      f"(`replibench {command} --help`).")


def _unused_flags(command: str, used: tuple[str, ...] | None = None) -> None:
  """A flag of this CLI given to a command that does not read it is refused (it would
  be silently ignored)."""
  used = COMMANDS[command].flags if used is None else used
  ours = {name for c in COMMANDS.values() for name in c.flags}
  given = sorted(n for n in ours if FLAGS[n].present and n not in used)
  if given:
    raise UserError(f"{command}: --{', --'.join(given)} not used by this command (it reads "
                    f"{', '.join('--' + n for n in used) or 'no flag'}); see `replibench "
                    f"{command} --help`.")


def _check_tracking_flags(command: str) -> None:
  _string_flags_given_empty(command)
  _unused_flags(command)


def cmd_ab(args) -> int:
  from replibench.tracking import ab_report, commands, revisions, suites  # pylint: disable=import-outside-toplevel
  _no_arguments("ab", args)
  _check_tracking_flags("ab")
  suite_list = suites.parse(FLAGS.suite or "all")
  options = _tracking_options(commands.parse_metrics(FLAGS.metric))
  repo = revisions.repo_root()
  base, head = commands.resolve_sides(repo, FLAGS.base, FLAGS.head, aa=FLAGS.aa)
  outcomes, text = commands.run_ab(base, head, suite_list, options, repo, FLAGS.workdir,
                                   history=FLAGS.record)
  print(text)
  return ab_report.exit_code(outcomes)


def cmd_bisect(args) -> int:
  from replibench.tracking import bisect, commands, revisions, suites  # pylint: disable=import-outside-toplevel
  _no_arguments("bisect", args)
  _check_tracking_flags("bisect")
  if not (FLAGS.good and FLAGS.bad and FLAGS.suite and len(FLAGS.metric) == 1):
    raise UserError("bisect: --good, --bad, --suite (one suite) and --metric (one metric) are "
                    "required; see `replibench bisect --help`.")
  suite_list = suites.parse(FLAGS.suite)
  if len(suite_list) != 1:
    raise UserError(f"--suite={FLAGS.suite}: bisect follows one suite's metric; name one.")
  metric = commands.parse_metrics(FLAGS.metric)[0]
  if metric == "converged":
    raise UserError("--metric=converged: bisect follows a measured metric (time_to_target_s, "
                    "steps_to_target, examples_per_s or final_metric).")
  options = _tracking_options()
  repo = revisions.repo_root()
  good = revisions.resolve(repo, FLAGS.good, "--good")
  bad = revisions.resolve(repo, FLAGS.bad, "--bad")
  workdir = FLAGS.workdir or os.path.join(repo, commands.AB_ROOT,
                                          f"bisect-{good.sha[:7]}-{bad.sha[:7]}")
  commands.check_workdir(workdir, given=FLAGS.workdir is not None)
  outcome = bisect.bisect(repo, good, bad, suite_list[0], metric, options, workdir)
  print(f"first commit that moved {metric}: {outcome.first_moved.describe()} "
        f"({len(outcome.steps)} A/B step(s), {outcome.seconds / 60:.1f} min; runs in {workdir})")
  return errors.EXIT_OK


def cmd_history(args) -> int:
  from replibench.tracking import commands, revisions, suites  # pylint: disable=import-outside-toplevel
  _string_flags_given_empty("history")
  action = args[0] if args else "render"
  if action == "render":
    _no_arguments("history render", args[1:])
    _unused_flags("history", ("out",))
    try:
      repo = revisions.repo_root()
    except UserError:   # Outside a checkout: the page lists commits without their subjects.
      repo = None
    path = commands.history_render(FLAGS.out or os.path.join("runs", "history"), repo,
                                   given=bool(FLAGS.out))
    print(f"wrote the history dashboard: {path}")
    return errors.EXIT_OK
  if action not in ("record", "compare") or len(args) != 2 or not FLAGS.suite:
    raise UserError("history: `replibench history [render] [--out=DIR]`, or `replibench "
                    "history record|compare SWEEP_DIR --suite=S`; see `replibench history "
                    "--help`.")
  _unused_flags("history", ("suite",) if action == "record" else ("suite", "factors"))
  suite = suites.parse(FLAGS.suite)
  if len(suite) != 1:
    raise UserError(f"--suite={FLAGS.suite}: name the one suite the sweep ran.")
  if action == "record":
    text, code = commands.history_record(args[1], suite[0], revisions.repo_root())
    print(text)
    return code
  factors = _parse_factors(FLAGS.factors)
  try:
    repo = revisions.repo_root()
  except UserError:
    repo = None
  print(commands.history_compare(args[1], suite[0], factors, repo))
  return errors.EXIT_OK


def cmd_export(args) -> int:
  _no_arguments("export", args)
  _string_flags_given_empty("export")
  _unused_flags("export")   # --network, --timeout...: a cluster's scheduler has no such knob.
  return cli_cluster.export()


HANDLERS = {"run": cmd_run, "plan": cmd_plan, "predict": cmd_predict, "launch": cmd_launch,
            "sweep": cmd_sweep, "report": cmd_report, "compare": cmd_compare,
            "ab": cmd_ab, "bisect": cmd_bisect, "history": cmd_history, "export": cmd_export}


def main(argv) -> int:
  if len(argv) < 2 or argv[1] not in HANDLERS:
    given = f"unknown command {argv[1]!r}" if len(argv) > 1 else "no command given"
    print(f"replibench: error: {given}.\n\n{overview()}", file=sys.stderr)
    return errors.EXIT_USER_ERROR
  command, args = argv[1], argv[2:]
  try:
    return HANDLERS[command](args)
  except UserError as e:
    logging.flush()
    print(f"replibench {command}: error: {errors.paragraph(e)}", file=sys.stderr)
    return errors.EXIT_USER_ERROR
  except errors.Failure as e:
    print(f"replibench {command}: failed: {errors.paragraph(e)}", file=sys.stderr)
    return errors.EXIT_FAILURE
  except processes.Terminated as e:
    print(f"replibench {command}: stopped by signal {e.signum}.", file=sys.stderr)
    return processes.exit_code(e.signum)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with a flag error as one paragraph and exit 2 (absl exits 1)."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    command = next((a for a in argv[1:] if a in COMMANDS), "")
    print(f"replibench {command}: error: {' '.join(str(e).split())}. See `replibench "
          f"{command + ' ' if command else ''}--help`.", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)


def _help_request(argv: list[str]) -> str | None:
  """The help text if argv asks for it (`--help`, `-h`, `help [COMMAND]`), else None."""
  asks = [a for a in argv[1:] if a in ("--help", "-h", "--helpfull", "--helpshort")]
  if argv[1:2] == ["help"]:
    return command_help(argv[2]) if len(argv) > 2 and argv[2] in COMMANDS else overview()
  if not asks:
    return None
  command = next((a for a in argv[1:] if a in COMMANDS), None)
  return command_help(command) if command else overview()


def _tensorflow_logging() -> None:
  """TensorFlow's C++ logging (set before TensorFlow loads): its start-up notices
  filtered out (native_logs.py), unless asked for with absl's -v / --verbosity (which
  shows them, and INFO lines, in this process and the ones it starts)."""
  if FLAGS["verbosity"].present:
    os.environ[native_logs.ENV] = "all"
  if native_logs.wanted():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  native_logs.filter_stderr()


def _closed_pipe() -> None:
  """stdout's reader went away (`replibench ... | head`): exit quietly, as a Unix tool
  killed by SIGPIPE does (128 + 13), with no traceback and no error at shutdown."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())   # Python's final flush of stdout must not fail.
  os._exit(128 + signal.SIGPIPE)  # pylint: disable=protected-access


def run_main():
  allocator.keep_buffers_mapped()   # Before TensorFlow allocates (see allocator.py).
  try:
    text = _help_request(sys.argv)
    if text is not None:
      print(text)
      sys.stdout.flush()
      sys.exit(errors.EXIT_OK)

    def start(argv):
      _tensorflow_logging()
      code = main(argv)
      sys.stdout.flush()
      from replibench.harness import cluster_exit  # pylint: disable=C0415  (no TF import)
      cluster_exit.leave(code)   # A cluster task: skips TensorFlow's slow teardown.
      sys.exit(code)

    app.run(start, flags_parser=_parse_flags)
  except BrokenPipeError:
    _closed_pipe()


if __name__ == "__main__":
  run_main()
