"""Parsing gin configs so that every mistake names the file or binding at fault."""

import os
import re
import tokenize

import gin

from replibench import errors, inputs, internals
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
    inputs.input_file("--gin_file", path)
    try:
      gin.parse_config_file(path, skip_unknown=False)
    except RecursionError:
      raise UserError(f"Gin file {path}: its include lines form a cycle (a file includes "
                      f"itself, directly or through others).") from None
    except Exception as e:  # pylint: disable=broad-except  (gin raises many kinds)
      raise UserError(f"Gin file {path}: {_gin_error(e)}") from None
  for binding in gin_bindings:
    try:
      gin.parse_config(binding, skip_unknown=False)
    except RecursionError:
      raise UserError(f"--gin_bindings='{binding}': its includes form a cycle.") from None
    except Exception as e:  # pylint: disable=broad-except  (gin raises many kinds)
      raise UserError(f"--gin_bindings='{binding}': {_gin_error(e)}") from None
  gin.finalize()


_UNREADABLE_TOKEN = re.compile(r"Failed to parse token '([^']*)'")


def _gin_error(error: Exception) -> str:
  """What gin's parser says about a binding, in the user's terms: the text it could
  not read and where, not the tokenizer's tuple or the parser's Python objects."""
  if isinstance(error, tokenize.TokenError):
    return ("the text ends inside an open parenthesis, bracket, brace or string: close "
            "it (e.g. small_resnet.widths = (16, 32, 64)).")
  location = error.args[1] if isinstance(error, SyntaxError) and len(error.args) > 1 else None
  where = (f" (line {location.line_num}: {location.line_content.strip()!r})"
           if getattr(location, "line_content", None) else "")
  unreadable = _UNREADABLE_TOKEN.search(str(error))
  if unreadable:
    return (f"cannot read {unreadable[1]} as a value{where}: gin reads numbers, 'quoted "
            f"strings', tuples, lists, dicts, True, False, None and @references (nan and "
            f"inf are none of these).")
  if location is not None:
    return f"{str(error.args[0]).strip()}{where}"
  return errors.paragraph(error)
