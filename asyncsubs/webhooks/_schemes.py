"""The signature schemes a webhook receiver knows, and each one's HMAC key: the names
:mod:`._config` checks a configuration against and :mod:`._signing` signs and verifies with."""

from __future__ import annotations

import base64
import binascii
from typing import Final, Literal, get_args

__all__ = ["SCHEMES", "Encoding", "Scheme", "signing_key"]

Scheme = Literal["hmac", "timestamped", "standard-webhooks"]
SCHEMES: Final[tuple[str, ...]] = get_args(Scheme)
Encoding = Literal["hex", "base64"]

_WHSEC: Final = b"whsec_"


def signing_key(secret: bytes, scheme: Scheme) -> bytes:
    """The HMAC key of ``secret`` (the secret's text as the service shows it) under ``scheme``:
    the secret itself, or for Standard Webhooks the bytes its base64 (after ``whsec_``) decodes
    to. ValueError, never naming the secret, when that is not base64."""
    if scheme != "standard-webhooks":
        return secret
    text = secret.strip().removeprefix(_WHSEC)
    try:
        key = base64.b64decode(text + b"=" * (-len(text) % 4), validate=True)
    except (ValueError, binascii.Error):
        key = b""
    if not key:
        raise ValueError(
            "a Standard Webhooks secret is the base64 text the service shows, "
            "usually prefixed whsec_; this one does not decode"
        )
    return key
