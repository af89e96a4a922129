"""The command line: ``pull``, errors and exit codes, ``demo``, ``fake-server``.

The fake server runs on its own event loop in a thread, so ``main([...])`` runs in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import pickle
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest

from asyncsubs import AdminClient, Rate
from asyncsubs.__main__ import main
from asyncsubs.cli._checkpoint import PullCheckpoint
from asyncsubs.cli._common import CommandFailed
from asyncsubs.cli._display import LIVE_HEADERS, live_row, progress_line
from asyncsubs.cli._fake_server import env_name
from asyncsubs.cli._progress import Progress
from asyncsubs.limiting import PoolStats
from asyncsubs.stores import Retrying, UnitStarted, load_config
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, ServerRateLimits, serve_in_thread

TOKEN_ENV = "ASYNCSUBS_TOKEN"
BASE_URL_ENV = "ASYNCSUBS_BASE_URL"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeAdminServer]:
    stores = [FakeStoreConfig("acme", records=137), FakeStoreConfig("globex", records=20)]
    with serve_in_thread(stores=stores, rate_limits=None) as srv:
        yield srv


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(BASE_URL_ENV, raising=False)


def pull_args(server: FakeAdminServer, *extra: str, store: str = "acme") -> list[str]:
    token = server.store(store).token
    url = server.base_url
    return [
        "pull",
        "--base-url",
        url,
        "--token",
        token,
        "--store",
        store,
        "--rate",
        "1000/s",
        *extra,
    ]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("asyncsubs: error: ")]


# ---------------------------------------------------------------------------------------------
# pull


@pytest.mark.parametrize("resource", ["subscriptions", "customers", "orders"])
def test_pull_to_file_writes_every_record_exactly(
    server: FakeAdminServer, tmp_path: Path, resource: str
) -> None:
    out = tmp_path / "out.jsonl"
    args = pull_args(server, resource, "--page-size", "20", "-o", str(out), "--quiet")
    assert main(args) == 0
    expected = server.records("acme", resource)
    lines = out.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every line ends with a newline
    records = [orjson.loads(line) for line in lines[:-1]]
    assert [r["id"] for r in records] == [r["id"] for r in expected]
    assert len({r["id"] for r in records}) == 137
    assert records == expected
    # As received: the server serves orjson bytes of the same records.
    assert lines[:-1] == [orjson.dumps(r) for r in expected]


def test_pull_reads_token_and_url_from_the_environment(
    server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv(TOKEN_ENV, server.store("globex").token)
    monkeypatch.setenv(BASE_URL_ENV, server.base_url)
    assert main(["pull", "orders", "--limit", "7", "--page-size", "5", "--rate", "100/s"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [orjson.loads(line) for line in lines] == server.records("globex", "orders")[:7]
    assert "7 orders in 2 pages" in captured.err


def test_pull_after_cursor_continues_after_that_page(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    async def first_cursor() -> str:
        token = server.store("acme").token
        async with AdminClient(token=token, base_url=server.base_url) as client:
            async for page in client.customers.list(page_size=50, model=dict).pages():
                assert page.next_cursor is not None
                return page.next_cursor
        raise AssertionError("no page")

    cursor = asyncio.run(first_cursor())
    out = tmp_path / "rest.jsonl"
    assert main(pull_args(server, "customers", "--after-cursor", cursor, "-o", str(out), "-q")) == 0
    ids = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert ids == [r["id"] for r in server.records("acme", "customers")[50:]]


def page_cursors(server: FakeAdminServer, resource: str, page_size: int) -> list[str]:
    """The cursor after each page but the last."""

    async def cursors() -> list[str]:
        token = server.store("acme").token
        async with AdminClient(token=token, base_url=server.base_url) as client:
            call = getattr(client, resource).list(page_size=page_size, model=dict)
            return [str(page.next_cursor) async for page in call.pages() if page.next_cursor]

    return asyncio.run(cursors())


def versioned_base(server: FakeAdminServer) -> str:
    """The base URL a pull's checkpoint names: the client's, version included."""
    return AdminClient(token="t", base_url=server.base_url).base_url


def fingerprint(server: FakeAdminServer, store: str) -> str:
    """The credentials a pull's checkpoint names: the client's one-way fingerprint."""
    return AdminClient(token=server.store(store).token, base_url=server.base_url).fingerprint


def jsonl(records: Sequence[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def test_pull_rerun_continues_from_the_checkpoint_and_cuts_a_partial_page(
    server: FakeAdminServer, tmp_path: Path, capsys: Any
) -> None:
    # What a pull killed after writing its first page, and part of a second one, leaves.
    out = tmp_path / "customers.jsonl"
    expected = server.records("acme", "customers")
    first = jsonl(expected[:50])
    out.write_bytes(first + orjson.dumps(expected[50])[:7])
    checkpoint = PullCheckpoint(
        resource="customers",
        base_url=versioned_base(server),
        credentials=fingerprint(server, "acme"),
        after_cursor=None,
        cursor=page_cursors(server, "customers", 50)[0],
        offset=len(first),
        records=50,
        pages=1,
    )
    checkpoint.save(out)
    assert main(pull_args(server, "customers", "-o", str(out))) == 0
    assert out.read_bytes() == jsonl(expected)
    assert not PullCheckpoint.path_for(out).exists()  # complete: nothing left to continue
    assert "137 customers in 2 pages" in capsys.readouterr().err
    # A different command on the same file does not continue someone else's checkpoint.
    checkpoint.save(out)
    assert main(pull_args(server, "orders", "-o", str(out))) == 2
    assert "pass --restart to start over" in capsys.readouterr().err
    assert main(pull_args(server, "orders", "-o", str(out), "--restart", "-q")) == 0
    assert out.read_bytes() == jsonl(server.records("acme", "orders"))
    assert not PullCheckpoint.path_for(out).exists()
    # Nor one of another store behind the same URL: the token chooses the store.
    checkpoint.save(out)
    assert main(pull_args(server, "customers", "-o", str(out), store="globex")) == 2
    err = capsys.readouterr().err
    assert "with another token; pass --restart to start over" in err
    assert server.store("globex").token not in err
    assert server.store("acme").token not in PullCheckpoint.path_for(out).read_text()


def test_pull_into_a_directory_that_does_not_exist_says_so(
    server: FakeAdminServer, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "no" / "such.jsonl"
    assert main(pull_args(server, "orders", "-o", str(out), "-q")) == 2
    assert f"cannot write {out}: no such directory" in capsys.readouterr().err


def test_pull_to_a_file_it_could_not_resume_is_a_usage_error_before_any_request(
    server: FakeAdminServer, tmp_path: Path, capsys: Any
) -> None:
    """A pipe cannot be cut back to whole pages, a checkpoint needs its directory, and a file
    needs a name: each fails before a request, not after the first page, and not with FILE
    truncated."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that opening it to write returns
    readonly = tmp_path / "ro"
    readonly.mkdir()
    kept = readonly / "out.jsonl"
    kept.write_text("kept\n")
    readonly.chmod(0o555)
    before = len(server.requests)
    try:
        cases = [
            (fifo, "cannot seek"),
            (kept, "out.jsonl.asyncsubs-checkpoint: Permission denied"),
            (Path("."), "not a file name"),
        ]
        for out, said in cases:
            if out is kept and os.access(readonly, os.W_OK):
                continue  # root with CAP_DAC_OVERRIDE writes anyway
            assert main(pull_args(server, "orders", "-o", str(out), "-q")) == 2, out
            assert said in capsys.readouterr().err
    finally:
        readonly.chmod(0o755)
        os.close(reader)
    assert kept.read_text() == "kept\n"
    assert len(server.requests) == before


@pytest.mark.parametrize("damage", [{"offset": "12"}, {"offset": -5}, {"cursor": 7}])
def test_a_damaged_checkpoint_is_said_so(
    server: FakeAdminServer, tmp_path: Path, capsys: Any, damage: dict[str, Any]
) -> None:
    out = tmp_path / "orders.jsonl"
    assert main(pull_args(server, "orders", "-o", str(out), "-q", "--limit", "5")) == 0
    checkpoint = PullCheckpoint.path_for(out)
    saved = {
        "resource": "orders",
        "base_url": server.base_url,
        "credentials": "x",
        "after_cursor": None,
        "cursor": "c",
        "offset": 0,
        "records": 0,
        "pages": 0,
    }
    checkpoint.write_bytes(orjson.dumps({**saved, **damage}))
    assert main(pull_args(server, "orders", "-o", str(out), "-q")) == 2
    assert "is not a pull checkpoint; remove it or pass --restart" in capsys.readouterr().err


def test_pull_after_a_cursor_to_a_file_resumes_by_rerunning_it_too(
    server: FakeAdminServer, tmp_path: Path, capsys: Any
) -> None:
    after_first, after_second = page_cursors(server, "orders", 50)
    expected = server.records("acme", "orders")
    out = tmp_path / "orders.jsonl"
    out.write_bytes(jsonl(expected[50:100]))  # the first page after --after-cursor
    checkpoint = PullCheckpoint(
        resource="orders",
        base_url=versioned_base(server),
        credentials=fingerprint(server, "acme"),
        after_cursor=after_first,
        cursor=after_second,
        offset=out.stat().st_size,
        records=50,
        pages=1,
    )
    checkpoint.save(out)
    assert main(pull_args(server, "orders", "-o", str(out), "-q")) == 2  # not the same command
    assert "after another cursor; pass --restart" in capsys.readouterr().err
    assert main(pull_args(server, "orders", "--after-cursor", after_first, "-o", str(out))) == 0
    assert out.read_bytes() == jsonl(expected[50:])


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_stopped_pull_to_a_file_resumes_by_rerunning_it(tmp_path: Path, how: str) -> None:
    stores = [FakeStoreConfig("slow", records=400)]
    with serve_in_thread(stores=stores, rate_limits=None, latency=0.01) as server:
        out = tmp_path / "subs.jsonl"
        command = [
            *(sys.executable, "-m", "asyncsubs", "pull", "subscriptions"),
            *("--base-url", server.base_url, "--token", server.store("slow").token),
            *("--page-size", "10", "--rate", "1000/s", "-o", str(out)),
        ]
        proc = subprocess.Popen(command, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60.0  # the one bounded wait: until some pages
            while time.monotonic() < deadline:  # are checkpointed (slow on a busy machine)
                saved = PullCheckpoint.load(out)
                if (saved is not None and saved.records >= 100) or proc.poll() is not None:
                    break
                time.sleep(0.01)
            proc.send_signal(getattr(signal, how))
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        saved = PullCheckpoint.load(out)
        assert saved is not None, "the pull finished before it was stopped"
        if how != "SIGKILL":
            assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[how]
            assert b"rerun the same command to continue" in err
        rerun = subprocess.run(command, capture_output=True, timeout=60, check=False)
        assert rerun.returncode == 0, rerun.stderr.decode()
        expected = server.records("slow", "subscriptions")
        assert out.read_bytes() == jsonl(expected)
        assert f"{saved.records:,} records of them before resuming".encode() in rerun.stderr
        assert not PullCheckpoint.path_for(out).exists()


# ---------------------------------------------------------------------------------------------
# Errors: exit code and one line, no traceback


def test_bad_token_exits_1_with_one_line(server: FakeAdminServer, capsys: Any) -> None:
    args = ["pull", "subscriptions", "--base-url", server.base_url, "--token", "wrong"]
    assert main([*args, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1
    (line,) = error_lines(err)
    assert "subscriptions" in line
    assert "HTTP 401" in line
    assert "Settings > API Tokens" in line
    assert "wrong" not in line  # the token is never echoed


def test_bad_token_in_sync_names_store_and_resource(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\n'
        f'[stores.globex]\nbase_url = "{server.base_url}"\ntoken_env = "G"\n'
        'resources = ["orders"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", "revoked-token")
    monkeypatch.setenv("G", server.store("globex").token)
    db = tmp_path / "s.db"
    assert main(["sync", "--config", str(config), "--db", str(db), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = error_lines(err)
    assert len(lines) == len(err.splitlines()) == 3
    for resource, line in zip(["subscriptions", "customers", "orders"], lines, strict=True):
        assert line.startswith(f"asyncsubs: error: store acme, {resource}: AuthenticationError: ")
    # The other store is not held back by one store's failure.
    with contextlib.closing(sqlite3.connect(db)) as conn:
        count = conn.execute("SELECT count(*) FROM orders WHERE store = 'globex'").fetchone()[0]
    assert count == 20


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_unreachable_server_exits_1_with_one_line(capsys: Any) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    args = ["pull", "orders", "--base-url", url, "--token", "t", "--max-attempts", "1"]
    assert main([*args, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = error_lines(err)
    assert "orders: TransportError: GET orders: " in line


def test_sync_with_redis_down_says_so_in_its_own_lines_and_falls_back_when_told(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    """Redis refusing connections: every line on stderr is the command's own (with --quiet,
    the one error), the failure names the setting a command-line user has, and
    ``--redis-fallback`` gets the sync done, saying so once."""
    pytest.importorskip("redis")
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n',
        encoding="utf-8",
    )
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        redis = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        runs = []
        for options in (("-q",), ("--redis-fallback", "0.5", "--progress", "plain")):
            command = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config)]
            command += ["--db", str(tmp_path / f"s{len(runs)}.db"), "--redis", redis]
            runs.append(
                subprocess.run(
                    [*command, *options],
                    env={**os.environ, "A": server.store("acme").token},
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            )
    failed, fell_back = runs
    assert failed.returncode == 1, failed.stderr
    assert fell_back.returncode == 0, fell_back.stderr
    (error,) = failed.stderr.splitlines()
    assert error.startswith("asyncsubs: error: store acme, orders: LimiterUnavailableError: ")
    assert "config key redis_fallback" in error
    lines = fell_back.stderr.splitlines()
    assert all(line.startswith(("[", "asyncsubs: ")) for line in lines), fell_back.stderr
    (warning,) = [line for line in lines if line.startswith("asyncsubs: ")]
    assert warning.startswith("asyncsubs: warning: Redis rate limiter at redis://127.0.0.1:")
    assert "paced in this process alone at 50% of each rate" in warning
    with contextlib.closing(sqlite3.connect(tmp_path / "s1.db")) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 137


def test_debug_shows_the_traceback(capsys: Any) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    args = ["pull", "orders", "--base-url", url, "--token", "t", "--max-attempts", "1"]
    assert main([*args, "--debug", "--quiet"]) == 1
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pull", "refunds", "--base-url", "https://x.example", "--token", "t"], "invalid choice"),
        (
            ["pull", "orders", "--base-url", "https://x.example"],
            "token is required (or set ASYNCSUBS_TOKEN)",
        ),
        (["pull", "orders", "--token", "t"], "base_url is required (or set ASYNCSUBS_BASE_URL)"),
        (["pull", "orders", "--base-url", "http://x.example", "--token", "t"], "plain http://"),
        (  # not the plain-http hint: --allow-insecure would not make this pass
            ["pull", "orders", "--base-url", "http://x.example", "--token", " t"],
            "token has leading or trailing whitespace",
        ),
        (
            ["pull", "orders", "--token", "t", "--base-url", "https://x", "--api-version", "a/b"],
            "version must look like '2026-04', got 'a/b'",
        ),
        (["pull", "orders", "--base-url", "https://x.example", "--token", "t", "--limit", "0"], ""),
        (["sync", "--config", "missing.toml", "--db", "x.db"], "cannot read the config file"),
        (
            ["sync", "--config", "missing.toml", "--db", "mysql://h/db"],
            "or PostgreSQL (postgresql://",
        ),
        (
            ["pull", "orders", "--base-url", "http://[::1:19100", "--token", "t"],
            "asyncsubs: error: base_url is not a valid URL (check the port, 1-65535, and any "
            "[IPv6] brackets): got 'http://[::1:19100'",
        ),
        (
            ["pull", "orders", "--base-url", "http://127.0.0.1:notaport", "--token", "t"],
            "asyncsubs: error: base_url is not a valid URL (check the port",
        ),
        (
            ["pull", "orders", "--base-url", "https://x.example", "--token", "t", "--rate", "-1/s"],
            "argument --rate: a rate looks like",
        ),
        (
            ["pull", "orders", "--base-url", "http://x.example", "--token", "t"],
            "use https:// (or --allow-insecure on a trusted network)",
        ),
        (
            ["sync", "--config", "missing.toml", "--db", "sqlite://rel.db"],
            "three slashes before a relative path (sqlite:///rel.db)",
        ),
        (
            ["pull", "orders", "--base-url", "https://acme..subs.example", "--token", "t"],
            "base_url's host is not a host name",
        ),
        (["fake-server", "--port", "70000"], "argument --port: expected a port, 0-65535"),
        (["fake-server", "--latency-ms", "inf"], "argument --latency-ms: expected a number >= 0"),
        (["fake-server", "--latency-ms", "-5"], "argument --latency-ms: expected a number >= 0"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_usage_and_config_errors_exit_2(args: list[str], message: str, capsys: Any) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["sync", "--config", "s.toml", "--db", "x.db", "--token", "T"], "--token ..."),
        (["pull", "orders", "--tokn=T", "--base-url", "https://x.example"], "--tokn=..."),
        (["sync-status", "--db", "x.db", "T"], "..."),
        (["sync", "--config", "s.toml", "--db", "x.db", "-tT"], "-t..."),
        (["sync", "--config", "s.toml", "--db", "x.db", "--token", "-T"], "--token -t..."),
    ],
)
def test_arguments_no_command_takes_are_named_without_their_values(
    args: list[str], shown: str, capsys: Any
) -> None:
    """A token given to a command that reads tokens from the environment, or after a mistyped
    option, is not repeated on stderr (which CI logs keep)."""
    token = "tok-0123456789-secret"
    assert main([arg.replace("T", token) if "T" in arg else arg for arg in args]) == 2
    err = capsys.readouterr().err
    assert f"asyncsubs: error: unrecognized arguments: {shown} (values not shown)\n" in err
    assert token not in err


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--re=T", "ambiguous option: --re=... could match --redis, --redis-fallback"),
        ("--quiet=T", "argument -q/--quiet: ignored explicit argument\n"),
    ],
)
def test_argparse_own_errors_do_not_quote_a_value(given: str, said: str, capsys: Any) -> None:
    secret = "redis://:pw-0123456789@cache.internal"
    assert main(["sync", "--config", "s.toml", "--db", "x.db", given.replace("T", secret)]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "pw-0123456789" not in err


def test_a_failed_command_pickles_with_its_lines_and_code() -> None:
    failed = CommandFailed(["store acme: failed", "store globex: failed"], 3)
    again = pickle.loads(pickle.dumps(failed))
    assert (str(again), again.lines, again.code) == (str(failed), failed.lines, 3)
    assert str(again) == "store acme: failed; store globex: failed"


def test_help_and_version(capsys: Any) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("asyncsubs ")
    assert main(["sync", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--config" in help_text
    assert "stores synced at once (default: 32)" in help_text
    assert main(["pull", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: the largest page the server serves, learned while pulling" in help_text
    assert "seconds per attempt (default: 30.0)" in help_text
    assert "(default: None)" not in help_text
    # fake-server shows no progress, so it offers no progress options.
    assert main(["fake-server", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--debug" in help_text
    assert "--progress" not in help_text
    assert "--quiet" not in help_text


def test_progress_rich_without_rich_exits_2_with_the_install_hint(
    server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr("asyncsubs.cli._display.rich_available", lambda: False)
    server.clear_requests()
    assert main(pull_args(server, "orders", "--progress", "rich")) == 2
    assert capsys.readouterr().err == (
        "asyncsubs: error: --progress rich needs the rich package: pip install 'asyncsubs[cli]'\n"
    )
    assert server.requests == []


def test_interrupted_run_shows_interrupted_in_the_live_tables_last_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    from asyncsubs.cli._common import CommandFailed, Runner
    from asyncsubs.cli._output import Output

    pytest.importorskip("rich")
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    args = argparse.Namespace(progress_interval=1.0, verbose=False)
    runner = Runner(args, Output(), mode="rich")
    runner.progress.add("acme", "orders")

    async def stopped_by_ctrl_c() -> None:
        runner.progress(UnitStarted("acme", "orders", False, 0, Rate(1)))
        raise KeyboardInterrupt

    with pytest.raises(CommandFailed) as info:
        runner.run(stopped_by_ctrl_c)
    assert info.value.code == 130
    last_frame = stream.getvalue().strip().splitlines()
    (line,) = [x for x in last_frame if x.startswith("acme ")]
    assert "interrupted" in line
    assert "running" not in line


def test_a_signal_after_the_work_is_done_does_not_say_interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM as the display draws its last frame: the pull is whole and its checkpoint gone,
    so exit 143 ("rerun to resume") would have a rerun start it over."""
    import argparse
    import contextlib

    from asyncsubs.cli import _common
    from asyncsubs.cli._common import Runner
    from asyncsubs.cli._output import Output

    @contextlib.asynccontextmanager
    async def last_frame_meets_sigterm(*args: Any, **kwargs: Any) -> AsyncIterator[None]:
        yield
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # what the SIGTERM handler does
        await asyncio.sleep(0)

    monkeypatch.setattr(_common, "show_progress", last_frame_meets_sigterm)
    args = argparse.Namespace(progress_interval=1.0, verbose=False)
    finished = []

    async def work() -> None:
        finished.append(True)

    Runner(args, Output(), mode="plain").run(work)  # returns: no CommandFailed
    assert finished == [True]


def test_plain_progress_prints_a_failure_once(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", "revoked-token")
    args = ["sync", "--config", str(config), "--db", str(tmp_path / "s.db"), "--progress", "plain"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("AuthenticationError") == 1, err
    assert re.search(r"^\[\s*[\d.]+s\] acme/orders: FAILED: AuthenticationError: ", err, re.M)


def test_demo_with_a_database_that_is_not_sqlite_prints_no_summary(
    tmp_path: Path, capsys: Any
) -> None:
    db = tmp_path / "notdb.db"
    db.write_text("not a database " * 100)
    assert main(["demo", "--quick", "--stores", "1", "--db", str(db)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"asyncsubs: error: database {db}: ")


# ---------------------------------------------------------------------------------------------
# demo and fake-server


def test_demo_without_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("CI", "true")
    db = tmp_path / "demo.db"
    args = ["demo", "--stores", "2", "--records", "300", "--db", f"sqlite:///{db}"]
    assert main([*args, "--progress-interval", "0.2"]) == 0
    captured = capsys.readouterr()
    assert "\x1b[" not in captured.out + captured.err
    # acme-coffee serves 500 records a page: one page; globex-pets refuses more than 250: a
    # page size learned from two 400s and one more past it, then two pages.
    assert "acme-coffee/orders: done, 300 records in 1 page" in captured.err
    assert re.search(r"globex-pets/orders: .*250 records/page", captured.err)
    out = captured.out
    assert "asyncsubs demo: records per store and resource" in out
    assert re.search(r"^globex-pets\s+customers\s+300\s+300\s+5\s+0\s", out, re.M)
    assert "1,800 records, 18 requests, 0 429s" in out
    for line in out.splitlines():  # the server never lets its window hold more
        if peak := re.search(r" (\d+)/(\d+) ", line):
            assert int(peak[1]) <= int(peak[2]), line
    assert f"database: kept at {db}" in out
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM subscriptions").fetchone()[0] == 600


def test_demo_table_learns_no_untried_raise_and_counts_as_the_server_does(
    capsys: Any,
) -> None:
    """A pool whose last raise was never tried learned the rate that ran clean; the allowed
    rate says how the server's window counts, and the peak counts the same way."""
    from asyncsubs.cli._demo import DEMO_STORES, _PoolReport, _summary

    store = DEMO_STORES[2]  # initech-razors: subscriptions 3 per 2 s, a leaky bucket
    assert (store.window, store.heavy["subscriptions"]) == ("leaky", Rate(3, per=2))
    progress = Progress()
    row = progress.add(store.name, "subscriptions")
    row.stats = PoolStats(requests=12, rate=4.0, rate_by="probe", good=2.0)
    reports = {(store.name, "subscriptions"): _PoolReport(achieved=1.6, peak=3)}
    _summary([store], progress, reports, elapsed=8.0, startup=1.0, remembered=[])
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith(store.name)]
    cells = re.split(r"\s{2,}", line)
    assert cells[5:9] == ["1.60", "2.00", "1.50 (3/2s leaky)", "3/3"], line
    assert "4.00" not in line
    assert "leaky: a bucket of n refilled at n per window" in out


@attrs.frozen
class FakeServerRun:
    """A ``fake-server`` process and what it printed."""

    base_url: str
    tokens: Mapping[str, str]
    printed: Sequence[str]
    #: Its stores.toml, saved, and the token variables that go with it.
    config: Path
    env: Mapping[str, str]


@contextlib.contextmanager
def fake_server_process(tmp_path: Path, *args: str) -> Iterator[FakeServerRun]:
    """``asyncsubs fake-server --port 0 ARGS`` as a user starts it; stopped with Ctrl-C (exit
    code 0 checked) when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncsubs", "fake-server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline()]
        assert printed[0].startswith("fake admin server on "), printed[0]
        tokens = {}
        while not printed[-1].startswith("asyncsubs sync "):
            printed.append(proc.stdout.readline())
            if found := re.match(r"store (\S+): token (\S+)$", printed[-1]):
                tokens[found[1]] = found[2]
        last_env = f'token_env = "{env_name(list(tokens)[-1])}"'
        while not printed[-1].startswith(last_env):
            printed.append(proc.stdout.readline())
        config = tmp_path / "stores.toml"
        config.write_text("".join(printed[printed.index("[defaults]\n") :]), encoding="utf-8")
        env = {env_name(name): token for name, token in tokens.items()}
        (base_url,) = [x.split("=", 1)[1].strip() for x in printed if "ASYNCSUBS_BASE_URL=" in x]
        yield FakeServerRun(base_url, tokens, printed, config, env)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


def test_fake_server_prints_urls_and_tokens_and_serves(tmp_path: Path) -> None:
    with fake_server_process(tmp_path, "--records", "5") as run:
        assert set(run.tokens) == {"store-1", "store-2"}
        pull_line = next(x for x in run.printed if x.startswith("asyncsubs pull "))
        assert pull_line.endswith(" --rate 2/1s\n")  # the server's pool: 2 requests per second
        configs = load_config(run.config, run.env)
        assert [c.store for c in configs] == ["store-1", "store-2"]
        for config in configs:  # what the server enforces and serves
            assert config.page_size == 250
            assert config.limits.global_rate == ServerRateLimits().global_rate
            assert dict(config.limits.heavy) == dict(ServerRateLimits().heavy)
        out = tmp_path / "subs.jsonl"
        args = ["pull", "subscriptions", "--base-url", run.base_url]
        assert main([*args, "--token", run.tokens["store-2"], "-o", str(out), "-q"]) == 0
        assert len(out.read_bytes().splitlines()) == 5


def test_fake_server_on_every_interface_prints_what_works_when_pasted(tmp_path: Path) -> None:
    """``--host 0.0.0.0``: the printed pull and sync commands, pasted into a shell as they
    are, reach it (on loopback: plain http elsewhere would be refused)."""
    with fake_server_process(tmp_path, "--host", "0.0.0.0", "--records", "5") as run:
        assert run.base_url.startswith("http://127.0.0.1:")
        assert "from another, http://THIS-HOST:" in run.printed[0]
        pull = run.printed.index(next(x for x in run.printed if x.startswith("# pull from ")))
        sync = run.printed.index("[defaults]\n")
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        pasted = subprocess.run(
            ["bash", "-euc", "".join(run.printed[pull:sync])],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert pasted.returncode == 0, pasted.stderr
        records = [x for x in pasted.stdout.splitlines() if x.startswith("{")]
        assert len(records) == 5  # the pull's
        with contextlib.closing(sqlite3.connect(tmp_path / "fake.db")) as conn:
            assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 10


def test_fake_server_off_loopback_prints_plain_http_allowed() -> None:
    from asyncsubs.cli._fake_server import paste_url

    assert paste_url("0.0.0.0", 80) == ("http://127.0.0.1:80", False)
    assert paste_url("::", 80) == ("http://[::1]:80", False)
    assert paste_url("127.0.0.1", 80) == ("http://127.0.0.1:80", False)
    assert paste_url("192.0.2.7", 80) == ("http://192.0.2.7:80", True)


def first_sync_429s(tmp_path: Path, stores: int) -> int:
    """The 429s the first ``sync`` of a just-started ``fake-server --stores N`` draws, with the
    stores.toml it prints: the new user's path of issue 15, item 6."""
    with fake_server_process(tmp_path, "--stores", str(stores)) as run:
        db = tmp_path / "fake.db"
        sync = subprocess.run(
            [
                *(sys.executable, "-m", "asyncsubs", "sync", "--config", str(run.config)),
                *("--db", str(db), "--log-format", "json"),
            ],
            env={**os.environ, **run.env},
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert sync.returncode == 0, sync.stderr.decode()
        done = [orjson.loads(line) for line in sync.stderr.splitlines()]
        done = [event for event in done if event["event"] == "done"]
        assert len(done) == 3 * stores
        return sum(int(event["rate_limited"]) for event in done)


def test_first_sync_of_a_fresh_fake_server_draws_no_429s(tmp_path: Path) -> None:
    assert first_sync_429s(tmp_path, stores=20) == 0


def test_cli_uses_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncsubs.cli._common import event_loop_factory

    uvloop = pytest.importorskip("uvloop")
    assert event_loop_factory() is uvloop.new_event_loop
    monkeypatch.setenv("ASYNCSUBS_LOOP", "asyncio")
    assert event_loop_factory() is None


def test_pull_writes_integers_beyond_64_bits_exactly(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    page = (
        b'{"success": true, "data": [{"id": 18446744073709551617}, {"id": 18446744073709551618}],'
        b' "pageInfo": {"hasNextPage": false}}'
    )
    server.enqueue(200, page, path="orders")
    out = tmp_path / "orders.jsonl"
    try:
        assert main(pull_args(server, "orders", "-o", str(out), "-q")) == 0
    finally:
        server.clear_scripted()
    assert out.read_bytes() == b'{"id":18446744073709551617}\n{"id":18446744073709551618}\n'


def test_api_version_of_the_flag_or_the_config_key_is_the_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = [FakeStoreConfig("acme", records=30)]
    with serve_in_thread(stores=stores, rate_limits=None, version="2027-01") as server:
        out = tmp_path / "o.jsonl"
        # Without it, the client's version: a path this server does not serve.
        assert main(pull_args(server, "orders", "-o", str(out), "-q", "--max-attempts", "1")) == 1
        args = pull_args(server, "orders", "-o", str(out), "-q", "--api-version", "2027-01")
        assert main(args) == 0
        assert len(out.read_bytes().splitlines()) == len(server.records("acme", "orders"))
        config = tmp_path / "stores.toml"
        config.write_text(
            f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\n'
            'version = "2027-01"\nresources = ["orders"]\n'
            '[defaults.limits]\nheavy = { orders = "1000/s" }\n',
            encoding="utf-8",
        )
        monkeypatch.setenv("A", server.store("acme").token)
        assert main(["sync", "--config", str(config), "--db", str(tmp_path / "s.db"), "-q"]) == 0
        paths = {r.path for r in server.requests}
    assert "/admin/2027-01/orders" in paths


def test_pull_and_sync_ask_for_the_largest_page_unless_a_size_is_set(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.clear_requests()
    assert main(pull_args(server, "orders", "-o", str(tmp_path / "o.jsonl"), "-q")) == 0
    assert (
        main(
            pull_args(server, "orders", "-o", str(tmp_path / "p.jsonl"), "-q", "--page-size", "100")
        )
        == 0
    )
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n'
        '[defaults.limits]\nheavy = { orders = "1000/s" }\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", server.store("acme").token)
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "s.db"), "-q"]) == 0
    with config.open("a", encoding="utf-8") as f:
        f.write("[defaults]\npage_size = 100\n")
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "t.db"), "-q"]) == 0
    sizes = [r.query.get("pageSize") for r in server.requests]
    # The largest page first (137 records: one page), a fixed size as set (two pages).
    assert sizes == ["1000", "100", "100", "1000", "100", "100"]


# ---------------------------------------------------------------------------------------------
# While retrying: the last error's reason; -v; --log-format json


def test_retries_show_their_reason_and_json_lines_carry_every_event(capsys: Any) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    args = ["pull", "orders", "--base-url", url, "--token", "t", "--max-attempts", "3"]
    args += ["--rate", "1000/s"]  # retries are paced like any request
    assert main([*args, "--log-format", "json", "-v"]) == 1
    err = capsys.readouterr().err
    events = [orjson.loads(line) for line in err.splitlines()]  # every line is one JSON object
    assert [e["event"] for e in events] == ["start", "retry", "retry", "failed"]
    for event in events:
        assert set(event) >= {"time", "level", "store", "resource", "event", "requests"}
        assert (event["store"], event["resource"]) == ("127.0.0.1", "orders")
        assert event["time"].endswith("Z")
    retry = events[1]
    assert retry["level"] == "warning"
    assert retry["last_error"].startswith("TransportError: GET orders: ")
    assert events[-1]["level"] == "error"
    assert events[-1]["error"].startswith("TransportError: GET orders: ")
    assert events[-1]["requests"] == 3
    # Without -v the retries are not events, but the row still knows the last one's reason.
    assert main([*args, "--progress", "plain"]) == 1
    err = capsys.readouterr().err
    assert "retrying after" not in err
    assert err.count("TransportError") == 1  # the failure, once


def test_live_row_and_progress_line_show_elapsed_time_and_the_last_error() -> None:
    progress = Progress()
    progress(UnitStarted("acme", "orders", False, 0, Rate(1)))
    progress(
        Retrying("acme", "orders", "ServerError: GET orders: HTTP 503 " + "x" * 100, PoolStats())
    )
    row = progress.rows[("acme", "orders")]
    now = time.monotonic()
    cells = live_row(row, now + 2.0)
    assert cells[LIVE_HEADERS.index("time")] == "2.0s"
    last = cells[LIVE_HEADERS.index("last error")]
    assert last.startswith("ServerError: GET orders: HTTP 503 ")
    assert len(last) == 60  # shortened to fit; the plain line has it whole
    assert progress_line(row, now).endswith(
        "; last error: ServerError: GET orders: HTTP 503 " + "x" * 100
    )


def test_a_config_error_the_client_finds_late_exits_2(
    server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from asyncsubs._pagination import ListCall
    from asyncsubs.errors import ConfigError

    async def refuse(*_: Any, **__: Any) -> Any:
        # As the client's first attempt of a hopeless request raises it.
        raise ConfigError("base_url: the server speaks plain http on this port")
        yield  # an async generator, like ListCall.pages

    monkeypatch.setattr(ListCall, "pages", refuse)
    assert main(pull_args(server, "orders", "-q")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line == "asyncsubs: error: base_url: the server speaks plain http on this port"


def test_counts_of_one_are_said_in_the_singular() -> None:
    from asyncsubs.cli._progress import UnitRow
    from asyncsubs.cli._summaries import WebhookTotals

    one = WebhookTotals(accepted=1, duplicates=1, applied=1, deletes=1, dead_letters=1)
    assert one.line() == (
        "webhooks: 1 accepted, 1 duplicate, 1 applied (1 delete), 0 stale, 0 ignored, "
        "1 dead letter, 0 refused"
    )
    row = UnitRow("acme", "orders", records=1, pages=1)
    row.stats = PoolStats(requests=2, rate_limited=1, retries=1)
    assert progress_line(row, time.monotonic()).endswith("2 requests, 1 429, 1 retry")


def test_live_table_and_summary_order_their_columns_alike() -> None:
    from asyncsubs.cli._summaries import sync_summary

    progress = Progress()
    progress.add("acme", "orders")
    stream = io.StringIO()
    sync_summary(progress, 1.0, "s.db", stream=stream)
    summary = stream.getvalue().splitlines()[1].split()
    shared = [h for h in LIVE_HEADERS if h in summary]
    assert shared == [h for h in summary if h in shared]
    assert shared.index("429s") + 1 == shared.index("retries")


def test_a_store_never_reached_achieved_no_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Attempts that never reached a server are no request rate achieved."""
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "http://127.0.0.1:{unused_port()}"\ntoken_env = "A"\n'
        'resources = ["orders"]\nmax_attempts = 2\n'
        '[defaults.limits]\nheavy = { orders = "20/s" }\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", "token")
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "s.db")]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^acme\s+orders\s+failed\s+0\s+0\s+0\s+2\s+- \(20\.00\)\s", out, re.M), out


@pytest.mark.parametrize(
    ("rate_by", "said"),
    [
        ("start", "1.00 start"),
        ("probe", "1.00 probing"),
        ("429", "1.00 learned"),
        ("remembered", "1.00 learned"),
        ("server", "1.00 announced"),
    ],
)
def test_req_s_column_says_how_the_rate_came_to_be_in_a_word(rate_by: str, said: str) -> None:
    """The live table and the summary alike; a pool still on its starting rate says "start",
    not the first word of a longer label ("to")."""
    from asyncsubs.cli._summaries import sync_summary

    progress = Progress()
    row = progress.add("acme", "orders")
    row.state, row.started, row.finished, row.pages = "done", 0.0, 2.0, 2
    row.stats = PoolStats(requests=3, rate=1.0, rate_by=rate_by)  # 2 intervals in 2 s
    expected = f"1.00 ({said})"
    assert live_row(row, 2.0)[LIVE_HEADERS.index("req/s (allowed)")] == expected
    stream = io.StringIO()
    sync_summary(progress, 2.0, "s.db", stream=stream)
    (line,) = [x for x in stream.getvalue().splitlines() if x.startswith("acme ")]
    assert f"  {expected}  " in line, line


def test_a_pool_on_its_starting_rate_learned_no_rate(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The rate a discovering pool starts at is no finding: neither ``sync``'s ``learned:``
    lines nor ``pull``'s closing note list it; a page size found is listed alone."""
    from asyncsubs.cli._progress import learned_text
    from asyncsubs.cli._summaries import sync_summary

    token = server.store("acme").token
    pull = ["pull", "orders", "--base-url", server.base_url, "--token", token, "--store", "acme"]
    assert main([*pull, "-o", str(tmp_path / "o.jsonl"), "--progress", "plain"]) == 0
    note = capsys.readouterr().err.splitlines()[-1]
    assert note.startswith("asyncsubs: 137 orders in 1 page (")
    assert "req/s" not in note, note

    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", token)
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "s.db")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^acme\s+orders\s+done\s.*\(1\.00 start\)", out, re.M), out
    assert "learned:" not in out
    assert "to start" not in out

    found = PoolStats(requests=5, rate=1.0, rate_by="start", page_size=100)
    assert learned_text(found) == "100 records/page"
    progress = Progress()
    progress.add("acme", "orders").stats = found
    progress.add("acme", "customers").stats = PoolStats(requests=2, rate=1.0, rate_by="start")
    stream = io.StringIO()
    sync_summary(progress, 1.0, "s.db", stream=stream)
    learned = [x for x in stream.getvalue().splitlines() if x.startswith("learned:")]
    assert learned == ["learned: acme/orders: 100 records/page"]


class FullStdout(io.StringIO):
    """A stdout on a disk that fills up once it is handed ``full_at``: that write and every
    later one fail as a full disk's do (the default: the first)."""

    def __init__(self, full_at: str = "") -> None:
        super().__init__()
        self.full_at, self.full = full_at, False

    def write(self, text: str) -> int:
        self.full = self.full or self.full_at in text
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


@pytest.mark.parametrize(
    ("stop", "code"), [(KeyboardInterrupt, 130), (asyncio.CancelledError, 143)]
)
def test_a_stopped_sync_whose_summary_stdout_cannot_take_exits_as_stopped(
    server: FakeAdminServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    stop: type[BaseException],
    code: int,
) -> None:
    """Ctrl-C (or SIGTERM: the task cancelled) and then a full stdout: the write failure is one
    more line, the interruption keeps its exit code and its note."""
    from asyncsubs.cli import _sync

    async def stopped(engine: Any) -> None:
        raise stop

    monkeypatch.setattr(_sync, "run_round", stopped)
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", server.store("acme").token)
    monkeypatch.setattr(sys, "stdout", FullStdout())
    args = ["sync", "--config", str(config), "--db", str(tmp_path / "s.db"), "--progress", "plain"]
    assert main(args) == code
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "asyncsubs: error: cannot write stdout: No space left on device",
        "asyncsubs: interrupted; every committed page is kept: rerun the same command to resume",
    ]


def test_the_summary_event_is_told_when_stdout_cannot_take_the_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from asyncsubs.cli._output import Output
    from asyncsubs.cli._summaries import summarise

    progress = Progress()
    progress.add("acme", "orders")
    monkeypatch.setattr(sys, "stdout", FullStdout())
    stderr = io.StringIO()
    with pytest.raises(CommandFailed, match="cannot write stdout: No space left on device"):
        summarise(progress, time.monotonic(), "s.db", Output(json=True, stream=stderr))
    (event,) = map(orjson.loads, stderr.getvalue().splitlines())
    assert (event["event"], event["database"]) == ("summary", "s.db")


@pytest.mark.parametrize("interrupted", [False, True])
def test_demo_says_a_database_line_stdout_cannot_take_as_a_write_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, interrupted: bool
) -> None:
    """The table went out, the ``database:`` line met a full disk: ``cannot write stdout``
    (exit 1, not an internal error), or after Ctrl-C one more line before the interrupt's."""
    from asyncsubs.cli import _demo

    if interrupted:

        async def stopped(engine: Any) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(_demo, "run_round", stopped)
    stdout = FullStdout(full_at="database: ")
    monkeypatch.setattr(sys, "stdout", stdout)
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    args = ["demo", "--stores", "1", "--records", "20", "--db", db, "--progress", "plain"]
    assert main(args) == (130 if interrupted else 1)
    assert "asyncsubs demo: records per store and resource" in stdout.getvalue()
    err = capsys.readouterr().err
    assert "internal error" not in err
    tail = ["asyncsubs: error: cannot write stdout: No space left on device"]
    if interrupted:
        tail.append("asyncsubs: interrupted; rerun with the same --db to resume")
    assert err.splitlines()[-len(tail) :] == tail


def test_help_says_every_default_and_seconds_alike(capsys: Any) -> None:
    def help_of(command: str) -> str:
        assert main([command, "--help"]) == 0
        return " ".join(capsys.readouterr().out.split())  # unwrapped

    sync = help_of("sync")
    assert "orders; default: each store's resources key, else all three)" in sync
    assert "--store ID only this store from the config (repeatable; default: every store" in sync
    assert "--store ID only this store's (repeatable; default: every store's)" in help_of(
        "dead-letters"
    )
    pull = help_of("pull")
    assert "--timeout SECONDS seconds per attempt (default: 30.0)" in pull
    assert "TIMEOUT" not in pull


def test_ctrl_c_while_the_command_line_loads_is_an_interrupt_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first second of a command imports aiohttp, rich and the rest: Ctrl-C lands there."""
    import types

    import asyncsubs.__main__ as entry

    class Loading(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "asyncsubs.cli", Loading("asyncsubs.cli"))
    assert entry.main(["pull", "--help"]) == 130
