"""A machine's fingerprint: which history series a measurement belongs to, and whether
two reports' times may be compared at all (result.json's machine.fingerprint;
suite/comparison.py judges no time across two fingerprints).

Machines of one name differ by generation (an AVX2 and an AVX-512 "AMD EPYC"
trained the same ResNet about 4x apart, a Zen 4 and a Zen 5 EPYC share every
AVX-512 flag), so the fingerprint is the CPU's vendor, family, model and
stepping, the instruction-set flags that decide TensorFlow's kernels, and the
core count. It is read from /proc/cpuinfo (no TensorFlow import). Two VMs with
one fingerprint may still differ in speed (a shared host drifts): that is why
the history is read for change points and decided by A/B, never by one value
against another.
"""

import hashlib
import os
import platform
import re

# The flags that change which kernels oneDNN / Eigen run (x86 and Arm).
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
                "asimd", "sve", "sve2")


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
  """The first processor's fields."""
  fields = {}
  try:
    with open(path) as f:
      for line in f:
        if not line.strip():
          if fields:
            break
          continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return fields


def describe(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
  """{cpu, vendor, family, model, stepping, flags, cores}: what the fingerprint hashes."""
  info = _cpuinfo(cpuinfo_path)
  flags = set((info.get("flags") or info.get("Features") or "").split())
  return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
          "vendor": info.get("vendor_id") or info.get("CPU implementer", ""),
          "family": info.get("cpu family") or info.get("CPU architecture", ""),
          "model": info.get("model") or info.get("CPU part", ""),
          "stepping": info.get("stepping") or info.get("CPU revision", ""),
          "flags": sorted(flags.intersection(KERNEL_FLAGS)),
          "cores": os.cpu_count() or 1}


def fingerprint(info: dict | None = None) -> str:
  """A short, readable, stable id, e.g. 'amd-epyc-f25m17-2c-3f9a1b2c'."""
  info = info or describe()
  digest = hashlib.sha256(repr(sorted(info.items())).encode()).hexdigest()[:8]
  name = re.sub(r"[^a-z0-9]+", "-", info["cpu"].lower())
  name = re.sub(r"-(processor|cpu|\d+-core)\b.*", "", name).strip("-")[:24] or "cpu"
  return f"{name}-f{info['family']}m{info['model']}-{info['cores']}c-{digest}"
