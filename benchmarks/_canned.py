"""Servers that are never the bottleneck: one canned page of records, a fresh cursor each time.

Each answers every request on a keep-alive connection with the same ``records``-record page of
realistic subscription records (from the fake server's data; ``small``: their scalar fields
only, ~265 bytes a record instead of ~770) and ``hasNextPage: true`` with a new
``nextCursor``, so a client paginates through it for as long as it likes.

- :func:`canned_server`: a process of its own on a bare ``asyncio.Protocol`` (uvloop when
  installed); the request line and headers are not even parsed beyond finding their end.
- :func:`nginx_server`: nginx, one worker, a temporary configuration; the page is a static
  file and ``sub_filter`` writes ``$request_id`` into its cursor, so the body goes out chunked.
- :func:`fast_server`: nginx when one is installed, else the canned server.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import orjson

from asyncsubs.testing._data import StoreData
from asyncsubs.testing._ports import free_port

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def page_prefix(records: int, *, small: bool = False) -> bytes:
    """The page body up to the cursor value: envelope, records, and ``"nextCursor":"c``."""
    counts = {"subscriptions": records, "customers": 0, "orders": 0}
    data = StoreData(seed=0, store="canned", counts=counts)["subscriptions"]
    encoded = [data.encoded_at(i) for i in range(records)]
    if small:  # the record's scalar fields: ids, status, times
        kept = (
            {k: v for k, v in orjson.loads(r).items() if not isinstance(v, dict | list)}
            for r in encoded
        )
        encoded = [orjson.dumps(record) for record in kept]
    joined = b",".join(encoded)
    return (
        b'{"success":true,"message":"OK","code":"SUCCESS","data":['
        + joined
        + b'],"pageInfo":{"hasNextPage":true,"nextCursor":"c'
    )


class _Protocol(asyncio.Protocol):
    prefix = b""
    served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:  # GETs: no body
            self.buffer = self.buffer[end + 4 :]
            _Protocol.served += 1
            body = _Protocol.prefix + str(_Protocol.served).encode() + b'"}}'
            self.transport.write(_HEAD % len(body) + body)


def _child(conn: Connection, records: int, use_uvloop: bool, small: bool) -> None:
    _Protocol.prefix = page_prefix(records, small=small)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Protocol, "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        conn.close()
        async with server:
            await server.serve_forever()

    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.run(main())
            return
    asyncio.run(main())


@contextlib.contextmanager
def canned_server(
    records: int = 100, *, use_uvloop: bool = True, small: bool = False
) -> Iterator[dict[str, Any]]:
    """Start the canned server in a spawned process; yields ``{"base_url", "pid", "name"}``."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child,
        args=(sender, records, use_uvloop, small),
        name="canned-page-server",
        daemon=True,
    )
    process.start()
    sender.close()
    try:
        if not receiver.poll(30):
            raise RuntimeError("canned server did not start within 30 s")
        port = receiver.recv()
        yield {"base_url": f"http://127.0.0.1:{port}", "pid": process.pid, "name": "canned server"}
    finally:
        receiver.close()
        process.kill()
        process.join(5)


#: Where nginx is looked for besides PATH (Debian installs it in sbin, often not on a user's PATH).
_NGINX_DIRS = ("/usr/sbin", "/usr/local/sbin")
_CURSOR_MARK = "@@cursor@@"  # in the static page; sub_filter matches it case-insensitively
_NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    server {{
        listen 127.0.0.1:{port};
        root {root}/pages;
        location / {{
            default_type application/json;
            sub_filter_types application/json;
            sub_filter '{mark}' '$request_id';
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    """The nginx executable on PATH (or in sbin), if any."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_NGINX_DIRS])
    return shutil.which("nginx", path=path)


@contextlib.contextmanager
def nginx_server(
    records: int = 100, *, binary: str | None = None, small: bool = False
) -> Iterator[dict[str, Any]]:
    """nginx serving the canned page at every path under ``/admin/2026-04/``; yields
    ``{"base_url", "pid", "name"}``. Raises RuntimeError if there is no nginx or it fails."""
    binary = binary or nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed")
    with tempfile.TemporaryDirectory(prefix="asyncsubs-nginx-") as root:
        pages = os.path.join(root, "pages", "admin", "2026-04")
        os.makedirs(pages)
        os.makedirs(os.path.join(root, "tmp"))
        with open(os.path.join(pages, "subscriptions"), "wb") as f:
            f.write(page_prefix(records, small=small) + _CURSOR_MARK.encode() + b'"}}')
        port = free_port()
        conf = os.path.join(root, "nginx.conf")
        with open(conf, "w", encoding="ascii") as f:
            f.write(_NGINX_CONF.format(root=root, port=port, mark=_CURSOR_MARK))
        log = os.path.join(root, "error.log")
        args = [binary, "-p", root, "-c", conf, "-e", log]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    with open(log, encoding="utf-8", errors="replace") as errors:
                        raise RuntimeError(f"nginx did not start: {errors.read()[-500:]}")
                time.sleep(0.05)
            name = f"nginx {_nginx_version(binary)}, one worker"
            yield {"base_url": f"http://127.0.0.1:{port}", "pid": process.pid, "name": name}
        finally:
            process.kill()
            process.wait(5)


def _nginx_version(binary: str) -> str:
    shown = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False).stderr
    return shown.strip().rpartition("/")[2] or "?"


@contextlib.contextmanager
def fast_server(records: int = 100, *, small: bool = False) -> Iterator[dict[str, Any]]:
    """:func:`nginx_server` when nginx is installed, else :func:`canned_server`."""
    if nginx_binary() is not None:
        with nginx_server(records, small=small) as server:
            yield server
    else:
        with canned_server(records, small=small) as server:
            yield server
