"""The command line's defaults find what the server allows, and remember it between runs.

``pull`` keeps what its store's pools learned in a state file in the cache directory (here a
directory of the test's own, see conftest), ``sync`` in its database; both start from it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from asyncsubs.__main__ import main
from asyncsubs.stores import FILE_FORMAT
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, serve_in_thread

RECORDS = 250
DEMO_RESOURCES = ("subscriptions", "customers", "orders")


@pytest.fixture
def server() -> Iterator[FakeAdminServer]:
    # The server refuses pages above 100 records: a pull asking for more learns it from 400s.
    store = FakeStoreConfig("acme", records=RECORDS, max_page_size=100, over_max="reject")
    with serve_in_thread(stores=[store], rate_limits=None) as srv:
        yield srv


def state_file() -> Path:
    return Path(os.environ["ASYNCSUBS_CACHE_DIR"]) / "learned.json"


def pull(server: FakeAdminServer, path: Path, *extra: str) -> int:
    token = server.store("acme").token
    return main(
        ["pull", "orders", "--base-url", server.base_url, "--token", token, "-o", str(path), *extra]
    )


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def sizes(server: FakeAdminServer) -> list[tuple[str | None, int]]:
    return [(r.query.get("pageSize"), r.status) for r in server.requests]


def test_a_second_pull_starts_from_the_page_size_the_first_learned(
    server: FakeAdminServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.clear_requests()
    assert pull(server, tmp_path / "a.jsonl", "--rate", "1000/s", "--progress", "plain") == 0
    first = sizes(server)
    # Down the ladder from 1,000 to a size accepted, one past it refused: 100 is the maximum.
    assert first[:5] == [("1000", 400), ("500", 400), ("250", 400), ("100", 200), ("101", 400)]
    assert len(lines(tmp_path / "a.jsonl")) == RECORDS
    err = capsys.readouterr().err
    assert err.count("acme.") == 0  # the store is a fingerprint: no name was given
    assert sum("100 records/page" in line for line in err.splitlines()) == 2  # learned; summary
    saved = orjson.loads(state_file().read_bytes())
    assert saved["format"] == FILE_FORMAT
    (entry,) = saved["stores"]
    assert (entry["pools"]["orders"]["page_size"], entry["pools"]["orders"]["page_by"]) == (
        100,
        "400",
    )

    server.clear_requests()
    assert pull(server, tmp_path / "b.jsonl", "--rate", "1000/s", "-q") == 0
    assert sizes(server) == [("100", 200)] * 3  # from its first request, no 400
    assert lines(tmp_path / "b.jsonl") == lines(tmp_path / "a.jsonl")


def test_a_pull_starts_at_a_remembered_rate_and_says_where_it_came_from(
    server: FakeAdminServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What an earlier pull of this store learned: 40/s, refused at 45/s, held for a while.
    assert pull(server, tmp_path / "warm.jsonl", "--rate", "1000/s", "-q") == 0
    saved = orjson.loads(state_file().read_bytes())
    pools = saved["stores"][0]["pools"]
    pools["orders"].update(
        rate=40.0, rate_by="429", good=40.0, refused=45.0, strikes=1, hold_until=time.time() + 600
    )
    state_file().write_bytes(orjson.dumps(saved))
    capsys.readouterr()

    assert pull(server, tmp_path / "a.jsonl", "--log-format", "json") == 0
    events = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    learned = [e for e in events if e["event"] == "learned"]
    assert learned[0]["rate"] == 40.0
    assert learned[0]["rate_by"] == "remembered"
    assert learned[0]["page_size"] == 100
    assert (
        learned[0]["message"] == "40.00 req/s learned before (refused at 45.00), 100 records/page"
    )
    assert len(learned) == 1  # nothing changed during the pull: told once


@pytest.mark.parametrize("damage", [b"{not json", b'{"format": "another/9", "stores": []}', b"[]"])
def test_a_damaged_or_foreign_state_file_is_ignored_with_one_warning(
    server: FakeAdminServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: bytes
) -> None:
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_bytes(damage)
    assert pull(server, tmp_path / "a.jsonl", "--rate", "1000/s", "--progress", "plain") == 0
    assert len(lines(tmp_path / "a.jsonl")) == RECORDS
    warnings = [line for line in capsys.readouterr().err.splitlines() if "ignoring" in line]
    assert len(warnings) == 1
    assert str(state_file()) in warnings[0]
    saved = orjson.loads(state_file().read_bytes())  # rewritten, with this pull's entry
    assert saved["format"] == FILE_FORMAT
    assert saved["stores"][0]["pools"]["orders"]["page_size"] == 100


def test_an_unwritable_cache_costs_only_the_memory(
    server: FakeAdminServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    monkeypatch.setenv("ASYNCSUBS_CACHE_DIR", str(blocker / "cache"))
    assert pull(server, tmp_path / "a.jsonl", "--rate", "1000/s", "--progress", "plain") == 0
    err = capsys.readouterr().err
    assert "cannot keep what the pull learned" in err
    assert len(lines(tmp_path / "a.jsonl")) == RECORDS


def test_sync_keeps_what_it_learned_in_its_database(
    server: FakeAdminServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        f'[stores.acme]\nbase_url = "{server.base_url}"\ntoken_env = "A"\nresources = ["orders"]\n'
        '[defaults.limits]\nheavy = { orders = "1000/s" }\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("A", server.store("acme").token)
    db = tmp_path / "s.db"
    server.clear_requests()
    assert main(["sync", "--config", str(config), "--db", str(db), "--progress", "plain"]) == 0
    assert ("100", 200) in sizes(server)
    assert sum(status == 400 for _, status in sizes(server)) == 4
    summary = capsys.readouterr().out
    assert "learned: acme/orders: 100 records/page" in summary
    with sqlite3.connect(db) as conn:
        ((stored,),) = conn.execute("SELECT learned FROM asyncsubs_learned WHERE store = 'acme'")
    assert orjson.loads(stored)["pools"]["orders"]["page_size"] == 100

    server.clear_requests()
    assert main(["sync", "--config", str(config), "--db", str(db), "-q"]) == 0
    assert sizes(server) == [("100", 200)] * 3  # the next sync of the store: no 400 at all


def demo_rows(out: str, store: str) -> dict[str, int]:
    """Requests per resource of ``store``, as the demo's table says."""
    rows = [line.split() for line in out.splitlines() if line.startswith(f"{store} ")]
    return {row[1]: int(row[4].replace(",", "")) for row in rows}


def test_a_demo_rerun_on_the_same_database_starts_from_what_the_first_learned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``asyncsubs demo --db X`` twice: the fake server listens on a new port each run, and its
    stores are the same stores all the same (what they learned is theirs by name)."""
    args = ["demo", "--quick", "--stores", "2", "--db", str(tmp_path / "demo.db")]
    assert main([*args, "-q"]) == 0
    capsys.readouterr()
    assert main([*args, "--log-format", "json"]) == 0
    out, err = capsys.readouterr()
    events = [orjson.loads(line) for line in err.splitlines()]
    assert not [e for e in events if e["event"] == "message"], err  # nothing refused
    first = {}
    for event in events:
        if event["event"] == "learned":
            first.setdefault((event["store"], event["resource"]), event)
    # The pools start at the page sizes the first run found: imported ("remembered"), or, as
    # both runs are in this one process, at times taken from the record the process still
    # holds (by what found it).
    assert "remembered" in {e["rate_by"] for e in first.values()}
    for resource in DEMO_RESOURCES:
        started = first[("globex-pets", resource)]
        assert (started["page_size"], started["page_size_by"]) in {
            (250, "remembered"),
            (250, "400"),
        }
    # globex-pets refuses pages above 250 records with a 400: the first run found that, the
    # second asks for 250 from its first request, one request a page (600, 300, 900 records).
    assert demo_rows(out, "globex-pets") == {"subscriptions": 3, "customers": 2, "orders": 4}
    assert " 0 429s in " in out
    assert "this run started from what the last one learned (2 of 2 stores" in out


def test_a_named_store_at_another_address_starts_from_what_it_learned(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    """``--store`` names the store for pacing, learned limits and progress: the same store
    served from another port (a restarted fake server, a proxy) is the same store."""
    assert pull(server, tmp_path / "a.jsonl", "--rate", "1000/s", "--store", "acme", "-q") == 0
    store = FakeStoreConfig("acme", records=RECORDS, max_page_size=100, over_max="reject")
    with serve_in_thread(stores=[store], rate_limits=None) as moved:
        assert moved.base_url != server.base_url
        assert pull(moved, tmp_path / "b.jsonl", "--rate", "1000/s", "--store", "acme", "-q") == 0
        assert sizes(moved) == [("100", 200)] * 3  # the page size it learned, at once
    (entry,) = orjson.loads(state_file().read_bytes())["stores"]
    assert entry["store"] == "acme"
