"""The malloc settings every replibench process starts with (replibench/allocator.py)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from replibench import allocator

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")

# Allocates, touches and frees 4 MiB, then reports how much free memory the main
# arena keeps mapped at its top (mallinfo2's keepcost), in a fresh process.
_KEPT_AFTER_FREE = """
import ctypes, json, sys
from replibench import allocator
set_ = allocator.keep_buffers_mapped() if sys.argv[1] == "tuned" else False
class Info(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
              "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
p = libc.malloc(4 << 20)
ctypes.memset(p, 1, 4 << 20)
libc.free(p)
print(json.dumps({"set": set_, "keepcost": libc.mallinfo2().keepcost,
                  "describe": allocator.describe()}))
"""


def _kept_after_free(mode: str, env: dict | None = None) -> dict:
  out = subprocess.run([sys.executable, "-c", _KEPT_AFTER_FREE, mode], capture_output=True,
                       text=True, check=True, env=env)
  return json.loads(out.stdout)


@glibc_only
def test_freed_buffers_stay_mapped_for_the_next_step():
  # glibc's defaults give a 4 MiB buffer its own mapping and unmap it on free, so the
  # next step's buffer is faulted in page by page; tuned, the heap keeps it (and the pad).
  assert _kept_after_free("default")["keepcost"] < 4 << 20
  tuned = _kept_after_free("tuned")
  assert tuned["set"] is True
  assert tuned["keepcost"] >= 64 << 20
  assert tuned["describe"] == allocator.APPLIED


@glibc_only
def test_a_users_own_malloc_tuning_is_left_as_it_is():
  env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.top_pad=0"}
  tuned = _kept_after_free("tuned", env)
  assert tuned["set"] is False
  assert tuned["keepcost"] < 4 << 20
  assert tuned["describe"] == "the environment's: GLIBC_TUNABLES=glibc.malloc.top_pad=0"


@pytest.mark.parametrize("environ, expected", [
    ({}, False),
    ({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.rtld.nns=2"}, False),
    ({"MALLOC_ARENA_MAX": "2"}, False),   # Not glibc's spelling (which ends in _).
    ({"MALLOC_ARENA_MAX_": "2"}, True),
    ({"MALLOC_TOP_PAD_": "0"}, True),
    ({"REPLIBENCH_MALLOC": "glibc"}, True),
    ({"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.mmap_threshold=4096"}, True),
])
def test_user_tunes_malloc(environ, expected):
  assert allocator.user_tunes_malloc(environ) is expected


def test_describe_says_where_the_settings_came_from():
  # This test process never called keep_buffers_mapped (only the CLI does).
  assert allocator.describe({}) == "the C library's defaults"
  assert allocator.describe({"MALLOC_TOP_PAD_": "0"}) == "the environment's: MALLOC_TOP_PAD_=0"
  assert "glibc's defaults" in allocator.describe({"REPLIBENCH_MALLOC": "glibc"})


def test_the_cli_tunes_malloc_before_anything_runs(monkeypatch):
  from replibench import cli   # pylint: disable=import-outside-toplevel
  calls = []
  monkeypatch.setattr(allocator, "keep_buffers_mapped", lambda: calls.append("malloc"))
  monkeypatch.setattr(cli.app, "run", lambda *a, **k: calls.append("app"))
  monkeypatch.setattr(sys, "argv", ["replibench", "plan"])
  cli.run_main()
  assert calls == ["malloc", "app"]
