"""pytest plugin (``pytest11`` entry point ``asyncsubs``): the ``fake_admin_server`` fixture.

The fixtures are async, so they need pytest-asyncio; without it the plugin still loads (pytest
must not crash for projects that merely have asyncsubs installed) and the fixtures skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from asyncsubs.testing import FakeAdminServer

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - exercised only without pytest-asyncio
    pytest_asyncio = None  # type: ignore[assignment]

__all__ = ["fake_admin_server", "fake_admin_server_factory"]

#: The ``fake_admin_server`` fixture's configuration: two stores, instant, unlimited.
FIXTURE_DEFAULTS: dict[str, Any] = {"stores": 2, "latency": None, "rate_limits": None}

FakeServerFactory = Callable[..., Awaitable["FakeAdminServer"]]

if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def fake_admin_server() -> AsyncIterator[FakeAdminServer]:
        """A started ``FakeAdminServer``: stores "store-1" and "store-2", no latency, no limits."""
        from asyncsubs.testing import FakeAdminServer

        async with FakeAdminServer(**FIXTURE_DEFAULTS) as server:
            yield server

    @pytest_asyncio.fixture
    async def fake_admin_server_factory() -> AsyncIterator[FakeServerFactory]:
        """``await factory(**kwargs)`` starts a ``FakeAdminServer``; all are closed afterwards."""
        from asyncsubs.testing import FakeAdminServer

        servers: list[FakeAdminServer] = []

        async def factory(**kwargs: Any) -> FakeAdminServer:
            server = FakeAdminServer(**kwargs)
            await server.start()
            servers.append(server)
            return server

        try:
            yield factory
        finally:
            for server in reversed(servers):
                await server.aclose()

else:  # pragma: no cover

    @pytest.fixture
    def fake_admin_server() -> None:
        pytest.skip("the fake_admin_server fixture needs pytest-asyncio")

    @pytest.fixture
    def fake_admin_server_factory() -> None:
        pytest.skip("the fake_admin_server_factory fixture needs pytest-asyncio")
