"""Running a ``FakeAdminServer`` outside the caller's event loop.

Benchmarks want the server in its own process, so its CPU time does not count against the client
under test; the CLI's ``fake-server`` wants a blocking ``serve_forever``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import queue
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import attrs
import orjson

from ._limits import StoreStats
from ._server import FakeAdminServer

__all__ = ["RemoteFakeServer", "run_in_process", "serve", "serve_forever"]

_T = TypeVar("_T")


async def serve(
    *,
    ready: Callable[[FakeAdminServer], None] | None = None,
    stop: asyncio.Event | None = None,
    signals: Collection[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    make_records: bool = False,
    **server_kwargs: Any,
) -> signal.Signals | None:
    """Run a ``FakeAdminServer(**server_kwargs)`` until ``stop`` is set or one of ``signals``
    arrives (handled only in the main thread); returns that signal (None: ``stop`` was set).

    ``ready(server)`` is called once it listens (e.g. to print ``server.base_url``/tokens) and,
    with ``make_records``, once every store's records are made (``server.make_records()``, in
    slices that leave the loop a turn: a signal meanwhile stops it, without ``ready``).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def stop_on(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    installed = []
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop_on, sig)
                installed.append(sig)
    try:
        async with FakeAdminServer(**server_kwargs) as server:
            if not make_records or await _make_records(server, stop):
                if ready is not None:
                    ready(server)
                await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return received[0] if received else None


#: How long making records holds the loop at a time (``serve(make_records=True)``).
_SLICE = 0.05


async def _make_records(server: FakeAdminServer, stop: asyncio.Event) -> bool:
    """``server.make_records()``, giving the loop a turn every ``_SLICE`` seconds: millions of
    records take seconds to make, and a signal is only handled on the loop's turn. False when
    ``stop`` is set meanwhile."""
    turn = time.monotonic() + _SLICE
    for _ in server._making_records():
        if time.monotonic() >= turn:
            await asyncio.sleep(0)
            if stop.is_set():
                return False
            turn = time.monotonic() + _SLICE
    await asyncio.sleep(0)
    return not stop.is_set()


@contextlib.contextmanager
def serve_in_thread(**server_kwargs: Any) -> Iterator[FakeAdminServer]:
    """A started ``FakeAdminServer(**server_kwargs)`` on its own loop in a daemon thread, for
    tests of blocking code (a CLI run in a subprocess, a sync library); stopped on exit.

    Read-only use of the server object from the calling thread (``base_url``, ``store()``,
    ``records()``) is safe; mutate it only through its loop.
    """
    ready: queue.Queue[Any] = queue.Queue()
    control: dict[str, Any] = {}

    async def run() -> None:
        control["loop"] = asyncio.get_running_loop()
        control["stop"] = stop = asyncio.Event()
        try:
            await serve(ready=ready.put, stop=stop, **server_kwargs)
        except Exception as exc:  # raised in the caller's thread: said once, there
            ready.put(exc)
        except BaseException as exc:
            ready.put(exc)
            raise

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    server = ready.get(timeout=30)
    if isinstance(server, BaseException):
        raise server
    try:
        yield server
    finally:
        control["loop"].call_soon_threadsafe(control["stop"].set)
        thread.join(30)


def serve_forever(
    *,
    ready: Callable[[FakeAdminServer], None] | None = None,
    use_uvloop: bool = False,
    **serve_kwargs: Any,
) -> signal.Signals | None:
    """Blocking ``serve``: a fresh event loop (uvloop if asked and installed) until a signal,
    which it returns."""
    return _run(serve(ready=ready, **serve_kwargs), use_uvloop=use_uvloop)


def _run(main: Coroutine[Any, Any, _T], *, use_uvloop: bool) -> _T:
    runner: Callable[..., Any] = asyncio.run
    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            runner = uvloop.run
    result: _T = runner(main)
    return result


#: How often the server process moves what it holds out of the cyclic GC's reach.
_FREEZE_EVERY = 1.0


async def _freeze_survivors() -> None:
    """In the server's own process: ``gc.freeze()`` once a second.

    With many stores the data the server builds runs to millions of objects, and a full
    collection over them stalled the process for 100-190 ms; requests arriving meanwhile were
    stamped together afterwards, and its own sliding windows then counted them as a burst (a
    benchmark traced a round of 429s to one such stall). Frozen objects are still freed by
    reference counting; only cyclic garbage alive at a freeze would stay, which this process
    hardly makes.
    """
    while True:
        await asyncio.sleep(_FREEZE_EVERY)
        gc.freeze()


def _child(
    conn: Connection, use_uvloop: bool, make_records: bool, server_kwargs: dict[str, Any]
) -> None:
    background: set[asyncio.Task[None]] = set()

    def ready(server: FakeAdminServer) -> None:
        background.add(asyncio.get_running_loop().create_task(_freeze_survivors()))
        conn.send(("ok", server.base_url, server.version, server.tokens))

    async def main() -> None:
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        if (parent := multiprocessing.parent_process()) is not None:
            # Should the parent die without stopping this process, its sentinel (the read end
            # of a pipe only the parent writes to) reads as closed, and stays so: stop once.
            sentinel = parent.sentinel

            def parent_gone() -> None:
                loop.remove_reader(sentinel)
                stop.set()

            with contextlib.suppress(NotImplementedError):  # a loop without add_reader
                loop.add_reader(sentinel, parent_gone)
        await serve(
            ready=ready,
            stop=stop,
            signals=(signal.SIGTERM,),
            make_records=make_records,
            **server_kwargs,
        )

    # Ctrl-C in a terminal reaches every process of the foreground group, this one too. It is the
    # parent's to handle, and the parent stops this process (RemoteFakeServer.stop) when it is
    # done with it: an interrupted run can still read the server's counts meanwhile.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _run(main(), use_uvloop=use_uvloop)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


@attrs.define
class RemoteFakeServer:
    """Handle on a fake server in another process (from ``run_in_process``)."""

    base_url: str
    version: str
    tokens: Mapping[str, str]
    process: BaseProcess

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/admin/{self.version}/"

    def _control(self, method: str, path: str) -> Any:
        request = urllib.request.Request(f"{self.base_url}/_fake/{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
            return orjson.loads(response.read())

    def stats(self, store: str) -> StoreStats:
        """Counters of ``store`` (pool start times are the child's loop clock)."""
        return StoreStats.from_dict(self._control("GET", "stats")[store])

    def reset_stats(self, store: str | None = None) -> None:
        query = "" if store is None else "?" + urllib.parse.urlencode({"store": store})
        self._control("POST", f"reset-stats{query}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (graceful close), then SIGKILL after ``timeout``."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)

    def __enter__(self) -> RemoteFakeServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_in_process(
    *,
    start_timeout: float = 30.0,
    use_uvloop: bool = False,
    make_records: bool = False,
    **server_kwargs: Any,
) -> RemoteFakeServer:
    """Start ``FakeAdminServer(**server_kwargs)`` in a spawned process; returns once it listens
    (and, with ``make_records``, once every store's records are made: ``make_records()``).

    Arguments must be picklable (the config classes are). The child is spawned, not forked, so a
    script calling this needs the usual ``if __name__ == "__main__":`` guard. It ignores Ctrl-C
    (the caller's to handle) and ends when stopped or when the caller's process exits. Use as a
    context manager or call ``stop()``::

        with run_in_process(stores=4, records=100_000, rate_limits=None) as remote:
            remote.base_url, remote.tokens["store-1"]
    """
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child,
        args=(sender, use_uvloop, make_records, server_kwargs),
        name="asyncsubs-fake-server",
        daemon=True,
    )
    process.start()
    sender.close()
    try:
        if not receiver.poll(start_timeout):
            raise RuntimeError(f"fake server did not start within {start_timeout} s")
        try:
            message = receiver.recv()
        except EOFError:
            raise RuntimeError("fake server process exited before it started") from None
    except BaseException:
        process.kill()
        process.join()
        raise
    finally:
        receiver.close()
    if message[0] != "ok":
        process.join(5)
        raise RuntimeError(f"fake server failed to start: {message[1]}")
    _, base_url, version, tokens = message
    return RemoteFakeServer(base_url=base_url, version=version, tokens=tokens, process=process)
