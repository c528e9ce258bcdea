"""Configs: gin files in, a validated Experiment (and its plan) out.

load_experiment parses the gin files (unknown bindings are errors) and builds
the Experiment, which validates itself: `replibench plan` and `run` share that
one validation. plan.make_plan describes an Experiment without devices.
"""


from replibench.config import gin_loader
from replibench.config.experiment import Experiment
from replibench import errors
from replibench.errors import UserError


def load_experiment(gin_files: list[str], gin_bindings: list[str]) -> Experiment:
  """Parses the configs (unknown bindings are errors) and builds the Experiment."""
  gin_loader.parse(gin_files, gin_bindings)
  try:
    return Experiment()
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    # gin reports missing REQUIRED bindings, bad constructor arguments and values
    # its configurables reject here, wrapped with the binding's location.
    raise UserError(f"Gin config {' + '.join(gin_files) or '(none)'}: "
                    f"{errors.paragraph(e)}") from None


__all__ = ["load_experiment", "Experiment"]
