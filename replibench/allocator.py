"""glibc malloc settings under which TensorFlow's CPU buffers stay mapped between steps.

TensorFlow allocates each op's output on CPU with malloc. glibc serves the
threads of a process from several arenas; when a step frees its buffers, an
arena whose free top exceeds its pad (128 KiB by default) gives the pages back
(madvise MADV_DONTNEED), and the next step faults them in again, one page at a
time. On the 2-core EPYC VM of results/scaling/README.md this cost D4PG's
learner at batch 128 about half its speed (830-960k page faults in a 500-step
run against 204k with the settings below; 19k against 37-42k examples/s) and
made its throughput bimodal from run to run.

Two of glibc's own knobs (mallopt(3)) fix it. M_TOP_PAD: every heap grows and
is trimmed with this much spare, so a step's freed buffers stay mapped for the
next. Setting any knob also freezes glibc's mmap threshold, which otherwise
rises with the largest buffer freed; frozen at its default (128 KiB), every
larger buffer (a conv layer's activations) would get fresh pages each step,
so M_MMAP_THRESHOLD is set too, to the most glibc's own adjustment reaches
(32 MiB on 64-bit). The cost is resident memory: up to the pad per arena (~50
MiB more at peak for a D4PG run).

A user's own setting wins: with any MALLOC_*_ variable or a glibc.malloc
entry in GLIBC_TUNABLES in the environment, nothing is changed (glibc applied
it at start-up); REPLIBENCH_MALLOC=glibc keeps glibc's defaults. Elsewhere
than glibc this does nothing.
"""

import ctypes
import os

# mallopt's parameter numbers (malloc.h) and the values set, in bytes.
M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3
SETTINGS = ((M_TOP_PAD, 64 * 2**20), (M_MMAP_THRESHOLD, 32 * 2**20))
APPLIED = "M_TOP_PAD 64 MiB, M_MMAP_THRESHOLD 32 MiB (replibench)"
_applied = False


def _environment_settings(environ) -> dict:
  """The environment's own malloc settings: MALLOC_*_ variables and GLIBC_TUNABLES
  when it names a glibc.malloc tunable."""
  tuned = {k: v for k, v in environ.items() if k.startswith("MALLOC_") and k.endswith("_")}
  if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
    tuned["GLIBC_TUNABLES"] = environ["GLIBC_TUNABLES"]
  return tuned


def user_tunes_malloc(environ=None) -> bool:
  """Whether the environment tunes glibc malloc itself (or asks for its defaults)."""
  environ = os.environ if environ is None else environ
  return environ.get("REPLIBENCH_MALLOC") == "glibc" or bool(_environment_settings(environ))


def keep_buffers_mapped(environ=None) -> bool:
  """Applies SETTINGS to this process's malloc for the rest of its life.

  Call before TensorFlow runs anything. Returns True if they were set; False
  where the environment tunes malloc itself or the C library has no mallopt.
  """
  if user_tunes_malloc(environ):
    return False
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  global _applied  # pylint: disable=global-statement
  _applied = all([mallopt(param, value) == 1 for param, value in SETTINGS])   # Each one tried.
  return _applied


def describe(environ=None) -> str:
  """The malloc settings this process runs with, for a run's machine record."""
  environ = os.environ if environ is None else environ
  if _applied:
    return APPLIED
  tuned = _environment_settings(environ)
  if tuned:
    return "the environment's: " + ", ".join(f"{k}={v}" for k, v in sorted(tuned.items()))
  if user_tunes_malloc(environ):
    return "the environment's: REPLIBENCH_MALLOC=glibc (glibc's defaults)"
  return "the C library's defaults"
