"""notebooks/*.ipynb are committed clean: valid nbformat v4, no outputs, no execution counts or
timings (a run's offsets, paths and timings would change with every run), and code that compiles.
``python notebooks/strip_outputs.py`` cleans them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("strip_outputs", REPO / "notebooks" / "strip_outputs.py")
strip_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strip_outputs)


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "operations.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_valid_v4_without_outputs(path):
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4, f"{path.name} is nbformat {nb.nbformat}, not 4"
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    dirty = [i for i, cell in enumerate(nb.cells)
             if (cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None))
             or any(key in cell.metadata for key in strip_outputs.RUN_METADATA)]
    assert not dirty, f"{path.name}: cells {dirty} hold a run's outputs; run `python notebooks/strip_outputs.py`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_code_compiles(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            # IPython's magics (%matplotlib) are not Python.
            lines = cell.source.splitlines()
            source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
            compile(source, f"{path.name}, cell {i}", "exec")


def test_strip_outputs_cleans_an_executed_notebook(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("print(1)", execution_count=3, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="1\n")],
            metadata={"execution": {"iopub.execute_input": "2026-01-01T00:00:00Z"}, "tags": ["keep"]}),
    ])
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    assert strip_outputs.strip_file(path) is True
    cleaned = nbformat.read(path, as_version=4)
    code = cleaned.cells[1]
    assert (code.outputs, code.execution_count, dict(code.metadata)) == ([], None, {"tags": ["keep"]})
    assert code.source == "print(1)" and cleaned.cells[0].source == "# title"
    assert strip_outputs.strip_file(path) is False  # already clean: not rewritten
