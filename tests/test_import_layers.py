"""The package is built in layers, and its imports point down only: the core at the bottom,
commands on top (bridge/__init__.py lists them). Each package's `__init__.py` says, in a line
`May import: ...`, which layers below it its modules may import; every module is held to its
package's line, so a module in the wrong place fails here with the rule it broke. Imports inside
functions count (moving an import into a function hides a circle, it does not remove it), and
so do imports only for type checking when layers are checked: a type a layer needs from above
is the sign of a missing view below (bridge.service.view)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], type_only: bool = False) -> set[str]:
    """The package modules `path` imports, anywhere in it (functions too; TYPE_CHECKING blocks
    only when `type_only`: they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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


def graph(type_only: bool = False) -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {m: imports_of(p, modules, type_only) for m, p in files.items()}


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
    found = cycles(graph(type_only=True))
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


# The layers from the bottom; "core" is the modules at the top of bridge/ itself.
LAYERS = ["core", "codecs", "schemas", "sources", "targets", "ledger", "pipeline", "lifecycle", "service", "demo",
          "commands"]
MAX_CORE_MODULES = 12


def layer_of(module: str) -> str:
    """The layer a module belongs to: its package under bridge, or "core" for bridge's own modules.
    `bridge.__main__` runs the command line, so it sits with the commands."""
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return "commands"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "core"


def may_import(package_dir: Path) -> list[str]:
    """The layers a package's `__init__.py` docstring lets it import (its `May import:` line)."""
    doc = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text())) or ""
    lines = [line for line in " ".join(doc.split("\n")).split("May import:")[1:]]
    assert lines, f"{package_dir / '__init__.py'}: its docstring has no 'May import: ...' line"
    return [w.strip(" .") for w in lines[0].split(".")[0].split(",") if w.strip(" .")]


def rules() -> dict[str, list[str]]:
    found = {"core": []}
    for d in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        found[d.name] = may_import(d)
    return found


def broken_rules(edges: dict[str, set[str]], allowed: dict[str, list[str]]) -> list[str]:
    """Each import that leaves its own package for a layer its package's rule does not name."""
    out = []
    for module, imported in sorted(edges.items()):
        mine = layer_of(module)
        for other in sorted(imported):
            theirs = layer_of(other)
            if theirs != mine and theirs not in allowed[mine]:
                where = "bridge/__init__.py (the core)" if mine == "core" else f"bridge/{mine}/__init__.py"
                out.append(f"{module} imports {other}: {mine} may import only "
                           f"{', '.join(allowed[mine]) or 'the core itself'} ({where})")
    return out


def test_every_package_says_what_it_may_import_and_only_layers_below_it() -> None:
    found = rules()
    assert set(found) == set(LAYERS), f"packages not placed in LAYERS, or LAYERS naming none: {set(found) ^ set(LAYERS)}"
    for layer, allowed in found.items():
        below = LAYERS[: LAYERS.index(layer)]
        upward = [a for a in allowed if a not in below]
        assert not upward, f"bridge/{layer}/__init__.py lets it import {upward}, which are not below {layer} in {LAYERS}"


def test_no_module_imports_upward() -> None:
    broken = broken_rules(graph(type_only=True), rules())
    assert not broken, "imports against the layers:\n" + "\n".join(broken)


def test_the_check_names_an_upward_import_and_its_rule() -> None:
    edges = {"bridge.ledger.state": {"bridge.pipeline.loop", "bridge.timefmt"}, "bridge.timefmt": set()}
    allowed = {"core": [], "ledger": ["core", "codecs", "schemas", "sources", "targets"], "pipeline": ["core", "ledger"]}
    assert broken_rules(edges, allowed) == [
        "bridge.ledger.state imports bridge.pipeline.loop: ledger may import only core, codecs, schemas, sources, "
        "targets (bridge/ledger/__init__.py)"]
    assert broken_rules({"bridge.config": {"bridge.ledger.state"}}, allowed) == [
        "bridge.config imports bridge.ledger.state: core may import only the core itself (bridge/__init__.py (the core))"]


def test_the_top_of_bridge_holds_the_packages_and_at_most_a_dozen_core_modules() -> None:
    core = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(core) <= MAX_CORE_MODULES, f"{len(core)} core modules at the top of bridge/: {core}"
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
    unnamed = [m for m in core if m not in doc]
    assert not unnamed, f"core modules bridge/__init__.py does not name: {unnamed}"


def test_architecture_page_names_every_layer_and_only_packages_that_exist() -> None:
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for layer in LAYERS[1:]:
        assert f"bridge/{layer}/" in page, f"docs/architecture.md does not name bridge/{layer}/"
    import re

    for named in set(re.findall(r"bridge/([a-z_]+)/", page)):
        assert (PACKAGE / named / "__init__.py").exists(), f"docs/architecture.md names bridge/{named}/, which does not exist"
    for named in set(re.findall(r"`bridge\.([a-z_.]+)`", page)):
        path = PACKAGE.joinpath(*named.split("."))
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), \
            f"docs/architecture.md names bridge.{named}, which does not exist"
