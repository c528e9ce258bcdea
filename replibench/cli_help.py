"""`replibench --help` and `replibench COMMAND --help`: the subcommands and their flags."""

import dataclasses

from absl import flags


@dataclasses.dataclass(frozen=True)
class Command:
  summary: str
  usage: str
  flags: tuple[str, ...]
  example: str


COMMANDS = {
    "run": Command(
        "Compile a gin config and train it to its target (or resume the run in --workdir).",
        "replibench run --gin_file=F [--gin_file=G] [--gin_bindings='X.y = 1'] --workdir=DIR "
        "[--max_steps=N] [--profile_steps=A,B]",
        ("gin_file", "gin_bindings", "workdir", "max_steps", "profile_steps"),
        "replibench run --gin_file=configs/resnet/fashion_mnist.gin --workdir=runs/fmnist"),
    "plan": Command(
        "Compile a config without training: replicas, batch, FLOPs, bytes, schedule, target.",
        "replibench plan --gin_file=F [--gin_bindings=B] [--profile_steps=A,B] [--json]",
        ("gin_file", "gin_bindings", "profile_steps", "json"),
        "replibench plan --gin_file=configs/resnet/imagenet_tpu32.gin"),
    "launch": Command(
        "Start a cluster and run a command in each of its tasks: on this machine, in a "
        "private network namespace (TF_CONFIG on its 127.0.0.1), or as a SLURM job "
        "(--backend=slurm: an sbatch script from the flags, submitted and followed to its "
        "end; the chief's exit code is the launch's).",
        "replibench launch [--backend=local|slurm] --workers N [--ps P] [--cpus_per_worker K] "
        "[--network RATE] [--timeout S] [--nodes N --tasks_per_node K --cpus_per_task C "
        "--gpus_per_task G --time T --partition P --account A --container_image I "
        "--container_mounts M --noexclusive --overcommit --dry_run] -- run ...",
        ("backend", "workers", "ps", "cpus_per_worker", "network", "timeout", "nodes",
         "tasks_per_node", "cpus_per_task", "gpus_per_task", "time", "partition", "account",
         "container_image", "container_mounts", "exclusive", "overcommit", "dry_run"),
        "replibench launch --backend=slurm --workers 2 --cpus_per_task 1 -- run "
        "--gin_file=configs/resnet/fashion_mnist.gin --gin_file=configs/topology/workers.gin "
        "--workdir=runs/w2"),
    "predict": Command(
        "Predict seconds per step, steps and time to target, and the critical batch, on "
        "any topology and device profile (measured batch-size fit x hardware model).",
        "replibench predict --gin_file=F [--gin_bindings=B] --device_profile=P "
        "[--workers N | --topology=T] [--network RATE] [--efficiency=E] [--json]",
        ("gin_file", "gin_bindings", "device_profile", "workers", "topology", "network",
         "efficiency", "json"),
        "replibench predict --gin_file=configs/resnet/fashion_mnist.gin "
        "--gin_bindings='Experiment.target = 0.90' "
        "--device_profile=configs/devices/v100_node.gin --workers=4"),
    "sweep": Command(
        "Run every trial of a sweep file (TOML), resuming an interrupted sweep; each trial "
        "here, or as a SLURM job (--executor=slurm: trials of one shape as one job array).",
        "replibench sweep --sweep=S --workdir=DIR [--seeds=K] [--gin_file=F] [--gin_bindings=B] "
        "[--executor=slurm [--partition P --account A --time T --cpus_per_task C "
        "--gpus_per_task G ...]]",
        ("sweep", "workdir", "seeds", "gin_file", "gin_bindings", "executor", "nodes",
         "tasks_per_node", "cpus_per_task", "gpus_per_task", "time", "partition", "account",
         "container_image", "container_mounts", "exclusive", "overcommit"),
        "replibench sweep --sweep=configs/resnet/scaling.sweep --workdir=runs/scaling"),
    "report": Command(
        "Aggregate a sweep's trials: table, report.json/.md and plots.",
        "replibench report DIR [--out=OUT] [--json]",
        ("out",),
        "replibench report runs/scaling --out=results/latest/resnet"),
    "compare": Command(
        "Compare a sweep (or report.json) with a baseline; exit 1 on a regression.",
        "replibench compare NEW --baseline=B [--judge=m,...] [--factors=metric=fraction,...] "
        "[--normalize]",
        ("baseline", "judge", "factors", "normalize"),
        "replibench compare runs/scaling --baseline=results/resnet/baseline.json"),
    "ab": Command(
        "A/B two revisions on this machine: both sides' suite trials interleaved (ABBA), "
        "and a suite's throughput probe (short processes, steady windows) likewise, "
        "judged from paired ratios with confidence intervals; every input checked before "
        "anything is checked out; exit 1 on a regression, a failed trial or a suite with no "
        "pair to judge.",
        "replibench ab --base=REV [--head=REV] --suite=resnet|sngan|d4pg|all [--rounds=K] "
        "[--seeds=K] [--configs=a,b] [--metric=m,...] [--min_effect=metric=fraction,...] "
        "[--probe_processes=K] [--workdir=DIR] [--record] [--aa]",
        ("base", "head", "suite", "rounds", "seeds", "first_seed", "configs", "metric",
         "min_effect", "gin_bindings", "probe_processes", "workdir", "record", "aa"),
        "replibench ab --base=main --suite=resnet"),
    "bisect": Command(
        "Find the first commit between --good and --bad that moved a metric, by A/B runs "
        "against --good at midpoints (ceil(log2 n) steps for n commits); exit 1 when a "
        "step's trials fail.",
        "replibench bisect --good=REV --bad=REV --suite=S --metric=M [--configs=a,b] "
        "[--rounds=K] [--seeds=K] [--min_effect=M=fraction]",
        ("good", "bad", "suite", "metric", "configs", "rounds", "seeds", "first_seed",
         "min_effect", "gin_bindings", "workdir"),
        "replibench bisect --good=HEAD~8 --bad=HEAD --suite=resnet --metric=examples_per_s "
        "--configs=replicas=1"),
    "history": Command(
        "The results history (results/history/): render its HTML dashboard with change "
        "points (the main line's commits), or record / compare a finished bench sweep "
        "(make bench does both; record exits 1 naming failed trials, which it leaves out).",
        "replibench history [render] [--out=DIR] | replibench history record|compare "
        "SWEEP_DIR --suite=S [--factors=...]",
        ("out", "suite", "factors"),
        "replibench history --out=runs/history"),
    "export": Command(
        "Write Kubernetes manifests that run a config's cluster (the tasks `launch --workers "
        "W [--ps P]` starts here): a Kubeflow TFJob, or a headless Service and an Indexed "
        "Job; validated offline before anything is written. --cpus_per_worker is each "
        "worker pod's cpu request; GPUs come from topology.MultiWorker.replicas_per_worker.",
        "replibench export --format=tfjob|job --gin_file=F [--gin_file=G] [--gin_bindings=B] "
        "--image=IMAGE --workdir=/ABS/DIR [--workers W] [--ps P] [--cpus_per_worker K] "
        "[--volume_claim=PVC] [--name=N] [--namespace=NS] [--out=FILE]",
        ("format", "gin_file", "gin_bindings", "image", "workdir", "workers", "ps",
         "cpus_per_worker", "volume_claim", "name", "namespace", "out"),
        "replibench export --format=tfjob --gin_file=configs/resnet/fashion_mnist.gin "
        "--gin_file=configs/topology/workers.gin --workers=2 --image=registry.example/"
        "replibench:latest --workdir=/runs/fmnist --volume_claim=runs --out=fmnist.yaml"),
}

EXIT_CODES = ("Exit codes: 0 success; 1 failure (a regression, a failed trial, a crash); "
              "2 bad input (one paragraph naming the culprit, nothing written); 3 diverged; "
              "128+N stopped by signal N.\n"
              "TensorFlow's C++ start-up notices are left out; -v 0 (absl's verbosity) shows "
              "them.")


def overview() -> str:
  width = max(map(len, COMMANDS))
  lines = ["usage: replibench COMMAND [flags]   (replibench COMMAND --help for its flags)", "",
           "commands:"]
  lines += [f"  {name.ljust(width)}  {c.summary}" for name, c in COMMANDS.items()]
  return "\n".join(lines + ["", EXIT_CODES])


def command_help(name: str) -> str:
  command = COMMANDS[name]
  lines = [f"usage: {command.usage}", "", command.summary, "", "flags:"]
  for flag_name in command.flags:
    flag = flags.FLAGS[flag_name]
    default = "none" if flag.default in (None, [], "") else flag.default_as_str
    lines.append(f"  --{flag_name}: {flag.help} (default: {default})")
  return "\n".join(lines + ["", "example:", f"  {command.example}", "", EXIT_CODES])
