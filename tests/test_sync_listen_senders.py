"""``sync --listen`` against senders written from the specifications, configured in stores.toml.

Each scheme's sender is the one ``test_webhook_schemes`` writes from its specification (hashlib,
hmac, base64; not ``WebhookSender``), posting bodies shaped as real services send them: no store
field. What is checked is the database: updates and deletes applied, or, for a refused
delivery, nothing changed; and what the command line shows of the refusals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import orjson
import pytest
from test_sync_listen import (
    assert_exact,
    fake_server,
    listening,
    start_listen,
    stepping_clock,
    table,
    terminate,
)
from test_webhook_schemes import hmac_headers, standard_headers, timestamped_headers

from asyncsubs.__main__ import main
from asyncsubs.cli._display import JsonLines, LiveTable, PlainLines
from asyncsubs.cli._progress import Progress
from asyncsubs.cli._summaries import webhook_summary
from asyncsubs.errors import ConfigError
from asyncsubs.stores import ConfigFileError, Event, WebhookCounts, WebhookRefused, load_config
from asyncsubs.stores import Store as StoreConfig
from asyncsubs.stores._config import StoreTable
from asyncsubs.sync import ListenSync, sink_for
from asyncsubs.sync._listen import KEYS_TO_CHECK, what_to_check
from asyncsubs.testing import FakeAdminServer
from asyncsubs.webhooks import ReceiverStats, Refusal, WebhookConfig

# Secrets as a Standard Webhooks service shows them; the other schemes use the text as it is.
SECRETS = {
    "acme": "whsec_" + base64.b64encode(b"a" * 32).decode(),
    "globex": "whsec_" + base64.b64encode(b"g" * 32).decode(),
}
OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
UNKNOWN_SECRET = "whsec_" + base64.b64encode(b"u" * 32).decode()

Sign = Callable[[Sequence[str], bytes, str], dict[str, str]]


def _hmac(encoding: str) -> Sign:
    return lambda secrets, body, event_id: hmac_headers(secrets[0], body, encoding=encoding)


#: scheme -> (its stores.toml keys, a sender: (secrets, body, event id) -> headers).
SCHEMES: dict[str, tuple[list[str], Sign]] = {
    # The sender of the issue: HMAC-SHA256 hex in X-Service-Signature; the default config.
    "hmac-hex": ([], _hmac("hex")),
    "hmac-base64": (['webhook_encoding = "base64"'], _hmac("base64")),
    "timestamped": (
        ['webhook_scheme = "timestamped"', 'webhook_signature_header = "Stripe-Signature"'],
        lambda secrets, body, _: timestamped_headers(secrets, body, int(time.time())),
    ),
    "standard-webhooks": (
        ['webhook_scheme = "standard-webhooks"'],
        lambda secrets, body, event_id: standard_headers(secrets, event_id, int(time.time()), body),
    ),
}


def write_stores(
    tmp_path: Path,
    server: FakeAdminServer,
    *,
    defaults: Sequence[str] = (),
    stores: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """stores.toml for the fake server's stores, each with its own secret unless ``stores``
    (store -> its lines) says otherwise; ``defaults``: lines of ``[defaults]``."""
    lines = ["[defaults]", "page_size = 25", *defaults, "[defaults.limits]", 'global = "1000/s"']
    lines.append('heavy = { subscriptions = "1000/s", customers = "1000/s", orders = "1000/s" }')
    for store in server.tokens:
        lines += [f"[stores.{store}]", f'base_url = "{server.base_url}"']
        lines.append(f'token_env = "{store.upper()}_TOKEN"')
        own = [f'webhook_secret_env = "{store.upper()}_WEBHOOK_SECRET"']
        lines += own if stores is None else stores.get(store, [])
    path = tmp_path / "stores.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def environment(server: FakeAdminServer) -> dict[str, str]:
    env = {f"{store.upper()}_TOKEN": token for store, token in server.tokens.items()}
    env.update({f"{store.upper()}_WEBHOOK_SECRET": s for store, s in SECRETS.items()})
    return {**env, "OLD_WEBHOOK_SECRET": OLD_SECRET, "SHARED_SECRET": "one-for-all"}


def event_body(event_id: str, topic: str, record: Mapping[str, Any], **extra: Any) -> bytes:
    """A delivery as the services of the issue send it: no store field unless ``extra``."""
    return orjson.dumps({"id": event_id, "topic": topic, **extra, "data": record})


def tombstoned(db: Path, store: str) -> set[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT id FROM asyncsubs_deleted WHERE store = ?", (store,))
        return {row[0] for row in rows}


async def post(url: str, body: bytes, headers: Mapping[str, str]) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=dict(headers)) as resp,
    ):
        return resp.status


# ---------------------------------------------------------------------------------------------
# Schemes, secrets of their own, store-less bodies


@pytest.mark.parametrize("scheme", list(SCHEMES))
async def test_each_scheme_from_stores_toml_applies_store_less_updates_and_deletes(
    tmp_path: Path, scheme: str
) -> None:
    keys, sign = SCHEMES[scheme]
    db = tmp_path / "subs.db"
    async with fake_server(seed=21) as server:
        config = write_stores(tmp_path, server, defaults=keys)
        configs = load_config(config, environment(server), listen=True)
        async with listening(configs, db) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            await engine.pull()
            changes: list[Any] = []
            server.store("acme").listeners.append(changes.append)
            mutator = server.mutator(
                "acme", seed=5, weights={"subscription_delete": 3.0}, clock=stepping_clock()
            )
            await mutator.run(steps=60)
            deleted = {str(c.record["id"]) for c in changes if c.kind == "deleted"}
            # Rows of the initial sync, which only a delivered delete can remove.
            synced = deleted & {row[0] for row in table(db, "acme", "subscriptions")}
            statuses = []
            for i, change in enumerate(changes):
                topic = f"{change.resource}/{change.kind}"
                body = event_body(f"evt-{i}", topic, change.record)
                statuses.append(
                    await post(urls["acme"], body, sign([SECRETS["acme"]], body, f"evt-{i}"))
                )
            assert statuses == [200] * len(changes)
            await engine.join()
            hook = engine.counts("acme")
        assert len(synced) >= 3
        assert (hook.receiver.refused, hook.receiver.dead_lettered) == (0, 0)
        assert hook.deletes == len(deleted)
        # Nothing pulled since the initial sync: the webhooks alone made the database the
        # server's state, deletes included (no pull could have brought them).
        assert_exact(db, server)
        assert deleted <= tombstoned(db, "acme")
        assert not deleted & {row[0] for row in table(db, "acme", "subscriptions")}


async def test_rotation_with_two_secrets_through_the_config(tmp_path: Path) -> None:
    """webhook_previous_secrets_env: deliveries signed with the old secret, the new one, or
    both (a Standard Webhooks sender during a rotation) are applied; an unknown secret is not."""
    keys, sign = SCHEMES["standard-webhooks"]
    db = tmp_path / "subs.db"
    async with fake_server(seed=22) as server:
        acme = [
            'webhook_secret_env = "ACME_WEBHOOK_SECRET"',
            'webhook_previous_secrets_env = ["OLD_WEBHOOK_SECRET"]',
        ]
        stores = {"acme": acme, "globex": ['webhook_secret_env = "GLOBEX_WEBHOOK_SECRET"']}
        config = write_stores(tmp_path, server, defaults=keys, stores=stores)
        configs = load_config(config, environment(server), listen=True)
        async with listening(configs, db) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            await engine.pull()
            records = server.records("acme", "customers")[:4]
            signers = [[OLD_SECRET], [SECRETS["acme"]], [SECRETS["acme"], OLD_SECRET]]
            signers.append([UNKNOWN_SECRET])
            statuses = []
            for i, (record, secrets) in enumerate(zip(records, signers, strict=True)):
                changed = {**record, "updatedAt": f"2031-01-0{i + 1}T00:00:00Z"}
                body = event_body(f"r-{i}", "customers/update", changed)
                statuses.append(await post(urls["acme"], body, sign(secrets, body, f"r-{i}")))
            await engine.join()
            hook = engine.counts("acme")
        assert statuses == [200, 200, 200, 401]
        assert (hook.applied, hook.receiver.refusals) == (3, {"bad_signature": 1})
        stamps = {row[0]: row[4] for row in table(db, "acme", "customers")}
        assert [stamps[str(r["id"])] for r in records] == [
            "2031-01-01T00:00:00Z",
            "2031-01-02T00:00:00Z",
            "2031-01-03T00:00:00Z",
            records[3]["updatedAt"],  # the delivery signed with an unknown secret changed nothing
        ]


# ---------------------------------------------------------------------------------------------
# One secret for several stores


def shared_secret_stores(ids: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    return {store: [] if ids is None else [f"webhook_store_id = {ids[store]}"] for store in SECRETS}


async def test_a_shared_secret_without_binding_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    db = tmp_path / "subs.db"
    message = (
        "stores acme, globex share a webhook secret, so a delivery for one could be replayed to "
        "another's URL: set stores.acme.webhook_store_id, stores.globex.webhook_store_id (the "
        "value the service sends for each store in the signed field 'store'), or give each "
        "store a secret of its own"
    )
    async with fake_server() as server:
        defaults = ['webhook_secret_env = "SHARED_SECRET"']
        config = write_stores(tmp_path, server, defaults=defaults, stores=shared_secret_stores())
        for name, value in environment(server).items():
            monkeypatch.setenv(name, value)
        args = ["sync", "--config", str(config), "--db", str(db), "--listen", "127.0.0.1:0"]
        # The command runs its own event loop: in a thread, beside the server's.
        assert await asyncio.to_thread(main, args) == 2
        assert capsys.readouterr().err == f"asyncsubs: error: {message}\n"
        assert (db.exists(), server.requests) == (False, [])  # nothing opened, nothing sent
        # Listening for one of them is no safer: the other's deliveries could be replayed to it.
        with pytest.raises(ConfigFileError) as info:
            load_config(config, environment(server), listen=True, only_stores=["globex"])
        assert info.value.problems == (message,)
        # A plain sync reads no webhook secret at all.
        assert len(load_config(config, environment(server))) == 2


async def test_a_shared_secret_binds_by_webhook_store_id(tmp_path: Path) -> None:
    """The service names acme by its shop domain and globex by a number, in the signed field
    "shop": each store takes its own deliveries, and a genuine globex delete replayed to acme's
    URL is refused: the acme record with that id stays, and is not tombstoned."""
    db = tmp_path / "subs.db"
    shared = "one-for-all"
    async with fake_server(seed=23) as server:
        config = write_stores(
            tmp_path,
            server,
            defaults=['webhook_secret_env = "SHARED_SECRET"', 'webhook_store_key = "shop"'],
            stores=shared_secret_stores({"acme": '"acme.example"', "globex": "4242"}),
        )
        configs = load_config(config, environment(server), listen=True)
        events: list[Event] = []
        progress = Progress()
        progress.watch(lambda event, _: events.append(event))
        async with listening(configs, db, progress) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            await engine.pull()
            victim = server.records("acme", "subscriptions")[0]
            order = {**server.records("globex", "orders")[0], "updatedAt": "2031-01-01T00:00:00Z"}
            update = event_body("g-1", "orders/update", order, shop=4242)
            replay = event_body("g-2", "subscriptions/delete", victim, shop=4242)
            storeless = event_body("a-1", "subscriptions/delete", victim)
            statuses = [
                await post(urls[store], body, hmac_headers(shared, body))
                for store, body in [
                    ("globex", update),
                    ("acme", replay),
                    ("acme", storeless),  # a shared secret: the body must name the store
                    ("globex", replay),  # at its own store's URL it is accepted
                ]
            ]
            await engine.join()
            acme, globex = engine.counts("acme"), engine.counts("globex")
        assert statuses == [200, 403, 403, 200]
        assert acme.receiver.refusals == {"wrong_store": 2}
        assert (acme.applied, globex.applied) == (0, 2)
        assert str(victim["id"]) in {row[0] for row in table(db, "acme", "subscriptions")}
        assert str(victim["id"]) not in tombstoned(db, "acme")
        assert table(db, "globex", "orders")[0][4] == "2031-01-01T00:00:00Z"
        refused = [e for e in events if isinstance(e, WebhookRefused)]
        assert len(refused) == 1  # the first of the reason; the second is only counted
        assert (refused[0].store, refused[0].reason, refused[0].status) == (
            "acme",
            "wrong_store",
            403,
        )
        assert "names store '4242' in 'shop', not this store's 'acme.example'" in refused[0].detail
        assert "; in stores.toml: webhook_store_id, webhook_store_key" in refused[0].check


def test_listen_sync_binds_configs_not_from_a_file(tmp_path: Path) -> None:
    """The same rule for StoreConfigs made by hand: ListenSync refuses a shared secret."""
    configs = [
        StoreConfig(store, "http://127.0.0.1:9", "t-0123456789", webhook=WebhookConfig("one"))
        for store in SECRETS
    ]
    sink = sink_for(str(tmp_path / "subs.db"))
    with pytest.raises(ConfigError, match="set store_id of store acme, store_id of store globex"):
        ListenSync(configs, sink, Progress())
    with pytest.raises(ConfigError, match="stores acme have no webhook config"):
        ListenSync([attrs.evolve(configs[0], webhook=None)], sink, Progress())
    bound = [attrs.evolve(c, webhook=WebhookConfig("one", store_id=c.store)) for c in configs]
    assert ListenSync(bound, sink, Progress()).webhooks["acme"].shared_secret is True


# ---------------------------------------------------------------------------------------------
# The keys, checked like every other key


def test_webhook_keys_are_checked_one_line_per_problem(tmp_path: Path) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        "[defaults]\n"
        'webhook_scheme = "svix"\n'
        'webhook_store_id = "x"\n'
        'webhook_encoding = "base32"\n'
        'webhook_algorithm = "shake_128"\n'
        'webhook_signature_header = "X Signature"\n'
        "webhook_timestamp_tolerance = 0\n"
        'webhook_store_key = ""\n'
        'webhook_previous_secrets_env = ["OLD", "whsec_pasted+secret="]\n'
        'webhook_signatur_prefix = "sha256="\n'
        "[stores.acme]\n"
        'base_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "A"\n'
        "webhook_store_id = true\n"
        "[stores.globex]\n"
        'base_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "G"\n'
        'webhook_scheme = "timestamped"\nwebhook_timestamp_header = "X-Timestamp"\n'
        "[stores.initech]\n"
        'base_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "I"\n'
        'webhook_scheme = "standard-webhooks"\n',
        encoding="utf-8",
    )
    env = {"T": "t-0123456789", "A": "a", "G": "g", "I": "not-base64!"}
    with pytest.raises(ConfigFileError) as info:
        load_config(config, env, listen=True)
    assert info.value.problems == (
        "defaults.webhook_scheme: must be one of hmac, timestamped, standard-webhooks, got 'svix'",
        "defaults.webhook_store_id: unknown key (webhook_store_id is set per store, in each "
        "[stores.<id>] table)",
        "defaults.webhook_encoding: must be 'hex' or 'base64', got 'base32'",
        "defaults.webhook_algorithm: must be usable with HMAC, got 'shake_128'",
        "defaults.webhook_signature_header: must be an HTTP header name, got 'X Signature'",
        "defaults.webhook_timestamp_tolerance: must be a number of seconds > 0, got 0",
        "defaults.webhook_store_key: must be a non-empty string, got ''",
        "defaults.webhook_previous_secrets_env: must be a list of NAMEs of environment variables, "
        'like ["ACME_WEBHOOK_SECRET_OLD"] (what it holds is not shown: it may be a secret itself)',
        "defaults.webhook_signatur_prefix: unknown key (did you mean 'webhook_signature_prefix'?)",
        "stores.acme.webhook_store_id: must be the value the service sends for this store (a "
        "string or an integer), got True",
        "stores.globex: webhook_timestamp_header is for the hmac scheme; the timestamped scheme "
        "reads its timestamp from t= in the signature header",
        "stores.initech.webhook_secret_env: I: a Standard Webhooks secret is the base64 text the "
        "service shows, usually prefixed whsec_; this one does not decode",
    )


def test_webhook_keys_make_the_receivers_config(tmp_path: Path) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        "[defaults]\n"
        'webhook_scheme = "standard-webhooks"\n'
        'webhook_id_header = "svix-id"\n'
        'webhook_timestamp_header = "svix-timestamp"\n'
        'webhook_signature_header = "svix-signature"\n'
        "webhook_timestamp_tolerance = 60\n"
        "[stores.acme]\n"
        'base_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "A"\n'
        'webhook_previous_secrets_env = "A_OLD"\n'
        "[stores.globex]\n"
        'base_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "G"\n'
        'webhook_scheme = "hmac"\nwebhook_id_header = "x-unused"\n',
        encoding="utf-8",
    )
    env = {"T": "t-0123456789", "A": SECRETS["acme"], "A_OLD": OLD_SECRET, "G": "g"}
    with pytest.raises(ConfigFileError) as info:
        load_config(config, env, listen=True)
    # A default that does not fit a store's own scheme is said of the store.
    assert info.value.problems == (
        "stores.globex: webhook_id_header is for the standard-webhooks scheme, the one that "
        "signs the id: an unsigned id header would let anyone slip a delivery past the dedupe",
    )
    (acme,) = load_config(config, env, listen=True, only_stores=["acme"])
    webhook = acme.webhook
    assert webhook is not None
    assert (webhook.scheme, webhook.id_header, webhook.timestamp_header) == (
        "standard-webhooks",
        "svix-id",
        "svix-timestamp",
    )
    assert (webhook.signature_header, webhook.encoding, webhook.timestamp_tolerance) == (
        "svix-signature",
        "base64",
        60,
    )
    assert webhook.secrets == (SECRETS["acme"].encode(), OLD_SECRET.encode())
    assert (webhook.shared_secret, webhook.store_id) == (False, None)
    assert SECRETS["acme"] not in repr(acme)


# ---------------------------------------------------------------------------------------------
# Refusals shown


def test_what_to_check_names_keys_stores_toml_has() -> None:
    known = set(attrs.fields_dict(StoreTable))
    for reason in Refusal:
        check = what_to_check(reason)
        assert check.startswith(reason.hint)
        assert set(KEYS_TO_CHECK.get(reason, ())) <= known, reason
        assert "in stores.toml: webhook_" in check or reason is Refusal.NOT_AN_EVENT
    assert "reads the default shape" in what_to_check(Refusal.NOT_AN_EVENT)


def refusal(reason: str, status: int = 401) -> WebhookRefused:
    return WebhookRefused("acme", reason, status, f"what was wrong ({reason})", f"how ({reason})")


def test_every_display_shows_the_first_refusal_and_counts_by_store_and_reason() -> None:
    counts = WebhookCounts(
        "acme", ReceiverStats(refusals={"no_signature": 2, "bad_signature": 150}, too_large=1)
    )
    plain, json_lines, summary = io.StringIO(), io.StringIO(), io.StringIO()
    progress = Progress()
    displays = [PlainLines(progress, plain, 1.0), JsonLines(progress, json_lines, 1.0)]
    for display in displays:
        progress.watch(display)
    progress(refusal("bad_signature"))
    progress(counts)
    progress(WebhookCounts("globex", ReceiverStats(refusals={"wrong_store": 3})))
    progress(WebhookCounts("initech"))
    for display in displays:
        display.tick()
    lines = [line.split("] ", 1)[1] for line in plain.getvalue().splitlines()]
    assert lines == [
        "warning: webhook delivery for store acme refused: what was wrong (bad_signature) "
        "[bad_signature, HTTP 401]. Check how (bad_signature). Further bad_signature refusals "
        "of this store are counted in the webhooks line and the summary, not shown",
        "webhooks: 0 accepted, 0 duplicates, 0 applied (0 deletes), 0 stale, 0 ignored, "
        "0 dead letters, 156 refused (acme: 150 bad_signature, 2 no_signature, 1 too_large; "
        "globex: 3 wrong_store)",
    ]
    objects = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    assert [(o["level"], o["event"]) for o in objects] == [
        ("warning", "webhook_refused"),
        ("info", "webhooks"),
    ]
    assert {k: objects[0][k] for k in ("store", "reason", "status", "detail", "check")} == {
        "store": "acme",
        "reason": "bad_signature",
        "status": 401,
        "detail": "what was wrong (bad_signature)",
        "check": "how (bad_signature)",
    }
    assert (objects[1]["refused"], objects[1]["refusals"]) == (
        156,
        {
            "acme": {"bad_signature": 150, "no_signature": 2, "too_large": 1},
            "globex": {"wrong_store": 3},
        },
    )

    live = Progress()
    live(counts)
    assert "153 refused (acme: 150 bad_signature, 2 no_signature, 1 too_large)" in str(
        LiveTable(live, io.StringIO())._render()
    )

    webhook_summary(progress, stream=summary)
    text = summary.getvalue()
    assert re.search(
        r"^acme\s.*\s153\s+150 bad_signature, 2 no_signature, 1 too_large\s", text, re.M
    )
    assert re.search(r"^globex\s.*\s3\s+3 wrong_store\s", text, re.M)
    assert re.search(r"^initech\s.*\s0\s{2,}0\s", text, re.M)  # nothing refused: nothing said
    assert "bad_signature: check how (bad_signature)" in text.splitlines()


@pytest.mark.parametrize("output", [["--progress", "plain"], ["--log-format", "json"]])
async def test_the_command_shows_refusals_once_each_and_counts_them(
    tmp_path: Path, output: list[str]
) -> None:
    """The issue's sender (store-less bodies, HMAC hex in X-Service-Signature), first with a
    secret the store does not have: those deliveries are refused, and the command says so, one
    warning per reason with what to check and the counters by store and reason in the progress
    and the summary; then with the store's own: its update and delete are applied."""
    db = tmp_path / "subs.db"
    async with fake_server(seed=24) as server:
        config = write_stores(tmp_path, server)
        options = ("--progress-interval", "0.1", *output)
        pipe = asyncio.subprocess.PIPE
        proc, urls, lines = await start_listen(
            db, config, environment(server), *options, stdout=pipe
        )
        kept, gone = server.records("acme", "subscriptions")[:2]
        customer = {**server.records("acme", "customers")[0], "updatedAt": "2031-01-01T00:00:00Z"}
        try:
            refused = event_body("e-1", "subscriptions/delete", kept)
            statuses = [
                await post(urls["acme"], refused, hmac_headers("stale", refused)) for _ in range(3)
            ]
            statuses += [await post(urls["acme"], refused, {}) for _ in range(2)]
            for event_id, topic, record in [
                ("e-2", "subscriptions/delete", gone),
                ("e-3", "customers/update", customer),
            ]:
                body = event_body(event_id, topic, record)
                statuses.append(await post(urls["acme"], body, hmac_headers(SECRETS["acme"], body)))
            assert statuses == [401] * 5 + [200] * 2
            counted = (
                ("2 applied (1 delete)", "5 refused (")
                if output[0] == "--progress"
                else ('"applied":2,', '"refused":5,')
            )
            async with asyncio.timeout(20):  # until the progress counts all seven
                assert proc.stderr is not None
                while not all(text in lines[-1] for text in counted):
                    line = (await proc.stderr.readline()).decode()
                    assert line, f"exited early: {''.join(lines)}"
                    lines.append(line)
            out, err = await terminate(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 143
    lines += err.decode().splitlines(keepends=True)
    if output[0] == "--progress":
        warnings = [line for line in lines if "warning:" in line]
        assert len(warnings) == 2, warnings
        assert "[bad_signature, HTTP 401]. Check the webhook secret" in warnings[0]
        assert "; in stores.toml: webhook_secret_env, webhook_previous_secrets_env," in warnings[0]
        assert "refused: missing or empty X-Service-Signature header" in warnings[1]
        assert "[no_signature, HTTP 401]" in warnings[1]
        assert "; in stores.toml: webhook_scheme, webhook_signature_header," in warnings[1]
        counts = [line for line in lines if "] webhooks: " in line][-1]
        assert counts.endswith("5 refused (acme: 3 bad_signature, 2 no_signature)\n")
    else:
        objects = [json.loads(line) for line in lines]
        refused = [o for o in objects if o["event"] == "webhook_refused"]
        assert [(o["level"], o["store"], o["reason"], o["status"]) for o in refused] == [
            ("warning", "acme", "bad_signature", 401),
            ("warning", "acme", "no_signature", 401),
        ]
        assert "webhook_secret_env" in refused[0]["check"]
        counts = [o for o in objects if o["event"] == "webhooks"][-1]
        assert counts["refusals"] == {"acme": {"bad_signature": 3, "no_signature": 2}}
        assert counts["refused"] == 5
        assert not [o for o in objects if "refused:" in o.get("message", "")]  # once, not twice
    summary = out.decode()
    assert re.search(
        r"^acme\s+2\s+0\s+2\s+1\s.*\s5\s+3 bad_signature, 2 no_signature\s", summary, re.M
    )
    assert re.search(r"^bad_signature: check the webhook secret", summary, re.M)
    subscriptions = {row[0] for row in table(db, "acme", "subscriptions")}
    assert str(kept["id"]) in subscriptions  # refused: deleted nothing
    assert str(gone["id"]) not in subscriptions
    assert tombstoned(db, "acme") == {str(gone["id"])}
    customers = {row[0]: row[4] for row in table(db, "acme", "customers")}
    assert customers[str(customer["id"])] == "2031-01-01T00:00:00Z"
