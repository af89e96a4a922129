"""Tables for summaries: aligned plain text, or rich's boxed table on a wide enough terminal;
for a command whose output is its table (``sync-status``, ``dead-letters``), ``--json`` prints
the same figures as one JSON document instead, and ``--log-format json`` its notes and errors
as JSON lines, as for ``sync``."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import IO, Any

from ..json import dumps

__all__ = ["format_table", "print_json", "print_table", "report_options", "rich_available"]


def report_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--log-format``, for a command whose output is its table."""
    parser.add_argument(
        "--json", action="store_true", help="the table's figures as one JSON document on stdout"
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: notes and errors on stderr as one JSON object per line, as for sync",
    )


def print_json(document: Any, *, stream: IO[str]) -> None:
    stream.write(dumps(document).decode() + "\n")
    stream.flush()


def rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain, aligned text table (numbers right-aligned) for logs and non-terminals."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def numeric(cell: str) -> bool:
        return bool(cell) and (cell[0].isdigit() or cell[0] in "-+") and cell[-1] != ":"

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if numeric(cell) else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    stream: IO[str],
    footer: Iterable[str] = (),
) -> None:
    """Print a summary table: with rich on a terminal, as plain text otherwise."""
    plain = format_table(headers, rows)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty() and rich_available():
        from rich.console import Console
        from rich.table import Table

        console = Console(file=stream)
        # A boxed table needs 3 columns per cell more than the plain one; when the terminal is
        # narrower, the plain table reads better than rich's truncated cells.
        needed = max(map(len, plain.splitlines())) + 3 * len(headers)
        if console.width >= needed:
            table = Table(title=title, title_justify="left", header_style="bold")
            for i, header in enumerate(headers):
                numeric = any(r[i][:1].isdigit() for r in rows)
                table.add_column(header, justify="right" if numeric else "left", no_wrap=True)
            for row in rows:
                table.add_row(*row)
            console.print(table)
            for text in footer:
                console.print(text, highlight=False)
            return
    stream.write(f"{title}\n{plain}\n")
    for text in footer:
        stream.write(f"{text}\n")
    stream.flush()
