"""`replibench ARGS` in the test's own process, for tests of what a command says and
returns rather than of the process around it.

replibench.cli.main after absl parses the flags, from the repo root, as `python -m
replibench.cli` does: without the 4-6 s of a fresh interpreter importing TensorFlow
that helpers.cli pays. tests/test_cli.py covers the entry point, the flag parser and
the help in real processes; a command that starts a cluster or trains stays in one
(helpers.cli), so that what it leaves running or allocated dies with it.
"""

import os
import subprocess

from replibench import cli as replibench_cli
from tests import helpers


def cli(capsys, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
  """Runs `replibench ARGS` here: its exit code and what it printed, as helpers.cli
  returns them. env: variables set for the call only (then restored)."""
  saved = {name: os.environ.get(name) for name in env or {}}
  cwd = os.getcwd()
  capsys.readouterr()   # What the test printed before is not the command's.
  os.environ.update(env or {})
  os.chdir(helpers.REPO)
  try:
    code = replibench_cli.main(replibench_cli.FLAGS(["replibench", *args]))
  finally:
    replibench_cli.FLAGS.unparse_flags()
    os.chdir(cwd)
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
  out, err = capsys.readouterr()
  return subprocess.CompletedProcess(["replibench", *args], code, out, err)
