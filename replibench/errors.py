"""The one error type for bad user input (configs, flags, environment).

The CLI prints its message as a single paragraph and exits non-zero; anything
else that escapes is a bug and keeps its traceback.
"""


class UserError(Exception):
  """Bad input: the message names the file, binding, flag or variable at fault."""
