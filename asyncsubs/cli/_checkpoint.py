"""``pull -o FILE``'s checkpoint: what a rerun of the same command continues from.

Beside FILE, ``FILE.asyncsubs-checkpoint`` holds the cursor after the last whole page written
and FILE's size at that moment. It is replaced atomically (write a temporary file, then rename)
after each page's records were written, so whatever stops the pull (Ctrl-C, SIGTERM, SIGKILL)
it describes a prefix of FILE made of whole pages; a rerun cuts FILE back to that size (the
bytes of a page written after the last checkpoint) and continues from the cursor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

import attrs
import orjson

from ..errors import ConfigError

__all__ = ["SUFFIX", "PullCheckpoint"]

SUFFIX: Final = ".asyncsubs-checkpoint"


@attrs.frozen
class PullCheckpoint:
    """A pull's position: ``offset`` bytes of FILE hold ``records`` records in ``pages``
    pages, and ``cursor`` continues after them. ``resource``, ``base_url``, ``credentials`` (a
    one-way fingerprint of base URL and token: the token chooses the store) and ``after_cursor``
    (the command's ``--after-cursor``) say which pull it belongs to, so a different command on
    the same FILE does not continue it."""

    resource: str
    base_url: str
    credentials: str
    after_cursor: str | None
    cursor: str
    offset: int
    records: int
    pages: int

    @staticmethod
    def path_for(output: Path) -> Path:
        return output.with_name(output.name + SUFFIX)

    @classmethod
    def load(cls, output: Path) -> PullCheckpoint | None:
        """The checkpoint beside ``output``, None when there is none; ConfigError when it
        cannot be read."""
        path = cls.path_for(output)
        try:
            data = orjson.loads(path.read_bytes())
            return cls(**{field.name: data[field.name] for field in attrs.fields(cls)})
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(
                f"{path} is not a pull checkpoint; remove it or pass --restart"
            ) from None

    def save(self, output: Path) -> None:
        path = self.path_for(output)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(orjson.dumps(attrs.asdict(self)))
        os.replace(temporary, path)  # atomic: a reader sees the old or the new one, whole

    @classmethod
    def remove(cls, output: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            cls.path_for(output).unlink()
