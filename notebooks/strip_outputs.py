"""Strip outputs, execution counts and execution timings from notebooks before committing them.

    python notebooks/strip_outputs.py                  # every notebooks/*.ipynb
    python notebooks/strip_outputs.py a.ipynb b.ipynb

Notebooks are committed clean (``tests/unit/test_notebooks_clean.py`` checks it): outputs hold
one run's offsets, paths and timings, which would change with every run and bloat diffs. The test
suite executes a copy (``tests/integration/test_notebooks.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parent
#: Cell metadata a run adds: nbclient's timings, Jupyter's view state of outputs.
RUN_METADATA = ("execution", "collapsed", "scrolled")


def strip(nb: nbformat.NotebookNode) -> bool:
    """Remove what a run left in ``nb``, in place; whether anything was removed."""
    changed = False
    for cell in nb.cells:
        for key in RUN_METADATA:
            changed |= cell.metadata.pop(key, None) is not None
        if cell.cell_type != "code":
            continue
        if cell.outputs or cell.execution_count is not None:
            cell.outputs, cell.execution_count = [], None
            changed = True
    return changed


def strip_file(path: Path) -> bool:
    """Strip the notebook at ``path`` (nbformat v4, validated) in place; whether it changed."""
    nb = nbformat.read(path, as_version=4)
    changed = strip(nb)
    nbformat.validate(nb)
    if changed:
        nbformat.write(nb, path)
    return changed


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        print(f"{path}: {'stripped' if strip_file(path) else 'clean'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
