"""What the docs show, read for the checks of tests/test_docs.py and
tests/test_benchmarks_layout.py: the pages, their shell snippets, and the words of a
command.

The pages are the site's sources (docs/, less the generated reference pages), README.md,
the committed results pages the site shows in place (results/**/*.md, tools/docs/hooks.py)
and the benchmarks' READMEs. Snippets are the lines of fenced code blocks (not Python,
TOML, YAML or JSON ones), of indented code blocks (the results pages write commands so)
and inline code spans.
"""

import functools
import glob
import os
import re
import shlex

from tests.helpers import REPO

GENERATED = ("docs/reference/cli.md", "docs/reference/gin.md", "docs/reference/result-json.md")
# Outputs of make bench, never committed: no page of the site.
_UNCOMMITTED = ("results/latest/", "results/latest-smoke/")
_NOT_SHELL = ("python", "py", "toml", "yaml", "json")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
PREFIXES = {"sudo", "time", "nohup", "exec", "env"}


def doc_files() -> list[str]:
  """Absolute paths of every page the checks read."""
  found = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
  found += glob.glob(os.path.join(REPO, "results", "**", "*.md"), recursive=True)
  found += glob.glob(os.path.join(REPO, "benchmarks", "**", "README.md"), recursive=True)
  found.append(os.path.join(REPO, "README.md"))
  rel = {f: os.path.relpath(f, REPO).replace(os.sep, "/") for f in found}
  return sorted(f for f in found
                if rel[f] not in GENERATED and not rel[f].startswith(_UNCOMMITTED))


def _indented_blocks(text: str):
  """(first line number, lines) of each indented code block: lines of 4+ spaces after a
  blank line, outside lists' own paragraphs (a list item's continuation is indented
  under its text, and follows it with no blank line)."""
  lines = text.split("\n")
  i = 0
  while i < len(lines):
    if re.match(r" {4,}\S", lines[i]) and (i == 0 or not lines[i - 1].strip()):
      start, block = i, []
      while i < len(lines) and (re.match(r" {4,}\S", lines[i]) or not lines[i].strip()):
        block.append(lines[i].strip())
        i += 1
      yield start + 1, block
    else:
      i += 1


@functools.cache
def snippets() -> tuple[tuple[str, str], ...]:
  """(where, text) of every shell-like code line and inline code span of the pages;
  a line that ends in a backslash is joined to the next: one command."""
  out = []
  for path in doc_files():
    rel = os.path.relpath(path, REPO)
    text = open(path).read()
    for match in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
      if match.group(1) in _NOT_SHELL:
        continue
      line = text.count("\n", 0, match.start()) + 2
      body = re.sub(r"\\\n", " ", match.group(2))
      out += [(f"{rel}:{line + k}", command) for k, command in enumerate(body.split("\n"))]
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text,
                   flags=re.M | re.S)
    for line, block in _indented_blocks(prose):
      body = re.sub(r"\\\n", " ", "\n".join(block))
      out += [(f"{rel}:{line + k}", command) for k, command in enumerate(body.split("\n"))]
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
      out.append((f"{rel} (inline)", " ".join(match.group(1).split())))
  return tuple(out)


def tokens(command: str) -> list[str]:
  """The words of a shell command; `<placeholder text>` is one word."""
  command = re.sub(r"<[^<>]*>", "<_>", command)   # `BASE=<commit before>`: one word.
  try:
    return shlex.split(command, comments=True)
  except ValueError:   # An unbalanced quote in a fragment: split on blanks.
    return command.split("#", 1)[0].split()


def segments(snippet: str) -> list[list[str]]:
  """The simple commands of a snippet (split at ;, &&, | ...), each without its `sudo`,
  `time` ... and leading VAR=value words."""
  out, segment = [], []
  for token in tokens(snippet) + [";"]:
    if token in SEPARATORS or token.endswith(";"):
      if token.endswith(";") and token != ";":
        segment.append(token[:-1])
      words = [w for w in segment if w not in PREFIXES]
      while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):   # VAR=x cmd
        words = words[1:]
      if words:
        out.append(words)
      segment = []
    else:
      segment.append(token)
  return out
