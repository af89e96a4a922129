"""Which part of the package may import which: read from the source, not from running it.

- The command line (``asyncsubs.cli``) is a user of the library: it imports the library's
  public modules and names only, never a private one (``asyncsubs._client``,
  ``asyncsubs.sync._engine``). The library's own subpackages (``sync``, ``webhooks``,
  ``testing``) are modules of one package and share its private helpers.
- The sync engine knows nothing of how progress is shown: ``asyncsubs.sync`` imports nothing of
  the command line, rich or argparse.
- One module knows that there are two sinks: only ``asyncsubs.sync._open`` imports them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import asyncsubs

ROOT = Path(asyncsubs.__file__).parent


def imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, absolute (``asyncsubs.sync._engine``), and every name it
    imports from one (``asyncsubs.sync.SyncEngine``)."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the package, one level up per dot after the first
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def modules(under: str) -> list[Path]:
    found = sorted((ROOT / under).rglob("*.py"))
    assert found, under
    return found


def test_the_command_line_imports_only_public_names_of_the_library() -> None:
    private = {}
    for path in modules("cli"):
        for name in imports(path):
            parts = name.split(".")
            if parts[0] != "asyncsubs" or parts[:2] == ["asyncsubs", "cli"]:
                continue  # another distribution, or the command line's own modules
            if any(part.startswith("_") and not part.endswith("__") for part in parts[1:]):
                private.setdefault(path.name, []).append(name)
    assert private == {}


def test_the_sync_engine_imports_nothing_of_the_display() -> None:
    for path in modules("sync"):
        for name in imports(path):
            assert not name.startswith(("asyncsubs.cli", "rich", "argparse")), (path.name, name)


def test_one_module_picks_the_sink() -> None:
    sinks = ("asyncsubs.sync.sqlite", "asyncsubs.sync.postgres")
    pickers = {
        path.relative_to(ROOT).as_posix()
        for path in modules(".")
        if path.stem not in ("sqlite", "postgres")
        and any(name.startswith(sinks) for name in imports(path))
    }
    assert pickers == {"sync/_open.py"}


def test_the_command_line_stays_small() -> None:
    """The command line drives the library and must not outgrow it: small modules, one concept
    each, and the whole well under the library's core."""
    lengths = {path.name: len(path.read_text().splitlines()) for path in modules("cli")}
    assert {name: n for name, n in lengths.items() if n > 450} == {}
    assert sum(lengths.values()) <= 3_600


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    """No import cycle, ``TYPE_CHECKING`` and function-level imports included: each module can
    be read (and loaded) after the ones it imports. ``from package import name`` depends on
    the module ``name`` when there is one, else on the package's ``__init__``."""
    paths = {
        ".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in modules(".")
    }

    def depends_on(name: str, path: Path) -> set[str]:
        found = set()
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    found.add(sub if sub in paths else module)
        return (found & set(paths)) - {name}

    graph = {name: depends_on(name, path) for name, path in paths.items()}
    state: dict[str, str] = {}  # "open" while its dependencies are read, then "done"
    cycles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for dependency in sorted(graph[name]):
            if state.get(dependency) == "open":
                cycles.append([*trail[trail.index(dependency) :], dependency])
            elif dependency not in state:
                visit(dependency, [*trail, dependency])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []
