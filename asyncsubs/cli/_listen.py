"""``sync --listen``: the command line's side of ``asyncsubs.sync.ListenSync``: its address
option, and the receivers' warnings among the progress."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..errors import ConfigError
from ..stores import Message, Store
from ..sync import DEFAULT_RECONCILE_EVERY, ListenSync, Sink
from ._common import USER_AGENT, Runner
from ._output import logging_to

__all__ = ["listen", "listen_address", "parse_listen"]


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
    as one line each among the progress, without traceback (--debug has them). They stay log
    records: that is how the receivers speak to any application. A refused delivery is left
    out: the display shows its ``WebhookRefused`` event, with the keys to check."""

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


def listen(
    args: argparse.Namespace, stores: Sequence[Store], sink: Sink, runner: Runner
) -> Callable[[], Awaitable[None]]:
    """The coroutine of ``sync --listen``: it runs until stopped, so it ends only by a signal
    or a failure."""
    host, port = args.listen
    every = DEFAULT_RECONCILE_EVERY if args.reconcile_every is None else args.reconcile_every

    async def run() -> None:
        listening = ListenSync(
            stores, sink, runner.progress, max_stores=args.max_stores, user_agent=USER_AGENT
        )
        # With --debug the library's own log lines show the receivers'.
        log = _ReceiverLog(runner)
        with contextlib.nullcontext() if args.debug else logging_to("asyncsubs.webhooks", log):
            async with listening:
                try:
                    await listening.run(host, port, every)
                except ConfigError as exc:
                    if exc.key != "listen":
                        raise
                    raise ConfigError(exc.problem, key="--listen", sep=" ") from None

    return run
