"""A private network namespace for a cluster launched on this machine.

TensorFlow's gRPC servers listen on every interface (0.0.0.0:PORT, hard-coded
in its server library) and have no authentication, whatever address TF_CONFIG
gives. So `replibench launch` runs all its tasks inside an anonymous network
namespace (`unshare --net`; `--user --map-root-user` for a non-root user) in
which the only interface is a loopback of its own: the servers are reachable
from the cluster's tasks and from nowhere else, and the namespace disappears
with its last process (nothing to clean up after a kill).

Inside, the loopback can be rate-limited with the token-bucket qdisc
(`tc qdisc ... tbf`: `launch --network=RATE`), and its counters are the bytes
the cluster put on the wire. This kernel has no netem, so there is no latency
knob: a link here has a bandwidth and the loopback's own (microsecond) latency.
"""

import fcntl
import os
import shutil
import socket
import struct
import subprocess

from replibench import rates
from replibench.errors import UserError

ENV = "REPLIBENCH_NETWORK"   # Set inside the namespace: the rate ('none' = unlimited).
# Set for a cluster's tasks: the loopback's byte counter when the launcher started them
# (a fresh namespace's is 0; a restarted cluster's counts the earlier ones' traffic).
BASE_ENV = "REPLIBENCH_WIRE_BASE"
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def inside() -> bool:
  """True in a process that a launch started inside its private namespace."""
  return ENV in os.environ


def rate() -> str | None:
  return os.environ.get(ENV)


def unshare_command(command: list[str]) -> list[str]:
  """command, run in a new network namespace (a new user namespace too unless root)."""
  unshare = shutil.which("unshare")
  if unshare is None:
    raise UserError(_unavailable("the `unshare` program (util-linux) is not installed"))
  user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
  return [unshare, *user, "--net", "--", *command]


def check_available() -> None:
  """UserError (naming why) if this machine does not let us create the namespace."""
  try:
    done = subprocess.run(unshare_command(["true"]), capture_output=True, text=True,
                          timeout=30)
  except (OSError, subprocess.SubprocessError) as e:
    raise UserError(_unavailable(f"unshare could not run ({e})")) from None
  if done.returncode:
    raise UserError(_unavailable(f"unshare failed: {done.stderr.strip() or done.returncode}"))


def _unavailable(why: str) -> str:
  return (f"replibench launch runs its tasks in a private network namespace, because "
          f"TensorFlow's gRPC servers listen on every interface with no authentication; "
          f"this machine does not allow one ({why}). Run as root, enable unprivileged user "
          f"namespaces (sysctl kernel.unprivileged_userns_clone=1), or use your cluster's "
          f"launcher, which sets TF_CONFIG itself.")


def bring_up_loopback() -> None:
  """Sets 'lo' up in this (new) namespace: it starts down."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack("16sH14s", b"lo", 0, b"")
    flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def tc_program(value: str) -> str | None:
  """The `tc` program that limit_rate(value) needs (None for 'none'); UserError if absent."""
  if value == "none":
    return None
  tc = shutil.which("tc")
  if tc is None:
    raise UserError(f"--network={value}: the `tc` program (iproute2) is not installed, so "
                    f"the link cannot be rate-limited; install iproute2 or use --network=none.")
  return tc


def limit_rate(value: str) -> None:
  """Rate-limits the namespace's loopback with a token bucket (tc tbf); 'none': no limit."""
  tc = tc_program(value)
  if tc is None:
    return
  done = subprocess.run([tc, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", value,
                         "burst", str(rates.token_bucket_bytes(value)), "latency", "100ms"],
                        capture_output=True, text=True)
  if done.returncode:
    raise UserError(f"--network={value}: tc could not rate-limit the namespace's loopback "
                    f"({done.stderr.strip()}).")


def cluster_start_bytes() -> int:
  """The loopback's counter when the launcher started this task's cluster (0 outside)."""
  value = os.environ.get(BASE_ENV, "0")
  return int(value) if value.isdigit() else 0


def loopback_bytes() -> int:
  """Bytes sent on this namespace's loopback so far (each byte on the wire once)."""
  with open("/proc/self/net/dev") as f:
    for line in f:
      name, _, rest = line.partition(":")
      if name.strip() == "lo":
        return int(rest.split()[8])   # Transmit bytes.
  return 0
