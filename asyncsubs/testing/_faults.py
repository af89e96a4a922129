"""Fault injection and scripted responses for the fake admin server.

Faults are drawn from a seeded RNG, one draw per eligible request, so a given request sequence
sees the same faults in every run. Scripted responses (``enqueue``) are exact, one-off answers
for tests of hostile or unusual responses.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from typing import Final

import attrs
import orjson

__all__ = ["FAULT_KINDS", "Faults", "ScriptedResponse"]

#: Fault kinds, in the order their fractions are stacked on the unit interval.
FAULT_KINDS: Final = (
    "error_500",
    "html_502",
    "reset",
    "truncate",
    "slow",
    "rate_limit_no_retry_after",
)


def _fraction(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"Faults.{attribute.name} must be a fraction in [0, 1], got {value!r}")


def _paths(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, tuple | list | set | frozenset):
        raise TypeError("Faults.paths must be a path prefix or a collection of them")
    return tuple(str(p).strip("/") for p in value)


@attrs.frozen(kw_only=True)
class Faults:
    """Fractions (0..1) of requests that get each fault; their sum must not exceed 1.

    - ``error_500``: 500 with a JSON error envelope, code ``INTERNAL_ERROR`` (not processed).
    - ``html_502``: 502 with an HTML body (``text/html``), as a proxy in front would send.
    - ``reset``: status and headers, part of the body, then the connection is closed.
    - ``truncate``: 200 whose body is cut in half, with a matching Content-Length (valid HTTP,
      invalid JSON).
    - ``slow``: sleep ``slow_seconds`` before answering normally (beyond a client timeout).
    - ``rate_limit_no_retry_after``: 429 ``RATE_LIMITED`` without a Retry-After header.

    ``paths`` limits faults to requests whose path (relative to ``/admin/{version}/``) starts
    with one of these prefixes. Faults apply after authentication.
    """

    seed: int = 0
    error_500: float = attrs.field(default=0.0, validator=_fraction)
    html_502: float = attrs.field(default=0.0, validator=_fraction)
    reset: float = attrs.field(default=0.0, validator=_fraction)
    truncate: float = attrs.field(default=0.0, validator=_fraction)
    slow: float = attrs.field(default=0.0, validator=_fraction)
    rate_limit_no_retry_after: float = attrs.field(default=0.0, validator=_fraction)
    slow_seconds: float = 60.0
    paths: tuple[str, ...] | None = attrs.field(default=None, converter=_paths)

    def __attrs_post_init__(self) -> None:
        if self.total > 1 + 1e-9:
            raise ValueError(f"Faults fractions add up to {self.total:g}, more than 1")
        if not math.isfinite(self.slow_seconds) or self.slow_seconds < 0:
            raise ValueError("Faults.slow_seconds must be a finite number >= 0")

    @property
    def total(self) -> float:
        return sum(self.fractions.values())

    @property
    def fractions(self) -> Mapping[str, float]:
        return {kind: float(getattr(self, kind)) for kind in FAULT_KINDS}

    def applies_to(self, path: str) -> bool:
        if self.paths is None:
            return True
        return any(path == p or path.startswith(p + "/") or not p for p in self.paths)


class FaultPicker:
    """Draws the fault (or None) for each eligible request from a seeded RNG."""

    def __init__(self, faults: Faults | None) -> None:
        self.faults = faults
        self._rng = random.Random(faults.seed if faults is not None else 0)
        self._cumulative: tuple[tuple[float, str], ...] = ()
        if faults is not None:
            edge = 0.0
            steps = []
            for kind, fraction in faults.fractions.items():
                if fraction > 0:
                    edge += fraction
                    steps.append((edge, kind))
            self._cumulative = tuple(steps)

    def draw(self, path: str) -> str | None:
        if not self._cumulative or self.faults is None or not self.faults.applies_to(path):
            return None
        roll = self._rng.random()
        for edge, kind in self._cumulative:
            if roll < edge:
                return kind
        return None


@attrs.frozen
class ScriptedResponse:
    """One raw answer queued by ``FakeAdminServer.enqueue`` (matched after authentication)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]
    path: str | None = None
    method: str | None = None
    store: str | None = None

    def matches(self, method: str, path: str, store: str) -> bool:
        return (
            (self.path is None or self.path == path)
            and (self.method is None or self.method == method)
            and (self.store is None or self.store == store)
        )


def encode_body(body: bytes | str | Mapping[str, object] | list[object] | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    try:
        return orjson.dumps(body)
    except TypeError:
        # orjson refuses ints beyond 64 bits, which hostile-response tests like to send.
        return json.dumps(body, ensure_ascii=False).encode()


@attrs.define
class _Script:
    response: ScriptedResponse
    remaining: int | None  # None: until cleared


class ScriptQueue:
    """FIFO of scripted responses; each entry answers ``times`` matching requests (None: all)."""

    def __init__(self) -> None:
        self._entries: list[_Script] = []

    def add(self, response: ScriptedResponse, times: int | None) -> None:
        whole = isinstance(times, int) and not isinstance(times, bool)
        if times is not None and not (whole and times >= 1):  # 2.5 would never run out
            raise ValueError(
                f"times must be a whole number >= 1 or None (until cleared), got {times!r}"
            )
        self._entries.append(_Script(response, times))

    def take(self, method: str, path: str, store: str) -> ScriptedResponse | None:
        for index, entry in enumerate(self._entries):
            if entry.response.matches(method, path, store):
                if entry.remaining is not None:
                    entry.remaining -= 1
                    if entry.remaining == 0:
                        del self._entries[index]
                return entry.response
        return None

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
