"""MkDocs hook: the committed results (results/**/README.md and the plots) and the
benchmarks' READMEs (benchmarks/**/README.md) as pages of the site, read where they are
(no copy to keep in step).

results/<dir>/README.md becomes the page results/<dir>/ (results/README.md, the
overview, becomes results/summary/), with each suite's report.md, every results/**/*.png beside it and the .md
files a README links to, so the READMEs' relative links and images resolve.
"""

import os
import re

from mkdocs.structure.files import File, InclusionLevel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")
BENCHMARKS = os.path.join(ROOT, "benchmarks")
SKIP = ("latest", "latest-smoke")   # Uncommitted outputs of make bench.


def _committed(dirpath: str) -> bool:
  rel = os.path.relpath(dirpath, RESULTS).split(os.sep)
  return rel[0] not in SKIP


def results_files() -> dict[str, str]:
  """site path (under docs/) -> file in the repo."""
  found = {}
  for dirpath, dirnames, filenames in os.walk(RESULTS):
    dirnames[:] = sorted(d for d in dirnames if _committed(os.path.join(dirpath, d)))
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
      if name.endswith(".png"):
        found[rel] = path
      elif name == "report.md" and os.path.dirname(rel).count("/") == 1:
        found[rel] = path   # A suite's committed report: results/<workload>/report.md.
      elif name == "README.md":
        found["results/summary.md" if rel == "results/README.md" else rel] = path
        for link in re.findall(r"\]\(([^)#\s]+\.md)\)", open(path).read()):
          target = os.path.normpath(os.path.join(dirpath, link))
          if os.path.isfile(target):
            found[os.path.relpath(target, ROOT).replace(os.sep, "/")] = target
  return found


def benchmarks_files() -> dict[str, str]:
  """site path (under docs/) -> file: benchmarks/README.md (the index) and each
  concern's README.md, which it links."""
  found = {}
  for dirpath, dirnames, filenames in os.walk(BENCHMARKS):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
    if "README.md" in filenames:
      path = os.path.join(dirpath, "README.md")
      found[os.path.relpath(path, ROOT).replace(os.sep, "/")] = path
  return found


def on_files(files, config):
  for src_uri, path in {**results_files(), **benchmarks_files()}.items():
    if files.get_file_from_path(src_uri) is None:
      # Linked from the Results page and the Tests and benchmarks page rather than
      # listed in the nav (a README.md in a nav section would become its index page).
      files.append(File.generated(config, src_uri, abs_src_path=path,
                                  inclusion=InclusionLevel.NOT_IN_NAV))
  return files
