"""The package's layout (issue 27): no import cycle between any two files of gobrrr, imports inside functions
included, and no file over 500 lines.

The graph is built from the source with ast, one node per file (a package is its __init__.py):
`import a.b` and `from a.b import name` are edges to the file a/b.py (or a/b/__init__.py), and
`from a import b` is an edge to a/b.py when b is a module there, else to a/__init__.py. A
package's __init__ running before its submodules is Python's import order, not an import the
file makes, so it is no edge. A late import inside a function, or one under `if TYPE_CHECKING:`, is
an edge like any other: it hides a cycle from the import-time order, not from the reader (grimp, under
the import-linter contract in pyproject.toml, counts both too).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gobrrr"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _file_of(name: str, mods: dict[str, Path]) -> str | None:
    """The module (file) an imported dotted name lives in: the longest prefix that is a module."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from ..a import b
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                target = _file_of(name, mods) if name.split(".")[0] == "gobrrr" else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search, three colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the current path, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_sees_every_kind_of_import():
    """The walker finds module-level, function-level, `from pkg import module` and relative imports."""
    g = import_graph()
    assert "gobrrr.parallel.ddp" in g["gobrrr.parallel"]                    # from gobrrr.parallel.ddp import ...
    assert "gobrrr.comm.collectives" in g["gobrrr.parallel.zero.shard"]     # from gobrrr.comm import collectives
    assert "gobrrr.models.gpt" in g["gobrrr.plan.inputs"]                    # inside ModelShape.gpt_config()


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_files():
    graph, cycles = import_graph(), []
    while len(cycles) < 10 and (cycle := find_cycle(graph)):  # every cycle, each named once by one of its edges
        cycles.append(" -> ".join(cycle))
        graph[cycle[0]].discard(cycle[1])
    if cycles:
        pytest.fail("import cycles: " + "; ".join(cycles) + ". Move what both files need into a third file "
                    "(a TYPE_CHECKING import counts too, as it does for the import-linter contract)")


def test_no_file_of_the_package_is_over_500_lines():
    """One concept per file, small enough to read at a sitting (issue 27; DESIGN.md): split a file that grows past it."""
    long = {str(f.relative_to(ROOT)): n for f in PKG.rglob("*.py") if (n := len(f.read_text().splitlines())) > 500}
    assert not long, f"over 500 lines: {long}; split each by concept"


def test_the_import_contract_encodes_every_layer_rule_of_issue_27():
    """pyproject's import-linter contracts (run by `make lint`) hold each rule of the issue, not only some: the
    commands above train and doctor, train above parallel, models, loader and comm, and the four Part-1 tools
    (loader, syncs, lint, doctor) independent of each other and of train."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    by_type: dict[str, list[dict]] = {}
    for c in contracts:
        by_type.setdefault(c["type"], []).append(c)
    (layers,) = [[set(name.strip() for name in layer.split("|")) for layer in c["layers"]] for c in by_type["layers"]]
    level = {m: i for i, layer in enumerate(layers) for m in layer}   # 0 is the top
    p = "gobrrr."
    for high, lows in ((("cli", "demo", "bench"), ("train", "doctor")),
                       (("train",), ("parallel", "models", "loader", "comm", "doctor", "syncs", "lint"))):
        for h in high:
            for low in lows:
                assert level[p + h] < level[p + low], f"{h} must sit above {low} in the layers contract"
    tools = {p + t for t in ("loader", "syncs", "lint", "doctor")}
    assert any(tools <= set(c["modules"]) for c in by_type.get("independence", [])), \
        "no independence contract over loader, syncs, lint and doctor"
    assert any(c["source_modules"] == [p + "train"] and {p + "syncs", p + "lint", p + "doctor"} <= set(c["forbidden_modules"])
               for c in by_type.get("forbidden", [])), "no contract keeps train from the Part-1 tools but the loader"
    ignored = [i for c in by_type.get("independence", []) for i in c.get("ignore_imports", [])]
    assert all(i.startswith(p + "doctor.") for i in ignored), f"only the doctor may reach another tool: {ignored}"
