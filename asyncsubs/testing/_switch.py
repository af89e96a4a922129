"""The testing switch: turn retry backoffs and 429 pauses off (as ``stamina.set_testing``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .._retry import set_waiting

__all__ = ["no_waiting", "set_waiting"]


@contextmanager
def no_waiting() -> Iterator[None]:
    """Within this block, failed attempts are retried at once and a 429 pauses nothing.

    Retry counts, error types and statistics stay as in production; only the waiting goes.
    """
    previous = set_waiting(False)
    try:
        yield
    finally:
        set_waiting(previous)
