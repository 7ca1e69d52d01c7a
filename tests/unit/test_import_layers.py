"""Imports point one way (docs/architecture.md): ``llog`` (the protocol core, never Spark) <- the
connectors and the broker <- ``jobs``; ``pyspark_llog`` (what Spark finds) imports the connectors,
they never import it; ``llog_tools`` (the ``llog`` command, the local stack, reports, progress
bars) imports the core alone, and only ``jobs`` of the packages above imports it; and no two
modules of one package import each other, at any depth of the module (a function's import
counts). Read from the source with :mod:`ast`, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("llog", "llog_tools", "llog_sink", "llog_source", "compaction_job", "broker_lite", "pyspark_llog", "jobs",
               "bench", "chaos", "loadtest")
#: What each package may import of the others (beside itself); third-party imports are free,
#: except Spark's in the core and its tools (the ``llog`` command runs where Spark is not), and
#: rich's in the core (it draws nothing: llog_tools.progress does).
ALLOWED = {
    "llog": set(),
    "llog_tools": {"llog"},
    "llog_sink": {"llog"},
    "llog_source": {"llog"},
    "compaction_job": {"llog"},
    "broker_lite": {"llog"},
    "pyspark_llog": {"llog", "llog_sink", "llog_source"},
    # The demo draws progress bars and prints the describe tables.
    "jobs": {"llog", "llog_tools", "llog_sink", "llog_source", "compaction_job", "broker_lite", "pyspark_llog"},
}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), at any depth,
    except under ``if TYPE_CHECKING:`` (annotations only: nothing is imported when it runs)."""
    package = ".".join(path.relative_to(CHECKOUT).with_suffix("").parts[:-1])
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _modules(package: str) -> dict[str, Path]:
    return {".".join(p.relative_to(CHECKOUT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted((CHECKOUT / package).rglob("*.py"))}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = {}
    for name, path in _modules(package).items():
        for imported in _imports(path):
            top = imported.split(".")[0]
            if (top in FIRST_PARTY and top != package and top not in ALLOWED[package]) or (
                    package in ("llog", "llog_tools") and top == "pyspark") or (package == "llog" and top == "rich"):
                wrong.setdefault(name, set()).add(imported)
    assert not wrong, wrong


@pytest.mark.parametrize("package", FIRST_PARTY)
def test_no_two_modules_of_a_package_import_each_other(package):
    modules = _modules(package)
    edges = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    cycles = set()
    for start in edges:  # a path from start back to start, depth first
        stack, seen = [(start, (start,))], set()
        while stack:
            name, path = stack.pop()
            for nxt in edges[name]:
                if nxt == start:
                    cycles.add(tuple(sorted(path)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + (nxt,)))
    # A package's __init__ re-exporting its modules is no knot: leave those cycles out.
    cycles = {c for c in cycles if package not in c}
    assert not cycles, sorted(cycles)
