"""Where what a store's pools learned (``AdminClient.export_learned()``) is kept between runs.

``LearnedStore``: loaded by the store's name before its client is made, saved after a unit.
Its backends: ``LearnedFile`` (the cache directory: ``pull``), ``LearnedState`` (the dlt
source's state) and a sync's sink (its ``asyncsubs_learned`` table). Redis needs none: a
``RedisLimiter``'s pools share each learned record there as they learn it, under the same name.
Keyed by the name, not the address: a fake server on a new port is the same store.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Final, Protocol

from ..json import dumps, loads

__all__ = ["FILE_FORMAT", "LearnedFile", "LearnedState", "LearnedStore"]

FILE_FORMAT: Final = "asyncsubs.learned-file/1"


class LearnedStore(Protocol):
    """What stores learned, by store name."""

    async def load_learned(self, store: str) -> Mapping[str, Any] | None:
        """What ``store``'s pools learned when last saved (None: nothing saved)."""

    async def save_learned(self, store: str, learned: Mapping[str, Any]) -> None:
        """Keep what ``store``'s pools learned."""


class LearnedState:
    """What stores learned, in a mapping the caller keeps (the dlt source's state)."""

    def __init__(self, state: MutableMapping[str, Any]) -> None:
        self.state = state

    async def load_learned(self, store: str) -> Mapping[str, Any] | None:
        return self.state.get(store)

    async def save_learned(self, store: str, learned: Mapping[str, Any]) -> None:
        self.state[store] = dict(learned)


def _cache_dir() -> Path:
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("ASYNCSUBS_CACHE_DIR") or xdg / "asyncsubs")


class LearnedFile:
    """``learned.json`` in ``$ASYNCSUBS_CACHE_DIR``, or ``$XDG_CACHE_HOME/asyncsubs``
    (``~/.cache/asyncsubs``): ``{"format": FILE_FORMAT, "stores": [<an export>, ...]}``, one
    ``AdminClient.export_learned()`` per store. A file that cannot be read, or is not this
    format, is ignored with one warning (``warn``) and replaced when saved; a learned value is
    probed again after a day anyway."""

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

    async def load_learned(self, store: str) -> Mapping[str, Any] | None:
        return next((e for e in self._entries(warn=True) if e.get("store") == store), None)

    async def save_learned(self, store: str, learned: Mapping[str, Any]) -> None:
        """Replace ``store``'s entry, atomically; a file that cannot be written costs only the
        memory, with a warning."""
        entries = [e for e in self._entries(warn=False) if e.get("store") != store]
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
