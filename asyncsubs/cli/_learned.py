"""What ``pull`` remembers between runs: the rates and page sizes its stores' pools learned.

One JSON file in the user's cache directory, ``$ASYNCSUBS_CACHE_DIR`` or
``$XDG_CACHE_HOME/asyncsubs`` (``~/.cache/asyncsubs``), named ``learned.json``::

    {"format": "asyncsubs.learned-file/1",
     "stores": [<AdminClient.export_learned() of a store>, ...]}

one export per (base URL, store). A pull starts from its store's entry and writes it back when
it ends, however it ends; other entries are kept. A file that cannot be read, or is not this
format, is ignored with one warning (and replaced at the end). Deleting it forgets everything;
a learned value is probed again after a day anyway.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from ..json import dumps, loads

__all__ = ["FILE_FORMAT", "LearnedFile"]

FILE_FORMAT: Final = "asyncsubs.learned-file/1"


def _cache_dir() -> Path:
    own = os.environ.get("ASYNCSUBS_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "asyncsubs"


class LearnedFile:
    """The state file: one store's entry read (``entry``), and written back (``save``);
    ``warn`` says what goes wrong with it, in one line."""

    def __init__(self, warn: Callable[[str], object], path: Path | None = None) -> None:
        self.path = _cache_dir() / "learned.json" if path is None else path
        self.warn = warn

    def _entries(self, *, warn: bool) -> list[Mapping[str, Any]]:
        why = None
        try:
            data = loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not JSON"
        else:
            stores = data.get("stores") if isinstance(data, dict) else None
            if isinstance(stores, list) and data.get("format") == FILE_FORMAT:
                return [entry for entry in stores if isinstance(entry, dict)]
            why = f"not a state file of this asyncsubs ({FILE_FORMAT})"
        if warn:
            self.warn(f"ignoring {self.path}: {why}; it is rewritten when the pull ends")
        return []

    def entry(self, base_url: str, store: str) -> Mapping[str, Any] | None:
        """What an earlier pull of ``store`` at ``base_url`` learned, or None."""
        for entry in self._entries(warn=True):
            if (entry.get("base_url"), entry.get("store")) == (base_url, store):
                return entry
        return None

    def save(self, learned: Mapping[str, Any]) -> None:
        """Replace the entry of ``learned``'s store, keeping the others as they are now
        (atomically: a reader sees the old file or the new one). A file that cannot be written
        costs only the memory, with a warning."""
        key = (learned.get("base_url"), learned.get("store"))
        entries = [
            e for e in self._entries(warn=False) if (e.get("base_url"), e.get("store")) != key
        ]
        entries.append(learned)
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(dumps({"format": FILE_FORMAT, "stores": entries}))
            os.replace(temporary, self.path)
        except OSError as exc:
            self.warn(f"cannot keep what the pull learned in {self.path}: {exc.strerror}")
            with contextlib.suppress(OSError):
                temporary.unlink()
