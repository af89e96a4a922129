"""``sync --listen``: the command line's side of ``asyncsubs.sync.ListenSync``: its address
option, its run until Ctrl-C or SIGTERM, the receivers' warnings among the progress, and the
summary of what was pulled and what the webhooks did."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence

from ..errors import ConfigError
from ..sync import DEFAULT_RECONCILE_EVERY, ListenSync, Message, Sink, StoreConfig
from ._common import EXIT_INTERRUPTED, EXIT_TERMINATED, USER_AGENT, CommandFailed, Runner
from ._summaries import summary_fields, sync_summary, webhook_summary

__all__ = ["listen_address", "parse_listen", "run_listen"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; port 0: any free port) -> (host, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"--listen takes HOST:PORT (e.g. 0.0.0.0:8080), got {text!r}")
    return host, int(port_text)


def listen_address(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _ReceiverLog(logging.Handler):
    """The receivers' warnings and errors (failed and dead-lettered events, bodies too large)
    as one line each among the progress, like every other message: no traceback (--debug has
    them), and through the display rather than across it. They stay log records: the
    receivers' logger is how they speak to any application. A refused delivery's warning is
    left out: the display shows it from its ``WebhookRefused`` event, with the keys to check."""

    def __init__(self, runner: Runner) -> None:
        super().__init__(logging.WARNING)
        self.runner = runner

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "webhook_refusal", None) is not None:
            return
        try:
            text = " ".join(record.getMessage().split())
            if self.runner.progress.shown:
                self.runner.progress(Message(f"{record.levelname.lower()}: {text}"))
            elif record.levelno >= logging.ERROR:  # --quiet: errors only
                self.runner.out.error(text)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _receiver_log(runner: Runner, *, enabled: bool) -> Iterator[None]:
    if not enabled:  # --debug: the library's own log lines show them
        yield
        return
    logger = logging.getLogger("asyncsubs.webhooks")
    handler = _ReceiverLog(runner)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def run_listen(
    args: argparse.Namespace, configs: Sequence[StoreConfig], sink: Sink, runner: Runner
) -> int:
    """Runs until stopped, so it only ends by a signal or a failure."""
    host, port = args.listen
    every = DEFAULT_RECONCILE_EVERY if args.reconcile_every is None else args.reconcile_every
    started = time.monotonic()

    async def listen() -> None:
        observe, stores = runner.progress, args.max_stores
        listen_sync = ListenSync(configs, sink, observe, max_stores=stores, user_agent=USER_AGENT)
        async with listen_sync as listening:
            try:
                await listening.run(host, port, every)
            except ConfigError as exc:
                if exc.key != "listen":
                    raise
                raise ConfigError(exc.problem, key="--listen", sep=" ") from None

    try:
        with _receiver_log(runner, enabled=not args.debug):
            runner.run(listen)
    except CommandFailed as exc:
        if not args.quiet:
            elapsed, progress = time.monotonic() - started, runner.progress
            sync_summary(progress, elapsed, sink.where, stream=sys.stdout, runs=progress.runs)
            webhook_summary(progress, stream=sys.stdout)
            fields = summary_fields(progress, elapsed, sink.where, runs=progress.runs)
            runner.out.event("summary", **fields)
        if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            runner.out.note(
                "stopped; accepted webhooks not applied yet are kept in webhook_inbox and every "
                "committed page is kept: rerun the same command to continue"
            )
        raise
    return 0  # not reached: ListenSync.run returns only by raising
