"""Parsing gin configs so that every mistake names the file or binding at fault."""

import os

import gin

from replibench import internals
from replibench.config import registry
from replibench.errors import UserError


# `include 'configs/...'` lines resolve against the repository root as well as
# the working directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(gin_files: list[str], gin_bindings: list[str]) -> None:
  """Parses files in order, then bindings; later settings override earlier ones."""
  registry.register_all()   # A binding to a name no module defines is an error.
  gin.clear_config()
  internals.add_gin_search_path(REPO_ROOT)
  for path in gin_files:
    if not os.path.isfile(path):
      raise UserError(f"--gin_file={path}: no such file.")
    try:
      gin.parse_config_file(path, skip_unknown=False)
    except RecursionError:
      raise UserError(f"Gin file {path}: its include lines form a cycle (a file includes "
                      f"itself, directly or through others).") from None
    except Exception as e:  # pylint: disable=broad-except  (gin raises many kinds)
      raise UserError(f"Gin file {path}: {_one_paragraph(e)}") from None
  for binding in gin_bindings:
    try:
      gin.parse_config(binding, skip_unknown=False)
    except RecursionError:
      raise UserError(f"--gin_bindings='{binding}': its includes form a cycle.") from None
    except Exception as e:  # pylint: disable=broad-except  (gin raises many kinds)
      raise UserError(f"--gin_bindings='{binding}': {_one_paragraph(e)}") from None
  gin.finalize()


def _one_paragraph(error: Exception) -> str:
  return " ".join(str(error).split())
