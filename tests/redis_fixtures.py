"""A real ``redis-server`` for the Redis limiter's tests, on a free loopback port.

Import the fixtures into a test module (``from redis_fixtures import redis_server_fixture``);
they are registered under their ``name=`` (``redis_server``, ``own_redis_server``), so that
test arguments of those names do not shadow the imports. Without a
``redis-server`` binary the tests skip locally but fail under CI (env ``CI`` set), where
``.ci/run`` installs it and the tests must run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsubs.testing import _ports

__all__ = [
    "RedisServer",
    "free_port",
    "own_redis_server_fixture",
    "redis_cluster_fixture",
    "redis_cluster_node_fixture",
    "redis_server_fixture",
    "require_redis_server",
    "start_redis_server",
]

#: How long a starting redis-server may take to answer PING.
START_TIMEOUT = 10.0


def free_port(below: int = 65536) -> int:
    """A loopback TCP port under ``below`` that nothing listens on now, and that a server
    restarted on it finds free again (``asyncsubs.testing._ports``)."""
    while (port := _ports.free_port()) >= below:
        continue
    return port


def _command(port: int, command: bytes) -> bytes:
    """One inline command, its reply's first 4 kB (b"" when the server is not there yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(command)
            return sock.recv(4096)
    except OSError:
        return b""


def _pong(port: int) -> bool:
    return _command(port, b"PING\r\n").startswith(b"+PONG")


def require_redis_server() -> str:
    """The redis-server binary; skips without it, or fails when running under CI."""
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{message}; CI must run the Redis limiter tests", pytrace=False)
        pytest.skip(message)
    return binary


class RedisServer:
    """A ``redis-server`` subprocess without persistence; ``stop()``/``start()`` keep the port."""

    def __init__(
        self, binary: str, port: int | None = None, *, cluster_dir: Path | None = None
    ) -> None:
        self.binary = binary
        # A cluster node also listens on its port + 10000, so Redis refuses ports above 55535.
        self.port = free_port(below=55536 if cluster_dir else 65536) if port is None else port
        #: Set: a one-node Redis Cluster holding every slot (its config file lives there).
        self.cluster_dir = cluster_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        # --save '' and --appendonly no: nothing on disk; the data dies with the process.
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no"]
        if self.cluster_dir is not None:
            config = self.cluster_dir / f"nodes-{self.port}.conf"
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(config)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.cluster_dir
        )
        # Bounded retries: waiting for a process to start serving, not synchronising tests.
        deadline = time.monotonic() + START_TIMEOUT
        while not _pong(self.port):
            self._check_alive(deadline)
        if self.cluster_dir is not None:
            _command(self.port, b"CLUSTER ADDSLOTSRANGE 0 16383\r\n")

    def wait_cluster_ok(self) -> None:
        """A new cluster node accepts writes only ~2 s after it started (Redis's own delay)."""
        deadline = time.monotonic() + START_TIMEOUT
        while b"cluster_state:ok" not in _command(self.port, b"CLUSTER INFO\r\n"):
            self._check_alive(deadline)

    def _check_alive(self, deadline: float) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.process.returncode}")
        if time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"redis-server was not ready within {START_TIMEOUT} s")
        time.sleep(0.01)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_redis_server(binary: str, *, cluster_dir: Path | None = None) -> RedisServer:
    # The free port may be taken between the check and redis-server's bind: try a few.
    for attempt in range(3):
        server = RedisServer(binary, cluster_dir=cluster_dir)
        try:
            server.start()
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        return server
    raise AssertionError("unreachable")


@pytest.fixture(scope="session", name="redis_server")
def redis_server_fixture() -> Iterator[RedisServer]:
    """One redis-server for the whole session; tests keep apart by key prefix."""
    server = start_redis_server(require_redis_server())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="own_redis_server")
def own_redis_server_fixture() -> Iterator[RedisServer]:
    """A redis-server for one test, which may stop and restart it (same port)."""
    server = start_redis_server(require_redis_server())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", name="redis_cluster_node")
def redis_cluster_node_fixture(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisServer | None]:
    """A one-node Redis Cluster holding all 16384 slots, started but maybe not ready yet.

    Request it early (``usefixtures``) so that Redis's start-up delay passes while other tests
    run; ``redis_cluster`` then waits for what is left. None without a redis-server binary.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    server = start_redis_server(binary, cluster_dir=tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="redis_cluster")
def redis_cluster_fixture(redis_cluster_node: RedisServer | None) -> RedisServer:
    """The one-node Redis Cluster, ready for writes."""
    require_redis_server()
    assert redis_cluster_node is not None
    redis_cluster_node.wait_cluster_ok()
    return redis_cluster_node
