"""The one error type for bad user input (configs, flags, environment), and exit codes.

The CLI prints a UserError's message as a single paragraph and exits
EXIT_USER_ERROR; anything else that escapes is a bug and keeps its traceback.
"""

EXIT_OK, EXIT_FAILURE, EXIT_USER_ERROR, EXIT_DIVERGED = 0, 1, 2, 3


class UserError(Exception):
  """Bad input: the message names the file, binding, flag or variable at fault."""
