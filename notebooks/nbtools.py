"""Builds a notebook from a list of (kind, source) cells, and optionally executes it (jupyter's
nbclient, from the ``notebooks`` extra). Used by the make_*.py scripts next to it, which keep
each notebook reviewable as code."""
import json
from pathlib import Path


def build(cells) -> dict:
    """nbformat-4 JSON of ``cells`` ((kind, source) pairs), without outputs."""
    out = []
    for i, (kind, src) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": src.splitlines(keepends=True)}
        if kind == "code":
            cell.update(outputs=[], execution_count=None)
        out.append(cell)
    return {"cells": out, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                                       "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def write(path: Path, cells, execute: bool = False, timeout: int = 1800) -> Path:
    """Write the notebook of ``cells`` to ``path``; with ``execute``, run it in its folder and keep the outputs."""
    path.write_text(json.dumps(build(cells), indent=1, ensure_ascii=False) + "\n")
    if execute:
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        for cell in nb.cells:  # the kernel's and libraries' warnings (machine paths) are not the notebook's content
            if cell.cell_type == "code":
                cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
        nbformat.write(nb, path)
    print(f"wrote {path}")
    return path
