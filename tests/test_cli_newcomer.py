"""A newcomer's first runs of the command line, end to end: what each command says when things
go their ordinary ways (a cut page size, 429s, a full disk, a busy port, a database that never
listened), through ``main([...])`` or a child process, as a user runs it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_cli import pull_args
from test_sync import wait_for_progress

from asyncsubs import AdminClient, Rate
from asyncsubs.__main__ import main
from asyncsubs.cli._checkpoint import PullCheckpoint
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, ServerRateLimits, serve_in_thread

COMMAND = (sys.executable, "-m", "asyncsubs")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCSUBS_TOKEN", raising=False)
    monkeypatch.delenv("ASYNCSUBS_BASE_URL", raising=False)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeAdminServer]:
    stores = [FakeStoreConfig("acme", records=137)]
    with serve_in_thread(stores=stores, rate_limits=None, max_page_size=50) as srv:
        yield srv


def pull(server: FakeAdminServer, *args: str) -> list[str]:
    return pull_args(server, *args)


def test_pull_says_when_the_server_cuts_the_page_size(server: FakeAdminServer, capsys: Any) -> None:
    assert main(pull(server, "customers", "--page-size", "100", "--progress", "plain")) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 137
    assert "acme/customers: the server cut the page size to 50 records (asked for 100)" in (
        captured.err
    )
    assert captured.err.count("cut the page size") == 1  # once, not every page


def test_pull_passes_filters_to_the_server(
    server: FakeAdminServer, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "active.jsonl"
    args = pull(server, "subscriptions", "--param", "status=ACTIVE", "-o", str(out), "-q")
    assert main(args) == 0
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert got == server.records("acme", "subscriptions", status="ACTIVE")
    assert 0 < len(got) < 137
    # Another filter is another pull: its checkpoint is not continued by this one.
    client = AdminClient(token=server.store("acme").token, base_url=server.base_url)
    PullCheckpoint(
        resource="subscriptions",
        base_url=client.base_url,
        credentials=client.fingerprint,
        after_cursor=None,
        cursor="c",
        offset=0,
        records=0,
        pages=1,
        params={"status": "PAUSED"},
    ).save(out)
    assert main(args) == 2
    assert "with other --param filters; pass --restart to start over" in capsys.readouterr().err
    for bad, message in [("status", "expected KEY=VALUE"), ("pageSize=5", "set by --page-size")]:
        assert main(pull(server, "orders", "--param", bad)) == 2
        assert message in capsys.readouterr().err


def test_pull_says_what_rate_the_server_allowed_after_429s(capsys: Any) -> None:
    limits = ServerRateLimits(heavy={"orders": Rate(5, per=1.0)})
    stores = [FakeStoreConfig("acme", records=80)]
    with serve_in_thread(stores=stores, rate_limits=limits) as server:
        token = server.store("acme").token
        args = ["pull", "orders", "--base-url", server.base_url, "--token", token]
        assert (
            main([*args, "--rate", "10/s", "--page-size", "10", "-v", "--progress", "plain"]) == 0
        )
    err = capsys.readouterr().err
    assert "retrying after RateLimitError" in err
    found = re.search(r"80 orders in 8 pages \([\d.]+s\); (\d+) 429s?: the server allowed about "
                      r"([\d.]+) requests/s \(configured: 10/s\)", err)  # fmt: skip
    assert found, err
    assert int(found[1]) >= 1
    assert 0 < float(found[2]) < 10


def test_a_full_disk_or_an_impossible_file_is_one_line(
    server: FakeAdminServer, capsys: Any
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    assert main(pull(server, "orders", "-o", "/dev/full", "-q")) == 1
    err = capsys.readouterr().err
    assert err == "asyncsubs: error: cannot write /dev/full: No space left on device\n"
    # A page small enough to wait in the buffer fails at its flush, and not again at close.
    assert main(pull(server, "orders", "-o", "/dev/full", "-q", "--limit", "1")) == 1
    err = capsys.readouterr().err
    assert err == "asyncsubs: error: cannot write /dev/full: No space left on device\n"
    # A path that cannot be opened is found before any request: a usage error.
    assert main(pull(server, "orders", "-o", "/proc/no-such.jsonl", "-q")) == 2
    err = capsys.readouterr().err
    assert err == "asyncsubs: error: cannot write /proc/no-such.jsonl: No such file or directory\n"


def test_a_busy_port_is_a_usage_error_for_fake_server_too(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        run = subprocess.run(
            [*COMMAND, "fake-server", "--port", port, "--records", "1"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 2, run.stderr.decode()
    assert run.stderr.decode().startswith(f"asyncsubs: error: cannot listen on 127.0.0.1:{port}: ")


def test_demo_help_says_where_the_server_runs(capsys: Any) -> None:
    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "in a process of its own" in text
    assert "in this process" not in text


def sync_config(tmp_path: Path, server: FakeAdminServer, defaults: str = "") -> Path:
    config = tmp_path / "stores.toml"
    config.write_text(
        f"[defaults]\n{defaults}\n[defaults.limits]\n"
        'heavy = { subscriptions = "1000/s", customers = "1000/s", orders = "1000/s" }\n'
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "ACME_TOKEN"\n',
        encoding="utf-8",
    )
    return config


@pytest.fixture
def synced(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Path]:
    """Runs ``sync`` of the server's store with the given flags; returns its database."""

    def sync(*args: str) -> Path:
        monkeypatch.setenv("ACME_TOKEN", server.store("acme").token)
        db = tmp_path / "subs.db"
        config = sync_config(tmp_path, server)
        assert main(["sync", "--config", str(config), "--db", str(db), *args]) == 0
        return db

    return sync


def test_sync_status_shows_an_sqlite_database_too(
    synced: Callable[..., Path], tmp_path: Path, capsys: Any
) -> None:
    db = synced("-q")
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE asyncsubs_sync_state SET done = 0 WHERE resource = 'orders'")
    capsys.readouterr()
    assert main(["sync-status", "--db", f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^acme\s+orders\s+pending\s+137\s+3\s+\d+s\s*$", out, re.M), out
    assert re.search(r"^acme\s+customers\s+done\s+137\s+3\s", out, re.M), out
    assert f"3 units in {db}: 2 done, 1 pending" in out
    assert main(["sync-status", "--db", str(tmp_path / "none.db")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sync_status_and_dead_letters_print_json_as_sync_logs_it(
    synced: Callable[..., Path], tmp_path: Path, capsys: Any
) -> None:
    db = synced("-q")
    capsys.readouterr()
    assert main(["sync-status", "--db", str(db), "--json"]) == 0
    status = orjson.loads(capsys.readouterr().out)
    assert status["database"] == str(db)
    assert status["states"] == {"done": 3}
    orders = next(u for u in status["units"] if u["resource"] == "orders")
    assert (orders["store"], orders["state"], orders["records"], orders["pages"]) == (
        "acme",
        "done",
        137,
        3,
    )
    assert main(["dead-letters", "--db", str(db), "--json", "--log-format", "json"]) == 0
    captured = capsys.readouterr()
    assert orjson.loads(captured.out) == {"database": str(db), "dead_letters": []}
    (note,) = [orjson.loads(line) for line in captured.err.splitlines()]
    assert note["level"] == "note"
    assert "never run sync --listen" in note["message"]
    # An error, too, is a JSON line.
    assert main(["sync-status", "--db", str(tmp_path / "none.db"), "--log-format", "json"]) == 2
    (error,) = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert error["level"] == "error"
    assert "does not exist" in error["message"]


def test_sync_summary_shows_the_achieved_against_the_allowed_rate(
    synced: Callable[..., Path], capsys: Any
) -> None:
    synced()
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("store "))
    assert "req/s (allowed)" in header
    assert re.search(
        r"^acme\s+orders\s+done\s+137\s+3\s+137\s+3\s+[\d.]+ \(1000\.00\)\s", out, re.M
    )


def test_dead_letters_of_a_database_that_never_listened(
    synced: Callable[..., Path], capsys: Any
) -> None:
    db = synced("-q")
    assert main(["dead-letters", "--db", str(db)]) == 0
    captured = capsys.readouterr()
    assert "webhook_dead_letters" not in captured.out + captured.err
    assert f"{db} has never run sync --listen" in captured.err
    with contextlib.closing(sqlite3.connect(db)) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "webhook_dead_letters" not in tables  # reading made nothing


@contextlib.contextmanager
def ended(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc``, killed on leaving if it has not ended by then (a test that failed first)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_config_problems_of_the_defaults_are_said_once_and_where_they_belong(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("T", "a-token")
    monkeypatch.delenv("SHARED_SECRET", raising=False)
    config = tmp_path / "stores.toml"
    config.write_text(
        '[defaults]\nwebhook_secret_env = "SHARED_SECRET"\ntoken_env = "T"\n'
        + "".join(
            f'[stores.s{i}]\nbase_url = "{server.base_url}"\ntoken_env = "T"\n' for i in range(3)
        ),
        encoding="utf-8",
    )
    args = ["sync", "--config", str(config), "--db", str(tmp_path / "x.db")]
    assert main([*args, "--listen", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "asyncsubs: error: defaults.token_env: unknown key (token_env is set per store, in each "
        "[stores.<id>] table)",
        "asyncsubs: error: defaults.webhook_secret_env: environment variable SHARED_SECRET is "
        "not set",
    ]


def test_an_interrupted_demo_counts_its_rows_and_its_time(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = subprocess.Popen(
        [*COMMAND, "demo", "--db", str(db), "--stores", "1", "--records", "5000"],
        env={**os.environ, "CI": "true"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with ended(proc):
        wait_for_progress(db, proc, 1500)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    text = out.decode()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = dict(
            conn.execute("SELECT 'acme-coffee/' || resource, run_records FROM asyncsubs_sync_state")
        )
    elapsed = float(re.search(r" 429s? in ([\d.]+)s", text)[1])  # type: ignore[index]
    lines = [line.split() for line in text.splitlines() if line.startswith("acme-coffee ")]
    assert len(lines) == 3, text
    for store, resource, records, in_db, *_, time_cell in lines:
        assert int(in_db.replace(",", "")) == rows[f"{store}/{resource}"], text
        assert int(records.replace(",", "")) <= int(in_db.replace(",", ""))
        assert float(time_cell.rstrip("s")) == pytest.approx(elapsed, abs=0.25), text


def run_closing(closed: str, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """The command line in a child process with the redirections ``closed`` (e.g. ``>&-``)."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {closed}', "sh", *COMMAND, *args],
        capture_output=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("loop", ["auto", "asyncio"])  # uvloop when installed, asyncio's
def test_a_closed_stdout_or_stderr_loses_only_what_went_there(
    server: FakeAdminServer, tmp_path: Path, loop: str
) -> None:
    """``>&-``: the command still does its work and exits as usual; a socket or file it opens
    does not take the closed stream's number (uvloop aborts closing one numbered 1 or 2)."""
    pulled = run_closing(">&-", *pull(server, "orders", "--limit", "2"), ASYNCSUBS_LOOP=loop)
    assert pulled.returncode == 0, pulled.stderr.decode()
    assert "2 orders in 1 page" in pulled.stderr.decode()
    pulled = run_closing("2>&- <&-", *pull(server, "orders", "--limit", "2"), ASYNCSUBS_LOOP=loop)
    assert pulled.returncode == 0
    assert [orjson.loads(line) for line in pulled.stdout.splitlines()] == server.records(
        "acme", "orders"
    )[:2]
    db, config = tmp_path / "subs.db", sync_config(tmp_path, server)
    token = server.store("acme").token
    args = ["sync", "--config", str(config), "--db", str(db), "--resources", "orders"]
    synced = run_closing(">&-", *args, "--progress", "plain", ACME_TOKEN=token, ASYNCSUBS_LOOP=loop)
    assert synced.returncode == 0, synced.stderr.decode()
    assert "acme/orders: done, 137 records" in synced.stderr.decode()
    status = run_closing(">&-", "sync-status", "--db", str(db), ASYNCSUBS_LOOP=loop)
    assert (status.returncode, status.stderr) == (0, b"")


def test_a_stream_set_to_none_in_process_writes_nowhere(
    server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", None)
    assert main(pull(server, "orders", "--limit", "2", "-o", os.devnull, "--restart")) == 0
    assert sys.stderr is None  # as it was


def non_ascii_store(tmp_path: Path, server: FakeAdminServer, monkeypatch: Any) -> Path:
    """A database of one sync of a store named "café ☕"."""
    monkeypatch.setenv("ACME_TOKEN", server.store("acme").token)
    config, db = tmp_path / "stores.toml", tmp_path / "subs.db"
    config.write_text(
        '[defaults.limits]\nheavy = { orders = "1000/s" }\n'
        f'[stores."café ☕"]\nbase_url = "{server.base_url}"\ntoken_env = "ACME_TOKEN"\n'
        'resources = ["orders"]\n',
        encoding="utf-8",
    )
    assert main(["sync", "--config", str(config), "--db", str(db), "-q"]) == 0
    return db


def test_tables_and_json_on_a_stdout_that_cannot_say_every_character(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    db = non_ascii_store(tmp_path, server, monkeypatch)
    for flags, said in [([], rb"caf\xe9 \u2615  orders"), (["--json"], rb'"caf\u00e9 \u2615"')]:
        stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")  # LC_ALL=C
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["sync-status", "--db", str(db), *flags]) == 0, capsys.readouterr().err
        assert said in stdout.buffer.getvalue()  # type: ignore[attr-defined]
        assert stdout.errors == "strict"  # an in-process caller's stream, as it was
    document = orjson.loads(stdout.buffer.getvalue())  # type: ignore[attr-defined]
    assert [unit["store"] for unit in document["units"]] == ["café ☕"]  # JSON's own escapes


def test_a_summary_stdout_cannot_take_is_one_line(
    server: FakeAdminServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    db = non_ascii_store(tmp_path, server, monkeypatch)
    capsys.readouterr()
    config = tmp_path / "stores.toml"
    for args in [
        ["sync-status", "--db", str(db)],
        ["sync-status", "--db", str(db), "--json"],
        ["sync", "--config", str(config), "--db", str(db), "--progress", "plain"],
    ]:
        full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - closed below
        monkeypatch.setattr(sys, "stdout", full)
        try:
            assert main(args) == 1, args
        finally:
            with contextlib.suppress(OSError):  # what the disk did not take, flushed again
                full.close()
        lines = capsys.readouterr().err.splitlines()
        assert "asyncsubs: error: cannot write stdout: No space left on device" in lines
        assert "internal error" not in "".join(lines)


def test_pull_to_a_fifo_nobody_reads_is_a_usage_error_not_a_wait(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = len(server.requests)
    run = subprocess.run(
        [*COMMAND, *pull(server, "orders", "--limit", "5", "-o", str(fifo))],
        capture_output=True,
        timeout=60,  # without a reader, opening it to write waits forever
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.decode() == (
        f"asyncsubs: error: cannot write {fifo}: -o needs a file a rerun can resume (this one "
        "cannot seek); write to stdout without -o instead\n"
    )
    assert len(server.requests) == before
    assert not PullCheckpoint.path_for(fifo).exists()


def test_pull_to_an_empty_file_name_says_the_name_given(
    server: FakeAdminServer, capsys: Any
) -> None:
    assert main(pull(server, "orders", "-o", "", "-q")) == 2
    assert capsys.readouterr().err == "asyncsubs: error: cannot write '': not a file name\n"


def test_pull_interrupted_before_its_first_page_says_so() -> None:
    """The server accepts the connection and never answers: the first page never comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = subprocess.Popen(
            [*COMMAND, "pull", "orders", "--base-url", url, "--token", "t", "--progress", "plain"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        with ended(proc):
            assert proc.stderr is not None
            assert proc.stderr.readline().endswith(b"127.0.0.1/orders: starting\n")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert out == b""
    assert err.decode().splitlines() == [
        "asyncsubs: interrupted before the first page; nothing written: rerun the same command"
    ]
