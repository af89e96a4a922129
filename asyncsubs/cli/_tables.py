"""Tables for summaries: aligned plain text, or rich's boxed table on a wide enough terminal;
for a command whose output is its table (``sync-status``, ``dead-letters``), ``--json`` prints
the same figures as one JSON document instead."""

from __future__ import annotations

import codecs
import contextlib
import importlib.util
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from ..json import dumps
from ._output import CommandFailed

__all__ = ["format_table", "print_json", "print_table", "rich_available", "writing_to"]


@contextlib.contextmanager
def writing_to(stream: IO[str]) -> Iterator[None]:
    """A table or document ``stream`` cannot take (a full disk) ends the command with one line
    and exit 1, as records ``pull`` cannot write do. A reader gone (BrokenPipeError) is the
    command line's own case."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        where = "stdout" if stream is sys.stdout else getattr(stream, "name", "output")
        raise CommandFailed([f"cannot write {where}: {exc.strerror or exc}"]) from None


def print_json(document: Any, *, stream: IO[str]) -> None:
    text = dumps(document).decode()
    if codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name != "utf-8":
        # Escaped as JSON does (what backslashreplace would make of "é" is not JSON).
        text = re.sub(r"[^\x00-\x7f]", lambda char: json.dumps(char[0])[1:-1], text)
    with writing_to(stream):
        stream.write(text + "\n")
        stream.flush()


def rich_available() -> bool:
    return importlib.util.find_spec("rich") is not None


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "-+") and cell[-1] != ":"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain, aligned text table (numbers right-aligned) for logs and non-terminals."""
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        aligned = [
            cell.rjust(width) if _numeric(cell) else cell.ljust(width)
            for cell, width in zip(cells, widths, strict=True)
        ]
        return "  ".join(aligned).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *map(line, rows)])


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    stream: IO[str],
    footer: Iterable[str] = (),
) -> None:
    """Print a summary table: with rich on a terminal, as plain text otherwise."""
    with writing_to(stream):
        _print_table(title, headers, rows, stream, footer)


def _print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    stream: IO[str],
    footer: Iterable[str],
) -> None:
    plain = format_table(headers, rows)
    if stream.isatty() and rich_available():
        from rich.console import Console
        from rich.table import Table

        console = Console(file=stream)
        # Narrower than a boxed table needs (3 columns a cell more), the plain one reads better
        # than rich's truncated cells.
        if console.width >= max(map(len, plain.splitlines())) + 3 * len(headers):
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
    stream.write(f"{title}\n{plain}\n" + "".join(f"{text}\n" for text in footer))
    stream.flush()
