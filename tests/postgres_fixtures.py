"""A real PostgreSQL server for the PostgreSQL sink's tests: one per test session, one database
per test.

``initdb`` and ``pg_ctl`` come from ``/usr/lib/postgresql/*/bin`` (Debian's ``postgresql``
package, which ``.ci/run`` installs) or ``pg_config --bindir``. PostgreSQL refuses to run as
root, so as root (CI) the cluster belongs to the ``postgres`` user (``nobody`` without one) and
the server runs as that user. Durability is off (``fsync=off``): the tests are about
transactions, not disks. Without the binaries or psycopg the tests skip locally, but fail under
CI (env ``CI`` set), where they must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from asyncsubs.testing._postgres import PostgresServer, postgres_bindir

__all__ = ["PostgresServer", "pg_url_fixture", "postgres_server_fixture"]


def _require(what: str, install: str) -> None:
    message = f"{what} is not installed ({install})"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{message}; CI must run the PostgreSQL tests", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session", name="postgres_server")
def postgres_server_fixture() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _require("psycopg", "pip install 'asyncsubs[postgres]'")
    bindir = postgres_bindir()
    if bindir is None:
        _require("PostgreSQL (initdb, pg_ctl)", "apt-get install postgresql")
    assert bindir is not None
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(name="pg_url")
def pg_url_fixture(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the session's server."""
    return postgres_server.create_database()
