"""Where a run's CPU goes: its process's threads by name, its child processes, the idle rest.

    .venv/bin/python benchmarks/d4pg/cpu_split.py --start_s=20 --end_s=60 -- \\
        .venv/bin/replibench run --gin_file=configs/d4pg/learner_scaling.gin \\
        --gin_bindings="Experiment.eval_every_epochs = 1000" --max_steps=5000 --workdir=DIR

Starts the command, reads /proc between start_s and end_s after its start (a steady
window: after start-up, before the end), and prints the cores each thread name of the
command's own process used (TensorFlow names its inter-op pool tf_Compute; Python
threads carry the process's name), the cores of its child processes (D4PG's actors)
and the machine's idle cores over the same window. Then waits for the command. Linux.
"""

import argparse
import collections
import os
import subprocess
import time

_HZ = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path: str) -> tuple[str, float]:
  text = open(stat_path).read()
  fields = text.rsplit(")", 1)[1].split()
  return text[text.index("(") + 1:text.rindex(")")], (int(fields[11]) + int(fields[12])) / _HZ


def _threads(pid: int) -> dict[int, tuple[str, float]]:
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      out[int(tid)] = _cpu_s(f"/proc/{pid}/task/{tid}/stat")
    except OSError:   # Ended meanwhile.
      pass
  return out


def _children(pid: int) -> dict[int, float]:
  """CPU seconds of every process whose parent is pid."""
  out = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        text = open(f"/proc/{name}/stat").read()
        if int(text.rsplit(")", 1)[1].split()[1]) == pid:
          out[int(name)] = _cpu_s(f"/proc/{name}/stat")[1]
      except OSError:
        pass
  return out


def _idle_s() -> float:
  fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
  return (fields[3] + fields[4]) / _HZ   # idle + iowait, summed over cores


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--start_s", type=float, default=20.0)
  parser.add_argument("--end_s", type=float, default=60.0)
  parser.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command or args.end_s <= args.start_s:
    raise SystemExit("give a command after --, and --end_s > --start_s")
  proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  time.sleep(args.start_s)
  before, kids, idle, start = _threads(proc.pid), _children(proc.pid), _idle_s(), time.time()
  time.sleep(args.end_s - args.start_s)
  if proc.poll() is not None:
    raise SystemExit(f"the command ended ({proc.returncode}) before --end_s: give it more "
                     f"work or a shorter window")
  after, kids_after, idle_after, end = _threads(proc.pid), _children(proc.pid), _idle_s(), time.time()
  span = end - start
  by_name = collections.defaultdict(float)
  for tid, (name, cpu) in after.items():
    by_name[name] += (cpu - before.get(tid, (name, 0.0))[1]) / span
  for name, cores in sorted(by_name.items(), key=lambda item: -item[1]):
    if cores >= 0.005:
      print(f"thread {name:24s} {cores:.3f} cores")
  children = sum(kids_after.get(pid, cpu) - cpu for pid, cpu in kids.items()) / span
  print(f"process total  {sum(by_name.values()):.3f} cores; child processes {children:.3f}; "
        f"machine idle {(idle_after - idle) / span:.3f} of {os.cpu_count()} cores "
        f"({span:.0f} s window)")
  print(f"command exited {proc.wait()}")


if __name__ == "__main__":
  main()
