"""The one error type for bad user input (configs, flags, environment), and exit codes.

The CLI prints a UserError's message as a single paragraph (`paragraph`) and exits
EXIT_USER_ERROR; anything else that escapes is a bug and keeps its traceback.
"""

import re

EXIT_OK, EXIT_FAILURE, EXIT_USER_ERROR, EXIT_DIVERGED = 0, 1, 2, 3


class UserError(Exception):
  """Bad input: the message names the file, binding, flag or variable at fault."""


class Failure(Exception):
  """A run that could not give its answer (trials failed): the CLI prints the message
  and exits EXIT_FAILURE."""


# What gin appends to an exception raised inside a configurable it calls: Python
# objects (<class ...>, <function ... at 0x...>), where the message names the binding.
_GIN_CALL_NOTE = re.compile(
    r"\s*In call to configurable '[^']*' \(<[^>]*>\)(?: in scope '[^']*')?")


def paragraph(error: BaseException) -> str:
  """error's message on one line, without gin's notes on the configurables it was
  calling."""
  return " ".join(_GIN_CALL_NOTE.sub("", str(error)).split())


_GIN_CALLED = re.compile(r"In call to configurable '([^']*)'")


def build_failure(culprit: str, error: Exception) -> UserError:
  """A UserError for a configurable (a model, a network) that raised while being built:
  the configurable gin was calling, with its bindings as the config holds them (so the
  bad value shows as the user wrote it), and the error's own words."""
  called = _GIN_CALLED.findall(str(error))
  if not called:
    return UserError(f"{culprit} does not build: {type(error).__name__}: {paragraph(error)}")
  bindings = _bindings_of(called[0])
  held = f" (bound: {'; '.join(bindings)})" if bindings else ""
  return UserError(f"{culprit} does not build: @{called[0]}{held} raised "
                   f"{type(error).__name__}: {paragraph(error)}")


def _bindings_of(configurable: str) -> list[str]:
  """The config's bindings of a configurable, 'name.param = value', on one line each."""
  import gin  # pylint: disable=import-outside-toplevel
  statements = []
  for line in gin.config_str().replace("\\\n", " ").splitlines():
    if line[:1].isspace() and statements:
      statements[-1] += " " + line.strip()
    elif line and not line.startswith("#"):
      statements.append(line)
  short = configurable.rsplit(".", 1)[-1]
  return [" ".join(s.split()).replace("( ", "(").replace(" )", ")") for s in statements
          if s.split(" = ", 1)[0].rsplit(".", 1)[0].split("/")[-1] in (configurable, short)]
