"""The compiler: gin configs in, a validated Experiment (and its plan) out."""


from replibench.compiler import gin_loader
from replibench.compiler.experiment import Experiment
from replibench.errors import UserError


def compile_experiment(gin_files: list[str], gin_bindings: list[str]) -> Experiment:
  """Parses the configs (unknown bindings are errors) and builds the Experiment."""
  gin_loader.parse(gin_files, gin_bindings)
  try:
    return Experiment()
  except UserError:
    raise
  except (ValueError, TypeError) as e:
    # gin reports missing REQUIRED bindings and bad constructor arguments here.
    raise UserError(f"Gin config {' + '.join(gin_files)}: {' '.join(str(e).split())}") from None


__all__ = ["compile_experiment", "Experiment"]
