"""Where a result came from: code version, TensorFlow version and machine."""

import os
import platform
import subprocess

import tensorflow as tf


def git_sha() -> str:
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                         text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return sha + ("-dirty" if dirty else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> dict:
  """CPU model, cores usable by this process, and accelerators TensorFlow sees."""
  accelerators = [f"{d.device_type}:{tf.config.experimental.get_device_details(d).get('device_name', d.name)}"
                  for d in tf.config.list_physical_devices() if d.device_type != "CPU"]
  return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
          "accelerators": accelerators}


def versions() -> dict:
  return {"git_sha": git_sha(), "tf_version": tf.__version__}
