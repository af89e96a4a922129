"""``asyncsubs pull RESOURCE``: one resource of one store as JSON Lines, on stdout or ``-o FILE``.

Unless ``--rate`` and ``--page-size`` pin them, the pool finds its rate and the pull the largest
page the server serves, starting from what earlier pulls of the store learned (``LearnedFile``,
in the cache). The store is ``--store``, else the base URL's host. With ``-o FILE``, a
checkpoint beside it (``_checkpoint``) lets a rerun continue after the last whole page written.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import urlsplit

from .. import Limits, Rate, RetryPolicy
from ..errors import AsyncSubsError, ConfigError
from ..json import dumps
from ..limiting import PoolStats
from ..settings import DEFAULT_VERSION, check_token
from ..stores import (
    DEFAULT_PAGE_SIZE,
    RESOURCES,
    LearnedFile,
    Store,
    StoreClients,
    Unit,
    check_base_url,
    describe_error,
)
from ._checkpoint import PullCheckpoint, open_output
from ._common import EXIT_OK, USER_AGENT, CommandFailed, Runner, positive_float, positive_int, rate
from ._output import Output, silence_stdout
from ._progress import learned_text, plural

__all__ = ["add_parser"]

log = logging.getLogger("asyncsubs.cli")

#: Query parameters the pull sets itself, and the flags that set them.
_RESERVED: Final = {"pageSize": "--page-size", "afterCursor": "--after-cursor"}


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key in _RESERVED:
        raise argparse.ArgumentTypeError(f"{key} is set by {_RESERVED[key]}")
    return key, value


def add_parser(commands: Any, output: argparse.ArgumentParser) -> None:
    pull = commands.add_parser(
        "pull",
        parents=[output],
        help="write one resource as JSON Lines",
        description=(
            "Write every record of RESOURCE as JSON Lines (one record per line, as received) "
            "to stdout or FILE. Token and base URL default to $ASYNCSUBS_TOKEN and "
            "$ASYNCSUBS_BASE_URL."
        ),
    )
    pull.add_argument("resource", metavar="RESOURCE", choices=RESOURCES, help=", ".join(RESOURCES))
    pull.add_argument("--base-url", help="the service's base URL (default $ASYNCSUBS_BASE_URL)")
    pull.add_argument(
        "--token",
        help="the admin API token (default $ASYNCSUBS_TOKEN; prefer the variable: "
        "command lines are visible to other users)",
    )
    pull.add_argument("--store", help="rate-limit identity of the store (default: derived)")
    pull.add_argument(
        "--page-size",
        type=positive_int,
        metavar="N",
        help="records per request, fixed (the server may clamp it); default: the largest page "
        "the server serves, learned while pulling and remembered for the next pull",
    )
    pull.add_argument("--after-cursor", metavar="C", help="resume after this cursor")
    pull.add_argument(
        "--param",
        type=_param,
        action="append",
        metavar="KEY=VALUE",
        help="a query parameter for the server, e.g. status=ACTIVE (repeatable)",
    )
    pull.add_argument("--limit", type=positive_int, metavar="N", help="stop after N records")
    pull.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout; a rerun of the same command continues after the "
        "last whole page written (checkpoint: FILE.asyncsubs-checkpoint)",
    )
    pull.add_argument(
        "--restart",
        action="store_true",
        help="with -o: start over even if FILE has a checkpoint to continue from",
    )
    pull.add_argument(
        "--allow-insecure",
        action="store_true",
        help="allow a plain http:// base URL that is not loopback (a trusted network only: "
        "the token travels unencrypted)",
    )
    pull.add_argument(
        "--rate",
        type=rate,
        metavar="N/Ss",
        help="the list endpoint's rate-limit pool, fixed, e.g. 2/s or 3/2s; default: found "
        "while pulling (from 1/s up, just under the first 429) and remembered for the next pull",
    )
    pull.add_argument(
        "--api-version",
        metavar="V",
        default=DEFAULT_VERSION,
        help="the interface version in the path (default: %(default)s, the one implemented)",
    )
    pull.add_argument(
        "--timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="seconds per attempt",
    )
    pull.add_argument(
        "--max-attempts", type=positive_int, default=6, metavar="N", help="attempts per request"
    )
    pull.set_defaults(handler=lambda args, out: Pull(args, out).main())


class Pull:
    """One ``pull``: its store's client, its output and checkpoint, and where it stands."""

    def __init__(self, args: argparse.Namespace, out: Output) -> None:
        self.args, self.out = args, out
        self.store = self._store()
        if args.restart and args.output is None:
            raise ConfigError("--restart needs -o FILE (a pull to stdout keeps no checkpoint)")
        # Learned limits are kept in a state file in the cache, by the store's name.
        self.clients = StoreClients(
            LearnedFile(out.warning), user_agent=USER_AGENT, note=out.warning
        )
        self.unit: Unit  # set by pull(), on the opened client
        # A client refuses bad settings before any request; it names the checkpoint's pull.
        client = self.clients.client(self.store)
        self.params: dict[str, str] = dict(args.param or ())
        self.identity: dict[str, Any] = {
            "resource": args.resource,
            "base_url": client.base_url,
            "credentials": client.fingerprint,
            "after_cursor": args.after_cursor,
            "params": self.params,
        }
        self.path = None if args.output is None else Path(args.output)
        self.file: IO[bytes] | None = None
        self.checkpoint: PullCheckpoint | None = None
        if self.path is not None:
            self.file, self.checkpoint = open_output(
                args.output, self.identity, restart=args.restart
            )
        saved = self.checkpoint
        #: Records and pages in the output, those written before resuming included.
        self.records = self.before = 0 if saved is None else saved.records
        self.pages = 0 if saved is None else saved.pages
        #: The cursor after the last page written (None: nothing to continue).
        self.cursor: str | None = args.after_cursor if saved is None else saved.cursor
        self.runner = Runner(args, out)
        if self.runner.mode == "rich" and self.file is None and sys.stdout.isatty():
            self.runner.mode = "plain"  # records go to the same terminal: a live table garbles

    def _store(self) -> Store:
        """The store the flags name, every setting checked: a usage error exits 2 before any
        request."""
        args, env = self.args, os.environ
        token = args.token if args.token is not None else env.get("ASYNCSUBS_TOKEN")
        base_url = args.base_url if args.base_url is not None else env.get("ASYNCSUBS_BASE_URL")
        check_token(token)
        hint = "--allow-insecure"
        check_base_url(base_url, args.api_version, args.allow_insecure, insecure_hint=hint)
        assert isinstance(token, str)
        assert isinstance(base_url, str)
        # The other heavy pools discover too, unused: one Limits for every pull of a store.
        heavy = None if args.rate is None else {args.resource: args.rate}
        return Store(
            name=args.store or urlsplit(base_url).hostname or "store",
            base_url=base_url,
            token=token,
            limits=Limits(discover=True, heavy=heavy),
            page_size=args.page_size or DEFAULT_PAGE_SIZE,
            retry=RetryPolicy(max_attempts=args.max_attempts),
            timeout=args.timeout,
            version=args.api_version,
            allow_insecure=args.allow_insecure,
        )

    # -- running ------------------------------------------------------------------------------

    def _write(self, records: list[Any]) -> None:
        out = self.file or sys.stdout.buffer
        try:
            # Each record as it was sent (same keys, order, values; integers exact).
            out.write(b"".join(dumps(r) + b"\n" for r in records))
            out.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            where = self.path or "stdout"
            raise CommandFailed([f"cannot write {where}: {exc.strerror or exc}"]) from None

    def _save(self) -> None:
        """The checkpoint after the page just written (removed once the pull is complete)."""
        if self.path is None or self.file is None:
            return
        try:
            if self.cursor is None:
                PullCheckpoint.remove(self.path)  # complete: nothing to continue
                return
            PullCheckpoint(
                **self.identity,
                cursor=self.cursor,
                offset=self.file.tell(),
                records=self.records,
                pages=self.pages,
            ).save(self.path)
        except OSError as exc:
            path = PullCheckpoint.path_for(self.path)
            raise CommandFailed([f"cannot write {path}: {exc.strerror or exc}"]) from None

    async def pull(self) -> None:
        args, limit = self.args, self.args.limit
        client = await self.clients.open(self.store, on_retry=lambda e: self.unit.retried(e))
        async with client:
            self.unit = unit = Unit(client, self.store.name, args.resource, self.runner.progress)
            unit.start(resumed=self.checkpoint is not None, records_before=self.before)
            if limit is not None and self.records >= limit:
                self.cursor = None
                self._save()
                unit.done()
                return
            try:
                # With --limit, a page fetched ahead would likely be thrown away.
                async for page in unit.pages(
                    page_size=self.store.page_size,
                    after_cursor=self.cursor,
                    params=self.params,
                    prefetch=None if limit is None else 0,
                ):
                    room = None if limit is None else limit - self.records
                    records = page.data[:room]
                    self._write(records)
                    self.records, self.pages = self.records + len(records), self.pages + 1
                    done = room is not None and len(records) >= room
                    self.cursor = None if done else page.next_cursor
                    self._save()
                    unit.committed(len(records))
                    if done:
                        break
            except ConfigError:
                raise  # a usage error the client found only now: exit 2, not a failed pull
            except AsyncSubsError as exc:
                log.debug("pull %s failed", args.resource, exc_info=True)  # --debug: traceback
                unit.failed(describe_error(exc))
                return
            except BaseException:
                unit.stopped()
                raise
            finally:
                await self.clients.keep(client)
            unit.done()

    def main(self) -> int:
        try:
            self.runner.run(self.pull)
        except CommandFailed as exc:
            if exc.code != 1:  # Ctrl-C or SIGTERM: said even before the first page
                self.out.note(self._interrupted())
            raise
        except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error of ours
            silence_stdout()
            return EXIT_OK
        finally:
            if self.file is not None:
                # Every page was flushed as written; a write that failed left its bytes in the
                # buffer, and closing would fail on them again over the one line said already.
                with contextlib.suppress(OSError):
                    self.file.close()
        (row,) = self.runner.progress.rows.values()
        if row.state == "failed":
            # The plain and JSON lines printed the failure when it happened.
            plain = self.runner.mode in ("plain", "json")
            lines = [] if plain else [f"{row.store}, {row.resource}: {row.error}"]
            if how := self._how_to_continue():
                lines.append(f"{plural(self.records, 'record')} written; {how}")
            raise CommandFailed(lines)
        if not self.args.quiet:
            before = f", {plural(self.before, 'record')} of them before resuming"
            learned = learned_text(row.stats)
            self.out.note(
                f"{plural(self.records, self.args.resource[:-1])} in "
                f"{plural(self.pages, 'page')} ({row.elapsed():.1f}s)"
                + (before if self.before else "")
                + self._rate_limited(row.stats, row.allowed)
                + (f"; {self.args.resource}: {learned}" if learned else "")
            )
        return EXIT_OK

    def _rate_limited(self, stats: PoolStats, allowed: Rate | None) -> str:
        """After 429s, the pace the server allowed (as the client slowed to it)."""
        if not stats.rate_limited:
            return ""
        said = f"; {plural(stats.rate_limited, '429')}"
        if stats.paced_by != "429" or not stats.interval:
            return said
        configured = "" if allowed is None else f" (configured: {allowed.per_second:g}/s)"
        return f"{said}: the server allowed about {1 / stats.interval:.2f} requests/s{configured}"

    def _interrupted(self) -> str:
        """The line of a pull stopped by a signal: what it wrote, and how to go on."""
        if how := self._how_to_continue():
            return f"interrupted after {plural(self.records, 'record')}; {how}"
        if not self.pages:
            return "interrupted before the first page; nothing written: rerun the same command"
        written = plural(self.records, "record")
        return f"interrupted after the last page; {written} written: nothing to continue"

    def _how_to_continue(self) -> str | None:
        """How to continue a pull stopped with pages written (None: nothing to continue)."""
        if not self.cursor or not self.pages:
            return None
        if self.path is not None:
            return "rerun the same command to continue (--restart starts over)"
        return f"resume with --after-cursor {self.cursor}"
