"""Opaque, signed pagination cursors.

A cursor is base64url(JSON ``[1, store, resource, position]`` + truncated HMAC-SHA256). The
position is the last record returned (its id, or ``[change key, id]`` in a list ordered by
change) rather than an offset, so resuming is exact even when records are added or a status
filter changes which records match; the HMAC binds it to one store and one resource, so a cursor
from another store, another resource or a tampered one is rejected (INVALID_CURSOR).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final, TypeAlias

import orjson

__all__ = ["CursorCodec", "InvalidCursor", "Position"]

#: Where a list stands: the last id served (id order), or its (change key, id) (change order).
Position: TypeAlias = int | tuple[float, int]

_VERSION: Final = 1
_MAC_BYTES: Final = 12
_MAX_LENGTH: Final = 512


class InvalidCursor(ValueError):
    """The cursor was not issued by this server for this store and resource."""


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(self, store: str, resource: str, position: Position) -> str:
        payload = orjson.dumps([_VERSION, store, resource, position])
        raw = payload + self._mac(payload)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, cursor: str, store: str, resource: str) -> Position:
        """The position the cursor points after; raises InvalidCursor."""
        if not cursor or len(cursor) > _MAX_LENGTH or not cursor.isascii():
            raise InvalidCursor("malformed cursor")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError) as exc:
            raise InvalidCursor("malformed cursor") from exc
        payload, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if len(raw) <= _MAC_BYTES or not hmac.compare_digest(mac, self._mac(payload)):
            raise InvalidCursor("cursor signature mismatch")
        try:
            version, cursor_store, cursor_resource, position = orjson.loads(payload)
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise InvalidCursor("malformed cursor payload") from exc
        if isinstance(position, list) and len(position) == 2:
            key, last_id = position
            if isinstance(key, int | float) and isinstance(last_id, int):
                position = (float(key), last_id)
        if version != _VERSION or not isinstance(position, int | tuple):
            raise InvalidCursor("unsupported cursor")
        if cursor_store != store:
            raise InvalidCursor("cursor belongs to another store")
        if cursor_resource != resource:
            raise InvalidCursor("cursor belongs to another list endpoint")
        return position
