"""The package layout, checked on the source (an AST scan of every import, lazy ones included).

Roles: the core (modules directly in ``tuner/``), ``tuner.store`` (the store contract), ``tuner.measure``,
``tuner.driver``, ``tuner.service``, ``tuner.cli``, ``tuner.report``, and the repository's ``db/``, ``api/``
and ``kernels/`` (installed as ``tuner.db``, ``tuner.api``, ``tuner.kernels``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# repository folder -> the package it is installed as (tuner/db etc. are links to the top-level folders)
SOURCES = {"tuner": "tuner", "db": "tuner.db", "api": "tuner.api", "kernels": "tuner.kernels"}
LINKED = ("db", "api", "kernels", "search_spaces")
ROLES = ("store", "measure", "driver", "service", "cli", "report", "db", "api", "kernels")


def _modules() -> Iterator[tuple[str, Path]]:
    for folder, package in SOURCES.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if folder == "tuner" and rel.parts[0] in LINKED:
                continue  # the links: scanned under their own folders
            parts = [*package.split("."), *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


@cache
def imports() -> dict[str, set[str]]:
    """Every module of the project -> the absolute names it imports (``from a import b`` counts a and a.b)."""
    found: dict[str, set[str]] = {}
    for module, path in _modules():
        names: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
        found[module] = names
    return found


def role(module: str) -> str | None:
    """The role of a project module (``core`` for tuner's own top-level modules); None outside tuner."""
    parts = module.split(".")
    if parts[0] != "tuner":
        return None
    if len(parts) > 1 and parts[1] in ROLES:
        return parts[1]
    return "core"


def _project(names: set[str], modules: set[str]) -> set[str]:
    return {n for n in names if n in modules}


def test_the_scan_sees_every_role() -> None:
    seen = {role(m) for m in imports()}
    assert seen == {"core", *ROLES}


def test_no_import_cycle_between_roles() -> None:
    modules = set(imports())
    graph: dict[str, set[str]] = {}
    for module, names in imports().items():
        src = role(module)
        assert src is not None
        for target in _project(names, modules):
            dst = role(target)
            if dst is not None and dst != src:
                graph.setdefault(src, set()).add(dst)
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle between roles: {' -> '.join(cycle or [])}; edges: {graph}"


def test_no_import_cycle_between_kernel_operators_or_device_backends() -> None:
    modules = set(imports())
    for parent in ("tuner.kernels", "tuner.measure", "tuner.measure.devices", "tuner.api"):
        depth = len(parent.split(".")) + 1
        graph: dict[str, set[str]] = {}
        for module, names in imports().items():
            if not module.startswith(parent + "."):
                continue
            src = ".".join(module.split(".")[:depth])
            for target in _project(names, modules):
                if target.startswith(parent + "."):
                    dst = ".".join(target.split(".")[:depth])
                    if dst != src:
                        graph.setdefault(src, set()).add(dst)
        assert _find_cycle(graph) is None, f"cycle inside {parent}: {graph}"


def test_the_core_imports_no_store_no_api_and_no_sqlalchemy() -> None:
    for module, names in imports().items():
        if role(module) == "core":
            bad = {n for n in names if n.split(".")[0] == "sqlalchemy" or role(n) in ("db", "api")}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_db_imports_nothing_of_the_engine_but_the_store_contract_and_the_errors() -> None:
    for module, names in imports().items():
        if role(module) == "db":
            engine = {n for n in names if role(n) not in (None, "db", "store")
                      and n != "tuner" and n != "tuner.errors" and not n.startswith("tuner.errors.")}
            assert not engine, f"{module} imports {sorted(engine)}"


def test_sqlalchemy_stays_inside_db() -> None:
    for module, names in imports().items():
        if role(module) != "db":
            assert not {n for n in names if n.split(".")[0] == "sqlalchemy"}, module


def test_one_namespace_no_top_level_db_api_or_kernels() -> None:
    for module, names in imports().items():
        bad = {n for n in names if n.split(".")[0] in ("db", "api", "kernels", "search_spaces")}
        assert not bad, f"{module} imports {sorted(bad)}: import them as tuner.db, tuner.api, tuner.kernels"


def test_the_links_point_at_the_repository_folders() -> None:
    for name in LINKED:
        link = ROOT / "tuner" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None
