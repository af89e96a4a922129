"""Which part of the package may import which: read from the source, not from running it.

- One direction: the doors (``sync``, ``dlt``, ``cli``) stand on the store runtime
  (``asyncsubs.stores``), the runtime on the client (``_client``), the client on the limiter
  and pagination, those on the protocol; nothing imports a layer above its own.
- One place makes a door's client (``stores/_clients.py`` constructs ``AdminClient``), and one
  pull loop lists pages (``stores/_units.py``): a door does neither itself.
- Only the command line speaks of flags: no message of the library names one.
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
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

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


#: The layers, lowest first, by module (a module not named here is beside them: errors, json,
#: webhooks, testing, ...). ``asyncsubs`` itself is the client's public face.
LAYERS = {
    "asyncsubs._protocol": 0,
    "asyncsubs._pagination": 1,
    "asyncsubs._limiter": 1,
    "asyncsubs._discovery": 1,
    "asyncsubs._server_limits": 1,
    "asyncsubs.limiting": 1,
    "asyncsubs._client": 2,
    "asyncsubs": 2,
    "asyncsubs.stores": 3,
    "asyncsubs.__main__": 4,
    "asyncsubs.sync": 4,
    "asyncsubs.dlt": 4,
    "asyncsubs.cli": 4,
}
DOORS = ("sync", "dlt", "cli")


def layer(module: str) -> int | None:
    """The layer of ``module`` (or of the name imported from it), by its longest known prefix."""
    parts = module.split(".")
    if len(parts) == 2 and parts[1][:1].isupper():
        parts = parts[:1]  # a name of the package's face (asyncsubs.AdminClient)
    for end in range(len(parts), 1 if len(parts) > 1 else 0, -1):
        found = LAYERS.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def test_nothing_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in modules("."):
        own = layer(module_name(path))
        if own is None or (own == LAYERS["asyncsubs"] and path.name == "__init__.py"):
            continue  # the package's face re-exports what users need, from every layer
        for name in imports(path):
            # The package as a module is what ``from . import _json`` names; its names count.
            other = None if name == "asyncsubs" else layer(name)
            if other is not None and other > own:
                upward.append((module_name(path), name))
    assert upward == []


def calls(path: Path) -> Iterator[ast.Call]:
    yield from (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call))


def test_one_module_makes_the_clients_of_the_doors() -> None:
    makers = {
        path.relative_to(ROOT).as_posix()
        for path in modules(".")
        for call in calls(path)
        if isinstance(call.func, ast.Name | ast.Attribute)
        and (call.func.id if isinstance(call.func, ast.Name) else call.func.attr) == "AdminClient"
    }
    assert makers == {"stores/_clients.py"}


@pytest.mark.parametrize("door", DOORS)
def test_a_door_pulls_through_the_runtimes_one_loop(door: str) -> None:
    """A door lists no endpoint and iterates no ``ListCall`` of its own: ``Unit.pages`` does."""
    own_loops = [
        (path.name, call.func.attr)
        for path in modules(door)
        for call in calls(path)
        if isinstance(call.func, ast.Attribute)
        and call.func.attr in ("list", "list_endpoint", "pages")
        and not (isinstance(call.func.value, ast.Name) and call.func.value.id == "unit")
    ]
    assert own_loops == []


#: Modules whose messages still name the command line's flags, in the sinks and the listener.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


def test_only_the_command_line_speaks_of_flags() -> None:
    """The library says what a parameter or a config key is called; ``cli/`` maps them to its
    flags. Docstrings may say which command uses a module."""
    found = []
    for path in modules("."):
        where = path.relative_to(ROOT).as_posix()
        # testing/ starts other programs (initdb, pg_ctl) with their own flags.
        if where.startswith(("cli/", "testing/")):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and FLAG.search(node.value)
            ):
                found.append((where, node.value))
    assert found == []


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
