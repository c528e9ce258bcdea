"""A real one-node SLURM for the tests: Debian's munged, slurmctld and slurmd.

Everything lives under one private directory: the munge key and socket, slurm.conf
(free ports, state, spool, logs, pid files), so it touches nothing of the machine's
own SLURM and two of them (two xdist workers) run side by side. Their job ids start
apart (FirstJobId, by xdist worker): a task's port comes from its job id
(replibench/cluster.py), and two clusters that both numbered a job 1 put their
concurrent jobs' servers on the same ports (one failed with "Could not start gRPC
server"). Each daemon is started by this module and stopped by its PID. Needs root
(slurmd runs the jobs as the submitting user and SlurmUser=root) and the packages
that `make install` puts on a root machine (Makefile: slurm); `unavailable()` says
why not where it cannot run.
"""

import os
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")

CONF = """\
ClusterName=rbtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
FirstJobId={first_job_id}
KillWait=5
MinJobAge=600
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def unavailable() -> str | None:
  """Why a local SLURM cannot start here (None: it can)."""
  if os.geteuid() != 0:
    return "a local SLURM needs root (slurmd runs jobs as their user; SlurmUser=root)"
  missing = [c for c in (*DAEMONS, *CLIENTS) if not shutil.which(c)]
  if missing:
    return (f"SLURM is not installed ({', '.join(missing)} missing): `make install` as root "
            f"installs Debian's slurmctld, slurmd, slurm-client and munge")
  return None


def _free_ports(n: int) -> list[int]:
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def first_job_id() -> int:
  """1 for xdist worker gw0 (or no xdist), 101 for gw1, ...: each cluster's jobs (fewer
  than 100 a test run) take port slots no other worker's cluster takes."""
  worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
  return 1 + 100 * int(worker.removeprefix("gw") or 0)


class LocalSlurm:
  """munged + slurmctld + slurmd under root_dir; env() is what a client needs."""

  def __init__(self, root_dir: str):
    self.dir = str(root_dir)
    self.conf = os.path.join(self.dir, "slurm.conf")
    self.pids: dict[str, int] = {}

  def env(self) -> dict:
    return {"SLURM_CONF": self.conf}

  def start(self, timeout: float = 60) -> "LocalSlurm":
    for sub in ("munge", "state", "spool", "log"):
      os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
    os.chmod(os.path.join(self.dir, "munge"), 0o700)
    key = os.path.join(self.dir, "munge", "munge.key")
    with open(key, "wb") as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    ctld, slurmd = _free_ports(2)
    with open(self.conf, "w") as f:
      f.write(CONF.format(dir=self.dir, ctld_port=ctld, slurmd_port=slurmd,
                          first_job_id=first_job_id()))
    munge = os.path.join(self.dir, "munge")
    self._daemon("munged", ["munged", f"--socket={munge}/munge.socket", f"--key-file={key}",
                            f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                            f"--seed-file={munge}/seed", "--force"], f"{munge}/munged.pid")
    self._daemon("slurmctld", ["slurmctld", "-f", self.conf], f"{self.dir}/slurmctld.pid")
    self._daemon("slurmd", ["slurmd", "-f", self.conf, "-N", "localhost"],
                 f"{self.dir}/slurmd.pid")
    self._wait_idle(timeout)
    return self

  def _daemon(self, name: str, command: list[str], pid_file: str, timeout: float = 30) -> None:
    """Starts a daemon (it forks into the background) and records its PID from its file."""
    subprocess.run(command, check=True, capture_output=True, timeout=timeout,
                   env={**os.environ, **self.env()})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      try:
        with open(pid_file) as f:
          self.pids[name] = int(f.read().split()[0])
        return
      except (OSError, IndexError, ValueError):
        time.sleep(0.05)
    raise RuntimeError(f"{name} wrote no pid file {pid_file}")

  def _wait_idle(self, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      out = self.run("sinfo", "--noheader", "--format=%T", check=False).stdout.split()
      if out and out[0] in ("idle", "mixed", "allocated"):
        return
      time.sleep(0.2)
    raise RuntimeError(f"the local SLURM node did not come up: {self.logs()}")

  def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                          check=check, env={**os.environ, **self.env()})

  def logs(self) -> str:
    out = []
    for name in ("slurmctld.log", "slurmd.log"):
      path = os.path.join(self.dir, "log", name)
      if os.path.exists(path):
        with open(path, errors="replace") as f:
          out.append(f"--- {name}\n" + f.read()[-3000:])
    return "\n".join(out)

  def stop(self) -> None:
    """Every daemon stopped by its PID (slurmd first), SIGKILL after 10 s."""
    for name in ("slurmd", "slurmctld", "munged"):
      pid = self.pids.pop(name, None)
      if pid is None:
        continue
      _signal(pid, signal.SIGTERM)
      deadline = time.monotonic() + 10
      while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
      _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
  try:
    os.kill(pid, sig)
  except ProcessLookupError:
    pass


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:   # A zombie of ours has exited.
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except OSError:
    return False
