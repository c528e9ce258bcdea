"""The architecture holds: no import cycle, models/ knows nothing of replibench, and
dependencies point the way README's architecture section draws them.

Imports are read from the source (ast), not by importing, so the test sees every
module-level and function-level import statement as written, and the imports a
module makes by name (importlib.import_module, __import__): such a module imports
every project module its string constants name. Packages are folders at any depth
(replibench.engine.regimes is one, inside replibench.engine), and no cycle of any
length may run between them.
"""

import ast
import os
import re
import subprocess
import sys

from tests import helpers

ROOTS = ("replibench", "models")
# Package -> packages it may import (besides itself and the top-level helper modules).
ALLOWED = {
    "models": set(),
    "replibench.engine": set(),
    "replibench.data": set(),
    "replibench.eval": {"replibench.data"},
    "replibench.rl": set(),
    "replibench.workloads": {"models", "replibench.engine", "replibench.data",
                             "replibench.eval", "replibench.rl"},
    "replibench.config": {"models", "replibench.engine", "replibench.workloads",
                          "replibench.data", "replibench.eval", "replibench.rl"},
    "replibench.harness": {"replibench.engine", "replibench.config", "replibench.workloads"},
    "replibench.suite": set(),
    "replibench.predict": {"replibench.config"},
    "replibench.tracking": {"replibench.suite"},
}
# Modules every package may use: they import nothing else of replibench.
LEAVES = {"replibench.errors", "replibench.atomic", "replibench.internals",
          "replibench.results", "replibench.processes", "replibench.rates",
          "replibench.allocator", "replibench.inputs", "replibench.device_profile",
          "replibench.native_logs", "replibench.cluster", "replibench.dirty",
          "replibench.machine"}


def _modules() -> dict[str, str]:
  """{dotted module name: path} for every .py file under the roots."""
  found = {}
  for root in ROOTS:
    for dirpath, _, files in os.walk(os.path.join(helpers.REPO, root)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(dirpath, name)
          rel = os.path.relpath(path, helpers.REPO)[:-3].replace(os.sep, ".")
          found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  return found


def _imports_by_name(tree: ast.AST) -> bool:
  """Whether the module calls importlib.import_module or __import__."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      if name in ("import_module", "__import__"):
        return True
  return False


def _imports(path: str, module: str, known: set[str]) -> set[str]:
  """The project modules that path imports (a package import counts as its __init__)."""
  tree = ast.parse(open(path).read(), path)
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  out = set()
  if _imports_by_name(tree):
    out.update(node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value in known)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    out.update(n for n in names if n in known)
  return out - {module}


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  known = set(modules)
  return {m: _imports(p, m, known) for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A cycle as a list of modules (first == last), or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


def _package(module: str) -> str:
  """The top-level package whose arrows ALLOWED lists (replibench.engine, models...)."""
  parts = module.split(".")
  return parts[0] if parts[0] == "models" else ".".join(parts[:2])


def _folder(module: str, modules: dict[str, str]) -> str:
  """The package (folder, at any depth) that holds module."""
  path = modules[module]
  return module if path.endswith("__init__.py") else module.rpartition(".")[0]


def _nested(a: str, b: str) -> bool:
  """Whether one package holds the other (a parent and its subpackage are one unit)."""
  return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def test_no_import_cycle_between_modules():
  cycle = _cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
  packages: dict[str, set[str]] = {}
  for module, imports in _graph().items():
    packages.setdefault(_package(module), set()).update(
        _package(i) for i in imports if _package(i) != _package(module) and i not in LEAVES)
  cycle = _cycle(packages)
  assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages_at_any_depth():
  modules = _modules()
  folders: dict[str, set[str]] = {}
  for module, imports in _graph().items():
    here = _folder(module, modules)
    folders.setdefault(here, set()).update(
        _folder(i, modules) for i in imports
        if i not in LEAVES and not _nested(here, _folder(i, modules)))
  cycle = _cycle(folders)
  assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_imports_by_name_are_seen(tmp_path):
  source = tmp_path / "m.py"
  source.write_text("import importlib\nNAMES = ('replibench.predict', 'os')\n"
                    "def load():\n  for n in NAMES:\n    importlib.import_module(n)\n")
  assert _imports(str(source), "replibench.config.m", {"replibench.predict"}) == {
      "replibench.predict"}


def test_dependencies_point_the_documented_way():
  wrong = []
  for module, imports in _graph().items():
    allowed = ALLOWED.get(_package(module))
    if allowed is None:
      continue
    for target in imports:
      if target in LEAVES or _package(target) == _package(module):
        continue
      if _package(target) not in allowed:
        wrong.append(f"{module} imports {target}")
  assert not wrong, "\n".join(wrong)


def test_models_import_nothing_of_replibench():
  offenders = [m for m, imports in _graph().items() if m.startswith("models")
               and any(i.startswith("replibench") for i in imports)]
  assert not offenders, offenders


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_gin_configurable_is_registered_by_loading_a_config():
  """gin refuses a configurable first defined after a config was loaded (and locked):
  every module defining one must be imported by registry.register_all (or with config)."""
  from replibench.config import registry  # pylint: disable=import-outside-toplevel
  registered = ("replibench.config",) + registry.PACKAGES + registry.MODULES
  unregistered = [
      module for module, path in _modules().items()
      if re.search(r"gin\.(configurable|external_configurable|register)\b", open(path).read())
      and not any(module == name or module.startswith(name + ".") for name in registered)]
  assert not unregistered, unregistered


def test_the_launcher_starts_tasks_without_importing_tensorflow():
  """`replibench launch` only starts processes: TensorFlow in it would cost every
  launched cluster seconds of start-up and ~0.6 GB before its tasks begin."""
  done = subprocess.run(
      [sys.executable, "-c", "import sys, replibench.cli, replibench.harness.launcher; "
       "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"],
      cwd=helpers.REPO, capture_output=True, text=True, check=True)
  assert done.stdout.strip() == "[]", done.stdout[:500]
