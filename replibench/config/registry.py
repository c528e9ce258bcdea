"""Registers every gin configurable, so configs can name them: no hand-kept list.

gin knows a configurable once the module that defines it is imported. This
imports every module of the packages that hold configurables (models, and
replibench's engine, workloads, data, eval and rl), so a new configurable is
nameable as soon as its file exists, and a binding to an unknown name is an error.

Packages that import config are not listed (their imports would run back up):
replibench.config's own Experiment is imported with the package, and
predict.DeviceProfile lives in a module of its own (replibench.device_profile) so
that it is registered here too: gin refuses a configurable defined after a config
was loaded (and locked), so a later `import replibench.predict` must add none.
"""

import importlib
import pkgutil

PACKAGES = ("models", "replibench.engine", "replibench.workloads", "replibench.data",
            "replibench.eval", "replibench.rl")


MODULES = ("replibench.device_profile",)


def register_all() -> None:
  for name in MODULES:
    importlib.import_module(name)
  for name in PACKAGES:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
      importlib.import_module(module.name)
