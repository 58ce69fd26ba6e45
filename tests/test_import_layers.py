"""The package's imports form no circle: codecs and model at the bottom, sources and targets
above them, the loop above those, commands on top. Imports inside functions count: moving an
import into a function hides a circle, it does not remove it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports, anywhere in it (functions too; TYPE_CHECKING blocks
    are left out: they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            # `from bridge.x import y` names module bridge.x.y when that is a module, else bridge.x
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me and name != "bridge":
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {m: imports_of(p, modules) for m, p in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_among_bridge_modules() -> None:
    found = cycles(graph())
    assert not found, "import circles (a module set that imports itself round): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_check_sees_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "bridge"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bridge.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from bridge import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bridge import a\n")
    files = {p.stem if p.stem != "__init__" else "": p for p in pkg.glob("*.py")}
    modules = {f"bridge.{n}" if n else "bridge" for n in files}
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        edges = {module_name(p): imports_of(p, modules) for p in pkg.glob("*.py")}
    finally:
        PACKAGE = saved
    assert cycles(edges) == [["bridge.a", "bridge.b"]]
    assert edges["bridge.c"] == set()


def test_every_module_is_under_400_lines() -> None:
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"
