"""Registers every gin configurable, so configs can name them: no hand-kept list.

gin knows a configurable once the module that defines it is imported. This
imports every module of the packages that hold configurables (models, and
replibench's engine, workloads, data, eval and rl), so a new configurable is
nameable as soon as its file exists, and a binding to an unknown name is an error.

Packages that import config are not listed (their imports would run back up):
replibench.config's own Experiment is imported with the package, and
predict.DeviceProfile by `replibench predict` (predict/command.py), the one
command whose configs bind it.
"""

import importlib
import pkgutil

PACKAGES = ("models", "replibench.engine", "replibench.workloads", "replibench.data",
            "replibench.eval", "replibench.rl")


def register_all() -> None:
  for name in PACKAGES:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
      importlib.import_module(module.name)
