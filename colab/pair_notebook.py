"""Writes a notebook from its paired script: `python colab/pair_notebook.py [script.py ...]`.

A paired script is plain Python split into cells by `# %%` lines; a `# %% [markdown]` cell holds
Markdown as comment lines (`# ` stripped). The notebook (`script.ipynb` beside the script) is
regenerated from the script, so the script is what is edited, reviewed and run by CI.
`notebook_from_script` is also what the test uses to check that the two are in sync.
"""

import json
import os
import sys

_MARKER = "# %%"


def split_cells(source: str) -> list[tuple[str, str]]:
  """[(kind, text)] with kind "markdown" or "code", in order; text without the marker line."""
  cells, kind, lines = [], None, []
  for line in source.splitlines():
    if line.startswith(_MARKER):
      if kind is not None:
        cells.append((kind, "\n".join(lines).strip("\n")))
      kind = "markdown" if "[markdown]" in line else "code"
      lines = []
      continue
    if kind == "markdown":
      if line.startswith("# "):
        line = line[2:]
      elif line.strip() == "#":
        line = ""
    lines.append(line)
  if kind is not None:
    cells.append((kind, "\n".join(lines).strip("\n")))
  return cells


def notebook_from_script(source: str) -> dict:
  """The nbformat-4 notebook of a paired script."""
  cells = []
  for kind, text in split_cells(source):
    lines = text.split("\n")
    body = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    cell = {"cell_type": kind, "metadata": {}, "source": body}
    if kind == "code":
      cell.update(execution_count=None, outputs=[])
    cells.append(cell)
  return {
      "cells": cells,
      "metadata": {
          "colab": {"provenance": []},
          "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"},
      },
      "nbformat": 4,
      "nbformat_minor": 5,
  }


def write_notebook(script_path: str) -> str:
  with open(script_path, encoding="utf-8") as f:
    notebook = notebook_from_script(f.read())
  path = os.path.splitext(script_path)[0] + ".ipynb"
  with open(path, "w", encoding="utf-8") as f:
    json.dump(notebook, f, indent=1, ensure_ascii=False)
    f.write("\n")
  return path


if __name__ == "__main__":
  scripts = sys.argv[1:] or [os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "quickstart.py")]
  for script in scripts:
    print(write_notebook(script))
