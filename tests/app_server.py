"""A test's own aiohttp app on loopback, for answers FakeAdminServer does not give."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    ssl_context: ssl.SSLContext | None = None,
    **runner_kwargs: Any,
) -> AsyncIterator[str]:
    """Serve ``app`` on ``host`` at a free port until the block ends (then the app's cleanup
    runs); yields its origin, ``http://host:port`` (``https://`` with ``ssl_context``)."""
    runner = web.AppRunner(app, **runner_kwargs)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0, ssl_context=ssl_context).start()
        address, port = runner.addresses[0][:2]
        yield f"{'https' if ssl_context else 'http'}://{address}:{port}"
    finally:
        await runner.cleanup()
