"""The checkpoint of ``pull -o FILE``: where a rerun of the same command continues.

``FILE.asyncsubs-checkpoint`` holds the cursor after the last whole page written and FILE's size
at that moment. It is replaced atomically (written to a temporary file, then renamed) after each
page's records were written, so whatever stops the pull (Ctrl-C, SIGTERM, SIGKILL) it describes a
prefix of FILE made of whole pages: a rerun of the same command cuts FILE back to that size and
continues from the cursor.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from ..errors import ConfigError
from ..json import dumps, loads

__all__ = ["CHECKPOINT_SUFFIX", "PullCheckpoint"]

CHECKPOINT_SUFFIX: Final = ".asyncsubs-checkpoint"


@attrs.frozen
class PullCheckpoint:
    """A pull's position: ``offset`` bytes of FILE hold ``records`` records in ``pages``
    pages, and ``cursor`` continues after them. ``resource``, ``base_url``, ``credentials`` (a
    one-way fingerprint of base URL and token: the token chooses the store), ``after_cursor``
    (the command's ``--after-cursor``) and ``params`` (its ``--param`` filters) say which pull
    it belongs to, so a different command on the same FILE does not continue it."""

    resource: str
    base_url: str
    credentials: str
    after_cursor: str | None
    cursor: str
    offset: int
    records: int
    pages: int
    params: Mapping[str, str] = attrs.field(factory=dict)

    @staticmethod
    def path_for(output: Path) -> Path:
        return output.with_name(output.name + CHECKPOINT_SUFFIX)

    @classmethod
    def load(cls, output: Path) -> PullCheckpoint | None:
        """The checkpoint beside ``output``, None when there is none; ConfigError when it
        cannot be read."""
        path = cls.path_for(output)
        try:
            data = loads(path.read_bytes())
            # A checkpoint from before --param has none.
            return cls(**{f.name: data.get(f.name, {}) for f in attrs.fields(cls)})
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except (ValueError, AttributeError, TypeError):
            raise ConfigError(
                f"{path} is not a pull checkpoint; remove it or pass --restart"
            ) from None

    def save(self, output: Path) -> None:
        path = self.path_for(output)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(dumps(attrs.asdict(self)))
        os.replace(temporary, path)  # atomic: a reader sees the old or the new one, whole

    @classmethod
    def remove(cls, output: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            cls.path_for(output).unlink()
