"""``asyncsubs dead-letters``: the webhook events ``sync --listen`` could not apply, listed,
handed back to its inbox with ``--requeue``, or dropped with ``--purge``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..sync import REQUEUE_BELOW_ATTEMPTS, Sink, sink_for
from ..webhooks import DeadLetter, InboxEntry
from ._common import report_options
from ._output import Output
from ._progress import plural
from ._tables import print_json, print_table

__all__ = ["add_parser", "dead_letters"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "dead-letters",
        help="list (requeue, purge) the webhook events sync --listen could not apply",
        description=(
            "List the dead letters of a sync database: webhook events that sync --listen "
            "accepted but could not apply. sync --listen requeues them itself on start while "
            f"they have had fewer than {REQUEUE_BELOW_ATTEMPTS} attempts; --requeue moves them "
            "(all, or those of --store) back to the inbox, whatever their attempts, for the "
            "next start of sync --listen to apply (restart a running one); --purge deletes "
            "them, for events no attempt will apply."
        ),
    )
    parser.add_argument(
        "--db", required=True, metavar="URL", help="sqlite:///path.db or postgresql://..."
    )
    parser.add_argument(
        "--store",
        action="append",
        metavar="ID",
        help="only this store's (repeatable; default: every store's)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--requeue", action="store_true", help="move them back to the inbox")
    what.add_argument("--purge", action="store_true", help="delete them")
    report_options(parser)
    parser.set_defaults(handler=cmd_dead_letters, debug=False)


async def dead_letters(
    sink: Sink, *, stores: Sequence[str] | None = None, requeue: bool = False, purge: bool = False
) -> tuple[list[DeadLetter], int] | None:
    """The dead letters (of ``stores``, or all), and how many were moved back to the inbox
    with ``requeue`` (letters without a store, from before they named one, stay) or deleted
    with ``purge``; None when the database never listened (no table is made to say so)."""
    if not await sink.has_webhook_tables():
        return None
    async with sink:
        inbox, dead = await sink.webhook_stores()
        letters = [x for x in await dead.all() if stores is None or x.store in stores]
        movable = [(x, x.store) for x in letters if requeue and x.store is not None]
        for letter, store in movable:
            # Attempts add up over requeues, as at start: the bound on start-up requeues holds.
            await inbox.add(
                InboxEntry(store, letter.event_id, letter.body, time.time(), letter.attempts)
            )
            # Only this store's: other stores' letters may share the event id.
            await dead.remove_for_store(store, letter.event_id)
        if purge:
            for letter in letters:
                await dead.remove_for_store(letter.store, letter.event_id)
    return letters, len(letters) if purge else len(movable)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _letter_json(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as the table shows it (its body stays in the database)."""
    return {
        "store": letter.store,
        "event_id": letter.event_id,
        "topic": letter.topic,
        "attempts": letter.attempts,
        "failed_at": datetime.fromtimestamp(letter.failed_at, UTC).isoformat(),
        "error": letter.error,
    }


def cmd_dead_letters(args: argparse.Namespace, out: Output) -> int:
    sink = sink_for(args.db)
    found = asyncio.run(
        dead_letters(sink, stores=args.store, requeue=args.requeue, purge=args.purge)
    )
    if found is None:
        out.note(
            f"no dead letters: {sink.where} has never run sync --listen (it has no webhook tables)"
        )
    letters, moved = found or ([], 0)
    if args.json:
        document = {"database": sink.where, "dead_letters": [_letter_json(x) for x in letters]}
        print_json(
            document
            | ({"moved": moved} if args.requeue and found else {})
            | ({"deleted": moved} if args.purge and found else {}),
            stream=sys.stdout,
        )
        return 0
    if found is None:
        return 0
    rows = [
        [x.store or "", x.event_id, x.topic or "", str(x.attempts), _utc(x.failed_at), x.error]
        for x in letters
    ]
    footer = [f"{plural(len(letters), 'dead letter')} in {sink.where} (table webhook_dead_letters)"]
    if args.requeue:
        footer.append(
            f"{moved:,} moved to webhook_inbox: sync --listen applies them when it next starts"
        )
    if args.purge:
        footer.append(f"{moved:,} deleted")
    missing = sorted(set(args.store or ()) - {letter.store for letter in letters})
    if missing:
        everyone, _ = asyncio.run(dead_letters(sink_for(args.db))) or ([], 0)
        having = sorted({letter.store for letter in everyone if letter.store})
        footer.append(
            f"--store {', '.join(missing)}: no dead letters of that store id (stores with dead "
            f"letters: {', '.join(having) or 'none'})"
        )
    print_table(
        "webhook dead letters",
        ["store", "event", "topic", "attempts", "failed at (UTC)", "error"],
        rows,
        stream=sys.stdout,
        footer=footer,
    )
    return 0
