"""The public names promised in shared/API.md exist and __all__ is explicit and sorted."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import tomllib
import types
from pathlib import Path

import attrs
import pytest

import asyncsubs
from asyncsubs import errors

API_MD_NAMES = {
    "AdminClient",
    "Limits",
    "Rate",
    "RetryPolicy",
    "Subscription",
    "Customer",
    "Order",
    "AsyncSubsError",
    "ConfigError",
    "TransportError",
    "ProtocolError",
    "APIError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "RateLimitError",
    "ServerError",
}


def test_all_is_sorted_and_complete() -> None:
    assert asyncsubs.__all__ == sorted(asyncsubs.__all__)
    assert set(asyncsubs.__all__) >= API_MD_NAMES
    for name in asyncsubs.__all__:
        assert hasattr(asyncsubs, name), name


def test_error_tree_matches_api_md() -> None:
    assert issubclass(errors.ConfigError, ValueError)
    for name in ("ConfigError", "TransportError", "ProtocolError", "APIError"):
        assert getattr(errors, name).__mro__[1] is errors.AsyncSubsError
    for name in ("BadRequestError", "AuthenticationError", "NotFoundError", "RateLimitError"):
        assert getattr(errors, name).__mro__[1] is errors.APIError
    assert errors.ServerError.__mro__[1] is errors.APIError
    assert errors.PermissionDeniedError.__mro__[1] is errors.AuthenticationError
    for name in errors.__all__:
        assert getattr(asyncsubs, name) is getattr(errors, name)


@pytest.mark.parametrize("model", [asyncsubs.Subscription, asyncsubs.Customer, asyncsubs.Order])
def test_models_are_frozen_slotted_attrs(model: type) -> None:
    assert attrs.has(model)
    assert "__slots__" in model.__dict__
    fields = attrs.fields_dict(model)
    assert {"id", "raw"} <= set(fields)
    record = model(id=1, raw={"id": 1})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.id = 2  # type: ignore[misc]


def test_config_objects_are_frozen_and_validated() -> None:
    assert asyncsubs.Rate(2, per=3.0).interval == pytest.approx(1.5)
    with pytest.raises(asyncsubs.ConfigError):
        asyncsubs.Rate(0)
    with pytest.raises(asyncsubs.ConfigError):
        asyncsubs.Rate(5, per=-1)
    with pytest.raises(asyncsubs.ConfigError):
        asyncsubs.Limits(max_in_flight=0)
    with pytest.raises(asyncsubs.ConfigError):
        asyncsubs.Limits(heavy={"orders": 5})  # type: ignore[dict-item]
    with pytest.raises(asyncsubs.ConfigError):
        asyncsubs.RetryPolicy(max_attempts=0)
    limits = asyncsubs.Limits(heavy={"/subscriptions/": asyncsubs.Rate(2, per=3.0)})
    assert limits.pool_for("GET", "subscriptions") == "subscriptions"
    assert limits.pool_for("GET", "subscriptions/5") == "global"
    assert limits.pool_for("POST", "subscriptions") == "global"
    assert limits.pool_for("GET", "orders") == "global"


def test_config_objects_pickle_and_hash() -> None:
    """Workers in other processes receive the same Limits/RetryPolicy objects."""
    import pickle

    limits = asyncsubs.Limits(heavy={"orders": asyncsubs.Rate(2, per=3.0)}, max_in_flight=8)
    policy = asyncsubs.RetryPolicy(max_attempts=3)
    for obj in (limits, policy, asyncsubs.Limits()):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy == obj
        assert hash(copy) == hash(obj)


def test_webhooks_namespace_is_explicit_and_sorted() -> None:
    from asyncsubs import webhooks

    assert webhooks.__all__ == sorted(webhooks.__all__)
    # Everything else lives in the package's private modules. (pytest's assertion rewriting
    # adds "@py_..." globals to the package it loads its plugin from.)
    public = {name for name in vars(webhooks) if name.isidentifier() and name[0] != "_"}
    assert public == set(webhooks.__all__)


@pytest.mark.parametrize(
    "name",
    [
        "asyncsubs",
        "asyncsubs.json",
        "asyncsubs.limiting",
        "asyncsubs.settings",
        "asyncsubs.sync",
        "asyncsubs.testing",
    ],
)
def test_namespaces_are_explicit_and_sorted(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__, key=lambda n: (n.startswith("_"), n))
    subpackages = {"cli", "errors", "limiting", "redis", "testing", "webhooks"}
    public = {
        n
        for n, value in vars(module).items()
        if n.isidentifier() and n[0] != "_" and not isinstance(value, types.ModuleType)
    }
    assert public <= set(module.__all__) | subpackages


def test_the_limiters_parts_live_in_asyncsubs_limiting() -> None:
    # The top level holds what users of the client need; backend authors import the rest.
    import asyncsubs.limiting

    parts = {"Limiter", "PacingBackend", "MemoryPacing", "StoreLimiter"}
    assert parts | {"LimiterStats", "PoolStats"} <= set(asyncsubs.limiting.__all__)
    assert not parts & set(asyncsubs.__all__)
    assert len(asyncsubs.__all__) <= 25


def test_every_runtime_dependency_is_imported_and_every_import_declared() -> None:
    root = Path(asyncsubs.__file__).parent
    project = tomllib.loads((root.parent / "pyproject.toml").read_text())["project"]

    # Distributions imported by another name than their own.
    imported_as = {"opentelemetry_api": "opentelemetry", "opentelemetry_sdk": "opentelemetry"}

    def names(requirements: list[str]) -> set[str]:
        # "pytest-asyncio>=0.23" -> "pytest_asyncio", the name it is imported by
        found = {re.split(r"[^A-Za-z0-9_.-]", r)[0].lower().replace("-", "_") for r in requirements}
        return {imported_as.get(name, name) for name in found}

    runtime = names(project["dependencies"])
    extras = set().union(*(names(reqs) for reqs in project["optional-dependencies"].values()))
    imported = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"asyncsubs"}
    assert runtime <= third_party, "declared but never imported"
    assert third_party <= runtime | extras, "imported but not declared"


def test_the_readmes_testing_example_runs_as_written(tmp_path: Path) -> None:
    """README's test of a user's export, in a project of its own: pytest-asyncio's default
    (strict) mode, no configuration but the example's, a stand-in for the user's export."""
    import subprocess

    readme = (Path(asyncsubs.__file__).parent.parent / "README.md").read_text()
    block = re.search(
        r"```python\n((?:import pytest\n)?from asyncsubs\.testing import .*?)```", readme, re.S
    )
    assert block, "README's testing example"
    export = (
        "from asyncsubs import AdminClient\n\n"
        "async def my_export(*, base_url: str, token: str) -> None:\n"
        "    async with AdminClient(token=token, base_url=base_url) as client:\n"
        "        async for _ in client.subscriptions.list(page_size=250):\n"
        "            pass\n\n"
    )
    (tmp_path / "test_export.py").write_text(export + block[1])
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_export.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "1 passed" in run.stdout, run.stdout + run.stderr
