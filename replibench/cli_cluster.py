"""The command line's cluster flags: SLURM (launch --backend=slurm, sweep --executor=slurm)
and Kubernetes (export). cli.py defines the commands; this module their cluster side,
so that the local commands read without it.
"""

import os
import shlex
import sys

from absl import flags

from replibench import errors
from replibench.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_enum("backend", "local", ["local", "slurm"], "launch: where the cluster runs: "
                  "'local' (processes on this machine, in a private network namespace) or "
                  "'slurm' (a job submitted with sbatch and followed to its end; each task's "
                  "TF_CONFIG derived from its srun step).")
flags.DEFINE_enum("executor", "local", ["local", "slurm"], "sweep: run each trial here "
                  "(local) or as a SLURM job (slurm; trials of one shape as one job array).")
flags.DEFINE_integer("nodes", None, "slurm: nodes a job spans (default: SLURM's choice).")
flags.DEFINE_integer("tasks_per_node", None, "slurm: tasks on each node (sbatch "
                     "--ntasks-per-node; default: SLURM's choice).")
flags.DEFINE_integer("cpus_per_task", 1, "slurm: CPUs for each task (sbatch --cpus-per-task).")
flags.DEFINE_integer("gpus_per_task", 0, "slurm: GPUs for each task (sbatch --gpus-per-task; "
                     "SLURM binds them, 0 for a CPU job).")
flags.DEFINE_string("time", "01:00:00", "slurm: the job's time limit (sbatch --time).")
flags.DEFINE_string("partition", None, "slurm: the partition (default: the cluster's).")
flags.DEFINE_string("account", None, "slurm: the account charged (sbatch --account).")
flags.DEFINE_string("container_image", None, "slurm: run each task in this container image "
                    "(pyxis/enroot's srun --container-image; its python must have replibench).")
flags.DEFINE_string("container_mounts", None, "slurm: srun --container-mounts, e.g. "
                    "/lustre/runs:/runs (with --container_image).")
flags.DEFINE_boolean("exclusive", True, "slurm: whole nodes for each job (sbatch --exclusive), "
                     "so no other job's load enters the timings.")
flags.DEFINE_boolean("overcommit", False, "slurm: allow more tasks than CPUs (sbatch "
                     "--overcommit), e.g. the light ps tasks of a parameter-server cluster.")
flags.DEFINE_boolean("dry_run", False, "launch --backend=slurm: print the sbatch script and "
                     "submit nothing.")
flags.DEFINE_string("format", None, "export: tfjob (a Kubeflow TFJob) or job (a headless "
                    "Service and an Indexed batch/v1 Job, no operator).")
flags.DEFINE_string("image", None, "export: the container image of every pod (replibench "
                    "installed, the gin files at the paths given).")
flags.DEFINE_string("name", None, "export: the manifest's name, a DNS-1035 label (default: "
                    "the first --gin_file's name, e.g. fashion-mnist).")
flags.DEFINE_string("namespace", "default", "export: the Kubernetes namespace.")
flags.DEFINE_string("volume_claim", None, "export: a PersistentVolumeClaim mounted at "
                    "--workdir in every pod, so that a restarted task resumes from the "
                    "run's checkpoint (without one: an emptyDir, lost with its pod).")


SLURM_FLAGS = ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_task", "time",
               "partition", "account", "container_image", "container_mounts", "exclusive",
               "overcommit")
DRY_RUN = ("--dry_run", "--dry_run=true", "--dry_run=True")
LOCAL_LAUNCH_FLAGS = ("network", "cpus_per_worker", "timeout")


def refuse_slurm_flags() -> None:
  """The SLURM flags refused without --backend/--executor=slurm (they would be ignored)."""
  given = [n for n in (*SLURM_FLAGS, "dry_run") if FLAGS[n].present]
  if given:
    raise UserError(f"--{', --'.join(given)}: SLURM's flags, for --backend=slurm (launch) "
                    f"or --executor=slurm (sweep); this runs on this machine.")


def slurm_allocation():
  """The SLURM flags as an Allocation; the local launch's own flags refused."""
  from replibench.scheduler import slurm  # pylint: disable=import-outside-toplevel
  local = [n for n in LOCAL_LAUNCH_FLAGS if FLAGS[n].present]
  if local:
    raise UserError(
        f"--{', --'.join(local)} with SLURM: the emulated link (--network), core pinning "
        f"(--cpus_per_worker) and --timeout belong to the local launch and its private "
        f"network namespace; on SLURM the cluster's own network carries the traffic, "
        f"--cpus_per_task sizes each task and --time limits the job. Nothing was submitted.")
  return slurm.Allocation(
      nodes=FLAGS.nodes, tasks_per_node=FLAGS.tasks_per_node,
      cpus_per_task=FLAGS.cpus_per_task, gpus_per_task=FLAGS.gpus_per_task, time=FLAGS.time,
      partition=FLAGS.partition, account=FLAGS.account,
      container_image=FLAGS.container_image, container_mounts=FLAGS.container_mounts,
      exclusive=FLAGS.exclusive, overcommit=FLAGS.overcommit)


def launch_on_slurm(args) -> int:
  from replibench.scheduler import slurm, submit  # pylint: disable=import-outside-toplevel
  allocation = slurm_allocation()
  # The command that submits this script again: without --dry_run, which printed it.
  made_by = shlex.join(["replibench", *(a for a in sys.argv[1:] if a not in DRY_RUN)])
  return submit.launch_on_slurm(slurm.Shape(FLAGS.workers, FLAGS.ps), allocation, args,
                                FLAGS.dry_run, made_by)


def sweep_executor(seeds):
  """None (each trial a local subprocess) or the SLURM executor, its trials checked
  (SLURM reachable, each shape held, no emulated link) before anything is written."""
  if FLAGS.executor != "slurm":
    refuse_slurm_flags()
    return None
  from replibench.scheduler import sweep_jobs  # pylint: disable=import-outside-toplevel
  from replibench.suite import sweep_file  # pylint: disable=import-outside-toplevel
  executor = sweep_jobs.SlurmExecutor(slurm_allocation(), FLAGS.workdir, sweep_jobs.made_by())
  executor.check(sweep_file.expand(sweep_file.load(FLAGS.sweep), FLAGS.gin_file, seeds,
                                   FLAGS.gin_bindings))
  return executor


def export() -> int:
  """`replibench export`: the manifest on stdout, or written to --out."""
  from replibench.scheduler import kubernetes  # pylint: disable=import-outside-toplevel
  if FLAGS.out and os.path.isdir(FLAGS.out):
    raise UserError(f"--out={FLAGS.out}: is a directory; give the manifest's file name.")
  request = kubernetes.Request(
      format=FLAGS.format, gin_files=tuple(FLAGS.gin_file), bindings=tuple(FLAGS.gin_bindings),
      workdir=FLAGS.workdir, image=FLAGS.image, name=FLAGS.name, namespace=FLAGS.namespace,
      # Not given: what the config's topology pins (else 2 workers, no ps).
      workers=FLAGS.workers if FLAGS["workers"].present else None,
      ps=FLAGS.ps if FLAGS["ps"].present else None,
      cpus_per_worker=FLAGS.cpus_per_worker, volume_claim=FLAGS.volume_claim)
  text = kubernetes.export(request, FLAGS.out)
  if FLAGS.out:
    print(f"wrote the {FLAGS.format} manifest: {FLAGS.out}")
  else:
    sys.stdout.write(text)
  return errors.EXIT_OK
