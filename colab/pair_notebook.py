"""Writes or checks a notebook from its paired script: `python colab/pair_notebook.py [--check]
[script.py ...]` (default: colab/quickstart.py).

A paired script is plain Python split into cells by `# %%` lines; a `# %% [markdown]` cell holds
Markdown as comment lines (`# ` stripped). The notebook (`script.ipynb` beside the script) is
regenerated from the script, so the script is what is edited, reviewed and run by CI. Each
cell's id (nbformat 4.5) is its kind and position, `code-3`, so that regenerating an unchanged
script changes nothing. `--check` writes nothing and exits with status 1, naming the notebook,
when a notebook differs from what its script gives (status 2 when a script is missing).
"""

import json
import os
import sys

_MARKER = "# %%"
DEFAULT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


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
  """The nbformat-4.5 notebook of a paired script (cell ids `<kind>-<position>`)."""
  cells = []
  for index, (kind, text) in enumerate(split_cells(source)):
    lines = text.split("\n")
    body = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    cell = {"cell_type": kind, "id": f"{kind}-{index}", "metadata": {}, "source": body}
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


def notebook_path(script_path: str) -> str:
  return os.path.splitext(script_path)[0] + ".ipynb"


def notebook_text(script_path: str) -> str:
  """The notebook file's text for the script at `script_path`."""
  with open(script_path, encoding="utf-8") as f:
    notebook = notebook_from_script(f.read())
  return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def is_in_sync(script_path: str) -> bool:
  """Whether the notebook beside `script_path` is exactly what the script gives."""
  path = notebook_path(script_path)
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    return f.read() == notebook_text(script_path)


def write_notebook(script_path: str) -> str:
  path = notebook_path(script_path)
  text = notebook_text(script_path)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)  # never a half-written notebook
  return path


def main(argv: list[str]) -> int:
  check = "--check" in argv
  scripts = [a for a in argv if a != "--check"] or [DEFAULT_SCRIPT]
  missing = [s for s in scripts if not os.path.isfile(s)]
  if missing or any(a.startswith("--") and a != "--check" for a in argv):
    bad = missing[0] if missing else next(a for a in argv if a.startswith("--"))
    print(f"pair_notebook: no such script or option: {bad}", file=sys.stderr)
    return 2
  stale = []
  for script in scripts:
    if check:
      if not is_in_sync(script):
        stale.append(notebook_path(script))
    else:
      print(write_notebook(script))
  for path in stale:
    print(f"{path} differs from its script: run `python colab/pair_notebook.py`",
          file=sys.stderr)
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
