"""Parsing gin configs so that every mistake names the file or binding at fault."""

import os

import gin

from replibench.errors import UserError


def _register_configurables() -> None:
  # Importing these modules registers their gin configurables; a binding to a
  # name none of them defines is an error, never silently skipped.
  import replibench.compiler.experiment  # noqa: F401  pylint: disable=import-outside-toplevel
  import replibench.compiler.registry  # noqa: F401  pylint: disable=import-outside-toplevel


# `include 'configs/...'` lines resolve against the repository root as well as
# the working directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(gin_files: list[str], gin_bindings: list[str]) -> None:
  """Parses files in order, then bindings; later settings override earlier ones."""
  _register_configurables()
  gin.clear_config()
  if REPO_ROOT not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(REPO_ROOT)
  for path in gin_files:
    if not os.path.isfile(path):
      raise UserError(f"--gin_file={path}: no such file.")
    try:
      gin.parse_config_file(path, skip_unknown=False)
    except (ValueError, SyntaxError, IOError, KeyError, TypeError) as e:
      raise UserError(f"Gin file {path}: {_one_paragraph(e)}") from None
  for binding in gin_bindings:
    try:
      gin.parse_config(binding, skip_unknown=False)
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
      raise UserError(f"--gin_bindings='{binding}': {_one_paragraph(e)}") from None
  gin.finalize()


def _one_paragraph(error: Exception) -> str:
  return " ".join(str(error).split())
